"""The serving protocol (ours, httptools on asyncio): each answer in one write, keep-alive and pipelining in
order, chunked bodies both ways, 100-continue, malformed requests and failing applications answered, and no
dependency on uvicorn's protocol classes. uvicorn runs the server, as `manage.py serve` runs it."""

from __future__ import annotations

import asyncio
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from typing import Any

import pytest

from inference.http_protocol import GatewayHttpProtocol
from tests.support.servers import serve_asgi

disconnects: list[str] = []  # paths whose application saw http.disconnect while reading the body


async def _app(scope: dict[str, Any], receive: Any, send: Any) -> None:
    if scope["type"] != "http":
        return
    if scope["path"] == "/until-disconnect":
        while (await receive())["type"] != "http.disconnect":
            pass
        disconnects.append(scope["path"])
        return
    body = b""
    while True:
        message = await receive()
        body += message.get("body", b"")
        if not message.get("more_body"):
            break
    if scope["path"] == "/empty":
        await send({"type": "http.response.start", "status": 204, "headers": []})
        await send({"type": "http.response.body", "body": b""})
        return
    if scope["path"] == "/fail":
        raise RuntimeError("the application failed")
    if scope["path"] == "/big":
        big = b"b" * (64 * 1024)
        await send({"type": "http.response.start", "status": 200, "headers": [(b"content-length", b"65536")]})
        await send({"type": "http.response.body", "body": big})
        return
    if scope["path"] == "/late-body":
        await send({"type": "http.response.start", "status": 200, "headers": [(b"content-length", b"4")]})
        await asyncio.sleep(0.3)
        await send({"type": "http.response.body", "body": b"late"})
        return
    if scope["path"] == "/stream":
        await send({"type": "http.response.start", "status": 200, "headers": []})
        for part in (b"one,", b"two"):
            await asyncio.sleep(0.01)
            await send({"type": "http.response.body", "body": part, "more_body": True})
        await send({"type": "http.response.body", "body": b""})
        return
    answer = b"echo:" + body
    await send(
        {
            "type": "http.response.start",
            "status": 200,
            "headers": [(b"content-length", str(len(answer)).encode())],
        }
    )
    await send({"type": "http.response.body", "body": answer})


socket_writes: list[bytes] = []  # what the real server's protocol handed to the socket transport


class RecordingProtocol(GatewayHttpProtocol):
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        write = transport.write

        def recording_write(data: Any) -> None:
            socket_writes.append(bytes(data))
            write(data)

        transport.write = recording_write  # type: ignore[method-assign]
        super().connection_made(transport)


@pytest.fixture
def server_port() -> Iterator[int]:
    socket_writes.clear()
    with serve_asgi(
        _app,
        timeout_s=10,
        protocol=RecordingProtocol,
        lifespan="off",
        log_level="critical",  # the failing application's traceback is expected
        timeout_keep_alive=0.5,
    ) as address:
        yield int(address.rsplit(":", 1)[1])


def _read_response(conn: socket.socket) -> bytes:
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = conn.recv(65536)
        assert chunk, f"connection closed early: {data!r}"
        data += chunk
    head, _, rest = data.partition(b"\r\n\r\n")
    length = next(
        int(line.split(b":", 1)[1])
        for line in head.split(b"\r\n")
        if line.lower().startswith(b"content-length")
    )
    while len(rest) < length:
        rest += conn.recv(65536)
    return head + b"\r\n\r\n" + rest


def test_a_real_server_answers_keep_alive_requests_whole_and_in_order(server_port: int) -> None:
    with socket.create_connection(("127.0.0.1", server_port), timeout=10) as conn:
        for payload in (b"first", b"second"):
            request = (
                b"POST /echo HTTP/1.1\r\nhost: x\r\ncontent-length: "
                + str(len(payload)).encode()
                + b"\r\n\r\n"
                + payload
            )
            conn.sendall(request)
            answer = _read_response(conn)
            assert answer.startswith(b"HTTP/1.1 200 OK\r\n")
            assert answer.endswith(b"\r\n\r\necho:" + payload), answer


