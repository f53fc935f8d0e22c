"""uvicorn's httptools protocol, sending each response's header block and body in one write, and
serving the common infer request without an ASGI task.

uvicorn writes the status line and headers as soon as the application sends
``http.response.start``, then the body on ``http.response.body``: two ``send`` system calls and two
TCP segments per answer, and on loopback each call also runs the receiver's TCP processing. One write
an answer saves a system call a request (bench/cpu_per_request.py measures the per-request CPU).

Here a write that is a response's header block (it starts with the status line and ends with the
blank line) is held back and goes out with the next write, the body, in one ``send``. If no body
follows in the same callback (a streamed or empty response), the held bytes go out on the event
loop's next iteration, which does not wait for I/O since a callback is ready. ``100 Continue`` is never
held: the client waits for it before sending the body.

Direct infer requests: for ``POST /v2/models/<m>/infer`` with a Content-Length and a cached API key
(``Gateway.direct_infer`` decides), the protocol collects the body itself, hands it to the gateway and
writes the answer in one write when the batch's results reach the event loop. The ASGI path would
build a scope, a task, receive/send messages and a future for each request; the gateway's checks,
statistics, ledger and answers are the same either way. Every other request, and an infer request
that arrives behind an unfinished one on the same connection (pipelining), takes uvicorn's path.

Slow and greedy clients (class attributes, set from the settings by ``with_limits``): a request's header
block must arrive within ``header_timeout_s`` (counted from its first byte, or from the connection while
nothing has arrived) and its body within ``body_timeout_s`` of the headers' end, or the connection is answered
408 and closed (closed silently when nothing was asked yet); a time-out covers the whole phase, so trickling a
byte at a time does not extend it. Header blocks over ``max_headers`` or ``max_header_bytes`` get 431, and
connections beyond ``max_connections`` in the process get 503, each with the connection closed. Waiting on the
server (an answer being computed, or reading paused by flow control) never counts against the client.

The time-outs cost the request path no timer and no clock read: a request only notes its phase in a slot (and
where it began), and one sweep per server, about every second, times each phase from the first sweep that saw
it and closes the connections past their time-out, which therefore fires between one and two sweep intervals
late, never early. A timer per connection re-armed per phase would allocate two handles and push and cancel
two heap entries for every request, on the event loop's thread: several times what the phase bookkeeping costs.
The sweep costs one callback a second whatever the load.
"""

from __future__ import annotations

import asyncio
import math
import time
import weakref
from typing import Any, ClassVar, Protocol, cast

import httptools
from uvicorn.protocols.http.httptools_impl import STATUS_LINE, HttpToolsProtocol

from inference.gateway import DirectInfer, wanted_headers

_STATUS_LINE_START = b"HTTP/1.1 "
_CONTINUE = b"HTTP/1.1 100 "
_HEADER_END = b"\r\n\r\n"
_MAX_HELD = 16 * 1024  # a header block is far smaller; anything larger is not one
_JOIN_LIMIT = 16 * 1024  # a body at least this large goes out in its own write rather than be copied

# A connection's phase, for the read time-outs.
_WAITING = 0  # connected, no byte of a request yet: the header time-out runs
_HEADER = 1  # a request's header block is arriving: the header time-out runs
_BODY = 2  # its body is arriving: the body time-out runs
_IDLE = 3  # answering, or between requests (uvicorn's keep-alive time-out): no read time-out
_SWEEP_MAX_S = 1.0


