"""KServe v2 gRPC codec: ``inference.ModelInferRequest`` to the core's ``InferRequest``, and the answer to a
``ModelInferResponse``.

The gRPC front end (grpc_server.py) hands the core the same ``InferRequest`` the HTTP codec (kserve.py)
builds, checked by the same functions against the same limits (limits.py): the request id, parameter values,
shapes and BYTES elements go through kserve.py's own checks, imported from there, so the two protocols
cannot drift apart. What is new here is only what the protobuf form adds: typed ``contents`` (one repeated
field per datatype family, as Triton reads them) and ``raw_input_contents`` (little-endian bytes, BYTES
elements each after a 4-byte length, as the HTTP binary extension lays them out). Every count is compared
with the shape before anything is laid out for it.

Outputs always travel in ``raw_output_contents``, as Triton's gRPC server sends them; tritonclient reads them.
"""

from __future__ import annotations

from math import prod
from typing import Any

import numpy as np
from tritonclient.grpc import service_pb2

from inference.config import TensorSpec
from inference.errors import InvalidInput
from inference.kserve import (
    _INT_RANGES,
    DTYPES,
    LITTLE_ENDIAN,
    InferRequest,
    RequestedOutput,
    _bytes_payload,
    _decode_bytes_elements,
    _parameters,
    _prefix,
    _request_id,
    _shape_of,
    _short,
)
from inference.limits import TENSOR_MAX_DIMS, TENSOR_MAX_ELEMENTS

ModelInferRequest = service_pb2.ModelInferRequest
ModelInferResponse = service_pb2.ModelInferResponse

# The typed contents field each datatype's values travel in (Triton's mapping). FP16 and BF16 have none: they
# travel in raw_input_contents only.
TYPED_FIELD: dict[str, str] = {
    "BOOL": "bool_contents",
    "INT8": "int_contents",
    "INT16": "int_contents",
    "INT32": "int_contents",
    "INT64": "int64_contents",
    "UINT8": "uint_contents",
    "UINT16": "uint_contents",
    "UINT32": "uint_contents",
    "UINT64": "uint64_contents",
    "FP32": "fp32_contents",
    "FP64": "fp64_contents",
    "BYTES": "bytes_contents",
}
# The integer datatypes narrower than the field that carries them: their range is checked before the cast.
_NARROW = frozenset({"INT8", "INT16", "UINT8", "UINT16"})
_WIDE_DTYPE: dict[str, np.dtype[Any]] = {
    "int_contents": np.dtype(np.int32),
    "uint_contents": np.dtype(np.uint32),
}


def parameter_values(params: Any, where: str, rid: str | None) -> dict[str, Any]:
    """A protobuf ``map<string, InferParameter>`` as the plain values the HTTP codec reads (bool, int, float,
    str), each checked by its checks; a parameter with no value set is refused."""
    if not params:
        return {}
    values: dict[str, Any] = {}
    for key, param in params.items():
        choice = param.WhichOneof("parameter_choice")
        values[key] = None if choice is None else getattr(param, choice)
    return _parameters(values, where, rid)


def _typed_tensor(
    contents: Any, datatype: str, count: int, name: str, rid: str | None
) -> np.ndarray[Any, Any]:
    field = TYPED_FIELD.get(datatype)
    if field is None:
        raise InvalidInput(
            f"{_prefix(rid)}input '{name}': {datatype} has no typed contents field; send its data in "
            "raw_input_contents"
        )
    for descriptor, values in contents.ListFields():
        if descriptor.name != field and len(values):
            raise InvalidInput(
                f"{_prefix(rid)}input '{name}': {datatype} data goes in contents.{field}, not in "
                f"contents.{descriptor.name}"
            )
    values = getattr(contents, field)
    if len(values) != count:
        raise InvalidInput(
            f"{_prefix(rid)}input '{name}': its shape needs {count} elements but contents.{field} has "
            f"{len(values)}"
        )
    if datatype == "BYTES":
        arr = np.empty(count, dtype=object)
        arr[:] = list(values)
        return arr
    # np.fromiter reads the repeated field one element at a time: np.array would first hold every element as
    # a Python object, twice the time and many times the memory.
    if datatype in _NARROW:
        wide = np.fromiter(values, _WIDE_DTYPE[field], count)
        low, high = _INT_RANGES[datatype]
        if count and (int(wide.min()) < low or int(wide.max()) > high):
            raise InvalidInput(
                f"{_prefix(rid)}input '{name}': data does not fit {datatype} (integers from {low} to {high})"
            )
        return wide.astype(DTYPES[datatype])
    return np.fromiter(values, DTYPES[datatype], count)


