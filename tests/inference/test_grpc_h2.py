"""The gRPC transport (inference/grpc_h2.py) on its own: toy methods behind a real ``GrpcServer``, driven by grpc's
own clients (sync and aio) and, for what a well-behaved client never sends, by a raw HTTP/2 client."""

from __future__ import annotations

import asyncio
import contextlib
import gzip
import socket
import struct
import threading
import time
import urllib.parse
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import grpc
import hpack
import pytest
from hpack.hpack import decode_integer
from hypothesis import given
from hypothesis import strategies as st

from inference import grpc_h2 as h2
from inference.grpc_h2 import Call, GrpcServer, Method

MAX_MESSAGE = 8 << 20
MAX_METADATA = 16384
OPTIONS = [("grpc.max_send_message_length", 64 << 20), ("grpc.max_receive_message_length", 64 << 20)]


@dataclass
class Toy:
    url: str
    port: int
    server: GrpcServer
    loop: asyncio.AbstractEventLoop
    cancelled: list[str] = field(default_factory=list)
    delivered: int = 0


def _methods(toy: Toy) -> dict[str, Method]:
    def echo(call: Call, message: bytes | None) -> None:
        call.reply(message or b"")

    def sized(call: Call, message: bytes | None) -> None:
        call.reply(bytes(range(256)) * (int(message or b"0") // 256))

    def later(call: Call, message: bytes | None) -> None:
        toy.loop.call_later(0.05, call.reply, message or b"")

    def never(call: Call, message: bytes | None) -> None:
        call.on_cancel = lambda: toy.cancelled.append(call.method)

    def release(call: Call, message: bytes | None) -> None:
        call.on_cancel = lambda: toy.loop.call_later(0.05, call.release)

    def fail(call: Call, message: bytes | None) -> None:
        call.fail(h2.NOT_FOUND, "nö modél: 100% gone\nreally", [("retry-after", "1")])

    def boom(call: Call, message: bytes | None) -> None:
        raise RuntimeError("a bug in a handler")

    def metadata(call: Call, message: bytes | None) -> None:
        call.reply(call.header(b"authorization") or b"-")

    def hold(call: Call, message: bytes | None) -> None:
        call.on_message = lambda _: call.pause()

    def chat(call: Call, message: bytes | None) -> None:
        def send(message: bytes) -> None:
            toy.delivered += 1
            call.send(message)

        call.on_message = send
        call.on_end = call.finish

    def admit(call: Call) -> None:
        if call.header(b"x-key") != b"ok":
            call.fail(h2.UNAUTHENTICATED, "no key")

    def gate(call: Call, message: bytes | None) -> None:
        # The first message pauses the call for a while; every later one pauses it, is answered and resumes it
        # at once, as a refusal does in the gateway's stream.
        def on_message(message: bytes) -> None:
            call.pause()
            call.send(message)
            if message == b"first":
                toy.loop.call_later(0.3, call.resume)
            else:
                call.resume()

        call.on_message = on_message
        call.on_end = call.finish

    def length(call: Call, message: bytes | None) -> None:
        call.reply(str(len(message or b"")).encode())

    return {
        "/t.T/Echo": Method(echo),
        "/t.T/Sized": Method(sized),
        "/t.T/Later": Method(later),
        "/t.T/Never": Method(never),
        "/t.T/Fail": Method(fail),
        "/t.T/Release": Method(release),
        "/t.T/Boom": Method(boom),
        "/t.T/Metadata": Method(metadata),
        "/t.T/Chat": Method(chat, streaming=True),
        "/t.T/Length": Method(length),
        "/t.T/Gate": Method(gate, streaming=True),
        "/t.T/Keyed": Method(length, admit=admit),
        "/t.T/Hold": Method(hold, streaming=True),
    }


@pytest.fixture
def toy() -> Iterator[Toy]:
    with _running() as made:
        yield made


@pytest.fixture
def strict() -> Iterator[Toy]:
    """A server with short time-outs and room for two connections."""
    with _running(max_connections=2, header_timeout_s=0.3, body_timeout_s=0.3) as made:
        yield made


@contextlib.contextmanager
def _running(**limits: Any) -> Iterator[Toy]:
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    server = GrpcServer({}, max_message_bytes=MAX_MESSAGE, max_metadata_bytes=MAX_METADATA, **limits)
    port = asyncio.run_coroutine_threadsafe(server.start("127.0.0.1", 0), loop).result(10)
    made = Toy(f"127.0.0.1:{port}", port, server, loop)
    server.methods = _methods(made)
    try:
        yield made
    finally:
        asyncio.run_coroutine_threadsafe(server.stop(1.0), loop).result(10)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(10)
        loop.close()


def _unary(channel: grpc.Channel, name: str) -> Any:
    return channel.unary_unary(f"/t.T/{name}", request_serializer=None, response_deserializer=None)


def _serving(toy: Toy) -> bool:
    with grpc.insecure_channel(toy.url) as channel:
        return bool(_unary(channel, "Echo")(b"still here", timeout=10) == b"still here")


# -- with grpc's clients ------------------------------------------------------------------------


def test_unary_calls_carry_messages_of_any_size_both_ways(toy: Toy) -> None:
    with grpc.insecure_channel(toy.url, options=OPTIONS) as channel:
        echo = _unary(channel, "Echo")
        for size in (0, 1, 65535, 70000, 3 << 20, MAX_MESSAGE):
            message = bytes(range(256)) * (size // 256) + b"x" * (size % 256)
            assert echo(message, timeout=30) == message
        # Answers past the client's windows (64 KiB at first) wait for its WINDOW_UPDATEs.
        sized = _unary(channel, "Sized")
        for size in (65536, 200_000, 5 << 20):
            assert sized(str(size).encode(), timeout=30) == bytes(range(256)) * (size // 256)


async def test_many_concurrent_calls_on_one_connection_are_each_answered_with_their_own_message(
    toy: Toy,
) -> None:
    async with grpc.aio.insecure_channel(toy.url) as channel:
        later = channel.unary_unary("/t.T/Later", request_serializer=None, response_deserializer=None)
        answers = await asyncio.gather(*(later(b"%d" % i, timeout=30) for i in range(300)))
    assert answers == [b"%d" % i for i in range(300)]


def test_a_stream_answers_every_message_in_order_and_ends_ok(toy: Toy) -> None:
    with grpc.insecure_channel(toy.url) as channel:
        chat = channel.stream_stream("/t.T/Chat", request_serializer=None, response_deserializer=None)
        messages = [b"m%d" % i * (i % 50) for i in range(1000)]
        assert list(chat(iter(messages), timeout=30)) == messages


def test_metadata_reaches_the_handler(toy: Toy) -> None:
    with grpc.insecure_channel(toy.url) as channel:
        answer = _unary(channel, "Metadata")(b"", metadata=(("authorization", "Bearer k1"),), timeout=10)
    assert answer == b"Bearer k1"


def test_a_failure_carries_its_status_its_message_and_its_trailers(toy: Toy) -> None:
    with grpc.insecure_channel(toy.url) as channel, pytest.raises(grpc.RpcError) as caught:
        _unary(channel, "Fail")(b"", timeout=10)
    assert caught.value.code() == grpc.StatusCode.NOT_FOUND
    assert caught.value.details() == "nö modél: 100% gone\nreally"
    assert ("retry-after", "1") in tuple(caught.value.trailing_metadata())


def test_a_handler_that_raises_is_internal_and_the_server_keeps_serving(toy: Toy) -> None:
    with grpc.insecure_channel(toy.url) as channel, pytest.raises(grpc.RpcError) as caught:
        _unary(channel, "Boom")(b"", timeout=10)
    assert caught.value.code() == grpc.StatusCode.INTERNAL
    assert _serving(toy)


def test_a_method_not_served_is_unimplemented(toy: Toy) -> None:
    with grpc.insecure_channel(toy.url) as channel, pytest.raises(grpc.RpcError) as caught:
        channel.unary_unary("/t.T/Nothing")(b"", timeout=10)
    assert caught.value.code() == grpc.StatusCode.UNIMPLEMENTED


def test_a_message_over_the_limit_is_resource_exhausted_and_the_server_keeps_serving(toy: Toy) -> None:
    with grpc.insecure_channel(toy.url, options=OPTIONS) as channel, pytest.raises(grpc.RpcError) as caught:
        _unary(channel, "Echo")(bytes(MAX_MESSAGE + 1), timeout=30)
    assert caught.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert f"({MAX_MESSAGE + 1} vs. {MAX_MESSAGE})" in (caught.value.details() or "")
    assert _serving(toy)


def test_metadata_over_the_limit_is_resource_exhausted(toy: Toy) -> None:
    with grpc.insecure_channel(toy.url) as channel, pytest.raises(grpc.RpcError) as caught:
        _unary(channel, "Echo")(b"", metadata=(("x-padding", "p" * (MAX_METADATA + 1)),), timeout=10)
    assert caught.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert _serving(toy)


def test_compressed_requests_are_unimplemented_and_answers_say_so(toy: Toy) -> None:
    with grpc.insecure_channel(toy.url, compression=grpc.Compression.Gzip) as channel:
        with pytest.raises(grpc.RpcError) as caught:
            _unary(channel, "Echo")(b"compress me " * 1000, timeout=10)
        assert caught.value.code() == grpc.StatusCode.UNIMPLEMENTED
        assert "uncompressed" in (caught.value.details() or "")
    raw = Raw(toy.port)  # grpc's clients keep grpc-* headers to themselves: read them raw
    try:
        raw.headers(1, "/t.T/Echo")
        raw.message(1, b"plain")
        decoder = hpack.Decoder()
        blocks = [decoder.decode(p) for kind, _, sid, p in raw.frames(1) if kind == h2.HEADERS and sid == 1]
    finally:
        raw.close()
    assert ("grpc-accept-encoding", "identity") in blocks[0]


def test_a_call_the_client_cancels_tells_its_handler(toy: Toy) -> None:
    with grpc.insecure_channel(toy.url) as channel, pytest.raises(grpc.RpcError) as caught:
        _unary(channel, "Never")(b"", timeout=0.3)
    assert caught.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
    _wait_for(lambda: toy.cancelled == ["/t.T/Never"])
    assert _serving(toy)


def test_stopping_lets_calls_in_progress_finish_and_refuses_new_connections(toy: Toy) -> None:
    with grpc.insecure_channel(toy.url) as channel:
        answer = _unary(channel, "Later").future(b"in flight", timeout=10)
        time.sleep(0.01)
        asyncio.run_coroutine_threadsafe(toy.server.stop(5.0), toy.loop).result(10)
        assert answer.result() == b"in flight"
    with pytest.raises(OSError):
        socket.create_connection(("127.0.0.1", toy.port), timeout=2).close()


# -- with a raw HTTP/2 client -------------------------------------------------------------------


class Raw:
    """An HTTP/2 client that sends what it is told, frame by frame, and reads what comes back."""

    def __init__(self, port: int, preface: bytes = h2.PREFACE, settings: bytes = b"") -> None:
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=10)
        self.encoder = hpack.Encoder()
        self.buf = b""
        self.closed = False
        self.sock.sendall(preface + h2.frame(h2.SETTINGS, 0, 0, settings))

    def headers(
        self, stream_id: int, path: str, extra: tuple[tuple[str, str], ...] = (), flags: int = 0
    ) -> None:
        fields = [
            (":method", "POST"),
            (":scheme", "http"),
            (":path", path),
            (":authority", "x"),
            ("content-type", "application/grpc"),
            *extra,
        ]
        block = self.encoder.encode(fields)
        self.sock.sendall(h2.frame(h2.HEADERS, h2.END_HEADERS | flags, stream_id, block))

    def message(self, stream_id: int, payload: bytes, compressed: int = 0, end: bool = True) -> None:
        body = bytes((compressed,)) + struct.pack(">I", len(payload)) + payload
        self.send(h2.DATA, h2.END_STREAM if end else 0, stream_id, body)

    def send(self, kind: int, flags: int, stream_id: int, payload: bytes = b"") -> None:
        self.sock.sendall(h2.frame(kind, flags, stream_id, payload))

    def frames(self, timeout_s: float = 10.0) -> Iterator[tuple[int, int, int, bytes]]:
        """Frames as they arrive, until the connection closes or ``timeout_s`` passes."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            while len(self.buf) >= 9 and len(self.buf) >= 9 + int.from_bytes(self.buf[:3], "big"):
                length = int.from_bytes(self.buf[:3], "big")
                kind, flags = self.buf[3], self.buf[4]
                stream_id = struct.unpack(">I", self.buf[5:9])[0] & 0x7FFFFFFF
                payload, self.buf = self.buf[9 : 9 + length], self.buf[9 + length :]
                yield kind, flags, stream_id, payload
            self.sock.settimeout(max(0.01, deadline - time.monotonic()))
            try:
                chunk = self.sock.recv(1 << 20)
            except TimeoutError:
                return
            except ConnectionResetError:
                self.closed = True
                return
            if not chunk:
                self.closed = True
                return
            self.buf += chunk

    def status(self, stream_id: int) -> tuple[str, str]:
        """The grpc-status and grpc-message the server ends ``stream_id`` with."""
        decoder = hpack.Decoder()
        for kind, flags, sid, payload in self.frames():
            if kind == h2.HEADERS and sid == stream_id:
                fields = dict(decoder.decode(payload))
                if flags & h2.END_STREAM:
                    return fields.get("grpc-status", ""), urllib.parse.unquote(fields.get("grpc-message", ""))
        raise AssertionError(f"stream {stream_id} never ended")

    def goaway(self) -> int | None:
        """The error code of the GOAWAY the server sends before it closes, None when it closes without one."""
        for kind, _, _, payload in self.frames():
            if kind == h2.GOAWAY:
                return int(struct.unpack(">I", payload[4:8])[0])
        return None

    def close(self) -> None:
        self.sock.close()


@pytest.fixture
def raw(toy: Toy) -> Iterator[Raw]:
    client = Raw(toy.port)
    yield client
    client.close()


def test_the_server_ends_a_call_past_its_grpc_timeout(toy: Toy, raw: Raw) -> None:
    raw.headers(1, "/t.T/Never", (("grpc-timeout", "200m"),))
    raw.message(1, b"")
    started = time.monotonic()
    assert raw.status(1) == (str(grpc.StatusCode.DEADLINE_EXCEEDED.value[0]), "Deadline Exceeded")
    assert 0.15 < time.monotonic() - started < 5
    _wait_for(lambda: toy.cancelled == ["/t.T/Never"])


@pytest.mark.parametrize("timeout", ["", "1x", "123456789S", "-1S", "S"])
def test_a_malformed_grpc_timeout_is_invalid_argument(raw: Raw, timeout: str) -> None:
    raw.headers(1, "/t.T/Echo", (("grpc-timeout", timeout),))
    raw.message(1, b"x")
    assert raw.status(1)[0] == str(grpc.StatusCode.INVALID_ARGUMENT.value[0])


def test_a_compressed_message_is_refused_before_it_is_read_whatever_its_encoding(toy: Toy, raw: Raw) -> None:
    bomb = gzip.compress(bytes(MAX_MESSAGE))
    raw.headers(1, "/t.T/Echo", (("grpc-encoding", "gzip"),))
    raw.message(1, bomb, compressed=1)
    status, message = raw.status(1)
    assert status == str(grpc.StatusCode.UNIMPLEMENTED.value[0]) and "'gzip'" in message
    raw.headers(3, "/t.T/Echo")
    raw.message(3, b"xx", compressed=1)
    assert raw.status(3)[0] == str(grpc.StatusCode.UNIMPLEMENTED.value[0])
    raw.headers(5, "/t.T/Echo")
    raw.message(5, b"xx", compressed=2)
    assert raw.status(5)[0] == str(grpc.StatusCode.INTERNAL.value[0])
    assert _serving(toy)


def test_a_unary_call_with_two_messages_or_none_is_invalid_argument(raw: Raw) -> None:
    raw.headers(1, "/t.T/Echo")
    raw.message(1, b"one", end=False)
    raw.message(1, b"two")
    assert raw.status(1)[0] == str(grpc.StatusCode.INVALID_ARGUMENT.value[0])
    raw.headers(3, "/t.T/Echo", flags=h2.END_STREAM)
    assert raw.status(3)[0] == str(grpc.StatusCode.INVALID_ARGUMENT.value[0])


def test_a_request_that_ends_inside_its_message_is_refused(raw: Raw) -> None:
    raw.headers(1, "/t.T/Echo")
    raw.send(h2.DATA, h2.END_STREAM, 1, b"\x00\x00\x00\x00\x10abc")
    assert raw.status(1)[0] == str(grpc.StatusCode.INTERNAL.value[0])


def test_a_message_split_over_many_frames_is_put_together(raw: Raw) -> None:
    message = bytes(range(256)) * 40
    body = b"\x00" + struct.pack(">I", len(message)) + message
    raw.headers(1, "/t.T/Echo")
    for start in range(0, len(body), 7):
        raw.send(h2.DATA, h2.END_STREAM if start + 7 >= len(body) else 0, 1, body[start : start + 7])
    data = b"".join(p for kind, _, sid, p in raw.frames(2) if kind == h2.DATA and sid == 1)
    assert data[5:] == message


@pytest.mark.parametrize(
    ("send", "code"),
    [
        (lambda raw: raw.headers(2, "/t.T/Echo"), h2.PROTOCOL_ERROR),
        (lambda raw: raw.send(h2.HEADERS, h2.END_HEADERS, 1, b"\xff\xff\xff\xff\xff"), h2.COMPRESSION_ERROR),
        (
            lambda raw: raw.sock.sendall(
                struct.pack(">I", (2 << 20) << 8 | h2.DATA)[:4] + b"\x00" + b"\x00" * 4
            ),
            h2.FRAME_SIZE_ERROR,
        ),
        (lambda raw: raw.send(h2.PING, 0, 0, b"short"), h2.FRAME_SIZE_ERROR),
        (lambda raw: raw.send(h2.DATA, 0, 9, b"\x00" * 5), h2.PROTOCOL_ERROR),
        (lambda raw: raw.send(h2.WINDOW_UPDATE, 0, 0, struct.pack(">I", 2**31 - 1)), h2.FLOW_CONTROL_ERROR),
        (lambda raw: raw.send(h2.SETTINGS, 0, 0, b"\x00\x05\x00\x00\x00\x01"), h2.PROTOCOL_ERROR),
        (lambda raw: raw.send(h2.CONTINUATION, h2.END_HEADERS, 1, b"\x82"), h2.PROTOCOL_ERROR),
    ],
    ids=[
        "even-stream",
        "hpack-garbage",
        "frame-too-large",
        "short-ping",
        "data-on-idle-stream",
        "window-overflow",
        "bad-max-frame-size",
        "stray-continuation",
    ],
)
def test_a_protocol_violation_ends_its_connection_with_goaway_and_others_are_served(
    toy: Toy, raw: Raw, send: Any, code: int
) -> None:
    send(raw)
    assert raw.goaway() == code
    assert _serving(toy)


def test_a_connection_without_the_preface_is_closed_and_others_are_served(toy: Toy) -> None:
    client = Raw(toy.port, preface=b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
    try:
        kinds = [kind for kind, _, _, _ in client.frames(5)]
        assert client.closed
        # Only what the server sends as a connection opens (its settings and window) may precede the close.
        assert set(kinds) <= {h2.SETTINGS, h2.WINDOW_UPDATE}
    finally:
        client.close()
    assert _serving(toy)


def test_a_request_sent_a_byte_at_a_time_is_answered(raw: Raw) -> None:
    block = raw.encoder.encode(
        [(":method", "POST"), (":path", "/t.T/Echo"), ("content-type", "application/grpc")]
    )
    wire = h2.frame(h2.HEADERS, h2.END_HEADERS, 1, block) + h2.frame(
        h2.DATA, h2.END_STREAM, 1, b"\x00" + struct.pack(">I", 3) + b"abc"
    )
    for i in range(len(wire)):
        raw.sock.sendall(wire[i : i + 1])
    assert raw.status(1) == ("0", "")


def test_pings_are_answered_and_settings_acknowledged(raw: Raw) -> None:
    raw.send(h2.PING, 0, 0, b"12345678")
    seen = list(raw.frames(1))
    assert (h2.PING, h2.ACK, 0, b"12345678") in seen
    assert any(kind == h2.SETTINGS and flags & h2.ACK for kind, flags, _, _ in seen)


def test_a_client_reset_stream_is_forgotten_and_the_connection_goes_on(toy: Toy, raw: Raw) -> None:
    raw.headers(1, "/t.T/Never")
    raw.message(1, b"")
    raw.send(h2.RST_STREAM, 0, 1, struct.pack(">I", h2.CANCEL))
    _wait_for(lambda: toy.cancelled == ["/t.T/Never"])
    raw.headers(3, "/t.T/Echo")
    raw.message(3, b"after")
    assert raw.status(3) == ("0", "")


def test_a_paused_stream_is_granted_no_window_and_a_client_that_sends_past_it_is_reset(raw: Raw) -> None:
    raw.headers(1, "/t.T/Hold")
    raw.message(1, b"first", end=False)  # the handler pauses the call on it
    time.sleep(0.2)
    chunk = bytes(h2.STREAM_WINDOW // 2)
    raw.send(h2.DATA, 0, 1, chunk)
    updates = [p for kind, _, sid, p in raw.frames(1) if kind == h2.WINDOW_UPDATE and sid == 1]
    assert updates == []  # nothing granted back while paused
    raw.send(h2.DATA, 0, 1, chunk)
    raw.send(h2.DATA, 0, 1, chunk)  # past the stream's window
    resets = [p for kind, _, sid, p in raw.frames(2) if kind == h2.RST_STREAM and sid == 1]
    assert resets == [struct.pack(">I", h2.FLOW_CONTROL_ERROR)]
    raw.headers(3, "/t.T/Echo")
    raw.message(3, b"after")
    assert raw.status(3) == ("0", "")


def test_a_connection_without_its_preface_in_time_is_closed(strict: Toy) -> None:
    with socket.create_connection(("127.0.0.1", strict.port), timeout=10) as sock:
        sock.sendall(h2.PREFACE[:10])
        started = time.monotonic()
        while sock.recv(65536):
            pass
        assert 0.25 < time.monotonic() - started < 5


def test_a_frame_left_unfinished_ends_its_connection_with_goaway(strict: Toy) -> None:
    client = Raw(strict.port)
    try:
        client.sock.sendall(h2.frame(h2.PING, 0, 0, b"12345678")[:12])
        assert client.goaway() == h2.ENHANCE_YOUR_CALM
    finally:
        client.close()


def test_a_unary_request_that_does_not_arrive_in_time_is_deadline_exceeded_and_a_stream_may_idle(
    strict: Toy,
) -> None:
    client = Raw(strict.port)
    try:
        client.headers(1, "/t.T/Chat")
        client.headers(3, "/t.T/Echo")
        client.message(3, b"half", end=False)
        status, message = client.status(3)
        assert status == str(grpc.StatusCode.DEADLINE_EXCEEDED.value[0]) and "did not arrive" in message
        time.sleep(0.5)
        client.message(1, b"still open")  # the idle stream is still served
        data = [p for kind, _, sid, p in client.frames(2) if kind == h2.DATA and sid == 1]
        assert data == [b"\x00" + struct.pack(">I", 10) + b"still open"]
    finally:
        client.close()


def test_a_stream_message_left_unfinished_ends_the_stream(strict: Toy) -> None:
    client = Raw(strict.port)
    try:
        client.headers(1, "/t.T/Chat")
        client.message(1, b"whole", end=False)
        client.send(h2.DATA, 0, 1, b"\x00" + struct.pack(">I", 100) + b"part")  # 4 of 100 bytes, then nothing
        status, message = client.status(1)
    finally:
        client.close()
    assert status == str(grpc.StatusCode.DEADLINE_EXCEEDED.value[0]) and "of its start" in message


def test_connections_past_the_limit_are_refused_with_goaway(strict: Toy) -> None:
    first, second = Raw(strict.port), Raw(strict.port)
    try:
        list(second.frames(0.3))
        third = Raw(strict.port)
        try:
            assert third.goaway() == h2.ENHANCE_YOUR_CALM
            list(third.frames(2))
            assert third.closed
        finally:
            third.close()
        first.close()
        time.sleep(0.2)
        fourth = Raw(strict.port)
        try:
            fourth.headers(1, "/t.T/Echo")
            fourth.message(1, b"room again")
            assert fourth.status(1) == ("0", "")
        finally:
            fourth.close()
    finally:
        second.close()


def test_calls_a_client_resets_count_against_its_streams_until_their_work_is_over(toy: Toy, raw: Raw) -> None:
    # Rapid reset: each call is sent whole and reset at once; its handler's work goes on (Never holds it).
    for stream_id in range(1, 2 * (h2.MAX_CONCURRENT_STREAMS + 50), 2):
        raw.headers(stream_id, "/t.T/Never")
        raw.message(stream_id, b"")
        raw.send(h2.RST_STREAM, 0, stream_id, struct.pack(">I", h2.CANCEL))
    refused = [
        sid
        for kind, _, sid, p in raw.frames(2)
        if kind == h2.RST_STREAM and p == struct.pack(">I", h2.REFUSED_STREAM)
    ]
    assert len(refused) == 50  # the calls past the limit were never started
    assert len(toy.cancelled) == h2.MAX_CONCURRENT_STREAMS


def test_a_released_call_frees_its_place(toy: Toy, raw: Raw) -> None:
    for stream_id in range(1, 2 * h2.MAX_CONCURRENT_STREAMS + 1, 2):
        raw.headers(stream_id, "/t.T/Release")
        raw.message(stream_id, b"")
        raw.send(h2.RST_STREAM, 0, stream_id, struct.pack(">I", h2.CANCEL))
    time.sleep(0.3)  # Release's handler says its work is over 0.05 s after the reset
    raw.headers(1001, "/t.T/Echo")
    raw.message(1001, b"room")
    assert raw.status(1001) == ("0", "")


def test_a_call_its_admission_refuses_is_answered_before_its_message_is_sent(raw: Raw) -> None:
    raw.headers(1, "/t.T/Keyed")  # no message yet, no end of stream
    assert raw.status(1) == (str(grpc.StatusCode.UNAUTHENTICATED.value[0]), "no key")
    resets = [p for kind, _, sid, p in raw.frames(1) if kind == h2.RST_STREAM and sid == 1]
    assert resets == [struct.pack(">I", h2.NO_ERROR)]  # the client is told to send nothing more
    raw.headers(3, "/t.T/Keyed", (("x-key", "ok"),))
    raw.message(3, b"12345")
    data = [p for kind, _, sid, p in raw.frames(1) if kind == h2.DATA and sid == 3]
    assert data == [b"\x00\x00\x00\x00\x015"]


def test_a_stream_whose_answers_are_not_read_stops_taking_messages_until_they_are(toy: Toy) -> None:
    closed_window = struct.pack(">HI", h2.SETTINGS_INITIAL_WINDOW_SIZE, 0)
    client = Raw(toy.port, settings=closed_window)  # grants the server no window for answers
    try:
        client.headers(1, "/t.T/Chat")
        message = bytes(1024)
        for _ in range(1100):  # within the windows granted until delivery stops
            client.message(1, message, end=False)
        list(client.frames(1))
        # Delivery stops once ANSWER_BACKLOG_BYTES of answers wait; the rest of the messages wait with them.
        assert toy.delivered <= h2.ANSWER_BACKLOG_BYTES // 1029 + 1
        client.send(h2.SETTINGS, 0, 0, struct.pack(">HI", h2.SETTINGS_INITIAL_WINDOW_SIZE, 8 << 20))
        client.send(h2.WINDOW_UPDATE, 0, 0, struct.pack(">I", 16 << 20))
        client.send(h2.DATA, h2.END_STREAM, 1)
        data = b"".join(p for kind, _, sid, p in client.frames(3) if kind == h2.DATA and sid == 1)
    finally:
        client.close()
    assert toy.delivered == 1100
    assert data == (b"\x00" + struct.pack(">I", 1024) + message) * 1100


def test_messages_that_waited_on_a_paused_stream_are_handed_over_without_recursion(toy: Toy) -> None:
    messages = [b"first"] + [b"m%d" % i for i in range(3000)]
    with grpc.insecure_channel(toy.url) as channel:
        gate = channel.stream_stream("/t.T/Gate", request_serializer=None, response_deserializer=None)
        assert list(gate(iter(messages), timeout=30)) == messages


async def test_many_large_requests_at_once_on_one_connection_all_complete() -> None:
    # More unfinished request data than the connection's buffer: the oldest stream is always fed, so each
    # completes in turn instead of all waiting for a window.
    with _running(buffer_bytes=1 << 20) as toy:
        async with grpc.aio.insecure_channel(toy.url, options=OPTIONS) as channel:
            length = channel.unary_unary("/t.T/Length", request_serializer=None, response_deserializer=None)
            sizes = [(1 << 20) + i * 1000 for i in range(12)]
            answers = await asyncio.wait_for(
                asyncio.gather(*(length(bytes(size), timeout=60) for size in sizes)), 60
            )
    assert answers == [str(size).encode() for size in sizes]


def test_streams_held_back_behind_a_stalled_oldest_one_are_fed_once_it_is_gone() -> None:
    # More unfinished request data than the connection's buffer, and the oldest stream stalls mid-message:
    # only it was being fed. Once the client resets it, the next oldest must be fed, and so on.
    with _running(buffer_bytes=1 << 20) as toy:
        client = Raw(toy.port)
        try:
            client.headers(1, "/t.T/Echo")
            client.send(h2.DATA, 0, 1, b"\x00" + struct.pack(">I", 2 << 20) + bytes(200_000))  # then nothing
            sizes = {sid: 900_000 for sid in range(3, 15, 2)}
            for sid in sizes:
                client.headers(sid, "/t.T/Length")
            answers = _upload_obeying_windows(client, sizes, reset_after_s=1.5, reset_stream=1, timeout_s=10)
        finally:
            client.close()
    assert answers == {sid: b"\x00" + struct.pack(">I", 6) + b"900000" for sid in sizes}


def _upload_obeying_windows(
    client: Raw, sizes: dict[int, int], reset_after_s: float, reset_stream: int, timeout_s: float
) -> dict[int, bytes]:
    """Sends a message of ``sizes[sid]`` bytes on each stream, no more at a time than its window allows (256 KiB
    at first, then what WINDOW_UPDATEs grant); resets ``reset_stream`` after ``reset_after_s``; returns the
    DATA each stream is answered with."""
    bodies = {sid: b"\x00" + struct.pack(">I", n) + bytes(n) for sid, n in sizes.items()}
    sent = dict.fromkeys(sizes, 0)
    window = dict.fromkeys(sizes, h2.STREAM_WINDOW)
    answers: dict[int, bytes] = {}
    started = time.monotonic()
    reset = False
    while len(answers) < len(sizes) and time.monotonic() - started < timeout_s:
        for sid, body in bodies.items():
            chunk = body[sent[sid] : sent[sid] + window[sid]]  # one frame: windows stay under 1 MiB
            if chunk:
                end = sent[sid] + len(chunk) == len(body)
                client.send(h2.DATA, h2.END_STREAM if end else 0, sid, chunk)
                sent[sid] += len(chunk)
                window[sid] -= len(chunk)
        if not reset and time.monotonic() - started > reset_after_s:
            client.send(h2.RST_STREAM, 0, reset_stream, struct.pack(">I", h2.CANCEL))
            reset = True
        for kind, _, sid, payload in client.frames(0.02):
            if kind == h2.WINDOW_UPDATE and sid in window:
                window[sid] += struct.unpack(">I", payload)[0]
            elif kind == h2.DATA and sid in sizes:
                answers[sid] = answers.get(sid, b"") + payload
    return answers


# -- the header codec ---------------------------------------------------------------------------


@given(name=st.binary(min_size=1, max_size=300), value=st.binary(max_size=5000))
def test_a_literal_decodes_to_its_name_and_value(name: bytes, value: bytes) -> None:
    assert hpack.Decoder().decode(h2.literal(name, value), raw=True) == [(name, value)]


@given(message=st.text(max_size=300))
def test_a_percent_encoded_message_is_printable_ascii_and_decodes_to_itself(message: str) -> None:
    encoded = h2.percent_encode(message)
    assert all(0x20 <= b <= 0x7E for b in encoded)
    assert urllib.parse.unquote_to_bytes(encoded) == message.encode("utf-8", "replace")


_FIELD_NAMES = st.sampled_from([":path", ":method", "content-type", "authorization", "x-a", "x-" + "n" * 200])
_FIELD = st.tuples(
    _FIELD_NAMES,
    st.one_of(st.sampled_from(["POST", "application/grpc", "Bearer k"]), st.text(max_size=300)),
    st.booleans(),  # sensitive: never indexed
)


@given(
    sent=st.lists(st.lists(_FIELD, max_size=8), min_size=1, max_size=4),
    huffman=st.booleans(),
    table_size=st.sampled_from([None, 0, 256, 4096]),
    cut=st.integers(min_value=0, max_value=5),
)
def test_a_block_remembered_leaves_hpacks_table_as_it_is(
    sent: list[list[tuple[str, str, bool]]], huffman: bool, table_size: int | None, cut: int
) -> None:
    encoder = hpack.Encoder()
    decoder = hpack.Decoder()
    if table_size is not None:
        encoder.header_table_size = table_size
    for fields in sent:  # the same fields sent again come out indexed
        block = encoder.encode([_header(*field) for field in fields], huffman=huffman)
        before = list(decoder.header_table.dynamic_entries)
        decoder.decode(block)
        if h2._leaves_table(block):
            assert list(decoder.header_table.dynamic_entries) == before
        assert isinstance(h2._leaves_table(block[: len(block) - cut]), bool)  # cut short: no error


@given(fields=st.lists(st.tuples(_FIELD_NAMES, st.text(max_size=20), st.booleans()), min_size=1, max_size=6))
def test_a_request_sent_again_is_remembered(fields: list[tuple[str, str, bool]]) -> None:
    encoder = hpack.Encoder()
    encoder.encode([_header(*field) for field in fields])
    assert h2._leaves_table(encoder.encode([_header(*field) for field in fields]))


def test_perf_analyzers_requests_are_remembered_from_the_second_on() -> None:
    # As perf_analyzer's gRPC client (grpc-c++) sends them: the first names its fields (incremental indexing),
    # later ones index them all but authorization, a literal not indexed.
    first = bytes.fromhex(
        "40053a706174682a2f696e666572656e63652e47525043496e666572656e6365536572766963652f4d6f64656c496e666572"
        "c58386c4c3c2c1000d617574686f72697a6174696f6e0b2042656172657220616263"
    )
    later = bytes.fromhex("bec58386c4c3c2c1000d617574686f72697a6174696f6e0b2042656172657220616263")
    assert not h2._leaves_table(first)
    assert h2._leaves_table(later)


def _header(name: str, value: str, sensitive: bool) -> hpack.HeaderTuple:
    return hpack.NeverIndexedHeaderTuple(name, value) if sensitive else hpack.HeaderTuple(name, value)


@given(value=st.integers(min_value=0, max_value=2**32), prefix=st.integers(min_value=1, max_value=8))
def test_hpack_integers_decode_to_themselves(value: int, prefix: int) -> None:
    assert decode_integer(h2._int(value, prefix), prefix) == (value, len(h2._int(value, prefix)))


def _wait_for(condition: Any, timeout_s: float = 5.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError("the condition never held")
        time.sleep(0.01)
