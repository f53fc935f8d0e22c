"""Issue 22 at the real gateway over HTTP: the requests that jammed the ledger, stalled the event loop or
answered 500 are refused with a 400 naming the field, never reach a batch (so nothing is spooled), and the
gateway keeps serving; outputs that are inf or NaN reach tritonclient as Triton sends them."""

from __future__ import annotations

import time
from collections.abc import Iterator

import numpy as np
import orjson
import pytest
import requests
import tritonclient.http as httpclient

from tests.inference.edge_gateway import BatchSpy, assert_still_serving, post, serve_edge_gateway


@pytest.fixture(scope="module")
def gateway(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, BatchSpy]]:
    with serve_edge_gateway(tmp_path_factory.mktemp("edge-models")) as served:
        yield served


@pytest.fixture
def session() -> Iterator[requests.Session]:
    with requests.Session() as s:
        yield s


def _linear(request_id: object = None, value: float = 0.5) -> bytes:
    data = [0.5] * 255 + [value]
    doc: dict[str, object] = {"inputs": [{"name": "x", "shape": [1, 256], "datatype": "FP32", "data": data}]}
    if request_id is not None:
        doc["id"] = request_id
    return orjson.dumps(doc)


@pytest.mark.parametrize("request_id", ["r" * 257, "jam\u0000me"])
def test_request_id_the_ledger_cannot_store_is_a_400_and_never_reaches_a_batch(
    gateway: tuple[str, BatchSpy], session: requests.Session, request_id: str
) -> None:
    address, spy = gateway
    r = post(session, address, "linear", _linear(request_id))
    assert r.status_code == 400, r.text
    assert "'id'" in r.json()["error"]
    assert_still_serving(session, address)
    assert request_id not in spy.ids


def test_request_id_of_256_characters_is_served_and_reaches_its_batch(
    gateway: tuple[str, BatchSpy], session: requests.Session
) -> None:
    address, spy = gateway
    r = post(session, address, "linear", _linear("i" * 256))
    assert r.status_code == 200 and r.json()["id"] == "i" * 256
    assert "i" * 256 in spy.ids


@pytest.mark.parametrize("count", [10**8, 10**15, 2**63, 2**64 - 1])
def test_bytes_binary_input_declaring_absurd_element_counts_is_a_prompt_400(
    gateway: tuple[str, BatchSpy], session: requests.Session, count: int
) -> None:
    address, _ = gateway
    header = (
        b'{"inputs":[{"name":"text","shape":[1,%d],"datatype":"BYTES","parameters":{"binary_data_size":4}}]}'
        % count
    )
    started = time.monotonic()
    r = post(session, address, "echo_bytes", header + b"\x00" * 4, len(header))
    assert r.status_code == 400, r.text
    assert time.monotonic() - started < 1.0
    assert "input 'text'" in r.json()["error"]
    assert_still_serving(session, address)


@pytest.mark.parametrize("datatype", [["FP32"], {"FP32": 1}])
def test_datatype_of_the_wrong_json_type_is_a_400_not_a_500(
    gateway: tuple[str, BatchSpy], session: requests.Session, datatype: object
) -> None:
    address, _ = gateway
    body = orjson.dumps(
        {"inputs": [{"name": "x", "shape": [1, 256], "datatype": datatype, "data": [0.0] * 256}]}
    )
    r = post(session, address, "linear", body)
    assert r.status_code == 400, r.text
    assert "datatype" in r.json()["error"]
    assert_still_serving(session, address)


def test_fp32_input_value_beyond_float32_is_a_400_not_a_null_output(
    gateway: tuple[str, BatchSpy], session: requests.Session
) -> None:
    address, spy = gateway
    r = post(session, address, "linear", _linear("overflow", 3.4e39))
    assert r.status_code == 400, r.text
    assert "input 'x'" in r.json()["error"] and "FP32" in r.json()["error"]
    assert "overflow" not in spy.ids
    assert_still_serving(session, address)


def test_inf_and_nan_outputs_reach_tritonclient_in_json_and_in_binary(gateway: tuple[str, BatchSpy]) -> None:
    address, _ = gateway
    client = httpclient.InferenceServerClient(address)
    try:
        for binary in (False, True):
            inp = httpclient.InferInput("x", [1, 1], "FP32")
            inp.set_data_from_numpy(np.array([[2.5]], dtype=np.float32), binary_data=binary)
            out = httpclient.InferRequestedOutput("y", binary_data=binary)
            y = client.infer("nonfinite", [inp], outputs=[out]).as_numpy("y")
            assert y.dtype == np.float32 and y.shape == (1, 4)
            assert y[0, 0] == np.inf and y[0, 1] == -np.inf and np.isnan(y[0, 2]) and y[0, 3] == 2.5
    finally:
        client.close()


def test_inf_and_nan_json_outputs_are_the_tokens_triton_writes(
    gateway: tuple[str, BatchSpy], session: requests.Session
) -> None:
    address, _ = gateway
    body = orjson.dumps({"inputs": [{"name": "x", "shape": [1, 1], "datatype": "FP32", "data": [1.0]}]})
    r = post(session, address, "nonfinite", body)
    assert r.status_code == 200
    assert b'"data":[Infinity,-Infinity,NaN,1.0]' in r.content
