"""Infer requests served directly by the HTTP protocol (no ASGI task): the same answers as the ASGI
path, in order on a connection, and every case the direct path does not take still answered.

Raw sockets, so that pipelining, ``Connection: close``, chunked bodies and disconnects are exactly
what the test sends. Which path served a request is read from a spy on the gateway.
"""

from __future__ import annotations

import asyncio
import json
import logging
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from inference.core import InferCall
from inference.core import complete as _complete
from inference.gateway import DirectInfer, Gateway
from inference.keys import Principal
from inference.repository import GatewayOptions
from tests.support.models import build_test_repository, linear_reference
from tests.support.servers import free_port, serve_asgi

KEY = "direct-key"
READ_ONLY_KEY = "read-only-key"
PRINCIPALS = {
    KEY: Principal(1, "acme", 10, frozenset({"infer"})),
    READ_ONLY_KEY: Principal(1, "acme", 11, frozenset({"read"})),
}


async def resolver(token: str) -> Principal | None:
    return PRINCIPALS.get(token)


class SpyGateway(Gateway):
    """Counts the infer requests each path served."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.asgi_infer = 0
        self.direct = 0

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] == "http" and scope["path"].endswith("/infer"):
            self.asgi_infer += 1
        await super().__call__(scope, receive, send)

    def direct_infer(
        self, method: str, path: str, headers: dict[bytes, bytes], received_ns: int
    ) -> DirectInfer | None:
        ticket = super().direct_infer(method, path, headers, received_ns)
        if ticket is not None:
            self.direct += 1
        return ticket


def _build(tmp: Path) -> SpyGateway:
    repo = build_test_repository(tmp, f"127.0.0.1:{free_port()}")
    return SpyGateway(repo, GatewayOptions(max_body_bytes=64 * 1024), resolver, key_cache_seconds=60)


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, SpyGateway]]:
    gateway = _build(tmp_path_factory.mktemp("models"))
    with serve_asgi(gateway) as address:
        yield address, gateway


def _linear_body(seed: int, request_id: str) -> tuple[bytes, np.ndarray]:
    x = np.random.default_rng(seed).random((1, 256), dtype=np.float32)
    doc = {
        "id": request_id,
        "inputs": [{"name": "x", "shape": [1, 256], "datatype": "FP32", "data": x.tolist()}],
    }
    return json.dumps(doc).encode(), x


def _request(path: str, body: bytes, *extra: bytes, key: str | None = KEY) -> bytes:
    lines = [b"POST " + path.encode() + b" HTTP/1.1", b"host: x", b"content-length: %d" % len(body), *extra]
    if key is not None:
        lines.append(b"authorization: Bearer " + key.encode())
    return b"\r\n".join(lines) + b"\r\n\r\n" + body


def _int_header(head: bytes, name: bytes) -> int:
    """The integer value of header ``name`` (lower case) in a response's header block."""
    return next(
        int(line.split(b":", 1)[1]) for line in head.split(b"\r\n") if line.lower().startswith(name + b":")
    )


def _read_answers(conn: socket.socket, count: int, timeout_s: float = 10.0) -> list[tuple[bytes, bytes]]:
    """``count`` responses off the connection, each as (header block, body)."""
    data = b""
    answers: list[tuple[bytes, bytes]] = []
    deadline = time.monotonic() + timeout_s
    while len(answers) < count:
        if b"\r\n\r\n" in data:
            head, _, rest = data.partition(b"\r\n\r\n")
            length = _int_header(head, b"content-length")
            if len(rest) >= length:
                answers.append((head, rest[:length]))
                data = rest[length:]
                continue
        assert time.monotonic() < deadline, data
        chunk = conn.recv(65536)
        assert chunk, f"connection closed after {len(answers)} answers: {data!r}"
        data += chunk
    return answers


def _slow_body(seconds: float, request_id: str | None = None) -> bytes:
    """A request for the ``slow`` test model, which sleeps its input's value in seconds."""
    doc: dict[str, Any] = {"inputs": [{"name": "x", "shape": [1, 1], "datatype": "FP32", "data": [seconds]}]}
    if request_id is not None:
        doc["id"] = request_id
    return json.dumps(doc).encode()


