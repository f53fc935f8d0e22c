"""Property-based fuzzing of the gateway's edge (issue 22): whatever infer body a client sends (JSON or the
binary extension, fields of the wrong type, huge or negative shapes, values out of range, lying sizes), the
codec decodes it or refuses it with a 400, promptly; the real gateway over HTTP never answers 5xx, never
hangs, and answers the next good request. The findings are pinned as explicit examples.

A fixed, small budget (``max_examples``) keeps CI time bounded; no example database is written.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator

import numpy as np
import pytest
import requests
from hypothesis import HealthCheck, example, given, settings

from inference.config import ModelSpec, TensorSpec, load_config
from inference.errors import InvalidInput
from inference.kserve import decode_request, encode_response, parse_header_length, validate_request
from inference.limits import REQUEST_ID_MAX_LENGTH
from tests.inference.edge_bodies import Body, infer_bodies
from tests.inference.edge_gateway import (
    BatchSpy,
    assert_still_serving,
    build_repository,
    post,
    serve_edge_gateway,
)

CODEC_BUDGET = settings(max_examples=400, deadline=None, database=None)
HTTP_BUDGET = settings(
    max_examples=150,
    deadline=None,
    database=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)
CODEC_TIME_BOUND_S = 0.5
HTTP_TIME_BOUND_S = 5.0


def _binary(model: str, header: bytes, blob: bytes, header_length: str | None = None) -> Body:
    return Body(model, header + blob, str(len(header)) if header_length is None else header_length)


def _linear_json(extra: str = "", value: str = "0.5") -> Body:
    data = ",".join(["0.5"] * 255 + [value])
    return Body(
        "linear",
        b'{%s"inputs":[{"name":"x","shape":[1,256],"datatype":"FP32","data":[%s]}]}'
        % (extra.encode(), data.encode()),
        None,
    )


def _bytes_claiming(count: int) -> Body:
    header = (
        b'{"inputs":[{"name":"text","shape":[1,%d],"datatype":"BYTES","parameters":{"binary_data_size":4}}]}'
        % count
    )
    return _binary("echo_bytes", header, b"\x00" * 4)


# The findings of issue 22, pinned: they run on every CI run whatever the random draw.
FINDINGS = [
    _linear_json('"id":"%s",' % ("r" * (REQUEST_ID_MAX_LENGTH + 1))),  # 1: id wider than the ledger column
    _linear_json('"id":"jam\\u0000me",'),  # 1: U+0000, which PostgreSQL text cannot hold
    _bytes_claiming(10**8),  # 2: seconds of np.empty(object) before any check
    _bytes_claiming(10**15),  # 2: MemoryError
    _bytes_claiming(2**64 - 1),  # 2: ValueError
    Body("linear", b'{"inputs":[{"name":"x","shape":[0,%d],"datatype":"FP32","data":[]}]}' % 2**62, None),
    Body("linear", b'{"inputs":[{"name":"x","shape":[1,256],"datatype":["FP32"],"data":[]}]}', None),  # 3
    Body("linear", b'{"inputs":[{"name":"x","shape":[1,256],"datatype":{"a":1},"data":[]}]}', None),  # 3
    _linear_json(value="3.4e39"),  # 8: answered 200 with null outputs
    _linear_json('"parameters":[],'),
    _binary(
        "linear",
        b'{"inputs":[{"name":"x","shape":[1,256],"datatype":"FP32","parameters":{"binary_data_size":1024}}]}',
        b"\x00" * 1024,
        "99999999999999999999",
    ),
]


def _with_findings(test: Callable[..., None]) -> Callable[..., None]:
    for body in FINDINGS:
        test = example(b=body)(test)
    return test


@pytest.fixture(scope="module")
def specs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, ModelSpec]:
    root = build_repository(tmp_path_factory.mktemp("edge-specs"))
    return {name: load_config(root / name) for name in ("linear", "echo_bytes")}


@CODEC_BUDGET
@given(b=infer_bodies())
@_with_findings
def test_the_codec_decodes_or_refuses_any_body_with_a_400_promptly(
    specs: dict[str, ModelSpec], b: Body
) -> None:
    started = time.perf_counter()
    try:
        req = decode_request(b.body, parse_header_length(b.header_bytes(), len(b.body)))
        validate_request(specs[b.model], req)
    except InvalidInput as exc:
        assert exc.status == 400 and exc.message
        req = None
    assert time.perf_counter() - started < CODEC_TIME_BOUND_S
    if req is None:
        return
    # What was accepted fits the ledger and holds its datatype's values.
    assert req.id is None or (len(req.id) <= REQUEST_ID_MAX_LENGTH and "\x00" not in req.id)
    for name, arr in req.inputs.items():
        if arr.dtype.kind == "f" and b.header_length is None:
            assert np.isfinite(arr).all(), name
        tspec = TensorSpec(name, req.datatypes[name], arr.shape)
        for binary in (False, True):
            encode_response(b.model, "1", req.id, [(tspec, arr, binary)])


@pytest.fixture(scope="module")
def gateway(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, BatchSpy]]:
    with serve_edge_gateway(tmp_path_factory.mktemp("edge-fuzz-models")) as served:
        yield served


@pytest.fixture(scope="module")
def session() -> Iterator[requests.Session]:
    with requests.Session() as s:
        yield s


@HTTP_BUDGET
@given(b=infer_bodies())
@_with_findings
def test_the_gateway_answers_any_body_below_500_promptly_and_keeps_serving(
    gateway: tuple[str, BatchSpy], session: requests.Session, b: Body
) -> None:
    address, _ = gateway
    started = time.monotonic()
    r = post(session, address, b.model, b.body, b.header_length)
    assert time.monotonic() - started < HTTP_TIME_BOUND_S
    assert r.status_code in (200, 400), (r.status_code, r.content[:300])
    if r.status_code == 400:
        assert r.json()["error"]
    assert_still_serving(session, address)
