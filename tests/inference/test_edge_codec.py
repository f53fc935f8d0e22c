"""What a client sends cannot get past the codec's edge unchecked (issue 22): a request id the ledger column
cannot hold, tensors whose declared size the body does not carry, fields of the wrong JSON type, values their
datatype cannot hold. Each is refused with a 400 naming the field, before anything is allocated; and outputs
that are inf or NaN travel exactly (binary) or as Triton 2.51 writes them (JSON).

Framework-free, like test_kserve.py: the codec alone.
"""

from __future__ import annotations

import struct
import time
import tracemalloc
from typing import Any

import numpy as np
import orjson
import pytest
import rapidjson

from inference.config import TensorSpec
from inference.errors import InvalidInput
from inference.kserve import DTYPES, LITTLE_ENDIAN, decode_request, encode_response

# ---------------------------------------------------------------------------------------------
# helpers


def _tensor(data: Any = None, **fields: Any) -> dict[str, Any]:
    doc: dict[str, Any] = {
        "name": "x",
        "shape": [1],
        "datatype": "FP32",
        "data": [1.0] if data is None else data,
    }
    doc.update(fields)
    return doc


def _doc(*inputs: dict[str, Any], **top: Any) -> bytes:
    return orjson.dumps({"inputs": list(inputs) or [_tensor()], **top})


def _refused(body: bytes, header_length: int | None = None) -> str:
    """The message of the 400 that refuses ``body``; any other exception fails the test."""
    with pytest.raises(InvalidInput) as info:
        decode_request(body, header_length)
    assert info.value.status == 400
    return info.value.message


def _binary(header: bytes, blob: bytes) -> tuple[bytes, int]:
    return header + blob, len(header)


def _bytes_header(shape_text: str, size: int) -> bytes:
    # Written by hand: orjson refuses to write integers beyond 64 bits, and the client may send them.
    return (
        b'{"inputs":[{"name":"t","shape":[' + shape_text.encode() + b'],"datatype":"BYTES",'
        b'"parameters":{"binary_data_size":%d}}]}' % size
    )


# ---------------------------------------------------------------------------------------------
# finding 1: the request id must fit the ledger's client_request_id column


def test_request_id_longer_than_the_ledger_column_is_refused_naming_id() -> None:
    message = _refused(_doc(id="r" * 257))
    assert "'id'" in message and "256" in message


def test_request_id_of_exactly_the_column_length_is_accepted() -> None:
    assert decode_request(_doc(id="é" * 256), None).id == "é" * 256  # characters, as varchar counts them


def test_request_id_with_a_nul_character_is_refused_naming_id() -> None:
    message = _refused(_doc(id="abc\u0000def"))
    assert "'id'" in message and "U+0000" in message


@pytest.mark.parametrize("value", [12, 1.5, True, ["a"], {"a": 1}])
def test_request_id_that_is_not_a_string_is_refused_naming_id(value: Any) -> None:
    assert "'id'" in _refused(_doc(id=value))


# ---------------------------------------------------------------------------------------------
# finding 2: sizes come from the shape and are checked against the body before any allocation


def test_bytes_binary_input_declaring_1e8_elements_is_refused_before_allocating() -> None:
    body, hlen = _binary(_bytes_header("100000000", 4), b"\x00" * 4)
    tracemalloc.start()
    started = time.perf_counter()
    try:
        message = _refused(body, hlen)
        elapsed = time.perf_counter() - started
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert "input 't'" in message and "100000000" in message
    assert elapsed < 0.05, f"refusing took {elapsed:.3f} s"
    assert peak < 1_000_000, f"refusing allocated {peak} bytes"


@pytest.mark.parametrize("count", ["1000000000000000", str(2**63), str(2**64 - 1), str(2**80)])
def test_bytes_binary_input_with_an_absurd_element_count_is_a_400(count: str) -> None:
    body, hlen = _binary(_bytes_header(count, 4), b"\x00" * 4)
    assert "input 't'" in _refused(body, hlen)