def _warm_key(address: str) -> None:
    """One request through the ASGI path puts the key in the gateway's cache."""
    body, _ = _linear_body(0, "warm")
    with _connect(address) as conn:
        conn.sendall(_request("/v2/models/linear/infer", body))
        ((head, _),) = _read_answers(conn, 1)
    assert head.startswith(b"HTTP/1.1 200")


def _connect(address: str) -> socket.socket:
    host, port = address.split(":")
    return socket.create_connection((host, int(port)), timeout=10)


def test_an_infer_request_with_a_cached_key_is_served_directly_with_the_asgi_paths_answer(
    served: tuple[str, SpyGateway],
) -> None:
    address, gateway = served
    _warm_key(address)
    direct_before, asgi_before = gateway.direct, gateway.asgi_infer
    body, x = _linear_body(1, "req-1")
    with _connect(address) as conn:
        conn.sendall(_request("/v2/models/linear/infer", body))
        ((head, payload),) = _read_answers(conn, 1)
    assert (gateway.direct, gateway.asgi_infer) == (direct_before + 1, asgi_before)
    assert head.startswith(b"HTTP/1.1 200 OK\r\n")
    assert b"content-type: application/json" in head
    doc = json.loads(payload)
    assert doc["id"] == "req-1" and doc["model_name"] == "linear"
    y = np.array(doc["outputs"][0]["data"], dtype=np.float32).reshape(1, 256)
    np.testing.assert_allclose(y, linear_reference(x), rtol=1e-5, atol=1e-5)


def test_the_first_request_of_an_uncached_key_takes_the_asgi_path_and_later_ones_the_direct(
    tmp_path: Path,
) -> None:
    gateway = _build(tmp_path)
    with serve_asgi(gateway) as address, _connect(address) as conn:
        for i in range(3):
            body, _ = _linear_body(i, f"r{i}")
            conn.sendall(_request("/v2/models/linear/infer", body))
            ((head, _),) = _read_answers(conn, 1)
            assert head.startswith(b"HTTP/1.1 200")
    assert (gateway.asgi_infer, gateway.direct) == (1, 2)


def test_pipelined_requests_are_answered_in_order_behind_a_slow_direct_one(
    served: tuple[str, SpyGateway],
) -> None:
    address, gateway = served
    _warm_key(address)
    slow = _slow_body(0.3, "slow")
    fast, _ = _linear_body(2, "fast")
    metadata = (
        b"GET /v2/models/linear HTTP/1.1\r\nhost: x\r\nauthorization: Bearer " + KEY.encode() + b"\r\n\r\n"
    )
    direct_before, asgi_before = gateway.direct, gateway.asgi_infer
    with _connect(address) as conn:
        conn.sendall(
            _request("/v2/models/slow/infer", slow)
            + _request("/v2/models/linear/infer", fast)
            + metadata
            + _request("/v2/models/linear/infer", fast)
        )
        answers = _read_answers(conn, 4)
    assert [head.split(b"\r\n", 1)[0] for head, _ in answers] == [b"HTTP/1.1 200 OK"] * 4
    assert json.loads(answers[0][1])["id"] == "slow"
    assert json.loads(answers[1][1])["id"] == "fast"
    assert json.loads(answers[2][1])["name"] == "linear"  # the metadata, in its place
    assert json.loads(answers[3][1])["id"] == "fast"
    # The first went direct; the two infer requests behind it queued in uvicorn's pipeline (ASGI path).
    assert (gateway.direct - direct_before, gateway.asgi_infer - asgi_before) == (1, 2)


def test_a_request_behind_an_immediate_direct_refusal_is_not_cut_off_by_the_keep_alive_timer(
    tmp_path: Path,
) -> None:
    # The refusal is answered inside the parser, which armed the keep-alive timer while the slow request
    # sent in the same packet ran: the connection closed after 0.3 s and its answer was lost.
    gateway = _build(tmp_path)
    with serve_asgi(gateway, timeout_keep_alive=0.3) as address:
        _warm_key(address)
        with _connect(address) as conn:
            conn.sendall(
                _request("/v2/models/nope/infer", b"{}")
                + _request("/v2/models/slow/infer", _slow_body(0.8, "s"))
            )
            refused, answered = _read_answers(conn, 2)
            assert refused[0].startswith(b"HTTP/1.1 404")
            assert answered[0].startswith(b"HTTP/1.1 200") and json.loads(answered[1])["id"] == "s"
            # The timer still closes the connection once it is idle.
            conn.settimeout(5)
            assert conn.recv(65536) == b""
    assert gateway.direct == 2


