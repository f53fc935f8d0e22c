"""KServe v2 / Triton HTTP codec: JSON and the binary tensor extension, all KServe datatypes.

Framework-free and allocation-light, because every request goes through it: binary inputs
are ``np.frombuffer`` views on the body at their offset (no copy), and error messages follow
Triton's wording so that clients written for Triton read them the same.
"""

from __future__ import annotations

import math
import struct
from dataclasses import dataclass
from typing import Any, NoReturn

import numpy as np
import orjson

from inference.config import ModelSpec, TensorSpec
from inference.errors import InvalidInput
from inference.limits import (
    PARAMETER_STRING_MAX_LENGTH,
    REQUEST_ID_MAX_LENGTH,
    TENSOR_MAX_DIMS,
    TENSOR_MAX_ELEMENTS,
)

try:  # BF16 has no numpy dtype of its own; ml_dtypes (an onnx dependency) provides one.
    from ml_dtypes import bfloat16 as _bf16

    _BF16: np.dtype[Any] = np.dtype(_bf16)
except ImportError:  # pragma: no cover - ml_dtypes ships with onnx
    _BF16 = np.dtype(np.uint16)

DTYPES: dict[str, np.dtype[Any]] = {
    "BOOL": np.dtype(np.bool_),
    "UINT8": np.dtype(np.uint8),
    "UINT16": np.dtype(np.uint16),
    "UINT32": np.dtype(np.uint32),
    "UINT64": np.dtype(np.uint64),
    "INT8": np.dtype(np.int8),
    "INT16": np.dtype(np.int16),
    "INT32": np.dtype(np.int32),
    "INT64": np.dtype(np.int64),
    "FP16": np.dtype(np.float16),
    "FP32": np.dtype(np.float32),
    "FP64": np.dtype(np.float64),
    "BF16": _BF16,
    "BYTES": np.dtype(object),
}
LITTLE_ENDIAN: dict[str, np.dtype[Any]] = {
    k: (v.newbyteorder("<") if v.kind in "iuf" else v) for k, v in DTYPES.items()
}

_U32 = struct.Struct("<I")


@dataclass(slots=True)
class RequestedOutput:
    name: str
    binary: bool


@dataclass(slots=True)
class InferRequest:
    """One decoded ``POST .../infer`` body."""

    id: str | None
    parameters: dict[str, Any]
    inputs: dict[str, np.ndarray[Any, Any]]
    datatypes: dict[str, str]
    outputs: list[RequestedOutput] | None
    binary_output_all: bool


def _prefix(request_id: str | None) -> str:
    return f"[request id: {request_id if request_id else '<id_unknown>'}] "


def parse_header_length(raw: bytes | None, body_len: int) -> int | None:
    """Validate ``Inference-Header-Content-Length``; ``None`` when the header is absent."""
    if raw is None:
        return None
    try:
        value = int(raw)
    except ValueError:
        raise InvalidInput(
            f"Inference-Header-Content-Length must be a non-negative integer, got {raw.decode(errors='replace')!r}"
        ) from None
    if value < 0:
        raise InvalidInput(f"Inference-Header-Content-Length must be a non-negative integer, got {value}")
    if value > body_len:
        raise InvalidInput(
            f"Inference-Header-Content-Length is {value} but the request body has only {body_len} bytes"
        )
    return value


def _short(value: Any) -> str:
    """A client's value for a message, cut short: an error must not echo a whole body back."""
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


def _shape_of(raw: Any, name: str, rid: str | None) -> tuple[tuple[int, ...], int]:
    """The shape and its element count, checked against limits.py before anything is laid out for it."""
    if type(raw) is not list or len(raw) > TENSOR_MAX_DIMS or not all(type(d) is int for d in raw):
        if type(raw) is list and len(raw) > TENSOR_MAX_DIMS:
            raise InvalidInput(
                f"{_prefix(rid)}input '{name}': 'shape' has {len(raw)} dimensions; at most {TENSOR_MAX_DIMS}"
            )
        raise InvalidInput(f"{_prefix(rid)}input '{name}': 'shape' must be a list of integers")
    count = 1
    span = 1  # zeros counted as one: numpy refuses a shape whose other dimensions overflow, even when empty
    for d in raw:
        if d < 0:
            raise InvalidInput(f"{_prefix(rid)}input '{name}': shape {raw} has a negative dimension")
        count *= d
        if d:
            span *= d
    if span > TENSOR_MAX_ELEMENTS:
        raise InvalidInput(
            f"{_prefix(rid)}input '{name}': shape {raw} has more than {TENSOR_MAX_ELEMENTS} elements"
        )
    return tuple(raw), count


