"""gRPC over HTTP/2 on an asyncio Protocol: the transport of the gateway's gRPC front end (grpc_server.py).

Why our own: grpc.aio does three tasks and four completion-queue events (each handed from its poller thread to
the event loop) for every call before any handler runs. Here a unary call costs one ``data_received`` that
parses its frames, one handler call and one ``write`` of its answer (headers, message and trailers in one
segment), as the HTTP/1.1 protocol does. Measured on the whole infer path under perf_analyzer (bench/README.md,
compare_triton.py): 152 / 111 / 90 µs of CPU a request at concurrency 8 / 32 / 64, against 388 / 357 / 380 µs
on grpc.aio on the same host.

What it serves: the server side of HTTP/2 (RFC 9113) as gRPC clients use it (prior knowledge, no TLS, no
upgrade), and gRPC's framing of messages (a compressed flag and a 4-byte length before each). Headers are
decoded by ``hpack``; the answers' headers are literals without indexing, so the client's decoder table is
never written. A header block that leaves the decoder's table as it is (indexed fields, literals not indexed)
decodes to what it decoded to before, until a block that changes the table arrives: such blocks are remembered
(perf_analyzer's and tritonclient's requests are such blocks from their second call on).

Methods: a ``Method`` per path, unary (its handler gets the call and the whole request message once the client
ended the stream) or streaming (its handler gets the call when the headers arrive, and the messages through
``Call.on_message``). A handler answers with ``Call.reply`` / ``Call.fail`` (unary) or ``Call.send`` then
``Call.finish``; it may do so later, from a callback on the event loop. Paths not served are UNIMPLEMENTED.

Limits: a message whose length prefix is over
``max_message_bytes`` is RESOURCE_EXHAUSTED before any of it is kept; a header list over ``max_metadata_bytes``
(each field's name and value plus 32 bytes, as HTTP/2 counts) is RESOURCE_EXHAUSTED; a content type that is
not gRPC is HTTP 415. Compressed messages are UNIMPLEMENTED (answers say ``grpc-accept-encoding: identity``): a
few kilobytes of gzip inflate to the largest message allowed, so a client could make the server hold and work
on a thousand times what it sent, where an uncompressed request costs its sender what it costs the server.
``grpc-timeout`` is honoured: DEADLINE_EXCEEDED when the answer is not written in time.

Slow and greedy clients (the HTTP/1.1 protocol's settings, passed in): beyond ``max_connections`` a new
connection gets GOAWAY and is closed; a connection must send its preface within ``header_timeout_s``, a header
block or a frame once begun must be whole within ``header_timeout_s`` / ``body_timeout_s``, a unary call's
request message within ``body_timeout_s`` of its headers and a streaming call's messages within
``body_timeout_s`` of their first bytes (DEADLINE_EXCEEDED), or the connection (the call) is ended. One sweep
(inference/sweeper.py, the HTTP protocol's too) times them all, at least every second, so the request path
reads no clock but when a call or a stream's message starts.
Streaming calls may last, and idle between messages, as long as the client likes.

Flow control: what a client may send is bounded by the windows this side grants. The connection's window is
granted again as data arrives; a stream's (``STREAM_WINDOW``) as half of it is used, unless its messages wait
for a paused handler, or the connection holds ``buffer_bytes`` of request data not yet handed over: then only
the oldest stream in the middle of a message gets more, so that it completes and frees its share (no stream
waits on a window that can never come). A client that does not grant windows for its answers is held too: a
streaming call stops taking messages while ``ANSWER_BACKLOG_BYTES`` of its answers wait, and a connection whose
waiting answers exceed ``buffer_bytes`` gets new streams refused (REFUSED_STREAM). While the socket's buffer is
over its high-water mark, reading pauses.

Cancelled work: a call the client resets, or whose deadline passes, while its handler still works keeps its
place among the connection's ``MAX_CONCURRENT_STREAMS`` until the handler says its work is over
(``Call.release``; ``reply``, ``fail`` and ``finish`` say it too): opening and resetting calls at once cannot
queue unbounded work ("rapid reset").

Threads: everything here runs on the event loop's thread.
"""

from __future__ import annotations

import asyncio
import logging
import struct
import time
from collections.abc import Callable, Iterable
from typing import Any, NamedTuple, cast

import hpack
from hpack.exceptions import HPACKError

from inference.sweeper import Sweeper, interval_for

log = logging.getLogger(__name__)

# gRPC status codes (grpc-status), as in grpc's StatusCode.
OK = 0
CANCELLED = 1
UNKNOWN = 2
INVALID_ARGUMENT = 3
DEADLINE_EXCEEDED = 4
NOT_FOUND = 5
PERMISSION_DENIED = 7
RESOURCE_EXHAUSTED = 8
UNIMPLEMENTED = 12
INTERNAL = 13
UNAVAILABLE = 14
UNAUTHENTICATED = 16

# HTTP/2 frame types, flags, settings and error codes (RFC 9113).
DATA, HEADERS, PRIORITY, RST_STREAM, SETTINGS, PUSH_PROMISE, PING, GOAWAY, WINDOW_UPDATE, CONTINUATION = (
    range(10)
)
END_STREAM = 0x1
ACK = 0x1
END_HEADERS = 0x4
PADDED = 0x8
PRIORITY_FLAG = 0x20
SETTINGS_HEADER_TABLE_SIZE = 0x1
SETTINGS_ENABLE_PUSH = 0x2
SETTINGS_MAX_CONCURRENT_STREAMS = 0x3
SETTINGS_INITIAL_WINDOW_SIZE = 0x4
SETTINGS_MAX_FRAME_SIZE = 0x5
NO_ERROR = 0x0
PROTOCOL_ERROR = 0x1
INTERNAL_ERROR = 0x2
FLOW_CONTROL_ERROR = 0x3
STREAM_CLOSED = 0x5
FRAME_SIZE_ERROR = 0x6
REFUSED_STREAM = 0x7
CANCEL = 0x8
COMPRESSION_ERROR = 0x9
ENHANCE_YOUR_CALM = 0xB

PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
DEFAULT_WINDOW = 65535
MAX_WINDOW = 2**31 - 1
# Frames we accept: larger than HTTP/2's default 16 KiB, so a large tensor costs fewer frames to parse.
OUR_MAX_FRAME_SIZE = 1 << 20
# What a stream may send before we grant more; granted again as data arrives (see the module's docstring).
STREAM_WINDOW = 256 << 10
# Streams a connection may have open at once (a client queues calls beyond it).
MAX_CONCURRENT_STREAMS = 256
# A streaming call's answers waiting for the client's window past which it stops taking requests.
ANSWER_BACKLOG_BYTES = 1 << 20
# Header blocks that leave HPACK's table as it is, remembered with what they decode to, per connection (the
# short ones only: a client's usual request is a few dozen bytes).
MAX_REMEMBERED_BLOCKS = 64
MAX_REMEMBERED_BLOCK_BYTES = 2048

_U32 = struct.Struct(">I")
_SETTING = struct.Struct(">HI")


def frame(kind: int, flags: int, stream_id: int, payload: bytes = b"") -> bytes:
    return (len(payload) << 8 | kind).to_bytes(4, "big") + bytes((flags,)) + _U32.pack(stream_id) + payload


def _int(value: int, prefix_bits: int, first: int = 0) -> bytes:
    """HPACK's integer with an N-bit prefix (RFC 7541 §5.1); ``first`` holds the bits above the prefix."""
    limit = (1 << prefix_bits) - 1
    if value < limit:
        return bytes((first | value,))
    out = bytearray((first | limit,))
    value -= limit
    while value >= 128:
        out.append(value & 0x7F | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def literal(name: bytes, value: bytes) -> bytes:
    """A header field as a literal without indexing, new name, no Huffman coding (RFC 7541 §6.2.2)."""
    return b"\x00" + _int(len(name), 7) + name + _int(len(value), 7) + value


# ':status: 200' is the static table's 8th entry; the other fields are written out.
RESPONSE_HEADERS = (
    b"\x88" + literal(b"content-type", b"application/grpc") + literal(b"grpc-accept-encoding", b"identity")
)
OK_TRAILERS = literal(b"grpc-status", b"0")


def percent_encode(message: str) -> bytes:
    """grpc-message's encoding: UTF-8, with '%' and bytes outside printable ASCII as %XX."""
    raw = message.encode("utf-8", "replace")
    if all(0x20 <= b <= 0x7E and b != 0x25 for b in raw):
        return raw
    return b"".join(bytes((b,)) if 0x20 <= b <= 0x7E and b != 0x25 else b"%%%02X" % b for b in raw)


def status_block(code: int, message: str, extra: Iterable[tuple[str, str]] = ()) -> bytes:
    block = literal(b"grpc-status", str(code).encode())
    if message:
        block += literal(b"grpc-message", percent_encode(message))
    for name, value in extra:
        block += literal(name.encode("latin-1"), value.encode("latin-1"))
    return block


_TIMEOUT_UNITS_S = {b"H": 3600.0, b"M": 60.0, b"S": 1.0, b"m": 1e-3, b"u": 1e-6, b"n": 1e-9}


def parse_timeout(value: bytes) -> float | None:
    """grpc-timeout (``<digits><unit>``) in seconds; None when malformed."""
    if not 2 <= len(value) <= 9 or not value[:-1].isdigit():
        return None
    unit = _TIMEOUT_UNITS_S.get(value[-1:])
    return None if unit is None else int(value[:-1]) * unit


class Method(NamedTuple):
    """How a path is served: ``handler(call, message)`` once the request message arrived (unary), or
    ``handler(call, None)`` as the headers arrive and the messages through ``call.on_message`` (streaming).
    ``admit(call)``, if given, runs as the headers arrive (unary calls): it may refuse the call (``Call.fail``)
    before its message is read, and may leave what it learnt in ``call.state``."""

    handler: Callable[[Call, bytes | None], None]
    streaming: bool = False
    admit: Callable[[Call], None] | None = None


class Call:
    """One gRPC call (an HTTP/2 stream) as its handler sees it.

    ``metadata`` holds the request's header fields that are not pseudo-headers, as sent (bytes). After
    ``reply``, ``fail`` or ``finish`` the call is ``done`` and writes nothing more; it is also done when the
    client cancels it or the connection closes (``cancelled``)."""

    __slots__ = (
        "_abandoned",
        "_buffer",
        "_conn",
        "_deadline",
        "_delivering",
        "_expected",
        "_message_since",
        "_messages",
        "_owed",
        "_paused",
        "_unary",
        "cancelled",
        "done",
        "half_closed",
        "headers_sent",
        "metadata",
        "method",
        "on_cancel",
        "on_end",
        "on_message",
        "out",
        "recv_window",
        "send_window",
        "started",
        "state",
        "stream_id",
        "trailers",
    )

    def __init__(
        self, conn: GrpcConnection, stream_id: int, method: str, metadata: list[tuple[bytes, bytes]]
    ) -> None:
        self._conn = conn
        self.started = time.monotonic()
        self.stream_id = stream_id
        self.method = method
        self.metadata = metadata
        self.done = False
        self.cancelled = False
        self.half_closed = False  # the client ended its side
        self.headers_sent = False
        self.on_message: Callable[[bytes], None] | None = None
        self.on_end: Callable[[], None] | None = None
        self.on_cancel: Callable[[], None] | None = None
        self.state: Any = None  # the application's, set by its admit
        self.recv_window = STREAM_WINDOW
        self.send_window = conn.peer_initial_window
        self.out = bytearray()  # DATA payload waiting for the client's window
        self.trailers: bytes | None = None  # the trailers' header block, written once ``out`` is
        self._buffer = bytearray()  # request bytes not yet a whole message
        self._expected = -1  # the length of the message being read, -1 before its prefix
        # Whole messages not yet handed over (unary: the one; streaming: those waiting while the call is paused
        # or its answers wait for the client's window).
        self._messages: list[bytes] = []
        self._message_since = 0.0  # when the message being read began (streaming calls)
        self._paused = False
        self._owed = False  # its handler runs or has work in progress (set before the handler is called)
        self._abandoned = False  # ended while owed: counted in the connection's ``abandoned``
        self._delivering = False
        self._unary = True
        self._deadline: asyncio.TimerHandle | None = None

    def header(self, name: bytes) -> bytes | None:
        for key, value in self.metadata:
            if key == name:
                return value
        return None

    # -- answering ---------------------------------------------------------------------------

    def reply(self, message: bytes) -> None:
        """A unary call's answer: headers, the message and an OK status, in one write when the windows allow."""
        self.release()
        if self.done:
            return
        self.done = True
        self._conn.respond(self, _message(message), OK_TRAILERS)

    def fail(self, code: int, message: str, trailers: Iterable[tuple[str, str]] = ()) -> None:
        """Ends the call with a status other than OK (headers and status in one frame when nothing was sent)."""
        self.release()
        self._end(code, message, trailers)

    def release(self) -> None:
        """Says the handler's work for this call is over. ``reply``, ``fail`` and ``finish`` say it too; a call
        that ended without them (the client cancelled it, its deadline passed) counts against its connection's
        streams until its handler says so, so that cancelled work cannot pile up behind a client that opens
        and resets calls at once."""
        if self._abandoned:
            self._abandoned = False
            self._conn.abandoned -= 1
        self._owed = False

    def _end(self, code: int, message: str, trailers: Iterable[tuple[str, str]] = ()) -> None:
        if self.done:
            return
        self.done = True
        self._conn.respond(self, b"", status_block(code, message, trailers))

    def send(self, message: bytes) -> None:
        """One message of a streaming answer."""
        if not self.done:
            self._conn.send_data(self, _message(message))

    def finish(self, code: int = OK, message: str = "") -> None:
        """Ends a streaming answer with its status."""
        self.release()
        if self.done:
            return
        self.done = True
        self._conn.respond(
            self, b"", OK_TRAILERS if code == OK and not message else status_block(code, message)
        )

    # -- flow of requests (streaming calls) --------------------------------------------------

    def pause(self) -> None:
        """Stop handing messages to ``on_message`` (they wait, and the client's window is not granted again)."""
        self._paused = True

    def resume(self) -> None:
        if not self._paused:
            return
        self._paused = False
        self._conn.deliver(self)


def _message(payload: bytes) -> bytes:
    return b"\x00" + _U32.pack(len(payload)) + payload


class GrpcConnection(asyncio.Protocol):
    """One client connection: HTTP/2 frames in, calls to ``methods`` out. Built by ``GrpcServer``."""

    def __init__(self, server: GrpcServer) -> None:
        self.server = server
        self.transport: asyncio.Transport | None = None
        self.calls: dict[int, Call] = {}
        self.peer_initial_window = DEFAULT_WINDOW
        self.peer_max_frame = 16384
        self.send_window = DEFAULT_WINDOW  # the connection's, granted by the client
        self._recv_window = DEFAULT_WINDOW  # the connection's, granted by us
        self._buffered = 0  # request bytes held in calls, not yet handed to a handler
        self._buf = bytearray()  # the start of a frame not yet whole
        self._need = 0  # the bytes _buf must hold before it is worth parsing again
        self._preface = False
        self._decoder = hpack.Decoder()
        # Past this a header block is a connection error (HPACK's state is then lost); under it, a list over
        # max_metadata_bytes is refused for its call alone.
        self._decoder.max_header_list_size = server.max_header_block_bytes
        self._decoder.max_allowed_table_size = 65536
        self._blocks: dict[bytes, list[tuple[bytes, bytes]]] = {}
        self._header_block: bytearray | None = None  # a header block waiting for its CONTINUATIONs
        self._header_stream = 0
        self._header_flags = 0
        self._last_stream = 0
        self._going_away = False
        self._write_paused = False
        self._read_paused = False
        self._blocked: dict[int, Call] = {}  # calls with DATA waiting for a window
        self._starved: set[int] = set()  # streams whose window _grant held back
        # Calls ended (cancelled, past their deadline) whose handlers still work (see Call.release).
        self.abandoned = 0
        self._out: list[bytes] = []  # frames to write at the end of this read
        self._reading = False  # inside data_received: answers leave with the frames of the same read
        self._opened = 0.0
        self._partial_since = 0.0  # when the bytes of an unfinished frame or header block began to wait

    # -- asyncio.Protocol --------------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport
        self._opened = time.monotonic()
        if len(self.server.connections) >= self.server.max_connections:
            log.warning("gRPC connection refused: %d open, the limit", len(self.server.connections))
            transport.write(
                frame(GOAWAY, 0, 0, _U32.pack(0) + _U32.pack(ENHANCE_YOUR_CALM) + b"too many connections")
            )
            transport.close()
            return
        self.server.connections.add(self)
        if self.server._sweeper is not None:
            self.server._sweeper.watch()
        settings = (
            _SETTING.pack(SETTINGS_MAX_CONCURRENT_STREAMS, MAX_CONCURRENT_STREAMS)
            + _SETTING.pack(SETTINGS_INITIAL_WINDOW_SIZE, STREAM_WINDOW)
            + _SETTING.pack(SETTINGS_MAX_FRAME_SIZE, OUR_MAX_FRAME_SIZE)
        )
        grant = self.server.buffer_bytes
        self._recv_window += grant
        transport.write(frame(SETTINGS, 0, 0, settings) + frame(WINDOW_UPDATE, 0, 0, _U32.pack(grant)))

    def connection_lost(self, exc: Exception | None) -> None:
        self.server.connections.discard(self)
        calls, self.calls = self.calls, {}
        for call in calls.values():
            self._cancelled(call)
        self.transport = None
        self.server.connection_closed()

    def pause_writing(self) -> None:
        self._write_paused = True
        if self.transport is not None and not self._read_paused:
            self._read_paused = True
            self.transport.pause_reading()

    def resume_writing(self) -> None:
        self._write_paused = False
        if self.transport is not None and self._read_paused:
            self._read_paused = False
            self.transport.resume_reading()

    def data_received(self, data: bytes) -> None:
        self._reading = True
        try:
            self._read(data)
        finally:
            self._reading = False
        self._flush()

    def _read(self, data: bytes) -> None:
        if self._buf:
            # An unfinished frame waits: bytes that do not finish it are only appended (a frame sent in small
            # pieces must not cost a copy of all it has so far per piece).
            self._buf += data
            if len(self._buf) < self._need:
                return
            buf = bytes(self._buf)
            self._buf = bytearray()
        else:
            buf = data
        if not self._preface:
            if len(buf) < len(PREFACE):
                if not PREFACE.startswith(buf):
                    self._close()
                    return
                self._buf = bytearray(buf)
                self._need = len(PREFACE)
                return
            if not buf.startswith(PREFACE):
                self._close()
                return
            self._partial_since = 0.0
            buf = buf[len(PREFACE) :]
            self._preface = True
        pos = 0
        end = len(buf)
        try:
            while end - pos >= 9:
                head = int.from_bytes(buf[pos : pos + 4], "big")
                length = head >> 8
                if length > OUR_MAX_FRAME_SIZE:
                    raise _ConnectionError(FRAME_SIZE_ERROR, f"a frame of {length} bytes")
                if end - pos - 9 < length:
                    break
                flags = buf[pos + 4]
                stream_id = _U32.unpack_from(buf, pos + 5)[0] & 0x7FFFFFFF
                payload = buf[pos + 9 : pos + 9 + length]
                pos += 9 + length
                self._frame(head & 0xFF, flags, stream_id, payload)
                if self.transport is None:
                    return
        except _ConnectionError as exc:
            self._goaway(exc.code, exc.message)
            return
        if pos < end:
            if pos or not self._partial_since:
                self._partial_since = time.monotonic()
            self._buf = bytearray(buf[pos:])
            self._need = 9 + (int.from_bytes(buf[pos : pos + 3], "big") if end - pos >= 9 else 0)
        elif self._header_block is None:
            self._partial_since = 0.0

    # -- frames in ---------------------------------------------------------------------------

    def _frame(self, kind: int, flags: int, stream_id: int, payload: bytes) -> None:
        if self._header_block is not None and kind != CONTINUATION:
            raise _ConnectionError(PROTOCOL_ERROR, "a header block interrupted")
        if kind == DATA:
            self._data(flags, stream_id, payload)
        elif kind == HEADERS:
            if stream_id == 0:
                raise _ConnectionError(PROTOCOL_ERROR, "HEADERS on stream 0")
            if flags & PADDED:
                payload = _unpad(payload)
            if flags & PRIORITY_FLAG:
                payload = payload[5:]
            self._header_stream = stream_id
            self._header_flags = flags
            if flags & END_HEADERS:
                self._headers(stream_id, flags, payload)
            else:
                self._header_block = bytearray(payload)
                self._partial_since = self._partial_since or time.monotonic()
        elif kind == CONTINUATION:
            block = self._header_block
            if block is None or stream_id != self._header_stream:
                raise _ConnectionError(PROTOCOL_ERROR, "an unexpected CONTINUATION")
            block += payload
            if len(block) > self.server.max_header_block_bytes:
                raise _ConnectionError(
                    ENHANCE_YOUR_CALM, f"a header block over {self.server.max_header_block_bytes} bytes"
                )
            if flags & END_HEADERS:
                self._header_block = None
                self._headers(stream_id, self._header_flags, bytes(block))
        elif kind == SETTINGS:
            if not flags & ACK:
                self._settings(payload)
                self._out.append(frame(SETTINGS, ACK, 0))
        elif kind == WINDOW_UPDATE:
            self._window_update(stream_id, payload)
        elif kind == PING:
            if len(payload) != 8:
                raise _ConnectionError(FRAME_SIZE_ERROR, "a PING of other than 8 bytes")
            if not flags & ACK:
                self._out.append(frame(PING, ACK, 0, payload))
        elif kind == RST_STREAM:
            call = self.calls.pop(stream_id, None)
            if call is not None:
                self._forget(call)
                self._cancelled(call)
        elif kind == GOAWAY:
            self._going_away = True
        elif kind == PUSH_PROMISE:
            raise _ConnectionError(PROTOCOL_ERROR, "a client may not push")
        # PRIORITY and unknown frame types are ignored, as RFC 9113 asks.

    def _settings(self, payload: bytes) -> None:
        if len(payload) % 6:
            raise _ConnectionError(FRAME_SIZE_ERROR, "a SETTINGS frame of a length not a multiple of 6")
        for offset in range(0, len(payload), 6):
            key, value = _SETTING.unpack_from(payload, offset)
            if key == SETTINGS_INITIAL_WINDOW_SIZE:
                if value > MAX_WINDOW:
                    raise _ConnectionError(FLOW_CONTROL_ERROR, "an initial window over 2^31-1")
                delta = value - self.peer_initial_window
                self.peer_initial_window = value
                for call in self.calls.values():
                    call.send_window += delta
                if delta > 0:
                    self._unblock()
            elif key == SETTINGS_MAX_FRAME_SIZE:
                if not 16384 <= value <= 16777215:
                    raise _ConnectionError(PROTOCOL_ERROR, "a max frame size out of range")
                self.peer_max_frame = value

    def _window_update(self, stream_id: int, payload: bytes) -> None:
        if len(payload) != 4:
            raise _ConnectionError(FRAME_SIZE_ERROR, "a WINDOW_UPDATE of other than 4 bytes")
        increment = _U32.unpack(payload)[0] & 0x7FFFFFFF
        if stream_id == 0:
            self.send_window += increment
            if self.send_window > MAX_WINDOW:
                raise _ConnectionError(FLOW_CONTROL_ERROR, "the connection's window over 2^31-1")
            self._unblock()
            return
        call = self.calls.get(stream_id)
        if call is not None:
            call.send_window += increment
            if call.out or call.trailers is not None:
                self._write_out(call)
                if call._messages and not call._unary:
                    self.deliver(call)

    def _headers(self, stream_id: int, flags: int, block: bytes) -> None:
        fields = self._blocks.get(block)
        if fields is None:
            try:
                fields = cast(list[tuple[bytes, bytes]], self._decoder.decode(block, raw=True))
            except HPACKError as exc:
                raise _ConnectionError(
                    COMPRESSION_ERROR, f"a header block HPACK cannot decode: {exc}"
                ) from None
            if len(block) <= MAX_REMEMBERED_BLOCK_BYTES and _leaves_table(block):
                if len(self._blocks) >= MAX_REMEMBERED_BLOCKS:
                    self._blocks.clear()
                self._blocks[block] = fields
            else:
                self._blocks.clear()  # the block may have changed the decoder's table
        call = self.calls.get(stream_id)
        if call is not None:  # trailers from the client: its side ends
            if flags & END_STREAM:
                self._end_of_requests(call)
            return
        if stream_id <= self._last_stream or not stream_id & 1:
            if stream_id & 1:  # a stream already closed
                self._out.append(frame(RST_STREAM, 0, stream_id, _U32.pack(STREAM_CLOSED)))
                return
            raise _ConnectionError(PROTOCOL_ERROR, f"a client stream with an even id ({stream_id})")
        self._last_stream = stream_id
        if self._going_away or self.server.closing:
            self._out.append(frame(RST_STREAM, 0, stream_id, _U32.pack(REFUSED_STREAM)))
            return
        if (
            len(self.calls) + self.abandoned >= MAX_CONCURRENT_STREAMS
            or self._unsent() > self.server.buffer_bytes
        ):
            # Past the limit (which clients respect; calls they reset count until their work is over, see
            # Call.release), or while the client leaves that much of its answers unread (its windows closed).
            # Unread request data does not refuse new streams (grpc clients fail a refused call as
            # UNAVAILABLE): they wait for their windows instead (_grant).
            self._out.append(frame(RST_STREAM, 0, stream_id, _U32.pack(REFUSED_STREAM)))
            return
        self._start_call(stream_id, flags, fields)

    def _start_call(self, stream_id: int, flags: int, fields: list[tuple[bytes, bytes]]) -> None:
        path = b""
        content_type = b""
        verb = b""
        metadata: list[tuple[bytes, bytes]] = []
        size = 0
        for name, value in fields:
            size += len(name) + len(value) + 32
            if name[:1] == b":":
                if name == b":path":
                    path = value
                elif name == b":method":
                    verb = value
            else:
                if name == b"content-type":
                    content_type = value
                metadata.append((name, value))
        call = Call(self, stream_id, path.decode("latin-1"), metadata)
        self.calls[stream_id] = call
        if flags & END_STREAM:
            call.half_closed = True
        if verb != b"POST" or not content_type.startswith(b"application/grpc"):
            status = b"405" if verb != b"POST" else b"415"
            call.done = True
            self._send_headers(
                call, literal(b":status", status) + status_block(INTERNAL, "not a gRPC request"), True
            )
            return
        if size > self.server.max_metadata_bytes:
            call.fail(
                RESOURCE_EXHAUSTED,
                f"the request's metadata is {size} bytes, over the limit of {self.server.max_metadata_bytes}",
            )
            return
        method = self.server.methods.get(call.method)
        if method is None:
            call.fail(UNIMPLEMENTED, f"Method not found: {call.method[:200]}")
            return
        call._unary = not method.streaming
        timeout = call.header(b"grpc-timeout")
        if timeout is not None:
            seconds = parse_timeout(timeout)
            if seconds is None:
                call.fail(INVALID_ARGUMENT, f"malformed grpc-timeout {timeout.decode('latin-1')!r}")
                return
            loop = asyncio.get_running_loop()
            call._deadline = loop.call_later(seconds, self._deadline_passed, call)
        if method.streaming:
            self._run(method.handler, call, None)
            if call.half_closed and not call.done:
                self._end_of_requests(call)
            return
        if method.admit is not None:
            self._guarded(method.admit, call, call)
            if call.done:
                return
        if call.half_closed:
            call.fail(INVALID_ARGUMENT, "a unary call carries exactly one request message; none was sent")

    def _data(self, flags: int, stream_id: int, payload: bytes) -> None:
        length = len(payload)
        self._recv_window -= length
        if self._recv_window < 0:
            raise _ConnectionError(FLOW_CONTROL_ERROR, "data past the connection's window")
        if flags & PADDED:
            payload = _unpad(payload)
        call = self.calls.get(stream_id)
        if call is None or call.half_closed:
            self._grant(None)  # a finished or unknown stream: its bytes are dropped, the window granted
            if call is None and (stream_id > self._last_stream or stream_id == 0):
                raise _ConnectionError(PROTOCOL_ERROR, f"DATA on idle stream {stream_id}")
            return
        call.recv_window -= length
        if call.recv_window < 0:
            self._reset(call, FLOW_CONTROL_ERROR)
            self._grant(None)
            return
        if call.done:  # answered already (a refusal): what follows is dropped
            self._grant(call)
        else:
            self._read_messages(call, payload)
            self._grant(call)
        if flags & END_STREAM:
            self._end_of_requests(call)

    def _read_messages(self, call: Call, payload: bytes) -> None:
        buffer = call._buffer
        buffer += payload
        self._buffered += len(payload)  # a message's 5-byte prefix included, until it is handed over
        while True:
            if call._expected < 0:
                if len(buffer) < 5:
                    return
                compressed = buffer[0]
                declared = int.from_bytes(buffer[1:5], "big")
                if declared > self.server.max_message_bytes:
                    self._drop_buffer(call)
                    call.fail(
                        RESOURCE_EXHAUSTED,
                        f"Received message larger than max ({declared} vs. {self.server.max_message_bytes})",
                    )
                    return
                call._expected = declared
                if not call._unary:  # a unary call's message is timed from its headers (swept)
                    call._message_since = time.monotonic()
                if compressed == 1:
                    self._drop_buffer(call)
                    encoding = (call.header(b"grpc-encoding") or b"").decode("latin-1")[:40]
                    call.fail(
                        UNIMPLEMENTED,
                        f"compressed messages (grpc-encoding {encoding!r}) are not accepted: send them"
                        " uncompressed",
                    )
                    return
                if compressed:
                    self._drop_buffer(call)
                    call.fail(INTERNAL, f"a message's compressed flag is {compressed}, not 0 or 1")
                    return
            length = call._expected
            if len(buffer) - 5 < length:
                return
            message = bytes(buffer[5 : 5 + length])
            del buffer[: 5 + length]
            call._expected = -1
            if call._unary:
                if call._messages:
                    self._drop_buffer(call)
                    call.fail(
                        INVALID_ARGUMENT, "a unary call carries exactly one request message; more were sent"
                    )
                    return
                call._messages.append(message)
            else:
                call._messages.append(message)
                self.deliver(call)
                if call.done:
                    return

    def _take(self, call: Call) -> bytes:
        """A call's first waiting message."""
        message = call._messages.pop(0)
        self._buffered -= len(message) + 5
        self._feed_starved()
        return message

    def deliver(self, call: Call) -> None:
        """Hands a streaming call's waiting messages to its handler, until it pauses the call or its answers
        wait for the client's window (ANSWER_BACKLOG_BYTES of them). Not reentrant: a handler that resumes
        the call from inside (an answer refused at once) lets this loop go on, instead of recursing."""
        if call._delivering:  # called back from a handler: the loop below goes on once it returns
            return
        call._delivering = True
        try:
            self._deliver(call)
        finally:
            call._delivering = False
        self._grant(call)
        self._flush()

    def _deliver(self, call: Call) -> None:
        messages = call._messages
        while messages and not call._paused and not call.done and len(call.out) < ANSWER_BACKLOG_BYTES:
            message = self._take(call)
            on_message = call.on_message
            if on_message is not None:
                self._guarded(on_message, call, message)
        if not messages and call.half_closed and call.on_end is not None and not call.done:
            on_end, call.on_end = call.on_end, None
            self._guarded(on_end, call)

    def _end_of_requests(self, call: Call) -> None:
        call.half_closed = True
        self._starved.discard(call.stream_id)
        self._feed_starved()  # another stream may be the oldest sending now, and this one's data is taken below
        if call.done:
            self._maybe_close(call)
            return
        if call._buffer or call._expected >= 0:
            self._drop_buffer(call)
            call.fail(INTERNAL, "the request ended inside a message")
            return
        if call._unary:
            if not call._messages:
                call.fail(INVALID_ARGUMENT, "a unary call carries exactly one request message; none was sent")
                return
            self._run(self.server.methods[call.method].handler, call, self._take(call))
        else:
            self.deliver(call)

    def _grant(self, call: Call | None) -> None:
        """Grants the client's windows again for what was read.

        The connection's window is always granted again: what bounds a connection's memory is its streams'
        windows. A stream's window is granted again when half of it is used, unless its messages wait (paused)
        or the connection holds ``buffer_bytes`` of unread request data; then only the oldest stream still
        sending its request gets more, so that one always completes and frees its share (no deadlock), and the
        others wait in ``_starved`` until the connection holds less."""
        if (
            call is not None
            and not call.half_closed
            and not call._paused
            and call.recv_window < STREAM_WINDOW // 2
            and not call._messages
            and not call.done
        ):
            if self._buffered < self.server.buffer_bytes or call.stream_id == self._oldest_sending():
                self._out.append(
                    frame(WINDOW_UPDATE, 0, call.stream_id, _U32.pack(STREAM_WINDOW - call.recv_window))
                )
                call.recv_window = STREAM_WINDOW
                self._starved.discard(call.stream_id)
            else:
                self._starved.add(call.stream_id)
        target = self.server.buffer_bytes
        if self._recv_window < target // 2:
            self._out.append(frame(WINDOW_UPDATE, 0, 0, _U32.pack(target - self._recv_window)))
            self._recv_window = target

    def _oldest_sending(self) -> int:
        """The oldest stream in the middle of a message it may go on sending (0 when none is)."""
        return min(
            (
                sid
                for sid, c in self.calls.items()
                if c._buffer and not c.half_closed and not c.done and not c._paused and not c._messages
            ),
            default=0,
        )

    def _feed_starved(self) -> None:
        """Grants the streams held back by ``_grant`` once the connection holds less, or one became the oldest."""
        if self._starved:
            for stream_id in sorted(self._starved):
                call = self.calls.get(stream_id)
                if call is None:
                    self._starved.discard(stream_id)
                else:
                    self._grant(call)

    def _drop_buffer(self, call: Call) -> None:
        self._buffered -= len(call._buffer) + sum(len(m) + 5 for m in call._messages)
        self._starved.discard(call.stream_id)
        call._buffer = bytearray()
        call._messages = []
        call._expected = -1
        self._feed_starved()  # the connection holds less, and this may have been the oldest stream fed

    # -- running handlers --------------------------------------------------------------------

    def _run(self, handler: Callable[[Call, bytes | None], None], call: Call, message: bytes | None) -> None:
        call._owed = True
        try:
            handler(call, message)
        except Exception:
            log.exception("the gRPC handler of %s failed", call.method)
            call.fail(INTERNAL, "internal error")

    def _guarded(self, callback: Callable[..., None], call: Call, *args: Any) -> None:
        try:
            callback(*args)
        except Exception:
            log.exception("a gRPC stream callback of %s failed", call.method)
            call.fail(INTERNAL, "internal error")

    def _deadline_passed(self, call: Call) -> None:
        call._deadline = None
        if not call.done:
            call._end(DEADLINE_EXCEEDED, "Deadline Exceeded")
            self._abandon(call)
            if call.on_cancel is not None:
                self._guarded(call.on_cancel, call)
            self._flush()

    def _cancelled(self, call: Call) -> None:
        call.cancelled = True
        was_done, call.done = call.done, True
        if call._deadline is not None:
            call._deadline.cancel()
            call._deadline = None
        if not was_done:
            self._abandon(call)
            if call.on_cancel is not None:
                self._guarded(call.on_cancel, call)

    def _abandon(self, call: Call) -> None:
        if call._owed and not call._abandoned:
            call._abandoned = True
            self.abandoned += 1

    # -- frames out --------------------------------------------------------------------------

    def respond(self, call: Call, data: bytes, trailers: bytes) -> None:
        """Writes what is left of a call: its headers if not sent, ``data`` and the trailers (Trailers-Only
        when there is neither data nor headers sent)."""
        if call._deadline is not None:
            call._deadline.cancel()
            call._deadline = None
        if self.transport is None or call.cancelled:
            return
        if not call.headers_sent and not data and not call.out:
            call.headers_sent = True
            self._send_headers(call, RESPONSE_HEADERS + trailers, True)
            self._flush_soon()
            return
        if not call.headers_sent:
            call.headers_sent = True
            if not call.out and len(data) <= min(call.send_window, self.send_window, self.peer_max_frame):
                # The common answer: headers, one DATA frame and the trailers, in one write.
                sid = call.stream_id
                call.send_window -= len(data)
                self.send_window -= len(data)
                self._out.append(
                    frame(HEADERS, END_HEADERS, sid, RESPONSE_HEADERS)
                    + frame(DATA, 0, sid, data)
                    + frame(HEADERS, END_HEADERS | END_STREAM, sid, trailers)
                )
                self._closed(call)
                self._flush_soon()
                return
            self._send_headers(call, RESPONSE_HEADERS, False)
        call.out += data
        call.trailers = trailers
        self._write_out(call)
        self._flush_soon()

    def send_data(self, call: Call, data: bytes) -> None:
        if self.transport is None or call.cancelled:
            return
        if not call.headers_sent:
            call.headers_sent = True
            self._send_headers(call, RESPONSE_HEADERS, False)
        call.out += data
        self._write_out(call)
        self._flush_soon()

    def _send_headers(self, call: Call, block: bytes, end_stream: bool) -> None:
        limit = self.peer_max_frame
        first, rest = block[:limit], block[limit:]
        flags = (END_STREAM if end_stream else 0) | (0 if rest else END_HEADERS)
        out = [frame(HEADERS, flags, call.stream_id, first)]
        while rest:
            piece, rest = rest[:limit], rest[limit:]
            out.append(frame(CONTINUATION, 0 if rest else END_HEADERS, call.stream_id, piece))
        self._out.append(b"".join(out))
        if end_stream:
            self._closed(call)

    def _write_out(self, call: Call) -> None:
        """Writes as much of a call's waiting DATA as the windows allow, then its trailers once all is out."""
        out = call.out
        while out:
            room = min(call.send_window, self.send_window, self.peer_max_frame)
            if room <= 0:
                self._blocked[call.stream_id] = call
                return
            piece = bytes(out[:room])
            del out[:room]
            call.send_window -= len(piece)
            self.send_window -= len(piece)
            self._out.append(frame(DATA, 0, call.stream_id, piece))
        self._blocked.pop(call.stream_id, None)
        if call.trailers is not None:
            trailers, call.trailers = call.trailers, None
            self._send_headers(call, trailers, True)

    def _unblock(self) -> None:
        if not self._blocked:  # the common case: every answer went out whole
            return
        for call in list(self._blocked.values()):
            self._write_out(call)
            if call._messages and not call._unary:
                self.deliver(call)
            if self.send_window <= 0:
                break

    def _unsent(self) -> int:
        """Answer bytes waiting for the client's windows (only calls in ``_blocked`` hold any)."""
        return sum(len(call.out) for call in self._blocked.values()) if self._blocked else 0

    def _closed(self, call: Call) -> None:
        """Our side of the stream has ended."""
        call.done = True
        if call._deadline is not None:
            call._deadline.cancel()
            call._deadline = None
        if not call.half_closed:
            # The client is still sending (a refusal before its message ended): ask it to stop.
            self._out.append(frame(RST_STREAM, 0, call.stream_id, _U32.pack(NO_ERROR)))
        self._forget(call)

    def _maybe_close(self, call: Call) -> None:
        if call.done and not call.out and call.trailers is None:
            self._forget(call)

    def _forget(self, call: Call) -> None:
        if self.calls.get(call.stream_id) is call:
            del self.calls[call.stream_id]
        self._blocked.pop(call.stream_id, None)
        if call._buffer or call._messages:
            self._drop_buffer(call)
        if not self.calls and self.server.closing:
            self.server.idle(self)

    def _reset(self, call: Call, code: int) -> None:
        self._out.append(frame(RST_STREAM, 0, call.stream_id, _U32.pack(code)))
        self._forget(call)
        self._cancelled(call)

    def _flush(self) -> None:
        if self._out and self.transport is not None:
            out, self._out = self._out, []
            self.transport.write(out[0] if len(out) == 1 else b"".join(out))

    def _flush_soon(self) -> None:
        # Inside data_received the frames leave together at its end; from a callback they leave now.
        if not self._reading:
            self._flush()

    def goaway(self) -> None:
        """Tells the client no new calls will be taken (the calls in progress go on)."""
        if self.transport is not None:
            self._out.append(frame(GOAWAY, 0, 0, _U32.pack(self._last_stream) + _U32.pack(NO_ERROR)))
            self._flush()
            if not self.calls:
                self.transport.close()

    def _goaway(self, code: int, message: str) -> None:
        log.info("gRPC connection closed: %s", message)
        self._out.append(
            frame(GOAWAY, 0, 0, _U32.pack(self._last_stream) + _U32.pack(code) + message.encode()[:200])
        )
        self._flush()
        self._close()

    def swept(self, now: float) -> None:
        """Ends what waits on the client past its time-out (see the module's docstring)."""
        server = self.server
        if not self._preface:
            if now - self._opened > server.header_timeout_s:
                log.info("gRPC connection closed: no HTTP/2 preface within %.0f s", server.header_timeout_s)
                self._close()
            return
        if self._partial_since:
            limit = server.header_timeout_s if self._header_block is not None else server.body_timeout_s
            if now - self._partial_since > limit:
                self._goaway(ENHANCE_YOUR_CALM, f"a frame unfinished after {limit:.0f} s")
                return
        for call in list(self.calls.values()):
            if (
                call._unary
                and not call.half_closed
                and not call.done
                and now - call.started > server.body_timeout_s
            ):
                call.fail(
                    DEADLINE_EXCEEDED,
                    f"the request message did not arrive within {server.body_timeout_s:.0f} s of its headers",
                )
                if call.on_cancel is not None:
                    self._guarded(call.on_cancel, call)
            elif (
                not call._unary
                and call._buffer
                and not call.done
                and now - call._message_since > server.body_timeout_s
            ):
                # A stream may idle between messages, not inside one: a message once begun holds its share of
                # the connection (and, being the oldest, may be the one stream still fed, see _grant).
                call._end(
                    DEADLINE_EXCEEDED,
                    f"a request message on the stream did not arrive within {server.body_timeout_s:.0f} s of its"
                    " start",
                )
                self._abandon(call)
                if call.on_cancel is not None:
                    self._guarded(call.on_cancel, call)
        self._flush()

    def close_after_flush(self) -> None:
        self._flush()
        self._close()

    def _close(self) -> None:
        if self.transport is not None:
            self.transport.close()


class _ConnectionError(Exception):
    def __init__(self, code: int, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


def _sweep(conn: GrpcConnection, now: float) -> None:
    try:
        conn.swept(now)
    except Exception:  # the sweeper logs it; a connection it cannot time is not kept
        conn._close()
        raise


def _unpad(payload: bytes) -> bytes:
    if not payload:
        raise _ConnectionError(PROTOCOL_ERROR, "a padded frame without its pad length")
    pad = payload[0]
    if pad >= len(payload):
        raise _ConnectionError(PROTOCOL_ERROR, "padding past the frame")
    return payload[1 : len(payload) - pad]


def _leaves_table(block: bytes) -> bool:
    """Whether a header block leaves HPACK's dynamic table as it is: it holds indexed fields and literals
    without indexing or never indexed (RFC 7541 §6.1, §6.2.2, §6.2.3), and no literal with incremental
    indexing or table size update. Such a block decodes to the same fields until the table changes. The
    clients' usual request is one: every field indexed but ``authorization``, a literal not indexed."""
    pos = 0
    end = len(block)
    while pos < end:
        first = block[pos]
        if first & 0x80:
            pos = _skip_int(block, pos, 0x7F)
        elif first & 0xC0 == 0x40 or first & 0xE0 == 0x20:
            return False
        else:
            new_name = not first & 0x0F
            pos = _skip_int(block, pos, 0x0F)
            if new_name:
                pos = _skip_string(block, pos)
            pos = _skip_string(block, pos)
    return pos == end


def _skip_int(block: bytes, pos: int, mask: int) -> int:
    """The position after an HPACK integer whose prefix is ``mask``'s bits (past the end when cut short)."""
    if pos >= len(block):
        return len(block) + 1
    if block[pos] & mask != mask:
        return pos + 1
    pos += 1
    while pos < len(block) and block[pos] & 0x80:
        pos += 1
    return pos + 1


def _skip_string(block: bytes, pos: int) -> int:
    """The position after an HPACK string literal (past the end when cut short)."""
    if pos >= len(block):
        return len(block) + 1
    after = _skip_int(block, pos, 0x7F)
    if after > len(block):
        return after
    length = block[pos] & 0x7F
    if length == 0x7F:
        shift = 0
        for byte in block[pos + 1 : after]:
            length += (byte & 0x7F) << shift
            shift += 7
    return after + length


class GrpcServer:
    """A listening gRPC server: ``methods`` by path, and the limits its connections apply."""

    def __init__(
        self,
        methods: dict[str, Method],
        *,
        max_message_bytes: int,
        max_metadata_bytes: int,
        buffer_bytes: int | None = None,
        max_connections: int = 1000,
        header_timeout_s: float = 10.0,
        body_timeout_s: float = 60.0,
    ) -> None:
        self.methods = methods
        self.max_connections = max_connections
        self.header_timeout_s = header_timeout_s
        self.body_timeout_s = body_timeout_s
        self.max_message_bytes = max_message_bytes
        self.max_metadata_bytes = max_metadata_bytes
        self.max_header_block_bytes = max(65536, 4 * max_metadata_bytes)
        # Unread request bytes a connection may hold before its streams' windows stop being granted (but the
        # oldest's): room for one message of the largest size, at least 4 MiB. Past it a connection holds at
        # most one STREAM_WINDOW more per open stream.
        self.buffer_bytes = buffer_bytes or min(
            MAX_WINDOW - DEFAULT_WINDOW, max(4 << 20, max_message_bytes + 5)
        )
        self.connections: set[GrpcConnection] = set()
        self.closing = False
        self._server: asyncio.AbstractServer | None = None
        self._idle: asyncio.Event | None = None
        self._sweeper: Sweeper | None = None

    def protocol(self) -> GrpcConnection:
        return GrpcConnection(self)

    async def start(self, host: str, port: int) -> int:
        loop = asyncio.get_running_loop()
        self._server = await loop.create_server(self.protocol, host, port, reuse_address=True)
        interval = interval_for(self.header_timeout_s, self.body_timeout_s)
        self._sweeper = Sweeper(loop, self.connections, interval, _sweep)
        sockets = self._server.sockets
        return int(sockets[0].getsockname()[1]) if sockets else port

    async def stop(self, grace_s: float) -> None:
        """Refuses new calls, lets the calls in progress finish for up to ``grace_s``, then closes every
        connection."""
        server, self._server = self._server, None
        if server is None:
            return
        self.closing = True
        server.close()
        if self._sweeper is not None:
            self._sweeper.cancel()
        self._idle = asyncio.Event()
        for conn in list(self.connections):
            conn.goaway()
        deadline = time.monotonic() + grace_s
        while any(conn.calls for conn in self.connections) and time.monotonic() < deadline:
            self._idle.clear()
            try:
                await asyncio.wait_for(self._idle.wait(), max(0.0, deadline - time.monotonic()))
            except TimeoutError:
                break
        for conn in list(self.connections):
            conn._close()

    def idle(self, conn: GrpcConnection) -> None:
        """A connection's last call has ended while the server stops: it closes once its frames are out."""
        if self._idle is not None:
            self._idle.set()
        asyncio.get_running_loop().call_soon(conn.close_after_flush)

    def connection_closed(self) -> None:
        if self._idle is not None:
            self._idle.set()
