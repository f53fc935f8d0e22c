"""The request decoder's header plans (kserve.RequestDecoder): a body decoded from a remembered plan is what
``decode_request`` makes of it, refusals included."""

from __future__ import annotations

from typing import Any

import numpy as np
import orjson
import pytest
from hypothesis import event, given, settings
from hypothesis import strategies as st

from inference.errors import InvalidInput
from inference.kserve import InferRequest, RequestDecoder, decode_request, parse_header_length
from tests.inference.edge_bodies import Body, infer_bodies


def _outcome(decode: Any, body: bytes, header_length: int | None) -> tuple[str, Any]:
    try:
        req: InferRequest = decode(body, header_length)
    except InvalidInput as exc:
        return "refused", exc.message
    return "decoded", (
        req.id,
        req.parameters,
        req.datatypes,
        req.outputs,
        req.binary_output_all,
        {
            name: (arr.dtype.str, arr.shape, arr.tobytes() if arr.dtype != object else list(arr.ravel()))
            for name, arr in req.inputs.items()
        },
    )


def _header_length(b: Body) -> int | None:
    try:
        return parse_header_length(b.header_bytes(), len(b.body))
    except InvalidInput:
        return None


@settings(max_examples=400, deadline=None, database=None)
@given(b=infer_bodies(), tail=st.binary(min_size=0, max_size=4096))
def test_a_body_with_a_remembered_header_decodes_as_decode_request_decodes_it(b: Body, tail: bytes) -> None:
    header_length = _header_length(b)
    decoder = RequestDecoder()
    assert _outcome(decoder.decode, b.body, header_length) == _outcome(decode_request, b.body, header_length)
    # Another body with the same header and length: other binary data (BOOL bytes past 1 among them).
    start = len(b.body) if header_length is None else header_length
    size = len(b.body) - start
    other = b.body[:start] + (tail * (size // max(1, len(tail)) + 1))[:size] if tail else b.body
    assert len(other) == len(b.body)
    event("the header has a plan" if len(decoder) else "the header has no plan")
    for _ in range(2):
        assert _outcome(decoder.decode, other, header_length) == _outcome(
            decode_request, other, header_length
        )


def binary_body(rid: str = "r", bools: bool = False, values: bytes | None = None) -> tuple[bytes, int]:
    datatype = "BOOL" if bools else "FP32"
    size = 4 if bools else 16
    header = orjson.dumps(
        {
            "id": rid,
            "inputs": [
                {"name": "x", "shape": [1, 4], "datatype": datatype, "parameters": {"binary_data_size": size}}
            ],
            "outputs": [{"name": "y", "parameters": {"binary_data": True}}],
        }
    )
    data = values if values is not None else np.arange(4, dtype=np.float32).tobytes()
    return header + data, len(header)


def test_a_remembered_header_serves_each_body_its_own_data_in_arrays_of_their_own() -> None:
    decoder = RequestDecoder()
    body1, n = binary_body(values=np.float32([1, 2, 3, 4]).tobytes())
    body2, _ = binary_body(values=np.float32([5, 6, 7, 8]).tobytes())
    first, second = decoder.decode(body1, n), decoder.decode(body2, n)
    assert len(decoder) == 1
    assert first.inputs["x"].tolist() == [[1, 2, 3, 4]] and second.inputs["x"].tolist() == [[5, 6, 7, 8]]
    second.parameters["changed"] = True  # a request's containers are its own, not the plan's
    assert second.outputs is not None
    second.outputs[0].binary = False
    third = decoder.decode(body1, n)
    assert "changed" not in third.parameters and third.outputs is not None and third.outputs[0].binary


def test_bool_data_is_checked_on_every_body_even_with_a_remembered_header() -> None:
    decoder = RequestDecoder()
    good, n = binary_body(bools=True, values=bytes([0, 1, 1, 0]))
    bad, _ = binary_body(bools=True, values=bytes([0, 1, 2, 0]))
    assert decoder.decode(good, n).inputs["x"].tolist() == [[False, True, True, False]]
    with pytest.raises(InvalidInput, match="BOOL data must be bytes 0 or 1"):
        decoder.decode(bad, n)
    assert len(decoder) == 0  # BOOL headers get no plan


def test_json_bodies_and_headers_over_the_limit_are_not_remembered() -> None:
    decoder = RequestDecoder(max_header_bytes=64)
    body, n = binary_body(rid="x" * 100)
    decoder.decode(body, n)
    doc = orjson.dumps({"inputs": [{"name": "x", "shape": [1, 1], "datatype": "FP32", "data": [1.0]}]})
    decoder.decode(doc, None)
    assert len(decoder) == 0


def test_the_memory_of_plans_is_bounded_by_emptying_it_when_full() -> None:
    decoder = RequestDecoder(max_plans=3)
    for i in range(7):
        body, n = binary_body(rid=f"r{i}")
        assert decoder.decode(body, n).id == f"r{i}"
        assert 1 <= len(decoder) <= 3