def _decode_bytes_elements(
    body: bytes, start: int, size: int, count: int, name: str, rid: str | None
) -> np.ndarray[Any, Any]:
    # The caller has checked that 4 * count <= size: the array is never larger than the body allows. Slicing
    # the body into a list, then filling the array at once, takes half the time of item assignment.
    unpack = _U32.unpack_from
    items: list[bytes] = []
    append = items.append
    pos = start
    end = start + size
    for i in range(count):
        if pos + 4 > end:
            raise InvalidInput(f"{_prefix(rid)}input '{name}': BYTES data ends inside element {i}'s length")
        n = unpack(body, pos)[0]
        pos += 4
        if pos + n > end:
            raise InvalidInput(f"{_prefix(rid)}input '{name}': BYTES element {i} runs past the data")
        append(body[pos : pos + n])
        pos += n
    if pos != end:
        raise InvalidInput(
            f"{_prefix(rid)}input '{name}': {end - pos} bytes left after {count} BYTES elements"
        )
    out = np.empty(count, dtype=object)
    out[:] = items
    return out


_JSON_NUMBERS = frozenset({int, float})
# KServe parameter values: a boolean, a number or a string.
_PARAMETER_TYPES = frozenset({bool, int, float, str})
# The smallest magnitude a float datatype rounds to infinity: half-way past its largest finite value (the tie
# rounds to even, away from that value). Checked on the float64 values before the cast, so the cast is exact
# and silent. BF16 is checked after its cast instead: ml_dtypes rounds through float32, twice.
_OVERFLOW_AT: dict[str, float] = {"FP16": (2 - 2**-11) * 2**15, "FP32": (2 - 2**-24) * 2**127}
_INT_RANGES: dict[str, tuple[int, int]] = {
    k: (int(np.iinfo(v).min), int(np.iinfo(v).max)) for k, v in DTYPES.items() if v.kind in "iu"
}


def _flatten_json(data: Any, name: str, rid: str | None) -> list[Any]:
    """Flatten row-major nested lists, refusing ragged nesting (rows of different lengths)."""
    if not isinstance(data, list):
        return [data]
    level: list[Any] = data
    while level and isinstance(level[0], list):
        width = len(level[0])
        if any(not isinstance(row, list) or len(row) != width for row in level):
            raise InvalidInput(
                f"{_prefix(rid)}input '{name}': nested 'data' is ragged (rows of different lengths)"
            )
        level = [item for row in level for item in row]
    return level