def test_a_real_server_streams_chunked_responses_and_honours_expect_100_continue(server_port: int) -> None:
    with socket.create_connection(("127.0.0.1", server_port), timeout=10) as conn:
        conn.sendall(b"GET /stream HTTP/1.1\r\nhost: x\r\n\r\n")
        data = b""
        while not data.endswith(b"0\r\n\r\n"):
            chunk = conn.recv(65536)
            assert chunk, data
            data += chunk
        assert b"transfer-encoding: chunked" in data
        assert b"4\r\none,\r\n" in data and b"3\r\ntwo\r\n" in data

        conn.sendall(b"POST /echo HTTP/1.1\r\nhost: x\r\ncontent-length: 3\r\nexpect: 100-continue\r\n\r\n")
        interim = conn.recv(65536)
        assert interim.startswith(b"HTTP/1.1 100 Continue\r\n\r\n")
        conn.sendall(b"abc")
        rest = interim[len(b"HTTP/1.1 100 Continue\r\n\r\n") :]
        if not rest:
            rest = _read_response(conn)
        assert rest.startswith(b"HTTP/1.1 200 OK") and rest.endswith(b"echo:abc")


def test_a_real_server_hands_each_answer_to_the_socket_in_one_write(server_port: int) -> None:
    with socket.create_connection(("127.0.0.1", server_port), timeout=10) as conn:
        conn.sendall(b"POST /echo HTTP/1.1\r\nhost: x\r\ncontent-length: 3\r\n\r\nabc")
        answer = _read_response(conn)
    assert answer.endswith(b"echo:abc")
    assert socket_writes == [answer]


def test_a_real_server_answers_pipelined_head_and_empty_requests_in_order(server_port: int) -> None:
    with socket.create_connection(("127.0.0.1", server_port), timeout=10) as conn:
        conn.sendall(
            b"HEAD /echo HTTP/1.1\r\nhost: x\r\n\r\n"
            b"GET /empty HTTP/1.1\r\nhost: x\r\n\r\n"
            b"POST /echo HTTP/1.1\r\nhost: x\r\ncontent-length: 2\r\n\r\nhi"
        )
        data = b""
        deadline = time.monotonic() + 10
        while not data.endswith(b"echo:hi"):
            assert time.monotonic() < deadline, data
            chunk = conn.recv(65536)
            assert chunk, data
            data += chunk
    head_answer, _, rest = data.partition(b"\r\n\r\n")
    assert head_answer.startswith(b"HTTP/1.1 200 OK") and b"content-length: 5" in head_answer
    assert rest.startswith(b"HTTP/1.1 204 No Content\r\n")
    assert rest.split(b"\r\n\r\n", 1)[1].startswith(b"HTTP/1.1 200 OK")


def _read_until_closed(conn: socket.socket, timeout_s: float = 10.0) -> bytes:
    conn.settimeout(timeout_s)
    data = b""
    while True:
        chunk = conn.recv(65536)
        if not chunk:
            return data
        data += chunk


def test_a_chunked_request_body_reaches_the_application_whole(server_port: int) -> None:
    with socket.create_connection(("127.0.0.1", server_port), timeout=10) as conn:
        conn.sendall(
            b"POST /echo HTTP/1.1\r\nhost: x\r\ntransfer-encoding: chunked\r\n\r\n"
            b"3\r\nabc\r\n4\r\ndefg\r\n0\r\n\r\n"
        )
        answer = _read_response(conn)
    assert answer.startswith(b"HTTP/1.1 200 OK") and answer.endswith(b"echo:abcdefg")


def test_a_malformed_request_gets_a_400_with_a_json_error_and_the_connection_closed(server_port: int) -> None:
    with socket.create_connection(("127.0.0.1", server_port), timeout=10) as conn:
        conn.sendall(b"NOT A REQUEST\r\n\r\n")
        answer = _read_until_closed(conn)
    head, _, body = answer.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 400 ") and b"connection: close" in head
    assert body.startswith(b'{"error":"invalid HTTP request')