def test_a_direct_request_writes_uvicorns_access_log_line_when_that_log_is_on(
    served: tuple[str, SpyGateway],
) -> None:
    address, gateway = served
    _warm_key(address)
    lines: list[str] = []

    class Collect(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            lines.append(record.getMessage())

    access = logging.getLogger("uvicorn.access")
    handler, level = Collect(), access.level
    access.addHandler(handler)  # uvicorn's protocol logs when the logger has a handler, per connection
    access.setLevel(logging.INFO)
    try:
        body, _ = _linear_body(6, "logged")
        direct_before = gateway.direct
        with _connect(address) as conn:
            conn.sendall(_request("/v2/models/linear/versions/1/infer", body))
            ((head, _),) = _read_answers(conn, 1)
    finally:
        access.removeHandler(handler)
        access.setLevel(level)
    assert head.startswith(b"HTTP/1.1 200") and gateway.direct == direct_before + 1
    # Only this request's line: an earlier connection's may land while the handler is on.
    (line,) = [x for x in lines if "/versions/1/" in x]
    assert line.startswith("127.0.0.1:") and line.endswith(
        ' - "POST /v2/models/linear/versions/1/infer HTTP/1.1" 200'
    )


def test_a_key_without_the_infer_scope_is_refused_with_403_on_both_paths(
    served: tuple[str, SpyGateway],
) -> None:
    address, gateway = served
    body, _ = _linear_body(5, "r")
    direct_before = gateway.direct
    with _connect(address) as conn:
        for _ in range(2):  # the first looks the key up (ASGI path), the second finds it cached (direct)
            conn.sendall(_request("/v2/models/linear/infer", body, key=READ_ONLY_KEY))
            ((head, payload),) = _read_answers(conn, 1)
            assert head.startswith(b"HTTP/1.1 403")
            assert json.loads(payload) == {"error": "this API key lacks the 'infer' scope"}
    assert gateway.direct == direct_before + 1


def test_a_direct_answer_waits_until_a_client_that_stopped_reading_reads_again() -> None:
    # uvicorn's ASGI path sends nothing more while the transport's buffer is over its high-water mark;
    # the direct path must not pile answers into it either.
    class Transport:
        def __init__(self) -> None:
            self.written: list[bytes] = []

        def write(self, data: bytes) -> None:
            self.written.append(data)

        def is_closing(self) -> bool:
            return False

        def close(self) -> None:
            raise AssertionError("a keep-alive connection must stay open")

    class ServerState:
        default_headers: list[tuple[bytes, bytes]] = []

    async def scenario() -> None:
        from uvicorn.protocols.http.flow_control import FlowControl

        from inference.http_protocol import DirectCycle

        protocol: Any = type("Protocol", (), {})()
        protocol.transport = Transport()
        protocol.flow = FlowControl(protocol.transport)
        protocol.loop = asyncio.get_running_loop()
        protocol.server_state = ServerState()
        protocol.access_log = False
        completed: list[bool] = []
        protocol.on_response_complete = lambda: completed.append(True)
        cycle = DirectCycle(protocol, None, b"/v2/models/m/infer")

        protocol.flow.pause_writing()
        cycle.respond(200, [(b"content-type", b"application/json")], b"{}")
        cycle.respond(500, [], b"{}")  # a second answer is never written
        await asyncio.sleep(0.05)
        assert protocol.transport.written == [] and completed == [] and not cycle.response_complete

        protocol.flow.resume_writing()
        await asyncio.sleep(0.01)
        assert cycle.response_complete and completed == [True]
        (written,) = protocol.transport.written
        assert written.startswith(b"HTTP/1.1 200 OK\r\n") and written.endswith(b"\r\n\r\n{}")

    asyncio.run(scenario())


def test_a_direct_answer_for_a_client_that_left_while_it_waited_is_dropped() -> None:
    class Transport:
        written: list[bytes] = []

        def write(self, data: bytes) -> None:
            self.written.append(data)

        def is_closing(self) -> bool:
            return True

    async def scenario() -> None:
        from uvicorn.protocols.http.flow_control import FlowControl

        from inference.http_protocol import DirectCycle

        protocol: Any = type("Protocol", (), {})()
        protocol.transport = Transport()
        protocol.flow = FlowControl(protocol.transport)
        protocol.loop = asyncio.get_running_loop()
        protocol.access_log = False
        protocol.on_response_complete = lambda: pytest.fail("no response completed for a lost connection")
        cycle = DirectCycle(protocol, None, b"/v2/models/m/infer")
        protocol.flow.pause_writing()
        cycle.respond(200, [], b"{}")
        cycle.disconnected = True  # what uvicorn's connection_lost does, then it releases the writers
        protocol.flow.resume_writing()
        await asyncio.sleep(0.01)
        assert protocol.transport.written == []

    asyncio.run(scenario())


def test_the_direct_path_is_found_through_uvicorns_wrappers_and_never_through_other_middleware(
    tmp_path: Path,
) -> None:
    from uvicorn.middleware.proxy_headers import ProxyHeadersMiddleware

    from inference.http_protocol import direct_target

    gateway = _build(tmp_path)

    class Tracing:
        def __init__(self, app: Any) -> None:
            self.app = app

    assert direct_target(gateway) is gateway
    assert direct_target(ProxyHeadersMiddleware(gateway)) is gateway  # type: ignore[arg-type]
    assert direct_target(Tracing(gateway)) is None
    assert direct_target(ProxyHeadersMiddleware(Tracing(gateway))) is None  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("request_bytes", "why"),
    [
        (b"connection: close", "the client asks to close"),
        (b"expect: 100-continue", "the client waits for 100 Continue"),
    ],
)
def test_requests_the_direct_path_does_not_take_are_answered_by_the_asgi_path(
    served: tuple[str, SpyGateway], request_bytes: bytes, why: str
) -> None:
    address, gateway = served
    _warm_key(address)
    body, _ = _linear_body(3, "other")
    direct_before, asgi_before = gateway.direct, gateway.asgi_infer
    with _connect(address) as conn:
        raw = _request("/v2/models/linear/infer", body, request_bytes)
        if request_bytes.startswith(b"expect"):
            head_only, _, rest = raw.partition(b"\r\n\r\n")
            conn.sendall(head_only + b"\r\n\r\n")
            assert conn.recv(65536).startswith(b"HTTP/1.1 100 Continue")
            conn.sendall(rest)
        else:
            conn.sendall(raw)
        ((head, payload),) = _read_answers(conn, 1)
    assert head.startswith(b"HTTP/1.1 200"), why
    assert json.loads(payload)["id"] == "other"
    assert (gateway.direct, gateway.asgi_infer) == (direct_before, asgi_before + 1), why


