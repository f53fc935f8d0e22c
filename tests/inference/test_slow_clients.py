"""Slow and greedy clients against a real server on a loopback port: connections stalled mid-header or
mid-body are closed after their time-out while good requests are answered; header blocks over the count or
size cap get 431; connections over the per-process cap get 503; the serve command takes the limits from the
settings. The server runs the gateway (both the direct infer path and the ASGI path) under uvicorn with the
serving protocol, with time-outs small enough for a test.
"""

from __future__ import annotations

import json
import selectors
import socket
import sys
import time
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest
import requests
import tritonclient.http as httpclient
from django.conf import settings as django_settings
from django.core.management import call_command

from carbonledger.management.commands import serve as serve_command
from inference.gateway import Gateway
from inference.http_protocol import GatewayHttpProtocol
from inference.keys import Principal
from inference.repository import GatewayOptions
from tests.support.models import build_test_repository
from tests.support.servers import free_port, serve_asgi

KEY = "slow-clients-key"
AUTH = {"Authorization": f"Bearer {KEY}"}
# Long enough that good requests, slowed by a busy test machine, are answered well inside the header time-out.
HEADER_TIMEOUT_S = 2.0
BODY_TIMEOUT_S = 3.5
SLACK_S = 1.2  # a sweep runs at most every second, plus scheduling on a busy test machine
STALLED = 25


class QuickProtocol(GatewayHttpProtocol):
    header_timeout_s = HEADER_TIMEOUT_S
    body_timeout_s = BODY_TIMEOUT_S
    max_headers = 20
    max_header_bytes = 2048
    max_connections = 80


async def resolver(token: str) -> Principal | None:
    return Principal(1, "acme", 10, frozenset({"infer", "read"})) if token == KEY else None


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, int]]:
    # The serve command's GIL switch interval (GATEWAY_SWITCH_INTERVAL_S), not Python's 5 ms: this server shares
    # the test process with its clients and with whatever threads earlier tests left, and the tests time it.
    switch_interval = sys.getswitchinterval()
    sys.setswitchinterval(django_settings.GATEWAY_SWITCH_INTERVAL_S)
    try:
        repo = build_test_repository(tmp_path_factory.mktemp("models"), f"127.0.0.1:{free_port()}")
        gateway = Gateway(repo, GatewayOptions(remote_timeout_s=1.0), resolver)
        with serve_asgi(gateway, protocol=QuickProtocol) as address:
            host, port = address.rsplit(":", 1)
            # The first requests pay one-time costs (the key's lookup, Django's first ASGI request, the model's
            # first batch); the tests time how good requests fare beside stalled ones, not those.
            assert_good_requests_answered(host, int(port))
            yield host, int(port)
    finally:
        sys.setswitchinterval(switch_interval)


def linear_body() -> bytes:
    x = np.zeros(256, dtype=np.float32)
    return json.dumps(
        {"inputs": [{"name": "x", "shape": [1, 256], "datatype": "FP32", "data": x.tolist()}]}
    ).encode()


def assert_good_requests_answered(host: str, port: int) -> None:
    """A tritonclient request (direct infer path) and a plain HTTP one (ASGI path) are answered."""
    client = httpclient.InferenceServerClient(f"{host}:{port}", connection_timeout=5, network_timeout=5)
    try:
        inp = httpclient.InferInput("x", [1, 256], "FP32")
        inp.set_data_from_numpy(np.ones((1, 256), dtype=np.float32), binary_data=True)
        result = client.infer("linear", [inp], headers=dict(AUTH))
        assert result.as_numpy("y").shape == (1, 256)
    finally:
        client.close()
    r = requests.get(f"http://{host}:{port}/v2/models/linear", headers=AUTH, timeout=5)
    assert r.status_code == 200, r.text


def wait_closed(socks: list[socket.socket], timeout_s: float) -> dict[socket.socket, tuple[float, bytes]]:
    """When each socket saw the server close it (monotonic time) and what it read before; sockets still open
    after ``timeout_s`` are missing from the answer."""
    sel = selectors.DefaultSelector()
    received: dict[socket.socket, bytes] = {}
    for s in socks:
        s.setblocking(False)
        sel.register(s, selectors.EVENT_READ)
        received[s] = b""
    closed: dict[socket.socket, tuple[float, bytes]] = {}
    deadline = time.monotonic() + timeout_s
    while len(closed) < len(socks) and time.monotonic() < deadline:
        for key, _ in sel.select(max(0.0, deadline - time.monotonic())):
            s: Any = key.fileobj
            try:
                chunk = s.recv(65536)
            except ConnectionResetError:
                chunk = b""
            if chunk:
                received[s] += chunk
            else:
                closed[s] = (time.monotonic(), received[s])
                sel.unregister(s)
    sel.close()
    return closed