def _json_tensor(data: Any, datatype: str, count: int, name: str, rid: str | None) -> np.ndarray[Any, Any]:
    flat = _flatten_json(data, name, rid)
    if len(flat) != count:
        raise InvalidInput(
            f"{_prefix(rid)}input '{name}': shape needs {count} elements but 'data' has {len(flat)}"
        )
    if datatype == "BYTES":
        arr = np.empty(count, dtype=object)
        for i, item in enumerate(flat):
            if isinstance(item, str):
                arr[i] = item.encode()
            elif isinstance(item, (bytes, int, float)):
                arr[i] = str(item).encode() if not isinstance(item, bytes) else item
            else:
                raise InvalidInput(f"{_prefix(rid)}input '{name}': BYTES element {i} is not a string")
        return arr
    if datatype == "BOOL":
        if not all(isinstance(v, bool) for v in flat):
            raise InvalidInput(f"{_prefix(rid)}input '{name}': BOOL data must be true or false")
        return np.array(flat, dtype=np.bool_)
    # One pass in C over the element types (JSON gives int, float, str, bool, None, dict or list): a
    # generator of isinstance checks cost 52 of the 74 µs of decoding a 256-float request.
    kinds = set(map(type, flat))
    if not kinds <= _JSON_NUMBERS:
        raise InvalidInput(f"{_prefix(rid)}input '{name}': {datatype} data must be numbers")
    int_range = _INT_RANGES.get(datatype)
    if int_range is not None:
        if float in kinds:
            # numpy would truncate 1.5 to 1 without a word; Triton refuses it. orjson also reads an integer
            # beyond 64 bits as a float, which no integer datatype holds.
            raise InvalidInput(f"{_prefix(rid)}input '{name}': {datatype} data must be integers")
        try:
            return np.array(flat, dtype=DTYPES[datatype])  # numpy refuses an integer outside the datatype
        except OverflowError as exc:
            raise InvalidInput(
                f"{_prefix(rid)}input '{name}': data does not fit {datatype} (integers from {int_range[0]} to "
                f"{int_range[1]}): {exc}"
            ) from None
    wide = np.array(flat, dtype=np.float64)  # orjson's floats are finite doubles, so FP64 holds them all
    if datatype == "FP64":
        return wide
    limit = _OVERFLOW_AT.get(datatype)
    if limit is not None:
        # One dot product bounds every value: no square exceeds the sum of squares (non-negative terms, and
        # rounding is monotonic), so a sum below limit**2 clears them all; only a larger one (or inf) needs
        # the exact look.
        if np.dot(wide, wide) >= limit * limit and (wide.max() >= limit or wide.min() <= -limit):
            _refuse_out_of_range(wide, np.abs(wide) >= limit, datatype, name, rid)
        return wide.astype(DTYPES[datatype])
    with np.errstate(over="ignore"):  # BF16 is rare enough to pay for the context
        arr = wide.astype(DTYPES[datatype])
    if not np.isfinite(arr).all():
        _refuse_out_of_range(wide, ~np.isfinite(arr), datatype, name, rid)
    return arr


def _refuse_out_of_range(
    wide: np.ndarray[Any, Any], bad: np.ndarray[Any, Any], datatype: str, name: str, rid: str | None
) -> NoReturn:
    value = float(wide[bad][0])
    raise InvalidInput(
        f"{_prefix(rid)}input '{name}': the value {value!r} is out of the range of {datatype} "
        "(it would become infinity)"
    )


def _parameters(raw: Any, where: str, rid: str | None) -> dict[str, Any]:
    """A ``parameters`` object (``where`` says whose), each value of a KServe parameter type."""
    if raw is None:
        return {}
    if type(raw) is not dict:
        raise InvalidInput(f"{_prefix(rid)}{where}'parameters' must be an object")
    for key, value in raw.items():
        kind = type(value)
        if kind not in _PARAMETER_TYPES:
            raise InvalidInput(
                f"{_prefix(rid)}{where}parameter '{key}' must be a boolean, a number or a string, "
                f"got {_short(value)}"
            )
        if kind is str and len(value) > PARAMETER_STRING_MAX_LENGTH:
            raise InvalidInput(
                f"{_prefix(rid)}{where}parameter '{key}' is longer than {PARAMETER_STRING_MAX_LENGTH} characters"
            )
    return raw


def _flag(params: dict[str, Any], key: str, where: str, rid: str | None) -> bool | None:
    value = params.get(key)
    if value is not None and type(value) is not bool:
        raise InvalidInput(
            f"{_prefix(rid)}{where}parameter '{key}' must be true or false, got {_short(value)}"
        )
    return value


def _request_id(doc: dict[str, Any]) -> str | None:
    rid = doc.get("id")
    if rid is None:
        return None
    if type(rid) is not str:
        raise InvalidInput(f"'id' must be a string, got {_short(rid)}")
    # The ledger stores the id (client_request_id): PostgreSQL refuses a longer one, or a NUL in any text,
    # and with it the drainer's whole transaction, on every retry.
    if len(rid) > REQUEST_ID_MAX_LENGTH:
        raise InvalidInput(f"'id' must be at most {REQUEST_ID_MAX_LENGTH} characters, got {len(rid)}")
    if "\x00" in rid:
        raise InvalidInput("'id' must not contain the character U+0000 (NUL)")
    return rid


