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
from inference.limits import TENSOR_MAX_DIMS

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
    rid = _request_id({"id": msg.id}) if msg.id else None
    params = parameter_values(msg.parameters, "", rid)
    raw = msg.raw_input_contents
    raw_count = len(raw)
    if raw_count and raw_count != len(msg.inputs):
        raise InvalidInput(
            f"{_prefix(rid)}the request has {len(msg.inputs)} inputs but {raw_count} raw_input_contents: give "
            "raw contents for every input, in order, or for none"
        )
    inputs: dict[str, np.ndarray[Any, Any]] = {}
    datatypes: dict[str, str] = {}
    for index, tensor in enumerate(msg.inputs):
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
        shape, count = _shape_of(list(dims), name, rid)
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
    if len(msg.outputs):
        outputs = []
        for out in msg.outputs:
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


def encode_infer_response(
    model_name: str,
    model_version: str,
    request_id: str | None,
    outputs: list[tuple[TensorSpec, np.ndarray[Any, Any], bool]],
    parameters: dict[str, str] | None,
) -> Any:
    """The ``ModelInferResponse`` of an answer (``InferenceCore.answer_parts``): every output's bytes in
    ``raw_output_contents`` (little-endian; BYTES elements each after a 4-byte length), the parameters as
    strings (``ledger_id``, ``variant``)."""
    response = ModelInferResponse(model_name=model_name, model_version=model_version, id=request_id or "")
    if parameters:
        for key, value in parameters.items():
            response.parameters[key].string_param = value
    raw = response.raw_output_contents
    for tspec, arr, _binary in outputs:
        response.outputs.add(name=tspec.name, datatype=tspec.datatype, shape=arr.shape)
        if tspec.datatype == "BYTES":
            raw.append(_bytes_payload(arr))
        else:
            want = LITTLE_ENDIAN[tspec.datatype]
            raw.append((arr if arr.dtype == want else arr.astype(want)).tobytes())
    return response
