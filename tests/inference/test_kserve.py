"""The KServe v2 / Triton HTTP codec in inference/kserve.py: decoding, validation, encoding.

Framework-free: no Django, no database. Expected texts and wire layouts come from the real
Triton captures in the Triton reference's kserve_v2_examples.md.
"""

from __future__ import annotations

import struct
from pathlib import Path
from typing import Any

import numpy as np
import orjson
import pytest

from inference.config import ModelSpec, TensorSpec, load_config, parse_config_text
from inference.errors import InferenceError, InvalidInput
from inference.kserve import (
    DTYPES,
    LITTLE_ENDIAN,
    InferRequest,
    RequestedOutput,
    decode_request,
    encode_response,
    error_body,
    parse_header_length,
    shape_signature,
    validate_request,
)

DEMO = Path(__file__).resolve().parents[2] / "inference" / "demo_repository"
NO_ID = "[request id: <id_unknown>] "

# ---------------------------------------------------------------------------------------------
# helpers


def _json_body(doc: dict[str, Any]) -> bytes:
    return orjson.dumps(doc)


def _binary_body(doc: dict[str, Any], *blobs: bytes) -> tuple[bytes, int]:
    header = orjson.dumps(doc)
    return header + b"".join(blobs), len(header)


def _bytes_blob(items: list[bytes]) -> bytes:
    return b"".join(struct.pack("<I", len(b)) + b for b in items)


def _invalid(body: bytes, header_length: int | None = None) -> InvalidInput:
    with pytest.raises(InvalidInput) as info:
        decode_request(body, header_length)
    assert info.value.status == 400
    return info.value


def _req(
    inputs: dict[str, np.ndarray[Any, Any]], datatypes: dict[str, str] | None = None, **kw: Any
) -> InferRequest:
    types = datatypes or {n: "FP32" for n in inputs}
    return InferRequest(
        id=kw.get("id"),
        parameters={},
        inputs=inputs,
        datatypes=types,
        outputs=kw.get("outputs"),
        binary_output_all=False,
    )


def _spec(text: str, name: str) -> ModelSpec:
    return parse_config_text(text, Path(f"/models/{name}/config.pbtxt"), name)


@pytest.fixture(scope="module")
def linear() -> ModelSpec:
    return load_config(DEMO / "linear")


@pytest.fixture(scope="module")
def digits() -> ModelSpec:
    return load_config(DEMO / "digits")


@pytest.fixture(scope="module")
def two_inputs() -> ModelSpec:
    return _spec(
        """
        name: "pair"
        backend: "python"
        max_batch_size: 8
        input [
          { name: "a", data_type: TYPE_FP32, dims: [ 3 ] },
          { name: "b", data_type: TYPE_INT64, dims: [ 1 ] }
        ]
        output [ { name: "c", data_type: TYPE_FP32, dims: [ 3 ] } ]
        """,
        "pair",
    )


def _validate_error(spec: ModelSpec, req: InferRequest) -> str:
    with pytest.raises(InvalidInput) as info:
        validate_request(spec, req)
    assert info.value.status == 400
    return info.value.message


# ---------------------------------------------------------------------------------------------
# JSON requests


def test_json_request_with_flat_data_is_reshaped_row_major() -> None:
    body = _json_body(
        {"inputs": [{"name": "x", "shape": [2, 3], "datatype": "FP32", "data": [0, 1, 2, 3, 4, 5]}]}
    )
    req = decode_request(body, None)
    x = req.inputs["x"]
    assert x.shape == (2, 3)
    assert x.dtype == np.float32
    np.testing.assert_array_equal(x, np.arange(6, dtype=np.float32).reshape(2, 3))
    assert req.datatypes == {"x": "FP32"}
    assert req.outputs is None
    assert req.binary_output_all is False


def test_json_request_with_nested_data_equals_the_flat_form() -> None:
    nested = decode_request(
        _json_body(
            {"inputs": [{"name": "x", "shape": [2, 3], "datatype": "INT32", "data": [[1, 2, 3], [4, 5, 6]]}]}
        ),
        None,
    )
    flat = decode_request(
        _json_body(
            {"inputs": [{"name": "x", "shape": [2, 3], "datatype": "INT32", "data": [1, 2, 3, 4, 5, 6]}]}
        ),
        None,
    )
    np.testing.assert_array_equal(nested.inputs["x"], flat.inputs["x"])
    assert nested.inputs["x"].dtype == np.int32


def test_json_request_with_deeply_nested_data_is_flattened_in_order() -> None:
    data = [[[1, 2], [3, 4]], [[5, 6], [7, 8]]]
    req = decode_request(
        _json_body({"inputs": [{"name": "x", "shape": [2, 2, 2], "datatype": "INT64", "data": data}]}), None
    )
    np.testing.assert_array_equal(req.inputs["x"], np.array(data, dtype=np.int64))


def test_triton_captured_nested_json_request_decodes() -> None:
    values = [i / 512 for i in range(256)]
    body = _json_body({"inputs": [{"name": "x", "shape": [1, 256], "datatype": "FP32", "data": [values]}]})
    req = decode_request(body, None)
    assert req.id is None
    assert req.inputs["x"].shape == (1, 256)
    assert req.inputs["x"][0, 1] == np.float32(0.001953125)


def test_request_parameters_are_decoded() -> None:
    body = _json_body(
        {
            "id": "v1",
            "parameters": {"my_param": "abc", "priority": 2},
            "inputs": [{"name": "x", "shape": [1], "datatype": "FP32", "data": [0.5]}],
        }
    )
    req = decode_request(body, None)
    assert req.parameters == {"my_param": "abc", "priority": 2}


# ---------------------------------------------------------------------------------------------
# binary tensor extension