def decode_request(body: bytes, header_length: int | None) -> InferRequest:
    """Decode an infer request body (JSON, or JSON header + binary tensors).

    Every field is type-checked and every size is computed from the shape and compared with the body and the
    limits (limits.py) before anything is allocated for it; whatever does not hold is an ``InvalidInput``.
    """
    return _decode(body, header_length, planning=False)[0]


@dataclass(slots=True)
class _BinaryInput:
    name: str
    dtype: np.dtype[Any]
    count: int
    offset: int
    shape: tuple[int, ...]


@dataclass(slots=True)
class HeaderPlan:
    """What a binary request's JSON header decoded to, for another body with the same header and length.

    Only for headers whose every input is binary data that needs no check of its values (not BYTES, whose
    elements are parsed, nor BOOL, whose bytes must be 0 or 1): every check ``decode_request`` makes then
    depends on the header's bytes and the body's length alone, so a body with both equal decodes, with the
    same checks passed, to the plan's request over its own bytes."""

    id: str | None
    parameters: dict[str, Any]
    inputs: tuple[_BinaryInput, ...]
    datatypes: dict[str, str]
    outputs: tuple[tuple[str, bool], ...] | None  # name, binary
    binary_output_all: bool

    def request(self, body: bytes) -> InferRequest:
        inputs = {
            i.name: np.frombuffer(body, dtype=i.dtype, count=i.count, offset=i.offset).reshape(i.shape)
            for i in self.inputs
        }
        return InferRequest(
            id=self.id,
            parameters=dict(self.parameters),
            inputs=inputs,
            datatypes=dict(self.datatypes),
            outputs=None if self.outputs is None else [RequestedOutput(n, b) for n, b in self.outputs],
            binary_output_all=self.binary_output_all,
        )


class RequestDecoder:
    """``decode_request`` that remembers the plans of recent binary requests' JSON headers.

    A client sends the same header with every request of a kind (perf_analyzer and tritonclient do, as does
    any service calling one model), and parsing and checking it is most of a small request's decoding. A body
    whose header bytes and length match a remembered plan's is decoded from the plan (``HeaderPlan``); any
    other is decoded in full, and its plan remembered when it qualifies. Headers over ``max_header_bytes`` are
    not remembered, and at ``max_plans`` the memory is emptied, so many distinct headers cost at most a full
    decoding each, as without it. Safe from several threads: a lookup, an insertion and emptying are each one
    dict operation.
    """

    def __init__(self, max_plans: int = 256, max_header_bytes: int = 4096) -> None:
        self.max_plans = max_plans
        self.max_header_bytes = max_header_bytes
        self._plans: dict[tuple[bytes, int], HeaderPlan] = {}

    def __len__(self) -> int:
        return len(self._plans)

    def decode(self, body: bytes, header_length: int | None) -> InferRequest:
        if header_length is None or header_length > self.max_header_bytes or header_length > len(body):
            return decode_request(body, header_length)
        key = (body[:header_length], len(body))
        plan = self._plans.get(key)
        if plan is not None:
            return plan.request(body)
        req, plan = _decode(body, header_length, planning=True)
        if plan is not None:
            if len(self._plans) >= self.max_plans:
                self._plans.clear()
            self._plans[key] = plan
        return req


