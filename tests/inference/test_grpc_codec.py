"""The gRPC codec's answers (grpc_codec.py): the bytes it writes by hand are the ModelInferResponse protobuf
builds for the same answer, for every datatype, shape and parameter, and so is the stream's wrapper around them."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from tritonclient.grpc import service_pb2 as pb

from inference.config import TensorSpec
from inference.grpc_codec import encode_infer_response, encode_stream_response
from inference.kserve import DTYPES, LITTLE_ENDIAN, _bytes_payload

pytestmark = pytest.mark.django_db(False)


def protobuf_answer(
    model_name: str,
    model_version: str,
    request_id: str | None,
    outputs: list[tuple[TensorSpec, np.ndarray[Any, Any], bool]],
    parameters: dict[str, str] | None,
    final_response: bool = False,
) -> Any:
    """The answer as protobuf's own message objects build it (the codec's former encoder)."""
    response = pb.ModelInferResponse(model_name=model_name, model_version=model_version, id=request_id or "")
    for key, value in (parameters or {}).items():
        response.parameters[key].string_param = value
    if final_response:
        response.parameters["triton_final_response"].bool_param = True
    for tspec, arr, _binary in outputs:
        response.outputs.add(name=tspec.name, datatype=tspec.datatype, shape=arr.shape)
        if tspec.datatype == "BYTES":
            response.raw_output_contents.append(_bytes_payload(arr))
        else:
            response.raw_output_contents.append(arr.astype(LITTLE_ENDIAN[tspec.datatype]).tobytes())
    return response


def _array(datatype: str, shape: tuple[int, ...]) -> np.ndarray[Any, Any]:
    count = int(np.prod(shape)) if shape else 1
    if datatype == "BYTES":
        return np.array([f"é{i}".encode() for i in range(count)], dtype=object).reshape(shape)
    if datatype == "BOOL":
        return (np.arange(count) % 2 == 0).reshape(shape)
    return (np.arange(count) * 3 - 7).astype(DTYPES[datatype]).reshape(shape)


CASES = [
    ("linear", "1", None, [("y", "FP32", (1, 16))], {"ledger_id": "01JABCDEFGHJKMNPQRSTVWXYZ0"}),
    ("linear", "1", "req-7", [("y", "FP32", (3, 16))], {"ledger_id": "x", "variant": "int8"}),
    ("m", "12", "ïd ünicode ✓", [("a", dt, (2, 3)) for dt in sorted(DTYPES)], None),
    ("m", "1", "", [("scalar", "INT64", ()), ("empty", "FP32", (0, 4)), ("big", "UINT8", (300, 2))], {}),
    ("echo_bytes", "1", "r", [("out", "BYTES", (2, 2))], {"ledger_id": "é" * 200}),
]


@pytest.mark.parametrize("final_response", [False, True])
@pytest.mark.parametrize(("name", "version", "rid", "outs", "params"), CASES)
def test_the_hand_written_answer_is_the_message_protobuf_builds(
    name: str,
    version: str,
    rid: str | None,
    outs: list[tuple[str, str, tuple[int, ...]]],
    params: dict[str, str] | None,
    final_response: bool,
) -> None:
    outputs = [(TensorSpec(o, dt, shape[1:]), _array(dt, shape), True) for o, dt, shape in outs]
    expected = protobuf_answer(name, version, rid, outputs, params, final_response)

    answer = encode_infer_response(name, version, rid, outputs, params, final_response=final_response)

    assert isinstance(answer, bytes)
    assert pb.ModelInferResponse.FromString(answer) == expected
    stream = pb.ModelStreamInferResponse.FromString(encode_stream_response(answer))
    assert stream.error_message == ""
    assert stream.infer_response == expected


def test_a_big_endian_or_other_typed_array_is_written_as_its_little_endian_datatype() -> None:
    arr = np.arange(6, dtype=">i8").reshape(2, 3)
    answer = encode_infer_response("m", "1", None, [(TensorSpec("y", "INT32", (3,)), arr, True)], None)
    response = pb.ModelInferResponse.FromString(answer)
    assert list(response.outputs[0].shape) == [2, 3]
    assert np.frombuffer(response.raw_output_contents[0], "<i4").tolist() == list(range(6))