@pytest.mark.parametrize("datatype", sorted(DTYPES))
def test_binary_input_of_every_datatype_claiming_more_elements_than_its_bytes_is_a_400(datatype: str) -> None:
    header = orjson.dumps(
        {
            "inputs": [
                {"name": "t", "shape": [2**40], "datatype": datatype, "parameters": {"binary_data_size": 8}}
            ]
        }
    )
    assert "input 't'" in _refused(header + b"\x00" * 8, len(header))


@pytest.mark.parametrize("datatype", sorted(DTYPES))
def test_json_input_of_every_datatype_claiming_more_elements_than_the_body_is_a_400(datatype: str) -> None:
    assert "input 'x'" in _refused(_doc(_tensor(data=[], shape=[2**62], datatype=datatype)))


def test_zero_element_shape_with_a_huge_dimension_is_a_400() -> None:
    body = b'{"inputs":[{"name":"x","shape":[0,%d],"datatype":"FP32","data":[]}]}' % 2**62
    assert "input 'x'" in _refused(body)


def test_shape_of_more_dimensions_than_the_limit_is_a_400() -> None:
    assert "input 'x'" in _refused(_doc(_tensor(data=[], shape=[0] * 70)))


def test_zero_element_shapes_of_reasonable_size_are_still_accepted() -> None:
    req = decode_request(_doc(_tensor(data=[], shape=[0, 256])), None)
    assert req.inputs["x"].shape == (0, 256)


def test_binary_data_size_past_the_body_is_a_400() -> None:
    header = orjson.dumps(
        {"inputs": [{"name": "x", "shape": [1], "datatype": "FP32", "parameters": {"binary_data_size": 4}}]}
    )
    assert "binary_data_size" in _refused(header + b"\x00\x00", len(header))


# ---------------------------------------------------------------------------------------------
# finding 3: every field of the request is type-checked, and the 400 names it


@pytest.mark.parametrize("datatype", [["FP32"], {"a": 1}, 1, None, True, "FP128"])
def test_datatype_that_is_not_a_known_name_is_a_400_naming_datatype(datatype: Any) -> None:
    assert "datatype" in _refused(_doc(_tensor(datatype=datatype)))


@pytest.mark.parametrize(
    "shape",
    [None, "1", 1, {"a": 1}, [True], [1.0], ["1"], [None], [[1]], [-1], [-(2**63)]],
)
def test_shape_that_is_not_a_list_of_non_negative_integers_is_a_400_naming_shape(shape: Any) -> None:
    assert "shape" in _refused(_doc(_tensor(shape=shape)))


def test_shape_element_beyond_64_bits_is_a_400_naming_shape() -> None:
    body = b'{"inputs":[{"name":"x","shape":[%d],"datatype":"FP32","data":[1]}]}' % 2**80
    assert "shape" in _refused(body)


@pytest.mark.parametrize("name", [None, 1, ["x"], {"x": 1}])
def test_input_name_that_is_not_a_string_is_a_400(name: Any) -> None:
    assert "'name'" in _refused(_doc(_tensor(name=name)))


@pytest.mark.parametrize("inputs", [None, {}, "x", 1, [1], [None], [["x"]]])
def test_inputs_that_are_not_a_list_of_objects_are_a_400(inputs: Any) -> None:
    assert "input" in _refused(orjson.dumps({"inputs": inputs}))


@pytest.mark.parametrize("params", [[], 0, "x", True, [1]])
def test_request_parameters_that_are_not_an_object_are_a_400(params: Any) -> None:
    assert "'parameters'" in _refused(_doc(parameters=params))


@pytest.mark.parametrize("value", [{"a": 1}, [1], None])
def test_request_parameter_of_a_type_kserve_does_not_allow_is_a_400_naming_it(value: Any) -> None:
    assert "'custom'" in _refused(_doc(parameters={"custom": value}))


def test_request_parameter_string_longer_than_the_limit_is_a_400_naming_it() -> None:
    assert "'custom'" in _refused(_doc(parameters={"custom": "v" * 100_000}))