def _decode(body: bytes, header_length: int | None, planning: bool) -> tuple[InferRequest, HeaderPlan | None]:
    """``decode_request``, and (``planning``) the request's ``HeaderPlan`` when it qualifies for one."""
    json_end = len(body) if header_length is None else header_length
    try:
        doc = orjson.loads(memoryview(body)[:json_end])
    except orjson.JSONDecodeError as exc:
        raise InvalidInput(f"failed to parse the request JSON: {exc}") from None
    if not isinstance(doc, dict):
        raise InvalidInput("the request JSON must be an object")
    rid = _request_id(doc)
    params = _parameters(doc.get("parameters"), "", rid)
    binary_all = _flag(params, "binary_data_output", "", rid) is True
    raw_inputs = doc.get("inputs")
    if not isinstance(raw_inputs, list):
        raise InvalidInput(f"{_prefix(rid)}'inputs' must be a list of tensors")

    offset = json_end
    inputs: dict[str, np.ndarray[Any, Any]] = {}
    datatypes: dict[str, str] = {}
    planned: list[_BinaryInput] | None = [] if planning and header_length is not None else None
    for raw in raw_inputs:
        if not isinstance(raw, dict) or not isinstance(raw.get("name"), str):
            raise InvalidInput(f"{_prefix(rid)}each input must be an object with a 'name'")
        name = raw["name"]
        if name in inputs:
            raise InvalidInput(f"{_prefix(rid)}input '{name}' is given twice")
        datatype = raw.get("datatype")
        if type(datatype) is not str or datatype not in DTYPES:
            raise InvalidInput(f"{_prefix(rid)}input '{name}': unknown datatype {_short(datatype)}")
        shape, count = _shape_of(raw.get("shape"), name, rid)
        tparams = _parameters(raw.get("parameters"), f"input '{name}': ", rid)
        size = tparams.get("binary_data_size")
        if size is not None:
            if header_length is None:
                raise InvalidInput(
                    f"{_prefix(rid)}input '{name}' has binary_data_size but the request has no "
                    "Inference-Header-Content-Length header"
                )
            if type(size) is not int or size < 0:
                raise InvalidInput(
                    f"{_prefix(rid)}input '{name}': binary_data_size must be a non-negative integer"
                )
            if offset + size > len(body):
                raise InvalidInput(
                    f"{_prefix(rid)}input '{name}': binary_data_size {size} runs past the end of the body "
                    f"({len(body) - offset} bytes left)"
                )
            if datatype == "BYTES":
                if 4 * count > size:  # each element carries at least its 4-byte length
                    raise InvalidInput(
                        f"{_prefix(rid)}input '{name}': shape {list(shape)} of BYTES needs at least "
                        f"{4 * count} bytes (a 4-byte length per element), binary_data_size is {size}"
                    )
                arr = _decode_bytes_elements(body, offset, size, count, name, rid)
                planned = None  # its elements are parsed from the body
            else:
                dt = LITTLE_ENDIAN[datatype]
                expected = count * dt.itemsize
                if size != expected:
                    raise InvalidInput(
                        f"{_prefix(rid)}input '{name}': shape {list(shape)} of {datatype} needs {expected} bytes, "
                        f"binary_data_size is {size}"
                    )
                arr = np.frombuffer(body, dtype=dt, count=count, offset=offset)
                if datatype == "BOOL":
                    if count and np.frombuffer(body, np.uint8, count, offset).max() > 1:
                        raise InvalidInput(f"{_prefix(rid)}input '{name}': BOOL data must be bytes 0 or 1")
                    planned = None  # its bytes are checked
                elif planned is not None:
                    planned.append(_BinaryInput(name, dt, count, offset, shape))
            offset += size
        else:
            planned = None  # its data is in the header
            if "data" not in raw:
                raise InvalidInput(f"{_prefix(rid)}input '{name}' has neither 'data' nor binary_data_size")
            if count > json_end:  # every JSON element takes at least one byte of the body
                raise InvalidInput(
                    f"{_prefix(rid)}input '{name}': shape {list(shape)} needs {count} elements, more than the "
                    f"request's {json_end} bytes of JSON can hold"
                )
            arr = _json_tensor(raw["data"], datatype, count, name, rid)
        inputs[name] = arr.reshape(shape)
        datatypes[name] = datatype
    if offset != len(body):
        raise InvalidInput(
            f"{_prefix(rid)}the body has {len(body) - offset} bytes of binary data that no input claims"
        )

    outputs: list[RequestedOutput] | None = None
    raw_outputs = doc.get("outputs")
    if raw_outputs is not None:
        if not isinstance(raw_outputs, list):
            raise InvalidInput(f"{_prefix(rid)}'outputs' must be a list")
        outputs = []
        for raw in raw_outputs:
            if not isinstance(raw, dict) or not isinstance(raw.get("name"), str):
                raise InvalidInput(f"{_prefix(rid)}each requested output must be an object with a 'name'")
            where = f"output '{raw['name']}': "
            oparams = _parameters(raw.get("parameters"), where, rid)
            classification = oparams.get("classification")
            if classification is not None and type(classification) is not int:
                raise InvalidInput(f"{_prefix(rid)}{where}parameter 'classification' must be an integer")
            if classification:
                raise InvalidInput(f"{_prefix(rid)}{where}the classification extension is not supported")
            binary = _flag(oparams, "binary_data", where, rid)
            outputs.append(RequestedOutput(raw["name"], binary_all if binary is None else binary))
    req = InferRequest(
        id=rid,
        parameters=params,
        inputs=inputs,
        datatypes=datatypes,
        outputs=outputs,
        binary_output_all=binary_all,
    )
    if planned is None:
        return req, None
    plan = HeaderPlan(
        id=rid,
        parameters=dict(params),
        inputs=tuple(planned),
        datatypes=dict(datatypes),
        outputs=None if outputs is None else tuple((o.name, o.binary) for o in outputs),
        binary_output_all=binary_all,
    )
    return req, plan