def test_binary_input_is_a_zero_copy_view_of_the_body() -> None:
    x = np.arange(2 * 256, dtype=np.float32).reshape(2, 256)
    body, hlen = _binary_body(
        {
            "inputs": [
                {"name": "x", "shape": [2, 256], "datatype": "FP32", "parameters": {"binary_data_size": 2048}}
            ],
            "outputs": [{"name": "y", "parameters": {"binary_data": True}}],
        },
        x.tobytes(),
    )
    req = decode_request(body, hlen)
    got = req.inputs["x"]
    np.testing.assert_array_equal(got, x)
    assert np.shares_memory(got, np.frombuffer(body, dtype=np.uint8))
    assert not got.flags.owndata
    assert not got.flags.writeable  # a view on immutable bytes
    # The view starts exactly at the end of the JSON header.
    base = np.frombuffer(body, dtype=np.uint8)
    assert got.__array_interface__["data"][0] == base.__array_interface__["data"][0] + hlen


def test_header_length_equal_to_the_body_means_pure_json() -> None:
    body = _json_body({"inputs": [{"name": "x", "shape": [1], "datatype": "FP32", "data": [1.0]}]})
    assert parse_header_length(str(len(body)).encode(), len(body)) == len(body)
    req = decode_request(body, len(body))
    assert req.inputs["x"].tolist() == [1.0]


def test_several_binary_inputs_are_read_in_declared_order() -> None:
    a = np.array([[1, -2, 3]], dtype=np.int32)
    b = np.array([[0.5, 0.25]], dtype=np.float64)
    c = [b"first", b"", b"third"]
    d = np.array([7], dtype=np.uint8)
    body, hlen = _binary_body(
        {
            "inputs": [
                {"name": "a", "shape": [1, 3], "datatype": "INT32", "parameters": {"binary_data_size": 12}},
                {"name": "json_one", "shape": [2], "datatype": "INT16", "data": [4, 5]},
                {"name": "b", "shape": [1, 2], "datatype": "FP64", "parameters": {"binary_data_size": 16}},
                {
                    "name": "c",
                    "shape": [3],
                    "datatype": "BYTES",
                    "parameters": {"binary_data_size": len(_bytes_blob(c))},
                },
                {"name": "d", "shape": [1], "datatype": "UINT8", "parameters": {"binary_data_size": 1}},
            ]
        },
        a.tobytes(),
        b.tobytes(),
        _bytes_blob(c),
        d.tobytes(),
    )
    req = decode_request(body, hlen)
    assert list(req.inputs) == ["a", "json_one", "b", "c", "d"]
    np.testing.assert_array_equal(req.inputs["a"], a)
    np.testing.assert_array_equal(req.inputs["json_one"], np.array([4, 5], dtype=np.int16))
    np.testing.assert_array_equal(req.inputs["b"], b)
    assert req.inputs["c"].tolist() == c
    np.testing.assert_array_equal(req.inputs["d"], d)
    assert req.datatypes == {"a": "INT32", "json_one": "INT16", "b": "FP64", "c": "BYTES", "d": "UINT8"}


def test_zero_element_binary_input_is_accepted() -> None:
    body, hlen = _binary_body(
        {
            "inputs": [
                {"name": "x", "shape": [0, 4], "datatype": "FP32", "parameters": {"binary_data_size": 0}}
            ]
        }
    )
    req = decode_request(body, hlen)
    assert req.inputs["x"].shape == (0, 4)


def test_bytes_binary_input_elements_are_length_prefixed() -> None:
    blob = struct.pack("<I", 5) + b"hello" + struct.pack("<I", 0) + struct.pack("<I", 3) + b"\x00\xff\x01"
    body, hlen = _binary_body(
        {
            "inputs": [
                {
                    "name": "s",
                    "shape": [3],
                    "datatype": "BYTES",
                    "parameters": {"binary_data_size": len(blob)},
                }
            ]
        },
        blob,
    )
    req = decode_request(body, hlen)
    s = req.inputs["s"]
    assert s.dtype == object
    assert s.tolist() == [b"hello", b"", b"\x00\xff\x01"]


# ---------------------------------------------------------------------------------------------
# every datatype, JSON and binary, request and response

SAMPLES: dict[str, list[Any]] = {
    "BOOL": [True, False, False, True],
    "UINT8": [0, 1, 254, 255],
    "UINT16": [0, 1, 65534, 65535],
    "UINT32": [0, 1, 2**32 - 2, 2**32 - 1],
    "UINT64": [0, 1, 2**63, 2**64 - 1],
    "INT8": [-128, -1, 0, 127],
    "INT16": [-32768, -1, 0, 32767],
    "INT32": [-(2**31), -1, 0, 2**31 - 1],
    "INT64": [-(2**63), -1, 0, 2**63 - 1],
    "FP16": [-65504.0, -0.0, 2**-14, 5.960464477539063e-08],
    "FP32": [float(np.float32(0.1)), -3.4028234663852886e38, 1.401298464324817e-45, -0.0],
    "FP64": [0.1, -1e-300, 1.7976931348623157e308, 5e-324],
    "BF16": [1.0, -2.5, 0.15625, 3.3895313892515355e38],
}
BYTES_SAMPLE = [b"hello", b"", "\u00fcn\u00efc\u00f6d\u00e9".encode(), b"a b"]
ALL_TYPES = [*SAMPLES, "BYTES"]


def _sample(datatype: str) -> np.ndarray[Any, Any]:
    if datatype == "BYTES":
        arr = np.empty(4, dtype=object)
        arr[:] = BYTES_SAMPLE
        return arr.reshape(2, 2)
    return np.array(SAMPLES[datatype], dtype=DTYPES[datatype]).reshape(2, 2)


def _binary_blob(datatype: str, arr: np.ndarray[Any, Any]) -> bytes:
    if datatype == "BYTES":
        return _bytes_blob(list(arr.ravel()))
    return arr.astype(LITTLE_ENDIAN[datatype]).tobytes()


def _same(datatype: str, got: np.ndarray[Any, Any], want: np.ndarray[Any, Any]) -> None:
    assert got.shape == want.shape
    if datatype == "BYTES":
        assert got.tolist() == want.tolist()
    else:
        assert got.dtype == want.dtype
        assert got.tobytes() == want.tobytes()  # bit for bit, -0.0 and subnormals included


