"""The serving protocol sends a response's headers and body in one write, and loses nothing else."""

from __future__ import annotations

import asyncio
import socket
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest
import uvicorn

from inference.http_protocol import CoalescingHttpToolsProtocol, HeaderHoldingTransport

HEAD = b"HTTP/1.1 200 OK\r\ncontent-length: 5\r\n\r\n"


class RecordingTransport(asyncio.Transport):
    def __init__(self) -> None:
        super().__init__()
        self.writes: list[bytes] = []
        self.closed = False
        self.aborted = False

    def write(self, data: Any) -> None:
        self.writes.append(bytes(data))

    def is_closing(self) -> bool:
        return self.closed or self.aborted

    def close(self) -> None:
        self.closed = True

    def abort(self) -> None:
        self.aborted = True

    def get_write_buffer_size(self) -> int:
        return 0

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return {"peername": ("127.0.0.1", 1234)}.get(name, default)


def test_headers_and_the_body_that_follows_leave_in_one_write() -> None:
    async def scenario() -> list[bytes]:
        inner = RecordingTransport()
        t = HeaderHoldingTransport(inner, asyncio.get_running_loop())
        t.write(HEAD)
        t.write(b"hello")
        await asyncio.sleep(0)  # the scheduled flush finds nothing left to send
        return inner.writes

    assert asyncio.run(scenario()) == [HEAD + b"hello"]


def test_a_large_body_follows_its_headers_without_being_copied_into_one_buffer() -> None:
    body = b"x" * (1 << 20)

    async def scenario() -> list[bytes]:
        inner = RecordingTransport()
        t = HeaderHoldingTransport(inner, asyncio.get_running_loop())
        t.write(HEAD)
        t.write(body)
        await asyncio.sleep(0)
        return inner.writes

    assert asyncio.run(scenario()) == [HEAD, body]


def test_headers_without_a_body_in_the_same_step_go_out_on_the_next_loop_iteration() -> None:
    head = b"HTTP/1.1 204 No Content\r\n\r\n"

    async def scenario() -> tuple[list[bytes], list[bytes]]:
        inner = RecordingTransport()
        t = HeaderHoldingTransport(inner, asyncio.get_running_loop())
        t.write(head)
        before = list(inner.writes)
        await asyncio.sleep(0)
        return before, inner.writes

    before, after = asyncio.run(scenario())
    assert before == []
    assert after == [head]


def test_100_continue_and_writes_that_are_no_header_block_go_out_at_once() -> None:
    writes = [
        b"HTTP/1.1 100 Continue\r\n\r\n",  # the client waits for it before sending the body
        b"5\r\nhello\r\n",
        b"0\r\n\r\n",  # a chunked body's end
        b"a body that happens to end in a blank line\r\n\r\n",
    ]

    async def scenario() -> list[bytes]:
        inner = RecordingTransport()
        t = HeaderHoldingTransport(inner, asyncio.get_running_loop())
        for data in writes:
            t.write(data)
        return list(inner.writes)

    assert asyncio.run(scenario()) == writes


def test_close_sends_held_headers_first_and_abort_drops_them() -> None:
    async def scenario() -> tuple[RecordingTransport, RecordingTransport]:
        loop = asyncio.get_running_loop()
        closing, aborting = RecordingTransport(), RecordingTransport()
        a = HeaderHoldingTransport(closing, loop)
        a.write(HEAD)
        a.close()
        a.flush()  # the scheduled flush, after the close: nothing left to send twice
        b = HeaderHoldingTransport(aborting, loop)
        b.write(HEAD)
        assert b.get_write_buffer_size() == len(HEAD)
        b.abort()
        await asyncio.sleep(0)
        return closing, aborting

    closing, aborting = asyncio.run(scenario())
    assert closing.writes == [HEAD] and closing.closed
    assert aborting.writes == [] and aborting.aborted


def test_other_transport_attributes_are_the_wrapped_transports() -> None:
    async def scenario() -> Any:
        t = HeaderHoldingTransport(RecordingTransport(), asyncio.get_running_loop())
        return t.get_extra_info("peername")

    assert asyncio.run(scenario()) == ("127.0.0.1", 1234)


async def _app(scope: dict[str, Any], receive: Any, send: Any) -> None:
    if scope["type"] != "http":
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


class RecordingProtocol(CoalescingHttpToolsProtocol):
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
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    config = uvicorn.Config(_app, http=RecordingProtocol, lifespan="off", log_level="warning", loop="asyncio")
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    deadline = time.monotonic() + 10
    while not server.started:
        assert time.monotonic() < deadline, "test server did not start"
        time.sleep(0.01)
    yield port
    server.should_exit = True
    thread.join(10)
    sock.close()


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