def test_a_chunked_infer_body_goes_through_the_asgi_path(served: tuple[str, SpyGateway]) -> None:
    address, gateway = served
    _warm_key(address)
    body, _ = _linear_body(4, "chunked")
    head = (
        b"POST /v2/models/linear/infer HTTP/1.1\r\nhost: x\r\ntransfer-encoding: chunked\r\n"
        b"authorization: Bearer " + KEY.encode() + b"\r\n\r\n"
    )
    half = len(body) // 2
    chunks = (
        b"".join(b"%x\r\n%s\r\n" % (len(part), part) for part in (body[:half], body[half:])) + b"0\r\n\r\n"
    )
    asgi_before = gateway.asgi_infer
    with _connect(address) as conn:
        conn.sendall(head + chunks)
        ((answer_head, payload),) = _read_answers(conn, 1)
    assert answer_head.startswith(b"HTTP/1.1 200")
    assert json.loads(payload)["id"] == "chunked"
    assert gateway.asgi_infer == asgi_before + 1


@pytest.mark.parametrize(
    ("path", "body", "key", "status", "message"),
    [
        ("/v2/models/linear/infer", b"{not json", KEY, 400, "failed to parse the request JSON"),
        ("/v2/models/nope/infer", b"{}", KEY, 404, "nope"),
        ("/v2/models/linear/versions/9/infer", b"{}", KEY, 404, "9"),
        ("/v2/models/linear/infer", b"{}", None, 401, "missing API key"),
        ("/v2/models/linear/infer", b'{"inputs": []}', KEY, 400, "input"),
    ],
)
def test_a_bad_direct_request_gets_a_kserve_error_and_the_connection_keeps_serving(
    served: tuple[str, SpyGateway], path: str, body: bytes, key: str | None, status: int, message: str
) -> None:
    address, gateway = served
    _warm_key(address)
    good, _ = _linear_body(5, "after")
    direct_before = gateway.direct
    with _connect(address) as conn:
        conn.sendall(_request(path, body, key=key) + _request("/v2/models/linear/infer", good))
        (bad_head, bad_payload), (good_head, good_payload) = _read_answers(conn, 2)
    assert bad_head.split(b"\r\n", 1)[0].startswith(b"HTTP/1.1 %d" % status)
    assert b"content-type: application/json" in bad_head
    error = json.loads(bad_payload)["error"]
    assert message in error
    assert good_head.startswith(b"HTTP/1.1 200") and json.loads(good_payload)["id"] == "after"
    assert gateway.direct == direct_before + 2