def _skip_without_bf16(datatype: str) -> None:
    if datatype == "BF16" and DTYPES["BF16"] == np.dtype(np.uint16):
        pytest.skip("ml_dtypes is not installed: BF16 has no numpy dtype")


@pytest.mark.parametrize("datatype", ALL_TYPES)
def test_every_datatype_round_trips_through_json(datatype: str) -> None:
    _skip_without_bf16(datatype)
    want = _sample(datatype)
    data = [b.decode() for b in BYTES_SAMPLE] if datatype == "BYTES" else SAMPLES[datatype]
    body = _json_body({"inputs": [{"name": "t", "shape": [2, 2], "datatype": datatype, "data": data}]})
    req = decode_request(body, None)
    assert req.datatypes["t"] == datatype
    assert req.inputs["t"].dtype == DTYPES[datatype]
    _same(datatype, req.inputs["t"], want)

    out, hlen = encode_response("m", "1", None, [(TensorSpec("t", datatype, (2,)), req.inputs["t"], False)])
    assert hlen is None
    doc = orjson.loads(out)["outputs"][0]
    assert doc["name"] == "t"
    assert doc["datatype"] == datatype
    assert doc["shape"] == [2, 2]
    assert "parameters" not in doc
    if datatype == "BYTES":
        parsed = np.empty(4, dtype=object)
        parsed[:] = [s.encode() for s in doc["data"]]
        parsed = parsed.reshape(2, 2)
    else:
        assert len(doc["data"]) == 4  # output data is always flat
        parsed = np.array(doc["data"], dtype=DTYPES[datatype]).reshape(2, 2)
    _same(datatype, parsed, want)


@pytest.mark.parametrize("datatype", ALL_TYPES)
def test_every_datatype_round_trips_through_binary(datatype: str) -> None:
    _skip_without_bf16(datatype)
    want = _sample(datatype)
    blob = _binary_blob(datatype, want)
    body, hlen = _binary_body(
        {
            "inputs": [
                {
                    "name": "t",
                    "shape": [2, 2],
                    "datatype": datatype,
                    "parameters": {"binary_data_size": len(blob)},
                }
            ]
        },
        blob,
    )
    req = decode_request(body, hlen)
    _same(datatype, req.inputs["t"], want)

    out, out_hlen = encode_response(
        "m", "1", None, [(TensorSpec("t", datatype, (2,)), req.inputs["t"], True)]
    )
    assert out_hlen is not None
    doc = orjson.loads(out[:out_hlen])["outputs"][0]
    assert doc == {
        "name": "t",
        "datatype": datatype,
        "shape": [2, 2],
        "parameters": {"binary_data_size": len(blob)},
    }
    assert out[out_hlen:] == blob  # the response bytes are the request bytes
    if datatype != "BYTES":
        _same(datatype, np.frombuffer(out[out_hlen:], dtype=LITTLE_ENDIAN[datatype]).reshape(2, 2), want)


def test_bf16_json_output_is_written_as_numbers() -> None:
    _skip_without_bf16("BF16")
    arr = np.array([1.5, -0.125], dtype=DTYPES["BF16"])
    out, _ = encode_response("m", "1", None, [(TensorSpec("t", "BF16", (2,)), arr, False)])
    assert orjson.loads(out)["outputs"][0]["data"] == [1.5, -0.125]


def test_bytes_output_is_length_prefixed_in_binary() -> None:
    arr = np.empty(2, dtype=object)
    arr[:] = [b"ab", b"\xff"]
    out, hlen = encode_response("m", "1", None, [(TensorSpec("s", "BYTES", (2,)), arr, True)])
    assert hlen is not None
    assert out[hlen:] == b"\x02\x00\x00\x00ab\x01\x00\x00\x00\xff"


def test_bytes_json_output_escapes_invalid_utf8_instead_of_failing() -> None:
    arr = np.empty(2, dtype=object)
    arr[:] = [b"ok", b"\xff"]
    out, _ = encode_response("m", "1", None, [(TensorSpec("s", "BYTES", (2,)), arr, False)])
    assert orjson.loads(out)["outputs"][0]["data"] == ["ok", "\\xff"]


# ---------------------------------------------------------------------------------------------
# request id and requested outputs


def test_request_id_is_decoded_and_echoed_first() -> None:
    req = decode_request(
        _json_body(
            {"id": "req-42", "inputs": [{"name": "x", "shape": [1], "datatype": "FP32", "data": [1]}]}
        ),
        None,
    )
    assert req.id == "req-42"
    out, _ = encode_response(
        "linear", "1", req.id, [(TensorSpec("y", "FP32", (1,)), np.zeros(1, np.float32), False)]
    )
    assert out.startswith(b'{"id":"req-42","model_name":"linear","model_version":"1","outputs":[')


def test_response_has_no_id_when_the_request_had_none() -> None:
    req = decode_request(
        _json_body({"inputs": [{"name": "x", "shape": [1], "datatype": "FP32", "data": [1]}]}), None
    )
    assert req.id is None
    out, _ = encode_response(
        "linear", "1", req.id, [(TensorSpec("y", "FP32", (1,)), np.zeros(1, np.float32), False)]
    )
    doc = orjson.loads(out)
    assert "id" not in doc
    assert list(doc) == ["model_name", "model_version", "outputs"]
    assert out.startswith(b'{"model_name":"linear","model_version":"1","outputs":[')


def test_request_id_appears_in_error_messages() -> None:
    err = _invalid(
        _json_body({"id": "r-7", "inputs": [{"name": "x", "shape": [2], "datatype": "FP32", "data": [1]}]})
    )
    assert err.message.startswith("[request id: r-7] ")
    err = _invalid(_json_body({"inputs": [{"name": "x", "shape": [2], "datatype": "FP32", "data": [1]}]}))
    assert err.message.startswith(NO_ID)