class HeaderHoldingTransport:
    """Wraps an asyncio transport; every other attribute is the wrapped transport's."""

    __slots__ = ("_held", "_loop", "_transport")

    def __init__(self, transport: asyncio.Transport, loop: asyncio.AbstractEventLoop) -> None:
        self._transport = transport
        self._loop = loop
        self._held: bytes | None = None

    def write(self, data: bytes | bytearray | memoryview) -> None:
        held = self._held
        if held is not None:
            self._held = None
            if len(data) >= _JOIN_LIMIT:
                # Joining would copy a large body to save one call: send them one after the other.
                self._transport.write(held)
                self._transport.write(data)
            else:
                self._transport.write(held + bytes(data))
            return
        if (
            isinstance(data, bytes)
            and len(data) <= _MAX_HELD
            and data.startswith(_STATUS_LINE_START)
            and data.endswith(_HEADER_END)
            and not data.startswith(_CONTINUE)
        ):
            self._held = data
            self._loop.call_soon(self.flush)
            return
        self._transport.write(data)

    def flush(self) -> None:
        held = self._held
        if held is not None:
            self._held = None
            # Even when closing: the transport still sends what it is given until the connection is lost.
            self._transport.write(held)

    def writelines(self, list_of_data: Any) -> None:
        self.write(b"".join(list_of_data))

    def close(self) -> None:
        self.flush()
        self._transport.close()

    def write_eof(self) -> None:
        self.flush()
        self._transport.write_eof()

    def abort(self) -> None:
        self._held = None
        self._transport.abort()

    # Called for every request: defined here rather than found through __getattr__.
    def is_closing(self) -> bool:
        return self._transport.is_closing()

    def pause_reading(self) -> None:
        self._transport.pause_reading()

    def resume_reading(self) -> None:
        self._transport.resume_reading()

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return self._transport.get_extra_info(name, default)

    def get_write_buffer_size(self) -> int:
        return self._transport.get_write_buffer_size() + (len(self._held) if self._held else 0)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._transport, name)


class DirectTarget(Protocol):
    def direct_infer(
        self, method: str, path: str, headers: dict[bytes, bytes], received_ns: int
    ) -> DirectInfer | None: ...


def direct_target(app: Any) -> DirectTarget | None:
    """The app (or the one uvicorn's own middleware wraps) that can serve infer requests directly.

    Only uvicorn's wrappers (proxy headers, message logging) are looked through: a direct request
    skips every ASGI layer, so behind any other middleware (authentication, tracing, CORS) it must
    not be served directly, or it would silently bypass that middleware."""
    for _ in range(8):
        if app is None:
            return None
        if callable(getattr(app, "direct_infer", None)):
            return app  # type: ignore[no-any-return]
        if not type(app).__module__.startswith("uvicorn.middleware."):
            return None
        app = getattr(app, "app", None)
    return None


class _NoEvent:
    def set(self) -> None:
        pass


class DirectCycle:
    """Stands in for uvicorn's RequestResponseCycle while an infer request is served directly.

    uvicorn's protocol reads ``self.cycle`` to queue a pipelined request behind an unfinished one,
    to mark a lost connection and to ask for a close at shutdown; this object answers those the
    same way (``response_complete``, ``disconnected``, ``keep_alive``, ``message_event``).
    """

    __slots__ = (
        "_protocol",
        "chunks",
        "disconnected",
        "keep_alive",
        "response_complete",
        "ticket",
        "url",
        "waiting",
    )
    message_event = _NoEvent()

    def __init__(self, protocol: CoalescingHttpToolsProtocol, ticket: DirectInfer | None, url: bytes) -> None:
        self._protocol = protocol
        self.ticket: DirectInfer | None = ticket
        self.url = url  # the protocol's own is the next request's once that one begins
        self.chunks: list[bytes] = []
        self.disconnected = False
        self.keep_alive = True
        self.response_complete = False
        self.waiting = False  # for the client to read what it was sent before (write back-pressure)

    def body_complete(self) -> None:
        ticket = self.ticket
        if ticket is None:
            return
        self.ticket = None
        body = b"".join(self.chunks)
        self.chunks = []
        ticket.serve(body, self.respond)

    def respond(self, status: int, headers: list[tuple[bytes, bytes]], body: bytes) -> None:
        if self.response_complete or self.waiting:
            return
        protocol = self._protocol
        if protocol.flow.write_paused and not self.disconnected:
            # As uvicorn's send: a client that does not read gets nothing more until it does. The cycle
            # stays unfinished meanwhile, so a request behind it queues in uvicorn's pipeline, which
            # pauses reading.
            self.waiting = True
            protocol.loop.create_task(self._respond_when_writable(status, headers, body))
            return
        self._write(status, headers, body)

    async def _respond_when_writable(
        self, status: int, headers: list[tuple[bytes, bytes]], body: bytes
    ) -> None:
        await self._protocol.flow.drain()  # also released when the connection is lost
        self.waiting = False
        self._write(status, headers, body)

    def _write(self, status: int, headers: list[tuple[bytes, bytes]], body: bytes) -> None:
        self.response_complete = True
        protocol = self._protocol
        transport = protocol.transport
        if self.disconnected or transport.is_closing():
            return
        if protocol.access_log:  # uvicorn's line, as its RequestResponseCycle writes it
            client = protocol.client
            protocol.access_logger.info(
                '%s - "%s %s HTTP/%s" %d',
                f"{client[0]}:{client[1]}" if client else "",
                "POST",
                self.url.decode("latin-1"),
                "1.1",
                status,
            )
        content = [STATUS_LINE[status]]
        for name, value in (*protocol.server_state.default_headers, *headers):
            content.extend((name, b": ", value, b"\r\n"))
        content.append(b"content-length: %d\r\n" % len(body))
        if not self.keep_alive:
            content.append(b"connection: close\r\n")
        content.extend((b"\r\n", body))
        transport.write(b"".join(content))
        if not self.keep_alive:
            transport.close()
        protocol.on_response_complete()