def test_a_body_over_the_limit_is_refused_with_413_by_the_asgi_path(served: tuple[str, SpyGateway]) -> None:
    address, gateway = served
    _warm_key(address)
    direct_before = gateway.direct
    with _connect(address) as conn:
        conn.sendall(
            b"POST /v2/models/linear/infer HTTP/1.1\r\nhost: x\r\ncontent-length: 999999\r\n"
            b"authorization: Bearer " + KEY.encode() + b"\r\n\r\n"
        )
        ((head, payload),) = _read_answers(conn, 1)
    assert head.startswith(b"HTTP/1.1 413")
    assert "exceeds the limit" in json.loads(payload)["error"]
    assert gateway.direct == direct_before


def test_a_client_that_leaves_before_its_answer_does_not_stop_the_server(
    served: tuple[str, SpyGateway],
) -> None:
    address, gateway = served
    _warm_key(address)
    slow = _slow_body(0.2)
    direct_before = gateway.direct
    with _connect(address) as conn:
        conn.sendall(_request("/v2/models/slow/infer", slow))
        time.sleep(0.05)
    assert gateway.direct == direct_before + 1
    time.sleep(0.3)  # the answer arrives for a closed connection
    _warm_key(address)


def test_a_direct_request_in_flight_at_shutdown_is_answered_then_the_connection_closes(
    tmp_path: Path,
) -> None:
    gateway = _build(tmp_path)
    answers: list[tuple[bytes, bytes]] = []
    closed_after: list[bytes] = []
    slow = _slow_body(0.5)
    with serve_asgi(gateway) as address:
        _warm_key(address)
        conn = _connect(address)
        conn.sendall(_request("/v2/models/slow/infer", slow))

        def read() -> None:
            answers.extend(_read_answers(conn, 1))
            closed_after.append(conn.recv(65536))

        reader = threading.Thread(target=read)
        reader.start()
        time.sleep(0.1)
        assert gateway.direct == 1
    # Leaving the block stopped the server: it waited for the answer before closing the connection.
    reader.join(10)
    conn.close()
    assert answers and answers[0][0].startswith(b"HTTP/1.1 200")
    assert b"connection: close" in answers[0][0]
    assert closed_after == [b""]


def test_one_failing_answer_does_not_keep_the_rest_of_its_batch_waiting() -> None:
    delivered: list[object] = []

    def explode(result: object) -> None:
        raise RuntimeError("answer failed")

    class P:
        def __init__(self, call: InferCall) -> None:
            self.payload = call

    calls = []
    for on_done in (explode, delivered.append):
        call = InferCall.__new__(InferCall)
        call.future = None
        call.on_done = on_done
        calls.append(call)
    _complete([(P(calls[0]), "a"), (P(calls[1]), "b")])  # type: ignore[list-item]
    assert delivered == ["b"]