def test_requested_outputs_are_binary_per_output() -> None:
    req = decode_request(
        _json_body(
            {
                "inputs": [{"name": "x", "shape": [1], "datatype": "FP32", "data": [1]}],
                "outputs": [{"name": "y", "parameters": {"binary_data": True}}, {"name": "z"}],
            }
        ),
        None,
    )
    assert req.outputs == [RequestedOutput("y", True), RequestedOutput("z", False)]
    assert req.binary_output_all is False


def test_binary_data_output_makes_every_output_binary_unless_one_says_otherwise() -> None:
    req = decode_request(
        _json_body(
            {
                "parameters": {"binary_data_output": True},
                "inputs": [{"name": "x", "shape": [1], "datatype": "FP32", "data": [1]}],
                "outputs": [{"name": "y"}, {"name": "z", "parameters": {"binary_data": False}}],
            }
        ),
        None,
    )
    assert req.binary_output_all is True
    assert req.outputs == [RequestedOutput("y", True), RequestedOutput("z", False)]


def test_binary_data_output_without_an_outputs_list_applies_to_all() -> None:
    req = decode_request(
        _json_body(
            {
                "parameters": {"binary_data_output": True},
                "inputs": [{"name": "x", "shape": [1], "datatype": "FP32", "data": [1]}],
            }
        ),
        None,
    )
    assert req.outputs is None
    assert req.binary_output_all is True


def test_classification_extension_is_refused() -> None:
    err = _invalid(
        _json_body(
            {
                "inputs": [{"name": "x", "shape": [1], "datatype": "FP32", "data": [1]}],
                "outputs": [{"name": "y", "parameters": {"classification": 3}}],
            }
        )
    )
    assert "classification" in err.message


# ---------------------------------------------------------------------------------------------
# encoded responses


def test_json_output_equals_binary_output_bit_for_bit_after_parsing_as_float32() -> None:
    rng = np.random.default_rng(7)
    y = rng.standard_normal((2, 256)).astype(np.float32)
    y[0, :6] = [-0.0, 1.4e-45, 1.1754942e-38, 3.4028235e38, -3.4028235e38, np.float32(-0.40573108196258547)]
    spec = TensorSpec("y", "FP32", (256,))
    json_out, json_hlen = encode_response("linear", "1", None, [(spec, y, False)])
    bin_out, bin_hlen = encode_response("linear", "1", None, [(spec, y, True)])
    assert json_hlen is None and bin_hlen is not None
    from_json = np.array(orjson.loads(json_out)["outputs"][0]["data"], dtype=np.float32).reshape(2, 256)
    from_binary = np.frombuffer(bin_out[bin_hlen:], dtype="<f4").reshape(2, 256)
    assert from_json.view(np.uint32).tolist() == from_binary.view(np.uint32).tolist()
    assert from_binary.tobytes() == y.tobytes()


def test_fp32_json_output_is_the_float32_widened_to_double() -> None:
    # Triton's capture prints -0.40573108196258547 (17 digits); the shortest form differs in text
    # but both parse to the very same double, the float32 value widened.
    y = np.array([-0.40573108196258547, -0.1487330049276352], dtype=np.float32)
    out, _ = encode_response("linear", "1", None, [(TensorSpec("y", "FP32", (2,)), y, False)])
    data = orjson.loads(out)["outputs"][0]["data"]
    assert data == [float(v) for v in y]
    assert data == [float("-0.40573108196258547"), float("-0.1487330049276352")]


def test_binary_response_header_is_byte_identical_to_triton_capture() -> None:
    y = np.ones((2, 256), dtype=np.float32)
    out, hlen = encode_response("linear", "1", None, [(TensorSpec("y", "FP32", (256,)), y, True)])
    header = (
        b'{"model_name":"linear","model_version":"1","outputs":[{"name":"y","datatype":"FP32",'
        b'"shape":[2,256],"parameters":{"binary_data_size":2048}}]}'
    )
    assert hlen == 141 == len(header)  # Inference-Header-Content-Length: 141
    assert out[:hlen] == header
    assert len(out) == 2189  # Content-Length: 2189
    assert out[hlen:] == y.tobytes()


def test_encoded_binary_response_keeps_output_order_and_sizes() -> None:
    a = np.arange(6, dtype=np.float32).reshape(2, 3)
    b = np.array([[1], [2]], dtype=np.int64)
    c = np.array([[True, False]], dtype=np.bool_)
    outputs = [
        (TensorSpec("a", "FP32", (3,)), a, True),
        (TensorSpec("j", "INT32", (1,)), np.array([[5], [6]], dtype=np.int32), False),
        (TensorSpec("b", "INT64", (1,)), b, True),
        (TensorSpec("c", "BOOL", (2,)), c, True),
    ]
    out, hlen = encode_response("m", "3", "rid", outputs)
    assert hlen is not None
    doc = orjson.loads(out[:hlen])
    assert doc["id"] == "rid"
    assert doc["model_version"] == "3"
    assert [o["name"] for o in doc["outputs"]] == ["a", "j", "b", "c"]
    assert doc["outputs"][1]["data"] == [5, 6]
    assert "parameters" not in doc["outputs"][1]
    sizes = [o["parameters"]["binary_data_size"] for o in doc["outputs"] if "parameters" in o]
    assert sizes == [24, 16, 2]
    assert all("data" not in o for o in doc["outputs"] if "parameters" in o)
    assert len(out) == hlen + sum(sizes)
    blobs = out[hlen:]
    assert blobs[:24] == a.tobytes()
    assert blobs[24:40] == b.astype("<i8").tobytes()
    assert blobs[40:] == b"\x01\x00"


def test_all_json_outputs_give_no_header_length() -> None:
    out, hlen = encode_response(
        "m", "1", None, [(TensorSpec("y", "FP32", (1,)), np.zeros((1, 1), np.float32), False)]
    )
    assert hlen is None
    assert orjson.loads(out)["outputs"][0]["data"] == [0.0]