def none_closed(socks: list[socket.socket]) -> bool:
    """No socket has anything to read yet: the server has neither answered nor closed any of them."""
    sel = selectors.DefaultSelector()
    for s in socks:
        sel.register(s, selectors.EVENT_READ)
    try:
        return sel.select(0) == []
    finally:
        sel.close()


def connect(host: str, port: int) -> socket.socket:
    s = socket.create_connection((host, port), timeout=5)
    s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return s


def close_all(socks: list[socket.socket]) -> None:
    for s in socks:
        s.close()


def test_connections_stalled_mid_header_are_closed_after_the_header_timeout_while_good_requests_are_answered(
    server: tuple[str, int],
) -> None:
    host, port = server
    # The server times each connection from its accept: the earliest bound is taken before the first connect,
    # the latest after the last (on a busy machine connecting all 50 takes a good part of a second).
    connecting = time.monotonic()
    silent = [connect(host, port) for _ in range(STALLED)]
    partial = [connect(host, port) for _ in range(STALLED)]
    opened = time.monotonic()
    for s in partial:
        s.sendall(b"POST /v2/models/linear/infer HTTP/1.1\r\nhost: x\r\ncontent-le")
    try:
        assert_good_requests_answered(host, port)
        # Answered while the others stall: the server has closed none of them yet. Had it waited on them, the
        # good requests would have been answered only after their time-out had closed them.
        assert none_closed(silent + partial)
        closed = wait_closed(silent + partial, HEADER_TIMEOUT_S + SLACK_S + 1.0)
        assert len(closed) == len(silent) + len(partial), f"{len(closed)} of {2 * STALLED} closed"
        for s, (when, data) in closed.items():
            assert when - connecting >= HEADER_TIMEOUT_S - 0.05
            assert when - opened <= HEADER_TIMEOUT_S + SLACK_S
            if s in silent:
                assert data == b""  # nothing was asked: nothing is answered
            else:
                assert data.startswith(b"HTTP/1.1 408 "), data
        assert_good_requests_answered(host, port)
    finally:
        close_all(silent + partial)


def test_connections_stalled_mid_body_get_408_and_are_closed_after_the_body_timeout(
    server: tuple[str, int],
) -> None:
    host, port = server
    body = linear_body()
    direct = [connect(host, port) for _ in range(STALLED)]  # the protocol's own infer path
    asgi = [connect(host, port) for _ in range(STALLED)]  # the ASGI path (not kept alive)
    for socks, extra in ((direct, b""), (asgi, b"connection: close\r\n")):
        for s in socks:
            s.sendall(
                b"POST /v2/models/linear/infer HTTP/1.1\r\nhost: x\r\nauthorization: Bearer "
                + KEY.encode()
                + b"\r\n"
                + extra
                + b"content-length: %d\r\n\r\n" % len(body)
                + body[:100]
            )
    headers_done = time.monotonic()
    try:
        assert_good_requests_answered(host, port)
        # Past the header time-out the bodies still have time: nobody is closed yet.
        assert wait_closed(direct + asgi, HEADER_TIMEOUT_S + 0.2) == {}
        assert_good_requests_answered(host, port)
        closed = wait_closed(direct + asgi, BODY_TIMEOUT_S + SLACK_S)
        assert len(closed) == len(direct) + len(asgi), f"{len(closed)} of {2 * STALLED} closed"
        for when, data in closed.values():
            assert BODY_TIMEOUT_S - 0.05 <= when - headers_done <= BODY_TIMEOUT_S + SLACK_S
            assert data.startswith(b"HTTP/1.1 408 "), data
            assert b"connection: close" in data.lower()
        assert_good_requests_answered(host, port)
    finally:
        close_all(direct + asgi)


def test_a_header_trickled_a_byte_at_a_time_is_cut_at_the_header_timeout(server: tuple[str, int]) -> None:
    host, port = server
    s = connect(host, port)
    opened = time.monotonic()
    request = b"GET /v2/health/live HTTP/1.1\r\nhost: x\r\nx-slow: " + b"a" * 200
    try:
        cut = False
        for byte in request:
            try:
                s.sendall(bytes([byte]))
            except OSError:
                cut = True
                break
            time.sleep(0.05)
            if time.monotonic() - opened > HEADER_TIMEOUT_S + SLACK_S:
                break
        if not cut:
            closed = wait_closed([s], 0.5)
            cut = s in closed
        assert cut, "a header trickled slowly kept the connection open past the header time-out"
        assert time.monotonic() - opened <= HEADER_TIMEOUT_S + SLACK_S + 0.5
    finally:
        s.close()


def test_a_request_sent_in_parts_within_the_timeouts_is_answered(server: tuple[str, int]) -> None:
    host, port = server
    body = linear_body()
    with connect(host, port) as s:
        s.sendall(b"POST /v2/models/linear/infer HTTP/1.1\r\nhost: x\r\n")
        time.sleep(HEADER_TIMEOUT_S / 2)
        s.sendall(b"authorization: Bearer " + KEY.encode() + b"\r\ncontent-length: %d\r\n\r\n" % len(body))
        time.sleep(HEADER_TIMEOUT_S)  # longer than the header time-out, within the body's
        s.sendall(body)
        s.settimeout(5)
        answer = s.recv(65536)
    assert answer.startswith(b"HTTP/1.1 200 "), answer[:200]