def test_an_application_that_fails_before_answering_gets_a_500_and_the_connection_closes(
    server_port: int,
) -> None:
    with socket.create_connection(("127.0.0.1", server_port), timeout=10) as conn:
        conn.sendall(b"GET /fail HTTP/1.1\r\nhost: x\r\n\r\n")
        answer = _read_until_closed(conn)
    assert answer.startswith(b"HTTP/1.1 500 ") and answer.endswith(b"Internal Server Error")


def test_a_large_body_follows_its_header_block_without_being_copied_into_one_buffer(server_port: int) -> None:
    with socket.create_connection(("127.0.0.1", server_port), timeout=10) as conn:
        conn.sendall(b"GET /big HTTP/1.1\r\nhost: x\r\n\r\n")
        answer = _read_response(conn)
    assert len(socket_writes) == 2 and socket_writes[1] == b"b" * 65536
    assert answer == socket_writes[0] + socket_writes[1]


def test_a_header_block_whose_body_comes_later_is_sent_without_waiting_for_it(server_port: int) -> None:
    with socket.create_connection(("127.0.0.1", server_port), timeout=10) as conn:
        conn.sendall(b"GET /late-body HTTP/1.1\r\nhost: x\r\n\r\n")
        conn.settimeout(0.25)  # the body comes 0.3 s after the header block
        first = conn.recv(65536)
        assert first.startswith(b"HTTP/1.1 200 OK") and first.endswith(b"\r\n\r\n")
        conn.settimeout(5)
        assert conn.recv(65536) == b"late"


def test_http_1_0_is_answered_and_closed_and_an_idle_keep_alive_connection_is_closed_after_its_timeout(
    server_port: int,
) -> None:
    with socket.create_connection(("127.0.0.1", server_port), timeout=10) as conn:
        conn.sendall(b"POST /echo HTTP/1.0\r\ncontent-length: 2\r\n\r\nhi")
        answer = _read_until_closed(conn)
    assert answer.startswith(b"HTTP/1.1 200 OK") and b"connection: close" in answer
    with socket.create_connection(("127.0.0.1", server_port), timeout=10) as conn:
        conn.sendall(b"POST /echo HTTP/1.1\r\nhost: x\r\ncontent-length: 2\r\n\r\nhi")
        assert _read_response(conn).endswith(b"echo:hi")
        answered = time.monotonic()
        assert _read_until_closed(conn) == b""  # keep-alive time-out 0.5 s; the sweep runs every 0.125 s
        assert 0.45 <= time.monotonic() - answered <= 3.0


def test_the_protocol_imports_none_of_uvicorns_protocol_modules() -> None:
    code = (
        "import sys, inference.http_protocol; "
        "print(sorted(m for m in sys.modules if m.startswith('uvicorn')))"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert done.stdout.strip() == "[]", done.stdout


def test_an_application_reading_the_body_hears_http_disconnect_when_the_client_leaves(
    server_port: int,
) -> None:
    disconnects.clear()
    with socket.create_connection(("127.0.0.1", server_port), timeout=10) as conn:
        conn.sendall(b"POST /until-disconnect HTTP/1.1\r\nhost: x\r\ncontent-length: 100\r\n\r\npart")
        time.sleep(0.1)
    deadline = time.monotonic() + 5
    while not disconnects:
        assert time.monotonic() < deadline, "the application never heard the client leave"
        time.sleep(0.01)
    assert disconnects == ["/until-disconnect"]


def test_a_body_larger_than_the_read_buffer_reaches_the_application_whole(server_port: int) -> None:
    payload = bytes(range(256)) * 4096  # 1 MiB: reading pauses and resumes as the application takes it
    with socket.create_connection(("127.0.0.1", server_port), timeout=10) as conn:
        conn.sendall(b"POST /echo HTTP/1.1\r\nhost: x\r\ncontent-length: %d\r\n\r\n" % len(payload) + payload)
        answer = _read_response(conn)
    assert answer.endswith(b"\r\n\r\necho:" + payload)