def test_big_endian_output_array_is_sent_little_endian() -> None:
    y = np.array([1.5, -2.0], dtype=">f4")
    out, hlen = encode_response("m", "1", None, [(TensorSpec("y", "FP32", (2,)), y, True)])
    assert hlen is not None
    assert out[hlen:] == np.array([1.5, -2.0], dtype="<f4").tobytes()


def test_binary_output_is_cast_to_the_declared_datatype() -> None:
    y = np.array([0.1, 2.0], dtype=np.float64)  # a backend that forgot .astype(np.float32)
    out, hlen = encode_response("m", "1", None, [(TensorSpec("y", "FP32", (2,)), y, True)])
    assert hlen is not None
    assert orjson.loads(out[:hlen])["outputs"][0]["parameters"]["binary_data_size"] == 8
    assert out[hlen:] == y.astype("<f4").tobytes()


def test_json_output_is_cast_to_the_declared_datatype_like_the_binary_output() -> None:
    y = np.array([1.5, -2.7], dtype=np.float64)  # a backend returning floats for an INT32 output
    spec = TensorSpec("y", "INT32", (2,))
    json_out, _ = encode_response("m", "1", None, [(spec, y, False)])
    bin_out, hlen = encode_response("m", "1", None, [(spec, y, True)])
    assert hlen is not None
    binary = np.frombuffer(bin_out[hlen:], dtype="<i4").tolist()
    assert orjson.loads(json_out)["outputs"][0]["data"] == binary == [1, -2]


def test_fp32_json_output_of_a_float64_array_carries_the_float32_values() -> None:
    y = np.array([0.1], dtype=np.float64)
    out, _ = encode_response("m", "1", None, [(TensorSpec("y", "FP32", (1,)), y, False)])
    assert orjson.loads(out)["outputs"][0]["data"] == [float(np.float32(0.1))]


def test_response_parameters_are_written_when_given() -> None:
    out, _ = encode_response(
        "m",
        "1",
        None,
        [(TensorSpec("y", "FP32", (1,)), np.zeros(1, np.float32), False)],
        {"sequence_end": True},
    )
    assert orjson.loads(out)["parameters"] == {"sequence_end": True}


def test_error_body_is_kserve_error_object() -> None:
    assert orjson.loads(error_body("boom 'x'")) == {"error": "boom 'x'"}


# ---------------------------------------------------------------------------------------------
# Inference-Header-Content-Length


def test_absent_header_length_is_none() -> None:
    assert parse_header_length(None, 10) is None


def test_header_length_larger_than_the_body_is_invalid() -> None:
    with pytest.raises(InvalidInput) as info:
        parse_header_length(b"999", 10)
    assert info.value.status == 400
    assert "999" in info.value.message
    assert "10 bytes" in info.value.message


def test_header_length_that_is_not_a_number_is_invalid() -> None:
    with pytest.raises(InvalidInput) as info:
        parse_header_length(b"abc", 10)
    assert info.value.status == 400
    assert "Inference-Header-Content-Length must be a non-negative integer" in info.value.message
    assert "'abc'" in info.value.message


def test_negative_header_length_is_invalid() -> None:
    with pytest.raises(InvalidInput) as info:
        parse_header_length(b"-5", 10)
    assert "non-negative" in info.value.message
    assert "-5" in info.value.message


# ---------------------------------------------------------------------------------------------
# malformed requests: each is InvalidInput (400) naming the problem


def test_malformed_json_is_invalid() -> None:
    err = _invalid(b'{"inputs": [')
    assert "failed to parse the request JSON" in err.message


def test_json_header_cut_short_by_header_length_is_invalid() -> None:
    body = _json_body({"inputs": []})
    err = _invalid(body, 5)
    assert "failed to parse the request JSON" in err.message


@pytest.mark.parametrize("body", [b"[1, 2]", b'"text"', b"42", b"null"])
def test_json_that_is_not_an_object_is_invalid(body: bytes) -> None:
    assert "must be an object" in _invalid(body).message


def test_missing_inputs_list_is_invalid() -> None:
    assert "'inputs' must be a list" in _invalid(b"{}").message
    assert "'inputs' must be a list" in _invalid(b'{"inputs": {"x": 1}}').message


def test_non_string_id_is_invalid() -> None:
    assert "'id' must be a string" in _invalid(b'{"id": 5, "inputs": []}').message


def test_non_object_parameters_are_invalid() -> None:
    assert "'parameters' must be an object" in _invalid(b'{"parameters": [1], "inputs": []}').message


def test_input_without_a_name_is_invalid() -> None:
    err = _invalid(_json_body({"inputs": [{"shape": [1], "datatype": "FP32", "data": [1]}]}))
    assert "must be an object with a 'name'" in err.message


def test_binary_data_size_past_the_end_of_the_body_is_invalid() -> None:
    body, hlen = _binary_body(
        {"inputs": [{"name": "x", "shape": [4], "datatype": "FP32", "parameters": {"binary_data_size": 16}}]},
        b"\x00" * 8,
    )
    err = _invalid(body, hlen)
    assert "input 'x'" in err.message
    assert "binary_data_size 16 runs past the end of the body (8 bytes left)" in err.message


def test_binary_size_not_matching_shape_times_itemsize_is_invalid() -> None:
    body, hlen = _binary_body(
        {"inputs": [{"name": "x", "shape": [2], "datatype": "FP32", "parameters": {"binary_data_size": 6}}]},
        b"\x00" * 6,
    )
    err = _invalid(body, hlen)
    assert "input 'x'" in err.message
    assert "shape [2] of FP32 needs 8 bytes, binary_data_size is 6" in err.message


def test_leftover_binary_bytes_are_invalid() -> None:
    body, hlen = _binary_body(
        {"inputs": [{"name": "x", "shape": [2], "datatype": "FP32", "parameters": {"binary_data_size": 8}}]},
        b"\x00" * 12,
    )
    err = _invalid(body, hlen)
    assert "4 bytes of binary data that no input claims" in err.message