def _raw_tensor(blob: bytes, datatype: str, count: int, name: str, rid: str | None) -> np.ndarray[Any, Any]:
    size = len(blob)
    if datatype == "BYTES":
        if 4 * count > size:  # each element carries at least its 4-byte length
            raise InvalidInput(
                f"{_prefix(rid)}input '{name}': {count} BYTES elements need at least {4 * count} bytes (a "
                f"4-byte length each), its raw_input_contents has {size}"
            )
        return _decode_bytes_elements(blob, 0, size, count, name, rid)
    dt = LITTLE_ENDIAN[datatype]
    expected = count * dt.itemsize
    if size != expected:
        raise InvalidInput(
            f"{_prefix(rid)}input '{name}': its shape of {datatype} needs {expected} bytes, its "
            f"raw_input_contents has {size}"
        )
    arr = np.frombuffer(blob, dtype=dt, count=count)
    if datatype == "BOOL" and count and np.frombuffer(blob, np.uint8, count).max() > 1:
        raise InvalidInput(f"{_prefix(rid)}input '{name}': BOOL data must be bytes 0 or 1")
    return arr


def decode_infer_request(msg: Any) -> InferRequest:
    """The ``InferRequest`` a ``ModelInferRequest`` carries; ``InvalidInput`` naming what does not hold.

    Inputs carry their data either all in ``raw_input_contents`` (one entry per input, in order) or each in
    its typed ``contents``, as Triton requires.
    """
    # This runs on the event loop for every gRPC request: the checks of what is rare (parameters, an unusual
    # shape) are only made when there is something to check.
    request_id = msg.id
    rid = _request_id({"id": request_id}) if request_id else None
    params = parameter_values(msg.parameters, "", rid) if msg.parameters else {}
    raw = msg.raw_input_contents
    raw_count = len(raw)
    tensors = msg.inputs
    if raw_count and raw_count != len(tensors):
        raise InvalidInput(
            f"{_prefix(rid)}the request has {len(tensors)} inputs but {raw_count} raw_input_contents: give "
            "raw contents for every input, in order, or for none"
        )
    inputs: dict[str, np.ndarray[Any, Any]] = {}
    datatypes: dict[str, str] = {}
    for index, tensor in enumerate(tensors):
        name = tensor.name
        if name in inputs:
            raise InvalidInput(f"{_prefix(rid)}input '{name}' is given twice")
        datatype = tensor.datatype
        if datatype not in DTYPES:
            raise InvalidInput(f"{_prefix(rid)}input '{name}': unknown datatype {_short(datatype)}")
        dims = tensor.shape
        if len(dims) > TENSOR_MAX_DIMS:  # before a list of them is made: the message may hold millions
            raise InvalidInput(
                f"{_prefix(rid)}input '{name}': 'shape' has {len(dims)} dimensions; at most {TENSOR_MAX_DIMS}"
            )
        shape = tuple(dims)
        count = prod(shape)
        if not 0 < count <= TENSOR_MAX_ELEMENTS or (shape and min(shape) < 0):
            # a zero, a negative or a huge dimension: kserve.py's checks, which name it
            shape, count = _shape_of(list(dims), name, rid)
        if tensor.parameters:
            parameter_values(tensor.parameters, f"input '{name}': ", rid)
        has_contents = tensor.HasField("contents")
        if raw_count:
            if has_contents:
                raise InvalidInput(
                    f"{_prefix(rid)}input '{name}': contents must not be given when the request carries "
                    "raw_input_contents"
                )
            arr = _raw_tensor(raw[index], datatype, count, name, rid)
        elif has_contents:
            arr = _typed_tensor(tensor.contents, datatype, count, name, rid)
        elif count == 0:
            arr = np.empty(0, dtype=DTYPES[datatype])
        else:
            raise InvalidInput(f"{_prefix(rid)}input '{name}' has neither contents nor raw_input_contents")
        inputs[name] = arr.reshape(shape)
        datatypes[name] = datatype

    outputs: list[RequestedOutput] | None = None
    requested = msg.outputs
    if requested:
        outputs = []
        for out in requested:
            if out.parameters:
                where = f"output '{out.name}': "
                oparams = parameter_values(out.parameters, where, rid)
                classification = oparams.get("classification")
                if classification is not None and type(classification) is not int:
                    raise InvalidInput(f"{_prefix(rid)}{where}parameter 'classification' must be an integer")
                if classification:
                    raise InvalidInput(f"{_prefix(rid)}{where}the classification extension is not supported")
            outputs.append(RequestedOutput(out.name, True))
    return InferRequest(
        id=rid,
        parameters=params,
        inputs=inputs,
        datatypes=datatypes,
        outputs=outputs,
        binary_output_all=True,
    )