def _shape_str(shape: tuple[int, ...] | list[int]) -> str:
    return "[" + ",".join(str(d) for d in shape) + "]"


def validate_request(spec: ModelSpec, req: InferRequest) -> int:
    """Check a decoded request against the model's config; return its batch size (rows).

    Arrays whose datatype matches but whose bytes are big-endian views never occur: the
    wire format is little-endian and decoding already produced native arrays.
    """
    rid = req.id
    name = spec.name
    for in_name in req.inputs:
        if spec.input(in_name) is None:
            raise InvalidInput(f"{_prefix(rid)}unexpected inference input '{in_name}' for model '{name}'")
    missing = [t.name for t in spec.inputs if not t.optional and t.name not in req.inputs]
    if missing:
        raise InvalidInput(
            f"{_prefix(rid)}expected {len(spec.inputs)} inputs but got {len(req.inputs)} inputs for model "
            f"'{name}'; missing required input(s) {missing}"
        )
    rows = 1
    first = True
    for tspec in spec.inputs:
        arr = req.inputs.get(tspec.name)
        if arr is None:
            continue
        got_type = req.datatypes[tspec.name]
        if got_type != tspec.datatype:
            raise InvalidInput(
                f"{_prefix(rid)}inference input '{tspec.name}' data-type is '{got_type}', but model '{name}' "
                f"expects '{tspec.datatype}'"
            )
        shape = arr.shape
        if spec.max_batch_size > 0:
            expected = (-1, *tspec.dims)
            if len(shape) != len(expected) or not _dims_match(shape[1:], tspec.dims):
                raise InvalidInput(
                    f"{_prefix(rid)}unexpected shape for input '{tspec.name}' for model '{name}'. Expected "
                    f"{_shape_str(expected)}, got {_shape_str(shape)}. NOTE: Setting a non-zero max_batch_size "
                    "in the model config requires a batch dimension to be prepended to each input shape."
                )
            batch = shape[0]
            if batch < 1 or batch > spec.max_batch_size:
                raise InvalidInput(
                    f"{_prefix(rid)}inference request batch-size must be <= {spec.max_batch_size} for '{name}'"
                    if batch > spec.max_batch_size
                    else f"{_prefix(rid)}inference request batch-size must be >= 1 for '{name}'"
                )
            if first:
                rows = batch
                first = False
            elif batch != rows:
                raise InvalidInput(
                    f"{_prefix(rid)}input '{tspec.name}' has batch size {batch} but other inputs have {rows} "
                    f"for model '{name}'"
                )
        elif len(shape) != len(tspec.dims) or not _dims_match(shape, tspec.dims):
            raise InvalidInput(
                f"{_prefix(rid)}unexpected shape for input '{tspec.name}' for model '{name}'. Expected "
                f"{_shape_str(tspec.dims)}, got {_shape_str(shape)}"
            )
    if req.outputs is not None:
        for out in req.outputs:
            if spec.output(out.name) is None:
                raise InvalidInput(
                    f"{_prefix(rid)}unexpected inference output '{out.name}' for model '{name}'"
                )
    return rows


def _dims_match(shape: tuple[int, ...], dims: tuple[int, ...]) -> bool:
    return all(d == -1 or d == s for s, d in zip(shape, dims, strict=True))