@pytest.mark.parametrize("value", [1, "true", [True], {"a": 1}])
def test_binary_data_output_that_is_not_a_boolean_is_a_400(value: Any) -> None:
    assert "binary_data_output" in _refused(_doc(parameters={"binary_data_output": value}))


@pytest.mark.parametrize("params", [[], 0, "x", True])
def test_input_parameters_that_are_not_an_object_are_a_400(params: Any) -> None:
    assert "'parameters'" in _refused(_doc(_tensor(parameters=params)))


@pytest.mark.parametrize("size", ["4", 4.0, True, [4], {"a": 4}, -4])
def test_binary_data_size_that_is_not_a_non_negative_integer_is_a_400(size: Any) -> None:
    header = orjson.dumps(
        {
            "inputs": [
                {"name": "x", "shape": [1], "datatype": "FP32", "parameters": {"binary_data_size": size}}
            ]
        }
    )
    assert "binary_data_size" in _refused(header + b"\x00" * 4, len(header))


@pytest.mark.parametrize("outputs", [{"a": 1}, "y", 1, [1], [None], [{"name": 1}], [{"parameters": {}}]])
def test_outputs_that_are_not_a_list_of_named_objects_are_a_400(outputs: Any) -> None:
    assert "output" in _refused(_doc(outputs=outputs))


@pytest.mark.parametrize(
    ("params", "field"),
    [
        ([1], "'parameters'"),
        ({"binary_data": "yes"}, "binary_data"),
        ({"binary_data": 1}, "binary_data"),
        ({"classification": [1]}, "classification"),
        ({"classification": "2"}, "classification"),
        ({"other": {"a": 1}}, "'other'"),
    ],
)
def test_output_parameters_of_the_wrong_type_are_a_400_naming_them(params: Any, field: str) -> None:
    assert field in _refused(_doc(outputs=[{"name": "y", "parameters": params}]))


# ---------------------------------------------------------------------------------------------
# finding 8: values a datatype cannot hold are refused; non-finite outputs travel as Triton sends them


@pytest.mark.parametrize(
    ("datatype", "value"),
    [
        ("FP32", 3.4e39),
        ("FP32", -3.4e39),
        ("FP32", 3.40282357e38),  # rounds to inf in float32
        ("FP16", 70000.0),
        ("FP16", -65520.0),  # half-way past the largest half: rounds to -inf
        ("BF16", 3.4e39),
    ],
)
def test_float_value_beyond_the_datatype_s_range_is_a_400_naming_the_input(
    datatype: str, value: float
) -> None:
    message = _refused(_doc(_tensor(data=[1.0, value], shape=[2], datatype=datatype)))
    assert "input 'x'" in message and datatype in message


@pytest.mark.parametrize(
    ("datatype", "value"),
    [
        ("FP32", 3.4028235e38),
        ("FP32", -3.4028234663852886e38),
        ("FP16", 65504.0),
        ("FP16", 65519.0),
        ("BF16", 3.3895313892515355e38),
        ("FP32", 1e-50),
        ("FP64", 1.7976931348623157e308),
    ],
)
def test_float_values_up_to_the_datatype_s_largest_are_accepted(datatype: str, value: float) -> None:
    arr = decode_request(_doc(_tensor(data=[value], datatype=datatype)), None).inputs["x"]
    assert arr.dtype == DTYPES[datatype] and np.isfinite(arr).all()


@pytest.mark.parametrize(
    ("datatype", "value"),
    [
        ("INT8", 128),
        ("INT8", -129),
        ("UINT8", -1),
        ("UINT8", 256),
        ("INT16", 32768),
        ("UINT16", 65536),
        ("INT32", 2**31),
        ("UINT32", 2**32),
        ("INT64", 2**63),
        ("UINT64", -1),
        ("INT32", 1.5),
        ("INT64", True),
    ],
)
def test_integer_value_outside_the_datatype_s_range_is_a_400_naming_the_input(
    datatype: str, value: Any
) -> None:
    message = _refused(_doc(_tensor(data=[0, value], shape=[2], datatype=datatype)))
    assert "input 'x'" in message and datatype in message