def test_a_full_queue_refuses_a_direct_request_with_429_and_retry_after(
    served: tuple[str, SpyGateway],
) -> None:
    address, gateway = served
    _warm_key(address)
    direct_before = gateway.direct
    # `slow` runs one request at a time and queues one more: the third is refused at once.
    with _connect(address) as running, _connect(address) as queued, _connect(address) as refused:
        running.sendall(_request("/v2/models/slow/infer", _slow_body(0.6, "running")))
        time.sleep(0.15)
        queued.sendall(_request("/v2/models/slow/infer", _slow_body(0.0, "queued")))
        time.sleep(0.15)
        refused.sendall(_request("/v2/models/slow/infer", _slow_body(0.0, "refused")))
        ((head, payload),) = _read_answers(refused, 1)
        assert head.startswith(b"HTTP/1.1 429")
        assert b"\r\nretry-after: " in head.lower()
        assert "exceeds maximum queue size for model 'slow/1'" in json.loads(payload)["error"]
        # The two accepted ones are answered, and the refused connection keeps serving.
        assert json.loads(_read_answers(running, 1)[0][1])["id"] == "running"
        assert json.loads(_read_answers(queued, 1)[0][1])["id"] == "queued"
        refused.sendall(_request("/v2/models/slow/infer", _slow_body(0.0, "later")))
        assert json.loads(_read_answers(refused, 1)[0][1])["id"] == "later"
    assert gateway.direct == direct_before + 4


def test_a_binary_tensor_request_is_served_directly_with_a_binary_answer(
    served: tuple[str, SpyGateway],
) -> None:
    address, gateway = served
    _warm_key(address)
    x = np.random.default_rng(21).random((2, 256), dtype=np.float32)
    header = json.dumps(
        {
            "id": "bin",
            "inputs": [
                {
                    "name": "x",
                    "shape": [2, 256],
                    "datatype": "FP32",
                    "parameters": {"binary_data_size": x.nbytes},
                }
            ],
            "outputs": [{"name": "y", "parameters": {"binary_data": True}}],
        }
    ).encode()
    body = header + x.tobytes()
    direct_before, asgi_before = gateway.direct, gateway.asgi_infer
    with _connect(address) as conn:
        conn.sendall(
            _request(
                "/v2/models/linear/infer",
                body,
                b"inference-header-content-length: %d" % len(header),
                b"content-type: application/octet-stream",
            )
        )
        ((head, payload),) = _read_answers(conn, 1)
    assert (gateway.direct, gateway.asgi_infer) == (direct_before + 1, asgi_before)
    assert head.startswith(b"HTTP/1.1 200")
    json_length = _int_header(head, b"inference-header-content-length")
    doc = json.loads(payload[:json_length])
    assert doc["id"] == "bin"
    assert doc["outputs"][0]["parameters"]["binary_data_size"] == 2 * 256 * 4
    y = np.frombuffer(payload[json_length:], dtype=np.float32).reshape(2, 256)
    np.testing.assert_allclose(y, linear_reference(x), rtol=1e-5, atol=1e-5)


def _success_count(address: str) -> int:
    with _connect(address) as conn:
        conn.sendall(
            b"GET /v2/models/linear/stats HTTP/1.1\r\nhost: x\r\nauthorization: Bearer "
            + KEY.encode()
            + b"\r\n\r\n"
        )
        ((head, payload),) = _read_answers(conn, 1)
    assert head.startswith(b"HTTP/1.1 200"), head
    (stats,) = json.loads(payload)["model_stats"]
    return int(stats["inference_stats"]["success"]["count"])


def test_a_client_that_leaves_in_the_middle_of_a_direct_body_leaves_nothing_behind(
    served: tuple[str, SpyGateway],
) -> None:
    address, gateway = served
    _warm_key(address)
    body, _ = _linear_body(22, "half")
    before = _success_count(address)
    direct_before = gateway.direct
    with _connect(address) as conn:
        conn.sendall(_request("/v2/models/linear/infer", body)[: -len(body) // 2])
        time.sleep(0.1)
    assert gateway.direct == direct_before + 1  # taken at its headers...
    time.sleep(0.2)
    # ...but never run: nothing was counted for it, and the next request is served as usual.
    assert _success_count(address) == before
    _warm_key(address)
    assert _success_count(address) == before + 1