def test_binary_bytes_after_a_pure_json_header_are_invalid() -> None:
    body, hlen = _binary_body(
        {"inputs": [{"name": "x", "shape": [1], "datatype": "FP32", "data": [1]}]}, b"junk"
    )
    assert "4 bytes of binary data that no input claims" in _invalid(body, hlen).message


def test_binary_data_size_without_the_header_length_is_invalid() -> None:
    body = _json_body(
        {"inputs": [{"name": "x", "shape": [1], "datatype": "FP32", "parameters": {"binary_data_size": 4}}]}
    )
    err = _invalid(body, None)
    assert "input 'x' has binary_data_size but the request has no Inference-Header-Content-Length header" in (
        err.message
    )


@pytest.mark.parametrize("size", [-4, "4", 4.0, True])
def test_binary_data_size_that_is_not_a_non_negative_integer_is_invalid(size: Any) -> None:
    body, hlen = _binary_body(
        {
            "inputs": [
                {"name": "x", "shape": [1], "datatype": "FP32", "parameters": {"binary_data_size": size}}
            ]
        },
        b"\x00" * 4,
    )
    assert "binary_data_size must be a non-negative integer" in _invalid(body, hlen).message


def test_input_without_data_or_binary_size_is_invalid() -> None:
    err = _invalid(_json_body({"inputs": [{"name": "x", "shape": [1], "datatype": "FP32"}]}))
    assert "input 'x' has neither 'data' nor binary_data_size" in err.message


def test_data_count_not_matching_the_shape_is_invalid() -> None:
    err = _invalid(
        _json_body({"inputs": [{"name": "x", "shape": [2, 2], "datatype": "FP32", "data": [1, 2, 3]}]})
    )
    assert err.message == NO_ID + "input 'x': shape needs 4 elements but 'data' has 3"


def test_ragged_nested_data_with_a_wrong_count_is_invalid() -> None:
    err = _invalid(
        _json_body({"inputs": [{"name": "x", "shape": [2, 2], "datatype": "FP32", "data": [[1, 2], [3]]}]})
    )
    assert err.message == NO_ID + "input 'x': nested 'data' is ragged (rows of different lengths)"


def test_nested_data_with_a_scalar_beside_a_list_is_invalid() -> None:
    err = _invalid(
        _json_body({"inputs": [{"name": "x", "shape": [3], "datatype": "FP32", "data": [1, [2], 3]}]})
    )
    assert "input 'x'" in err.message


def test_ragged_nested_data_with_the_right_total_count_is_invalid() -> None:
    # [[1,2,3],[4]] holds 2*2 elements, but it is not a [2,2] tensor.
    err = _invalid(
        _json_body({"inputs": [{"name": "x", "shape": [2, 2], "datatype": "FP32", "data": [[1, 2, 3], [4]]}]})
    )
    assert "input 'x': nested 'data' is ragged" in err.message


def test_nested_data_mixing_rows_and_scalars_is_invalid() -> None:
    err = _invalid(
        _json_body({"inputs": [{"name": "x", "shape": [3], "datatype": "FP32", "data": [[1, 2], 3]}]})
    )
    assert "input 'x': nested 'data' is ragged" in err.message


def test_strings_in_fp32_data_are_invalid() -> None:
    err = _invalid(
        _json_body({"inputs": [{"name": "x", "shape": [2], "datatype": "FP32", "data": ["1.0", 2]}]})
    )
    assert err.message == NO_ID + "input 'x': FP32 data must be numbers"


@pytest.mark.parametrize("value", [None, True, {"v": 1}])
def test_non_numbers_in_numeric_data_are_invalid(value: Any) -> None:
    err = _invalid(
        _json_body({"inputs": [{"name": "x", "shape": [2], "datatype": "INT32", "data": [1, value]}]})
    )
    assert "INT32 data must be numbers" in err.message


def test_bool_data_must_be_true_or_false() -> None:
    err = _invalid(_json_body({"inputs": [{"name": "b", "shape": [2], "datatype": "BOOL", "data": [1, 0]}]}))
    assert "BOOL data must be true or false" in err.message


@pytest.mark.parametrize(
    ("datatype", "value"), [("UINT8", 256), ("UINT8", -1), ("INT8", 128), ("INT64", 2**63)]
)
def test_integer_out_of_range_for_the_datatype_is_invalid(datatype: str, value: int) -> None:
    err = _invalid(
        _json_body({"inputs": [{"name": "x", "shape": [1], "datatype": datatype, "data": [value]}]})
    )
    assert f"data does not fit {datatype}" in err.message


@pytest.mark.parametrize("datatype", ["INT32", "UINT8", "INT64"])
def test_fractional_number_in_integer_data_is_invalid(datatype: str) -> None:
    # numpy would truncate 1.5 to 1; Triton refuses non-integer JSON for integer datatypes.
    err = _invalid(
        _json_body({"inputs": [{"name": "x", "shape": [2], "datatype": datatype, "data": [1.5, 2]}]})
    )
    assert err.message == NO_ID + f"input 'x': {datatype} data must be integers"


def test_bytes_json_element_that_is_not_a_string_is_invalid() -> None:
    err = _invalid(
        _json_body({"inputs": [{"name": "s", "shape": [2], "datatype": "BYTES", "data": ["a", None]}]})
    )
    assert "BYTES element 1 is not a string" in err.message


@pytest.mark.parametrize("datatype", ["FLOAT32", "fp32", "STRING", None, 5])
def test_unknown_datatype_is_invalid(datatype: Any) -> None:
    err = _invalid(_json_body({"inputs": [{"name": "x", "shape": [1], "datatype": datatype, "data": [1]}]}))
    assert f"input 'x': unknown datatype {datatype!r}" in err.message