def test_uint64_value_beyond_64_bits_is_a_400_naming_the_input() -> None:
    body = b'{"inputs":[{"name":"x","shape":[1],"datatype":"UINT64","data":[%d]}]}' % 2**64
    message = _refused(body)
    assert "input 'x'" in message and "UINT64" in message


@pytest.mark.parametrize(("datatype", "value"), [("UINT64", 2**64 - 1), ("INT64", -(2**63)), ("INT8", -128)])
def test_integer_values_at_the_datatype_s_bounds_are_accepted(datatype: str, value: int) -> None:
    assert decode_request(_doc(_tensor(data=[value], datatype=datatype)), None).inputs["x"][0] == value


@pytest.mark.parametrize("value", [1, 0, "true", None])
def test_bool_value_that_is_not_true_or_false_is_a_400_naming_the_input(value: Any) -> None:
    assert "input 'x'" in _refused(_doc(_tensor(data=[value], datatype="BOOL")))


def test_binary_fp32_inputs_carry_inf_and_nan_exactly() -> None:
    bits = np.array(
        [0x7F800000, 0xFF800000, 0x7FC00001, 0x3FC00000], dtype="<u4"
    )  # inf, -inf, NaN payload, 1.5
    header = orjson.dumps(
        {"inputs": [{"name": "x", "shape": [4], "datatype": "FP32", "parameters": {"binary_data_size": 16}}]}
    )
    arr = decode_request(header + bits.tobytes(), len(header)).inputs["x"]
    assert arr.view("<u4").tolist() == bits.tolist()


@pytest.mark.parametrize("datatype", ["FP16", "FP32", "FP64", "BF16"])
def test_non_finite_json_outputs_are_written_as_triton_2_51_writes_them(datatype: str) -> None:
    arr = np.array([np.inf, -np.inf, np.nan, 1.5, 0.0], dtype=DTYPES[datatype])
    out, hlen = encode_response("m", "1", "r1", [(TensorSpec("y", datatype, (5,)), arr, False)])
    assert hlen is None
    # Triton 2.51 (rapidjson, kWriteNanAndInfFlag) writes the bare tokens: see docs/gateway.md.
    assert b'"data":[Infinity,-Infinity,NaN,1.5,0.0]' in out
    data = rapidjson.loads(out)["outputs"][0]["data"]  # what tritonclient parses responses with
    assert data[0] == np.inf and data[1] == -np.inf and np.isnan(data[2]) and data[3:] == [1.5, 0.0]


def test_finite_json_outputs_are_unchanged_plain_json() -> None:
    arr = np.array([1.5, -2.0, 3.25], dtype=np.float32)
    out, _ = encode_response("m", "1", None, [(TensorSpec("y", "FP32", (3,)), arr, False)])
    assert orjson.loads(out)["outputs"][0]["data"] == [1.5, -2.0, 3.25]


def test_non_finite_binary_outputs_travel_bit_for_bit() -> None:
    bits = np.array([0x7F800000, 0xFF800000, 0x7FC00001, 0xFFC12345], dtype="<u4")
    arr = bits.view(LITTLE_ENDIAN["FP32"])
    out, hlen = encode_response("m", "1", None, [(TensorSpec("y", "FP32", (4,)), arr, True)])
    assert hlen is not None and out[hlen:] == bits.tobytes()


def test_nested_fp32_output_with_nan_keeps_every_other_value() -> None:
    arr = np.array([[np.nan, 0.1], [-0.0, np.inf]], dtype=np.float32)
    out, _ = encode_response("m", "1", None, [(TensorSpec("y", "FP32", (2,)), arr, False)])
    data = rapidjson.loads(out)["outputs"][0]["data"]
    assert np.isnan(data[0]) and data[1] == float(np.float32(0.1)) and data[3] == np.inf
    assert struct.pack("<d", data[2]) == struct.pack("<d", -0.0)


def test_json_nested_deeper_than_the_parser_allows_is_a_400_naming_the_depth() -> None:
    body = b'{"inputs":' + b"[" * 50_000 + b"]" * 50_000 + b"}"
    with pytest.raises(InvalidInput, match="depth limit"):
        decode_request(body, None)