def test_an_answer_slower_than_both_timeouts_is_not_cut(server: tuple[str, int]) -> None:
    host, port = server
    doc = {"inputs": [{"name": "x", "shape": [1, 1], "datatype": "FP32", "data": [BODY_TIMEOUT_S + 0.5]}]}
    r = requests.post(f"http://{host}:{port}/v2/models/slow/infer", json=doc, headers=AUTH, timeout=10)
    assert r.status_code == 200, r.text


def read_answer(s: socket.socket, timeout_s: float = 5.0) -> bytes:
    s.settimeout(timeout_s)
    data = b""
    try:
        while True:
            chunk = s.recv(65536)
            if not chunk:
                return data
            data += chunk
    except (TimeoutError, ConnectionResetError):
        return data


def test_too_many_headers_are_refused_with_431_and_the_connection_closed(server: tuple[str, int]) -> None:
    host, port = server
    many = b"".join(b"x-h%d: v\r\n" % i for i in range(25))
    with connect(host, port) as s:
        s.sendall(b"GET /v2/health/live HTTP/1.1\r\nhost: x\r\n" + many + b"\r\n")
        answer = read_answer(s)  # read to the end: the server closes the connection
    assert answer.startswith(b"HTTP/1.1 431 "), answer
    assert b"connection: close" in answer.lower()


def test_a_header_block_over_the_size_cap_is_refused_with_431(server: tuple[str, int]) -> None:
    host, port = server
    with connect(host, port) as s:
        s.sendall(b"GET /v2/health/live HTTP/1.1\r\nhost: x\r\nx-big: " + b"b" * 4000 + b"\r\n\r\n")
        answer = read_answer(s)
    assert answer.startswith(b"HTTP/1.1 431 "), answer


def test_an_endless_header_value_is_refused_before_it_is_all_read(server: tuple[str, int]) -> None:
    host, port = server
    with connect(host, port) as s:
        s.sendall(b"GET /v2/health/live HTTP/1.1\r\nhost: x\r\nx-endless: ")
        sent = 0
        try:
            for _ in range(200):  # up to 200 KB, never ending the value
                s.sendall(b"e" * 1000)
                sent += 1000
                time.sleep(0.002)
        except OSError:
            pass  # the server closed the connection: nothing more is read
        answer = read_answer(s)
    assert answer.startswith(b"HTTP/1.1 431 "), (sent, answer[:100])
    assert sent < 100_000


def test_connections_over_the_cap_get_503_and_are_closed_while_the_others_are_served(
    server: tuple[str, int],
) -> None:
    host, port = server
    held: list[socket.socket] = []
    try:
        # Keep-alive connections that each finished a request: idle, within the keep-alive time-out.
        for _ in range(QuickProtocol.max_connections):
            s = connect(host, port)
            s.sendall(b"GET /v2/health/live HTTP/1.1\r\nhost: x\r\n\r\n")
            assert s.recv(65536).startswith(b"HTTP/1.1 200 ")
            held.append(s)
        extra = connect(host, port)
        answer = read_answer(extra)
        extra.close()
        assert answer.startswith(b"HTTP/1.1 503 "), answer
        # The connections already accepted are still served.
        held[0].sendall(b"GET /v2/health/live HTTP/1.1\r\nhost: x\r\n\r\n")
        held[0].settimeout(5)
        assert held[0].recv(65536).startswith(b"HTTP/1.1 200 ")
        close_all(held[:10])
        time.sleep(0.2)  # the server sees them closed
        assert_good_requests_answered(host, port)
    finally:
        close_all(held)


def test_the_serve_command_passes_the_connection_limits_from_the_settings(
    settings: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    settings.GATEWAY_HEADER_TIMEOUT_S = 3.5
    settings.GATEWAY_BODY_TIMEOUT_S = 7.5
    settings.GATEWAY_MAX_HEADERS = 42
    settings.GATEWAY_MAX_HEADER_BYTES = 9000
    settings.GATEWAY_MAX_CONNECTIONS = 321
    seen: dict[str, Any] = {}
    monkeypatch.setattr(serve_command.uvicorn, "run", lambda app, **kw: seen.update(kw))
    monkeypatch.setattr(serve_command.sys, "setswitchinterval", lambda s: None)
    call_command("serve", port=free_port())
    protocol = seen["http"]
    assert issubclass(protocol, GatewayHttpProtocol)
    assert (
        protocol.header_timeout_s,
        protocol.body_timeout_s,
        protocol.max_headers,
        protocol.max_header_bytes,
        protocol.max_connections,
    ) == (3.5, 7.5, 42, 9000, 321)