class _Refused(Exception):
    """Raised inside a parser callback once the request has been answered and the connection closed: it stops
    the parser from calling back for the rest of the data."""


class _Sweeper:
    """Closes the server's connections that are past their read time-out: one timer for all of them, run about
    every second while any connection is open (module docstring: why not a timer per request)."""

    def __init__(self, loop: asyncio.AbstractEventLoop, connections: set[Any], interval_s: float) -> None:
        self._loop = loop
        self._connections = connections
        self._interval_s = interval_s
        self._handle: asyncio.TimerHandle | None = None

    def watch(self) -> None:
        if self._handle is None:
            self._handle = self._loop.call_later(self._interval_s, self._sweep)

    def _sweep(self) -> None:
        self._handle = None
        now = time.monotonic()
        for conn in list(self._connections):  # closing one may change the set
            if isinstance(conn, CoalescingHttpToolsProtocol):
                conn._swept(now)
        if self._connections:
            self.watch()


# One sweeper per server (uvicorn's ServerState is shared by all of a server's connections).
_sweepers: weakref.WeakKeyDictionary[Any, _Sweeper] = weakref.WeakKeyDictionary()


class CoalescingHttpToolsProtocol(HttpToolsProtocol):
    """HttpToolsProtocol whose responses leave in one write when the body follows at once, which serves the
    common infer request directly, and which bounds what slow or greedy clients can hold (module docstring).

    The limits are class attributes so that uvicorn, which builds a protocol per connection from the class, can
    be handed a configured one: ``with_limits`` makes it.
    """

    # Slots, not the instance dict: uvicorn's protocol already keeps about 30 attributes there, and past 30 an
    # instance dict stops sharing its keys, which slows every attribute read on the request path (measured).
    __slots__ = (
        "_begin_at",
        "_begin_end",
        "_chunk_start",
        "_direct",
        "_mark_begin",
        "_mark_phase",
        "_max_header_bytes",
        "_max_headers",
        "_phase",
        "_refused",
        "_seen",
        "_since",
    )

    header_timeout_s: ClassVar[float] = 10.0
    body_timeout_s: ClassVar[float] = 60.0
    max_headers: ClassVar[int] = 100
    max_header_bytes: ClassVar[int] = 16384
    max_connections: ClassVar[int] = 1000

    @classmethod
    def with_limits(
        cls,
        *,
        header_timeout_s: float,
        body_timeout_s: float,
        max_headers: int,
        max_header_bytes: int,
        max_connections: int,
    ) -> type[CoalescingHttpToolsProtocol]:
        """This protocol with these limits (each must be positive)."""
        limits: dict[str, float | int] = {
            "header_timeout_s": header_timeout_s,
            "body_timeout_s": body_timeout_s,
            "max_headers": max_headers,
            "max_header_bytes": max_header_bytes,
            "max_connections": max_connections,
        }
        for name, value in limits.items():
            if not value > 0 or not math.isfinite(value):
                raise ValueError(f"{name} must be a positive number, got {value!r}")
        return cast("type[CoalescingHttpToolsProtocol]", type(cls.__name__, (cls,), limits))

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        direct_ok = self.limit_concurrency is None and not self.root_path
        self._direct = direct_target(self.app) if direct_ok else None
        self.url = b""  # uvicorn sets it when a request begins; the header-size check may look before
        self._max_headers = self.max_headers  # read per request: a slot is quicker than the class attribute
        self._max_header_bytes = self.max_header_bytes
        # The request path only notes the phase (and where its request began); the sweep notes when it first
        # saw each phase (_mark_*, _since) and times it from there.
        self._phase = _IDLE
        self._mark_phase = _IDLE
        self._mark_begin = -1
        self._since = 0.0
        self._refused = False
        # Bytes received on the connection: up to the start of the latest chunk, and to its end. A request's
        # header block lies after _begin_at (the start of the chunk it began in); every byte after _begin_end
        # (that chunk's end) while it is still arriving is part of it.
        self._chunk_start = 0
        self._seen = 0
        self._begin_at = 0
        self._begin_end = 0

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        super().connection_made(HeaderHoldingTransport(transport, self.loop))  # type: ignore[arg-type]
        if len(self.connections) > self.max_connections:
            self._refuse(503, "the server has too many connections open; retry later", b"retry-after: 1\r\n")
            return
        self._phase = self._mark_phase = _WAITING
        self._mark_begin = 0
        self._since = time.monotonic()
        sweeper = _sweepers.get(self.server_state)
        if sweeper is None:
            interval = min(_SWEEP_MAX_S, self.header_timeout_s / 4, self.body_timeout_s / 4)
            sweeper = _sweepers[self.server_state] = _Sweeper(self.loop, self.connections, interval)
        sweeper.watch()

    def data_received(self, data: bytes) -> None:
        # uvicorn's, with the bytes counted for the header-size cap and refusals that stop the parser.
        self._unset_keepalive_if_required()
        seen = self._seen
        self._chunk_start = seen
        self._seen = seen + len(data)
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserError:
            if self._refused:
                return  # answered already (431)
            msg = "Invalid HTTP request received."
            self.logger.warning(msg)
            self.send_400_response(msg)
            return
        except httptools.HttpParserUpgrade:
            if self._should_upgrade():
                self.handle_websocket_upgrade()
            else:
                self._unsupported_upgrade_warning()
            return
        if self._phase < _BODY:  # a header block still arriving: check it before reading more of it
            if self.headers is not None and len(self.headers) > self._max_headers:
                self._refuse(431, f"the request has more than {self._max_headers} header fields")
            elif self._seen - self._begin_at > self._max_header_bytes and self._header_block_over(
                in_progress=True
            ):
                self._refuse(431, f"the request's header block exceeds {self._max_header_bytes} bytes")

    def _header_block_over(self, in_progress: bool) -> bool:
        """Whether the current request's header block exceeds ``max_header_bytes`` (the request target and each
        header line); ``in_progress``: counting also the bytes of a field still arriving, which the parser
        holds back until it ends."""
        size = len(self.url) + sum(len(name) + len(value) + 4 for name, value in self.headers or ())
        if in_progress:
            size = max(size, self._seen - self._begin_end)
        return size > self._max_header_bytes

    def on_message_begin(self) -> None:
        super().on_message_begin()
        # uvicorn stops the keep-alive timer only when data arrives or a response completes. A direct
        # refusal is answered inside the parser, and its completion arms the timer; a request that follows
        # in the same packet must stop it, or the timer closes the connection while that request runs.
        self._unset_keepalive_if_required()
        self._phase = _HEADER
        self._begin_at = self._chunk_start
        self._begin_end = self._seen

    def on_headers_complete(self) -> None:
        if len(self.headers) > self._max_headers:
            self._refuse(431, f"the request has more than {self._max_headers} header fields")
            raise _Refused
        if self._seen - self._begin_at > self._max_header_bytes and self._header_block_over(
            in_progress=False
        ):
            self._refuse(431, f"the request's header block exceeds {self._max_header_bytes} bytes")
            raise _Refused
        self._phase = _BODY
        if self._direct is not None and self._start_direct():
            return
        super().on_headers_complete()

    def _refuse(self, status: int, message: str, extra_headers: bytes = b"") -> None:
        """Answers ``status`` with ``{"error": message}`` and closes the connection. Nothing is written if an
        earlier request's answer is still due (it would be sent after this one); the connection just closes."""
        self._refused = True
        self._phase = _IDLE
        transport = self.transport
        if transport.is_closing():
            return
        cycle: Any = self.cycle
        if cycle is None or cycle.response_complete:
            self._write_error(status, message, extra_headers)
        transport.close()

    def _write_error(self, status: int, message: str, extra_headers: bytes = b"") -> None:
        body = b'{"error":"' + message.replace('"', "'").encode("utf-8") + b'"}'
        content = [STATUS_LINE[status]]
        for name, value in self.server_state.default_headers:
            content.extend((name, b": ", value, b"\r\n"))
        content.append(b"content-type: application/json\r\ncontent-length: %d\r\n" % len(body))
        content.extend((extra_headers, b"connection: close\r\n\r\n", body))
        self.transport.write(b"".join(content))

    def _swept(self, now: float) -> None:
        """The sweep's look at this connection: times the phase from the first sweep that saw it (so a
        time-out fires between one and two sweep intervals late, never early), and ends it past its time-out."""
        phase = self._phase
        if phase == _IDLE:
            return
        if phase != self._mark_phase or self._begin_at != self._mark_begin or self.flow.read_paused:
            # A phase (or request) began since the last sweep; or reading is paused on the server's side (a
            # pipelined request waits, or a body is not consumed yet) and the client cannot send: time from now.
            self._mark_phase = phase
            self._mark_begin = self._begin_at
            self._since = now
            return
        limit = self.body_timeout_s if phase == _BODY else self.header_timeout_s
        if now - self._since >= limit:
            self._read_timed_out(phase)

    def _read_timed_out(self, phase: int) -> None:
        """Ends a connection whose header block or body did not arrive in time: 408 when a request was under
        way and nothing has been answered to it, then close."""
        self._phase = _IDLE
        transport = self.transport
        if transport.is_closing():
            return
        cycle: Any = self.cycle
        if phase == _HEADER and (cycle is None or cycle.response_complete):
            self._write_error(
                408, f"the request's header block did not arrive within {self.header_timeout_s} s"
            )
        elif (
            phase == _BODY
            and cycle is not None
            and not cycle.response_complete
            and not getattr(cycle, "response_started", False)  # a DirectCycle answers all at once, if at all
        ):
            self._write_error(408, f"the request's body did not arrive within {self.body_timeout_s} s")
        transport.close()

    def _start_direct(self) -> bool:
        cycle = self.cycle
        if (cycle is not None and not cycle.response_complete) or self.pipeline or self.expect_100_continue:
            return False  # behind an unfinished request: uvicorn queues it in order
        if self.transport.is_closing():
            return False  # closing (Connection: close, shutdown): nothing new is started here
        parser = self.parser
        if (
            parser.get_method() != b"POST"
            or parser.get_http_version() != "1.1"
            or not parser.should_keep_alive()
            or parser.should_upgrade()
        ):
            return False
        try:
            raw_path = httptools.parse_url(self.url).path
            path = raw_path.decode("ascii")
        except (httptools.HttpParserInvalidURLError, UnicodeDecodeError):
            return False  # uvicorn's path answers it as it always has
        if "%" in path:
            return False
        assert self._direct is not None
        ticket = self._direct.direct_infer("POST", path, wanted_headers(self.headers), time.monotonic_ns())
        if ticket is None:
            return False
        self.cycle = DirectCycle(self, ticket, self.url)  # type: ignore[assignment]
        return True

    def on_body(self, body: bytes) -> None:
        cycle: Any = self.cycle
        if type(cycle) is DirectCycle:
            cycle.chunks.append(body)  # at most the Content-Length, which the gateway bounded
            return
        super().on_body(body)

    def on_message_complete(self) -> None:
        self._phase = _IDLE
        cycle: Any = self.cycle
        if type(cycle) is DirectCycle:
            cycle.body_complete()
            return
        super().on_message_complete()