# -- answers, written by hand -----------------------------------------------------------------------------
# An answer is a handful of length-delimited fields: building protobuf message objects for it (a map entry per
# parameter, a message per output, then serializing them) cost several times what writing the bytes does, on
# the event loop, for every request. The tags below are service.proto's field numbers; the test
# (tests/inference/test_grpc_codec.py) checks the bytes parse to the message protobuf builds.
_RESPONSE_MODEL_NAME = b"\x0a"  # ModelInferResponse.model_name = 1
_RESPONSE_MODEL_VERSION = b"\x12"  # .model_version = 2
_RESPONSE_ID = b"\x1a"  # .id = 3
_RESPONSE_PARAMETER = b"\x22"  # .parameters = 4, map<string, InferParameter>
_RESPONSE_OUTPUT = b"\x2a"  # .outputs = 5, InferOutputTensor
_RESPONSE_RAW = b"\x32"  # .raw_output_contents = 6
_OUTPUT_NAME = b"\x0a"  # InferOutputTensor.name = 1
_OUTPUT_DATATYPE = b"\x12"  # .datatype = 2
_OUTPUT_SHAPE = b"\x1a"  # .shape = 3, packed int64
_ENTRY_KEY = b"\x0a"  # a map entry's key = 1
_ENTRY_VALUE = b"\x12"  # its value = 2
_PARAMETER_STRING = b"\x1a"  # InferParameter.string_param = 3
_STREAM_RESPONSE = b"\x12"  # ModelStreamInferResponse.infer_response = 2
# parameters["triton_final_response"] = InferParameter(bool_param=True)
_FINAL_RESPONSE = b"\x22\x1b\x0a\x15triton_final_response\x12\x02\x08\x01"
_SMALL_VARINTS = [bytes((n,)) for n in range(0x80)]
_INT64_MASK = (1 << 64) - 1


def _varint(n: int) -> bytes:
    if 0 <= n < 0x80:
        return _SMALL_VARINTS[n]
    n &= _INT64_MASK  # a negative int64 is written as its two's complement, ten bytes
    out = bytearray()
    while n >= 0x80:
        out.append((n & 0x7F) | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


def _field(tag: bytes, payload: bytes) -> bytes:
    return tag + _varint(len(payload)) + payload


def _text_field(tag: bytes, text: str) -> bytes:
    return _field(tag, text.encode("utf-8")) if text else b""


# The fields that repeat from answer to answer: a model's name and version, an output's name, datatype and
# shape. Bounded: a client choosing its batch size makes only a few shapes per output.
_HEADS: dict[tuple[str, str], bytes] = {}
_OUTPUT_HEADS: dict[tuple[str, str, tuple[int, ...]], bytes] = {}
_MAX_CACHED = 4096


def _head(model_name: str, model_version: str) -> bytes:
    key = (model_name, model_version)
    head = _HEADS.get(key)
    if head is None:
        head = _text_field(_RESPONSE_MODEL_NAME, model_name) + _text_field(
            _RESPONSE_MODEL_VERSION, model_version
        )
        if len(_HEADS) >= _MAX_CACHED:
            _HEADS.clear()
        _HEADS[key] = head
    return head


def _output_head(name: str, datatype: str, shape: tuple[int, ...]) -> bytes:
    key = (name, datatype, shape)
    head = _OUTPUT_HEADS.get(key)
    if head is None:
        tensor = _text_field(_OUTPUT_NAME, name) + _text_field(_OUTPUT_DATATYPE, datatype)
        if shape:
            tensor += _field(_OUTPUT_SHAPE, b"".join([_varint(d) for d in shape]))
        head = _field(_RESPONSE_OUTPUT, tensor)
        if len(_OUTPUT_HEADS) >= _MAX_CACHED:
            _OUTPUT_HEADS.clear()
        _OUTPUT_HEADS[key] = head
    return head


def encode_infer_response(
    model_name: str,
    model_version: str,
    request_id: str | None,
    outputs: list[tuple[TensorSpec, np.ndarray[Any, Any], bool]],
    parameters: dict[str, str] | None,
    *,
    final_response: bool = False,
) -> bytes:
    """The serialized ``ModelInferResponse`` of an answer (``InferenceCore.answer_parts``): every output's
    bytes in ``raw_output_contents`` (little-endian; BYTES elements each after a 4-byte length), the
    parameters as strings (``ledger_id``, ``variant``), and ``triton_final_response`` when asked for (a
    stream's answer, as Triton flags the last response of a request)."""
    parts = [_head(model_name, model_version)]
    if request_id:
        parts.append(_text_field(_RESPONSE_ID, request_id))
    if parameters:
        for key, value in parameters.items():
            entry = _field(_ENTRY_KEY, key.encode("utf-8")) + _field(
                _ENTRY_VALUE, _field(_PARAMETER_STRING, value.encode("utf-8"))
            )
            parts.append(_field(_RESPONSE_PARAMETER, entry))
    if final_response:
        parts.append(_FINAL_RESPONSE)
    raws = []
    for tspec, arr, _binary in outputs:
        datatype = tspec.datatype
        parts.append(_output_head(tspec.name, datatype, arr.shape))
        if datatype == "BYTES":
            raw = _bytes_payload(arr)
        else:
            want = LITTLE_ENDIAN[datatype]
            raw = (arr if arr.dtype == want else arr.astype(want)).tobytes()
        raws.append(_RESPONSE_RAW + _varint(len(raw)))
        raws.append(raw)
    parts += raws
    return b"".join(parts)


def encode_stream_response(infer_response: bytes) -> bytes:
    """A ``ModelStreamInferResponse`` carrying a serialized ``ModelInferResponse``."""
    return _STREAM_RESPONSE + _varint(len(infer_response)) + infer_response