def test_negative_dims_are_invalid() -> None:
    err = _invalid(
        _json_body({"inputs": [{"name": "x", "shape": [-1, 2], "datatype": "FP32", "data": [1, 2]}]})
    )
    assert "input 'x': shape [-1, 2] has a negative dimension" in err.message


@pytest.mark.parametrize("shape", [None, "2", [2.0], [True], [[2]]])
def test_shape_that_is_not_a_list_of_integers_is_invalid(shape: Any) -> None:
    err = _invalid(
        _json_body({"inputs": [{"name": "x", "shape": shape, "datatype": "FP32", "data": [1, 2]}]})
    )
    assert "'shape' must be a list of integers" in err.message


def test_duplicate_input_names_are_invalid() -> None:
    item = {"name": "x", "shape": [1], "datatype": "FP32", "data": [1]}
    err = _invalid(_json_body({"inputs": [item, item]}))
    assert "input 'x' is given twice" in err.message


def _bytes_request(blob: bytes, count: int) -> tuple[bytes, int]:
    return _binary_body(
        {
            "inputs": [
                {
                    "name": "s",
                    "shape": [count],
                    "datatype": "BYTES",
                    "parameters": {"binary_data_size": len(blob)},
                }
            ]
        },
        blob,
    )


def test_bytes_length_prefix_past_the_data_is_invalid() -> None:
    body, hlen = _bytes_request(struct.pack("<I", 10) + b"short", 1)
    assert "input 's': BYTES element 0 runs past the data" in _invalid(body, hlen).message


def test_bytes_data_ending_inside_a_length_prefix_is_invalid() -> None:
    body, hlen = _bytes_request(struct.pack("<I", 2) + b"ab" + b"\x01\x00", 2)
    assert "BYTES data ends inside element 1's length" in _invalid(body, hlen).message


def test_bytes_data_longer_than_its_elements_is_invalid() -> None:
    body, hlen = _bytes_request(struct.pack("<I", 2) + b"ab" + b"xyz", 1)
    assert "3 bytes left after 1 BYTES elements" in _invalid(body, hlen).message


def test_every_codec_error_is_an_inference_error_with_status_400() -> None:
    with pytest.raises(InferenceError) as info:
        decode_request(b"not json", None)
    assert info.value.status == 400
    assert isinstance(info.value, InvalidInput)


# ---------------------------------------------------------------------------------------------
# validate_request against model configs


def test_valid_request_returns_its_batch_size(linear: ModelSpec) -> None:
    req = _req({"x": np.zeros((2, 256), np.float32)}, outputs=[RequestedOutput("y", True)])
    assert validate_request(linear, req) == 2


def test_validation_accepts_decoded_triton_request(linear: ModelSpec) -> None:
    body, hlen = _binary_body(
        {
            "inputs": [
                {"name": "x", "shape": [2, 256], "datatype": "FP32", "parameters": {"binary_data_size": 2048}}
            ],
            "outputs": [{"name": "y", "parameters": {"binary_data": True}}],
        },
        bytes(2048),
    )
    assert validate_request(linear, decode_request(body, hlen)) == 2


def test_wrong_datatype_is_invalid(linear: ModelSpec) -> None:
    msg = _validate_error(linear, _req({"x": np.zeros((1, 256), np.float64)}, {"x": "FP64"}))
    assert msg == NO_ID + "inference input 'x' data-type is 'FP64', but model 'linear' expects 'FP32'"


def test_shape_mismatch_reads_like_triton(linear: ModelSpec) -> None:
    msg = _validate_error(linear, _req({"x": np.zeros((2, 255), np.float32)}))
    assert msg.startswith(
        NO_ID + "unexpected shape for input 'x' for model 'linear'. Expected [-1,256], got [2,255]. "
        "NOTE: Setting a non-zero max_batch_size in the model config requires a batch dimension to be "
        "prepended to each input shape."
    )


def test_missing_batch_dimension_is_a_shape_mismatch(linear: ModelSpec) -> None:
    msg = _validate_error(linear, _req({"x": np.zeros(256, np.float32)}))
    assert "Expected [-1,256], got [256]" in msg


def test_batch_above_max_batch_size_reads_like_triton(linear: ModelSpec) -> None:
    msg = _validate_error(linear, _req({"x": np.zeros((33, 256), np.float32)}))
    assert msg == NO_ID + "inference request batch-size must be <= 32 for 'linear'"


def test_batch_at_max_batch_size_is_valid(linear: ModelSpec) -> None:
    assert validate_request(linear, _req({"x": np.zeros((32, 256), np.float32)})) == 32


def test_batch_zero_is_invalid(linear: ModelSpec) -> None:
    msg = _validate_error(linear, _req({"x": np.zeros((0, 256), np.float32)}))
    assert "batch-size must be >= 1 for 'linear'" in msg


def test_missing_input_is_invalid(linear: ModelSpec) -> None:
    msg = _validate_error(linear, _req({}))
    assert "expected 1 inputs but got 0 inputs for model 'linear'" in msg
    assert "['x']" in msg


def test_unexpected_input_is_invalid(linear: ModelSpec) -> None:
    req = _req({"x": np.zeros((1, 256), np.float32), "z": np.zeros((1, 256), np.float32)})
    msg = _validate_error(linear, req)
    assert msg == NO_ID + "unexpected inference input 'z' for model 'linear'"


def test_unexpected_requested_output_is_invalid(linear: ModelSpec) -> None:
    req = _req(
        {"x": np.zeros((1, 256), np.float32)},
        outputs=[RequestedOutput("y", False), RequestedOutput("w", False)],
    )
    msg = _validate_error(linear, req)
    assert msg == NO_ID + "unexpected inference output 'w' for model 'linear'"


def test_validation_errors_carry_the_request_id(linear: ModelSpec) -> None:
    msg = _validate_error(linear, _req({"x": np.zeros((33, 256), np.float32)}, id="abc"))
    assert msg.startswith("[request id: abc] ")