def shape_signature(spec: ModelSpec, req: InferRequest) -> tuple[tuple[int, ...], ...] | None:
    """Requests may share a batch only when all non-batch dimensions agree.

    With no variable (-1) dimension every valid request agrees, so the signature is None.
    """
    if not any(-1 in t.dims for t in spec.inputs):
        return None
    start = 1 if spec.max_batch_size > 0 else 0
    return tuple(req.inputs[t.name].shape[start:] for t in spec.inputs if t.name in req.inputs)


def _bytes_payload(arr: np.ndarray[Any, Any]) -> bytes:
    parts: list[bytes] = []
    for item in arr.ravel():
        b = item if isinstance(item, bytes) else str(item).encode()
        parts.append(_U32.pack(len(b)))
        parts.append(b)
    return b"".join(parts)


_FLOAT_OUTPUTS = frozenset({"FP16", "FP32", "FP64", "BF16"})
_NAN, _INFINITY, _MINUS_INFINITY = b"NaN", b"Infinity", b"-Infinity"


def _json_data(arr: np.ndarray[Any, Any], datatype: str) -> list[Any]:
    if datatype == "BYTES":
        return [
            (v.decode("utf-8", errors="backslashreplace") if isinstance(v, bytes) else str(v))
            for v in arr.ravel()
        ]
    if datatype == "BF16":
        return arr.astype(np.float32).ravel().tolist()
    return arr.ravel().tolist()


def _float_json(arr: np.ndarray[Any, Any], datatype: str) -> orjson.Fragment:
    """The data of a float output, serialised here: orjson writes inf and NaN as ``null``, and no finite number
    has an ``n`` in it, so one byte search finds them. They are written as Triton 2.51 writes them (rapidjson,
    kWriteNanAndInfFlag): the bare tokens ``NaN``, ``Infinity`` and ``-Infinity``, which tritonclient reads."""
    values = _json_data(arr, datatype)
    text = orjson.dumps(values)
    if b"n" not in text:
        return orjson.Fragment(text)
    parts = text.split(b"null")  # the i-th null is the i-th non-finite value
    special = [v for v in values if not math.isfinite(v)]
    pieces = [parts[0]]
    for value, part in zip(special, parts[1:], strict=True):
        pieces.append(_NAN if value != value else _INFINITY if value > 0 else _MINUS_INFINITY)
        pieces.append(part)
    return orjson.Fragment(b"".join(pieces))


def encode_response(
    model_name: str,
    model_version: str,
    request_id: str | None,
    outputs: list[tuple[TensorSpec, np.ndarray[Any, Any], bool]],
    parameters: dict[str, Any] | None = None,
) -> tuple[bytes, int | None]:
    """Encode an infer response; returns (body, json header length or None when all JSON)."""
    doc: dict[str, Any] = {}
    if request_id is not None:
        doc["id"] = request_id
    doc["model_name"] = model_name
    doc["model_version"] = model_version
    if parameters:
        doc["parameters"] = parameters
    out_docs: list[dict[str, Any]] = []
    blobs: list[bytes] = []
    for tspec, arr, binary in outputs:
        entry: dict[str, Any] = {"name": tspec.name, "datatype": tspec.datatype, "shape": list(arr.shape)}
        if binary:
            if tspec.datatype == "BYTES":
                blob = _bytes_payload(arr)
            else:
                want = LITTLE_ENDIAN[tspec.datatype]
                blob = (arr if arr.dtype == want else arr.astype(want)).tobytes()
            entry["parameters"] = {"binary_data_size": len(blob)}
            blobs.append(blob)
        else:
            want_dtype = DTYPES[tspec.datatype]
            if tspec.datatype not in ("BYTES", "BF16") and arr.dtype != want_dtype:
                arr = arr.astype(want_dtype)  # the same values the binary form would carry
            if tspec.datatype in _FLOAT_OUTPUTS:
                entry["data"] = _float_json(arr, tspec.datatype)
            else:
                entry["data"] = _json_data(arr, tspec.datatype)
        out_docs.append(entry)
    doc["outputs"] = out_docs
    header = orjson.dumps(doc)
    if not blobs:
        return header, None
    return header + b"".join(blobs), len(header)


def error_body(message: str) -> bytes:
    return orjson.dumps({"error": message})