def test_digits_spec_accepts_a_batch_of_images(digits: ModelSpec) -> None:
    req = _req({"input": np.zeros((5, 64), np.float32)}, outputs=[RequestedOutput("label", False)])
    assert validate_request(digits, req) == 5


def test_digits_spec_rejects_wrong_type_shape_and_batch(digits: ModelSpec) -> None:
    assert "expects 'FP32'" in _validate_error(
        digits, _req({"input": np.zeros((1, 64), np.int64)}, {"input": "INT64"})
    )
    assert "Expected [-1,64], got [1,8,8]" in _validate_error(
        digits, _req({"input": np.zeros((1, 8, 8), np.float32)})
    )
    assert "must be <= 64 for 'digits'" in _validate_error(
        digits, _req({"input": np.zeros((65, 64), np.float32)})
    )
    assert "unexpected inference input 'x' for model 'digits'" in _validate_error(
        digits, _req({"x": np.zeros((1, 64), np.float32)})
    )


def test_inputs_with_different_batch_sizes_are_invalid(two_inputs: ModelSpec) -> None:
    req = _req(
        {"a": np.zeros((2, 3), np.float32), "b": np.zeros((3, 1), np.int64)}, {"a": "FP32", "b": "INT64"}
    )
    msg = _validate_error(two_inputs, req)
    assert "input 'b' has batch size 3 but other inputs have 2 for model 'pair'" in msg


def test_inputs_with_the_same_batch_size_return_it(two_inputs: ModelSpec) -> None:
    req = _req(
        {"a": np.zeros((4, 3), np.float32), "b": np.zeros((4, 1), np.int64)}, {"a": "FP32", "b": "INT64"}
    )
    assert validate_request(two_inputs, req) == 4


def test_one_missing_input_of_two_is_named(two_inputs: ModelSpec) -> None:
    msg = _validate_error(two_inputs, _req({"a": np.zeros((1, 3), np.float32)}))
    assert "expected 2 inputs but got 1 inputs for model 'pair'; missing required input(s) ['b']" in msg


def test_optional_input_may_be_left_out() -> None:
    spec = _spec(
        """
        name: "opt"
        backend: "python"
        max_batch_size: 4
        input [
          { name: "a", data_type: TYPE_FP32, dims: [ 2 ] },
          { name: "b", data_type: TYPE_FP32, dims: [ 2 ], optional: true }
        ]
        output [ { name: "c", data_type: TYPE_FP32, dims: [ 2 ] } ]
        """,
        "opt",
    )
    assert validate_request(spec, _req({"a": np.zeros((3, 2), np.float32)})) == 3


def test_model_without_batching_checks_the_full_shape_and_counts_one_row() -> None:
    spec = _spec(
        """
        name: "nobatch"
        backend: "python"
        max_batch_size: 0
        input [ { name: "x", data_type: TYPE_FP32, dims: [ -1, 4 ] } ]
        output [ { name: "y", data_type: TYPE_FP32, dims: [ -1, 4 ] } ]
        """,
        "nobatch",
    )
    assert validate_request(spec, _req({"x": np.zeros((7, 4), np.float32)})) == 1
    msg = _validate_error(spec, _req({"x": np.zeros((7, 5), np.float32)}))
    assert msg == NO_ID + "unexpected shape for input 'x' for model 'nobatch'. Expected [-1,4], got [7,5]"
    assert "Expected [-1,4], got [4]" in _validate_error(spec, _req({"x": np.zeros(4, np.float32)}))


def test_variable_dims_accept_any_size() -> None:
    spec = _spec(
        """
        name: "tokens"
        backend: "python"
        max_batch_size: 8
        input [ { name: "ids", data_type: TYPE_INT64, dims: [ -1 ] } ]
        output [ { name: "out", data_type: TYPE_FP32, dims: [ -1 ] } ]
        """,
        "tokens",
    )
    for n in (1, 17):
        assert validate_request(spec, _req({"ids": np.zeros((2, n), np.int64)}, {"ids": "INT64"})) == 2


# ---------------------------------------------------------------------------------------------
# shape_signature


def test_shape_signature_is_none_for_fixed_dims(linear: ModelSpec) -> None:
    assert shape_signature(linear, _req({"x": np.zeros((3, 256), np.float32)})) is None


def test_shape_signature_is_the_non_batch_shape_for_variable_dims() -> None:
    spec = _spec(
        """
        name: "tokens"
        backend: "python"
        max_batch_size: 8
        input [
          { name: "ids", data_type: TYPE_INT64, dims: [ -1 ] },
          { name: "mask", data_type: TYPE_INT64, dims: [ -1 ] }
        ]
        output [ { name: "out", data_type: TYPE_FP32, dims: [ -1 ] } ]
        """,
        "tokens",
    )
    ints = {"ids": "INT64", "mask": "INT64"}
    a = shape_signature(
        spec, _req({"ids": np.zeros((2, 7), np.int64), "mask": np.zeros((2, 7), np.int64)}, ints)
    )
    b = shape_signature(
        spec, _req({"ids": np.zeros((5, 7), np.int64), "mask": np.zeros((5, 7), np.int64)}, ints)
    )
    c = shape_signature(
        spec, _req({"ids": np.zeros((2, 9), np.int64), "mask": np.zeros((2, 9), np.int64)}, ints)
    )
    assert a == ((7,), (7,))
    assert a == b  # batch size does not matter
    assert a != c
    assert hash(a) == hash(b)


def test_shape_signature_without_batching_keeps_every_dim() -> None:
    spec = _spec(
        """
        name: "nobatch"
        backend: "python"
        max_batch_size: 0
        input [ { name: "x", data_type: TYPE_FP32, dims: [ -1, 4 ] } ]
        output [ { name: "y", data_type: TYPE_FP32, dims: [ -1, 4 ] } ]
        """,
        "nobatch",
    )
    assert shape_signature(spec, _req({"x": np.zeros((6, 4), np.float32)})) == ((6, 4),)
