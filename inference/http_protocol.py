"""The gateway's HTTP/1.1 server protocol: httptools' parser on an asyncio Protocol, ours rather than uvicorn's.

It serves every request on a connection itself: the common infer request (``POST /v2/models/<m>/infer`` with a
Content-Length and a cached API key, as ``Gateway.direct_infer`` decides) without an ASGI task at all, and every
other request through a small ASGI HTTP bridge to the application (the KServe ASGI app, Django and the rest).
uvicorn (or whatever starts the server) still runs the process, the sockets and the lifespan: it builds one
protocol per connection from the class with its ``config``, ``server_state`` and ``app_state`` keyword arguments,
and nothing here subclasses or imports uvicorn's protocol classes, which any of its releases may change.

Measured against the uvicorn subclass this replaced (bench/cpu_per_request.py's concurrency-32 phase): the
request path no longer builds an ASGI scope per request, arms and cancels a keep-alive timer per response, or
goes through a wrapping transport to join a response's header block with its body.

One write per answer: a response's status line, headers and body leave in one ``send`` (two segments would cost
a system call and, on loopback, the receiver's TCP processing twice). On the ASGI path the header block of
``http.response.start`` is held until the first body message, which the application sends in the same step in
the common case; if it does not, the held block goes out on the event loop's next iteration. A body of 16 KiB or
more follows its header block in a write of its own rather than be copied into one buffer. ``100 Continue`` is
sent when the application first asks for the body (the client waits for it before sending one).

Pipelining: requests on a connection are answered in order. A request that arrives behind an unfinished one
waits in the connection's queue (reading pauses meanwhile) and then takes the ASGI path.

Slow and greedy clients (class attributes, set from the settings by ``with_limits``): a request's header block
must arrive within ``header_timeout_s`` (counted from its first byte, or from the connection while nothing has
arrived) and its body within ``body_timeout_s`` of the headers' end, or the connection is answered 408 and closed
(closed silently when nothing was asked yet); a time-out covers the whole phase, so trickling a byte at a time
does not extend it. Header blocks over ``max_headers`` or ``max_header_bytes`` get 431, malformed requests 400,
and connections beyond ``max_connections`` in the process 503, each with ``{"error": ...}`` and the connection
closed. Waiting on the server (an answer being computed, or reading paused) never counts against the client.
Between requests the server's keep-alive time-out (uvicorn's ``timeout_keep_alive``) applies.

The time-outs cost the request path no timer and no clock read: a request only notes its phase in a slot (and
where it began), and one sweep per server, about every second, times each phase from the first sweep that saw
it and closes the connections past their time-out, which therefore fires between one and two sweep intervals
late, never early. A timer per connection re-armed per phase would allocate handles and push and cancel heap
entries for every request, on the event loop's thread: several times what the phase bookkeeping costs.
"""

from __future__ import annotations

import asyncio
import contextvars
import http
import logging
import math
import re
import time
import urllib.parse
import weakref
from collections import deque
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any, ClassVar, Protocol, cast

import httptools

from inference.gateway import DirectInfer, wanted_headers
from inference.sweeper import Sweeper, interval_for

log = logging.getLogger("uvicorn.error")  # the server's log, as the process's logging configuration names it
access_log = logging.getLogger("uvicorn.access")

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
App = Callable[[Scope, Receive, Send], Awaitable[None]]


def _status_line(status: int) -> bytes:
    try:
        phrase = http.HTTPStatus(status).phrase.encode()
    except ValueError:
        phrase = b""
    return b"HTTP/1.1 %d %s\r\n" % (status, phrase)


STATUS_LINE = {status: _status_line(status) for status in range(100, 600)}
_CONTINUE = b"HTTP/1.1 100 Continue\r\n\r\n"
# Header names and values an application may not send (they would split or smuggle a response).
_BAD_NAME = re.compile(b'[\x00-\x1f\x7f()<>@,;:\\[\\]={} \t\\\\"]')
_BAD_VALUE = re.compile(b"[\x00-\x08\x0a-\x1f\x7f]")
_JOIN_LIMIT = 16 * 1024  # a body at least this large goes out in its own write rather than be copied
HIGH_WATER_BYTES = 65536  # an unread ASGI request body beyond this pauses reading

# A connection's phase, for the read time-outs.
_WAITING = 0  # connected, no byte of a request yet: the header time-out runs
_HEADER = 1  # a request's header block is arriving: the header time-out runs
_BODY = 2  # its body is arriving: the body time-out runs
_IDLE = 3  # answering: no time-out
_KEEP_ALIVE = 4  # answered, nothing more asked: the keep-alive time-out runs


class FlowControl:
    """Reading paused while a body waits to be consumed or a request waits its turn; writing paused while the
    transport's buffer is over its high-water mark (``drain`` waits for it to come down)."""

    __slots__ = ("_transport", "_writable", "read_paused", "write_paused")

    def __init__(self, transport: asyncio.Transport) -> None:
        self._transport = transport
        self.read_paused = False
        self.write_paused = False
        self._writable = asyncio.Event()
        self._writable.set()

    async def drain(self) -> None:
        await self._writable.wait()

    def pause_reading(self) -> None:
        if not self.read_paused:
            self.read_paused = True
            self._transport.pause_reading()

    def resume_reading(self) -> None:
        if self.read_paused:
            self.read_paused = False
            self._transport.resume_reading()

    def pause_writing(self) -> None:
        if not self.write_paused:
            self.write_paused = True
            self._writable.clear()

    def resume_writing(self) -> None:
        if self.write_paused:
            self.write_paused = False
            self._writable.set()


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


def _address(info: Any) -> tuple[str, int] | None:
    if isinstance(info, (tuple, list)) and len(info) >= 2:
        return str(info[0]), int(info[1])
    return None


class DirectCycle:
    """One infer request served without an ASGI task: its body is collected, handed to the gateway's ticket, and
    the answer written in one write when it comes (``respond``, on the event loop)."""

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

    def __init__(self, protocol: Any, ticket: DirectInfer | None, url: bytes) -> None:
        self._protocol = protocol
        self.ticket: DirectInfer | None = ticket
        self.url = url
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
        chunks = self.chunks
        body = chunks[0] if len(chunks) == 1 else b"".join(chunks)
        self.chunks = []
        ticket.serve(body, self.respond)

    def wake(self) -> None:
        pass  # nothing waits on a direct request but its answer

    def respond(self, status: int, headers: list[tuple[bytes, bytes]], body: bytes) -> None:
        if self.response_complete or self.waiting:
            return
        protocol = self._protocol
        if protocol.flow.write_paused and not self.disconnected:
            # A client that does not read gets nothing more until it does. The request stays unfinished
            # meanwhile, so one behind it waits its turn (and reading pauses).
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
        if protocol.access_log:  # uvicorn's access line
            client = protocol.client
            access_log.info(
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


class AsgiCycle:
    """One request handed to the ASGI application: its ``receive`` and ``send``, the body as it arrives, and the
    response written as the application sends it (header block and first body part in one write)."""

    __slots__ = (
        "_head",
        "_protocol",
        "body",
        "chunked",
        "disconnected",
        "expected_length",
        "keep_alive",
        "message_event",
        "more_body",
        "response_complete",
        "response_started",
        "scope",
        "waiting_for_100_continue",
    )

    def __init__(
        self, protocol: GatewayHttpProtocol, scope: Scope, keep_alive: bool, expect_100: bool
    ) -> None:
        self._protocol = protocol
        self.scope = scope
        self.keep_alive = keep_alive
        self.waiting_for_100_continue = expect_100
        self.disconnected = False
        self.body = bytearray()
        self.more_body = True
        self.message_event = asyncio.Event()
        self.response_started = False
        self.response_complete = False
        self.chunked: bool | None = None
        self.expected_length = 0
        self._head: bytes | None = None

    def wake(self) -> None:
        self.message_event.set()

    async def run(self, app: App) -> None:
        try:
            # An application that returns something is an error worth naming (typing says it returns None).
            result: Any = await cast("Callable[..., Awaitable[Any]]", app)(
                self.scope, self.receive, self.send
            )
        except BaseException as exc:
            log.error("Exception in ASGI application\n", exc_info=exc)
            if not self.response_started:
                await self._send_500()
            else:
                self._flush_head()
                self._protocol.transport.close()
        else:
            if result is not None:
                log.error("ASGI callable should return None, but returned '%s'.", result)
                self._protocol.transport.close()
            elif not self.response_started and not self.disconnected:
                log.error("ASGI callable returned without starting response.")
                await self._send_500()
            elif not self.response_complete and not self.disconnected:
                log.error("ASGI callable returned without completing response.")
                self._flush_head()
                self._protocol.transport.close()

    async def _send_500(self) -> None:
        await self.send(
            {
                "type": "http.response.start",
                "status": 500,
                "headers": [
                    (b"content-type", b"text/plain; charset=utf-8"),
                    (b"content-length", b"21"),
                    (b"connection", b"close"),
                ],
            }
        )
        await self.send({"type": "http.response.body", "body": b"Internal Server Error", "more_body": False})

    async def receive(self) -> Message:
        protocol = self._protocol
        if self.waiting_for_100_continue and not protocol.transport.is_closing():
            protocol.transport.write(_CONTINUE)
            self.waiting_for_100_continue = False
        if not self.disconnected and not self.response_complete:
            protocol.flow.resume_reading()
            await self.message_event.wait()
            self.message_event.clear()
        if self.disconnected or self.response_complete:
            return {"type": "http.disconnect"}
        message = {"type": "http.request", "body": bytes(self.body), "more_body": self.more_body}
        self.body = bytearray()
        return message

    async def send(self, message: Message) -> None:
        protocol = self._protocol
        if protocol.flow.write_paused and not self.disconnected:
            await protocol.flow.drain()
        if self.disconnected:
            return
        kind = message["type"]
        if not self.response_started:
            if kind != "http.response.start":
                raise RuntimeError(f"Expected ASGI message 'http.response.start', but got '{kind}'.")
            self._start(message)
        elif not self.response_complete:
            if kind != "http.response.body":
                raise RuntimeError(f"Expected ASGI message 'http.response.body', but got '{kind}'.")
            self._body(message.get("body", b""), message.get("more_body", False))
        else:
            raise RuntimeError(f"Unexpected ASGI message '{kind}' sent, after response already completed.")

    def _start(self, message: Message) -> None:
        self.response_started = True
        self.waiting_for_100_continue = False
        protocol = self._protocol
        status = message["status"]
        scope = self.scope
        if protocol.access_log:
            client = scope.get("client")
            query = scope.get("query_string", b"")
            target = scope["root_path"] + scope["path"] + ("?" + query.decode("ascii") if query else "")
            access_log.info(
                '%s - "%s %s HTTP/%s" %d',
                f"{client[0]}:{client[1]}" if client else "",
                scope["method"],
                target,
                scope["http_version"],
                status,
            )
        content = [STATUS_LINE[status]]
        close_asked = False
        for name, value in (*protocol.server_state.default_headers, *message.get("headers", ())):
            if _BAD_NAME.search(name):
                raise RuntimeError("Invalid HTTP header name.")
            if _BAD_VALUE.search(value):
                raise RuntimeError("Invalid HTTP header value.")
            name = name.lower()
            if name == b"content-length" and self.chunked is None:
                self.expected_length = int(value.decode())
                self.chunked = False
            elif name == b"transfer-encoding" and value.lower() == b"chunked":
                self.expected_length = 0
                self.chunked = True
            elif name == b"connection" and b"close" in [t.lower().strip() for t in value.split(b",")]:
                self.keep_alive = False
                close_asked = True
            content.extend((name, b": ", value, b"\r\n"))
        if not self.keep_alive and not close_asked:
            content.append(b"connection: close\r\n")
        if self.chunked is None and scope["method"] != "HEAD" and status not in (204, 304):
            self.chunked = True  # neither a length nor an encoding given
            content.append(b"transfer-encoding: chunked\r\n")
        content.append(b"\r\n")
        self._head = b"".join(content)
        # Held for the body, which usually follows in this same step; if it does not, it goes out next iteration.
        protocol.loop.call_soon(self._flush_head)

    def _flush_head(self) -> None:
        head = self._head
        if head is not None:
            self._head = None
            if not self.disconnected:
                self._protocol.transport.write(head)

    def _body(self, body: bytes, more_body: bool) -> None:
        if self.scope["method"] == "HEAD":
            self.expected_length = 0
            data = b""
        elif self.chunked:
            parts = [b"%x\r\n" % len(body), body, b"\r\n"] if body else []
            if not more_body:
                parts.append(b"0\r\n\r\n")
            data = b"".join(parts)
        else:
            if len(body) > self.expected_length:
                raise RuntimeError("Response content longer than Content-Length")
            self.expected_length -= len(body)
            data = body
        transport = self._protocol.transport
        head = self._head
        if head is not None:
            self._head = None
            if len(data) >= _JOIN_LIMIT:
                transport.write(head)
                transport.write(data)
            else:
                transport.write(head + data)
        elif data:
            transport.write(data)
        if not more_body:
            if self.expected_length != 0:
                raise RuntimeError("Response content shorter than Content-Length")
            self.response_complete = True
            self.message_event.set()
            if not self.keep_alive:
                transport.close()
            self._protocol.on_response_complete()


async def _service_unavailable(scope: Scope, receive: Receive, send: Send) -> None:
    await send(
        {
            "type": "http.response.start",
            "status": 503,
            "headers": [
                (b"content-type", b"text/plain; charset=utf-8"),
                (b"content-length", b"19"),
                (b"connection", b"close"),
            ],
        }
    )
    await send({"type": "http.response.body", "body": b"Service Unavailable", "more_body": False})


class _Refused(Exception):
    """Raised inside a parser callback once the request has been answered and the connection closed: it stops
    the parser from calling back for the rest of the data."""


def _sweep(conn: Any, now: float) -> None:
    if isinstance(conn, GatewayHttpProtocol):  # the server's set may hold other protocols' connections
        conn._swept(now)


# One sweeper per server (its state object is shared by all of a server's connections).
_sweepers: weakref.WeakKeyDictionary[Any, Sweeper] = weakref.WeakKeyDictionary()


class GatewayHttpProtocol(asyncio.Protocol):
    """One HTTP/1.1 connection (module docstring). Built per connection by uvicorn from its ``config`` (the
    loaded app, ``timeout_keep_alive``, ``root_path``, ``limit_concurrency``) and ``server_state`` (the
    connection set its shutdown and our sweep walk, the tasks it waits for, the default headers).

    The limits are class attributes, since the server builds a protocol per connection from the class:
    ``with_limits`` makes a configured one.
    """

    __slots__ = (
        "_active",
        "_begin_at",
        "_begin_end",
        "_chunk_start",
        "_direct",
        "_keep_alive_s",
        "_mark_begin",
        "_mark_phase",
        "_max_header_bytes",
        "_max_headers",
        "_phase",
        "_refused",
        "_reset_contextvars",
        "_seen",
        "_since",
        "access_log",
        "app",
        "app_state",
        "asgi_version",
        "client",
        "connections",
        "cycle",
        "expect_100_continue",
        "flow",
        "headers",
        "limit_concurrency",
        "loop",
        "parser",
        "pipeline",
        "root_path",
        "scheme",
        "server",
        "server_state",
        "tasks",
        "transport",
        "url",
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
    ) -> type[GatewayHttpProtocol]:
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
        return cast("type[GatewayHttpProtocol]", type(cls.__name__, (cls,), {"__slots__": (), **limits}))

    def __init__(
        self,
        config: Any,
        server_state: Any,
        app_state: dict[str, Any],
        _loop: asyncio.AbstractEventLoop | None = None,
    ) -> None:
        if not config.loaded:
            config.load()
        self.app: App = config.loaded_app
        self.loop = _loop or asyncio.get_event_loop()
        self.access_log = access_log.hasHandlers()
        self.parser = httptools.HttpRequestParser(self)
        # Answer a request even when data follows its "Connection: close" in the same packet.
        self.parser.set_dangerous_leniencies(lenient_data_after_close=True)
        self.root_path: str = config.root_path
        self.asgi_version: str = config.asgi_version
        self.limit_concurrency: int | None = config.limit_concurrency
        self._keep_alive_s = float(config.timeout_keep_alive)
        self._reset_contextvars = bool(getattr(config, "reset_contextvars", False))
        self.app_state = app_state
        self.server_state = server_state
        self.connections: set[Any] = server_state.connections
        self.tasks: set[asyncio.Task[None]] = server_state.tasks
        direct_ok = self.limit_concurrency is None and not self.root_path
        self._direct = direct_target(self.app) if direct_ok else None

        self.transport: asyncio.Transport = None  # type: ignore[assignment]
        self.flow: FlowControl = None  # type: ignore[assignment]
        self.server: tuple[str, int] | None = None
        self.client: tuple[str, int] | None = None
        self.scheme = "http"
        self.pipeline: deque[tuple[AsgiCycle, App]] = deque()  # requests waiting their turn, oldest first
        self.cycle: DirectCycle | AsgiCycle | None = None  # the latest request's
        self._active: DirectCycle | AsgiCycle | None = None  # the request being answered

        self.url = b""
        self.headers: list[tuple[bytes, bytes]] = []
        self.expect_100_continue = False
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

    # -- asyncio.Protocol --------------------------------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.connections.add(self)
        self.transport = transport
        self.flow = FlowControl(transport)
        self.server = _address(transport.get_extra_info("sockname"))
        self.client = _address(transport.get_extra_info("peername"))
        self.scheme = "https" if transport.get_extra_info("sslcontext") else "http"
        if len(self.connections) > self.max_connections:
            self._refuse(503, "the server has too many connections open; retry later", b"retry-after: 1\r\n")
            return
        self._phase = self._mark_phase = _WAITING
        self._mark_begin = 0
        self._since = time.monotonic()
        sweeper = _sweepers.get(self.server_state)
        if sweeper is None:
            interval = interval_for(self.header_timeout_s, self.body_timeout_s, self._keep_alive_s)
            sweeper = _sweepers[self.server_state] = Sweeper(self.loop, self.connections, interval, _sweep)
        sweeper.watch()

    def connection_lost(self, exc: Exception | None) -> None:
        self.connections.discard(self)
        self._phase = _IDLE
        for cycle in (self._active, self.cycle):
            if cycle is not None and not cycle.response_complete:
                cycle.disconnected = True
                cycle.wake()
        if self.cycle is not None:
            self.cycle.wake()  # an ASGI app listening for the disconnect after its answer
        if self.flow is not None:
            self.flow.resume_writing()  # releases writers waiting to drain: they find the connection gone
        if exc is None:
            self.transport.close()

    def eof_received(self) -> bool | None:
        return None  # the transport closes; connection_lost follows

    def pause_writing(self) -> None:
        self.flow.pause_writing()

    def resume_writing(self) -> None:
        self.flow.resume_writing()

    def data_received(self, data: bytes) -> None:
        seen = self._seen
        self._chunk_start = seen
        self._seen = seen + len(data)
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserUpgrade:
            # No protocol to upgrade to: the request was served as plain HTTP; what follows it is not HTTP.
            log.warning("Unsupported upgrade request.")
            if self.cycle is not None:
                self.cycle.keep_alive = False
                if self.cycle.response_complete and not self.transport.is_closing():
                    self.transport.close()
            return
        except httptools.HttpParserCallbackError as exc:
            if self._refused:
                return  # answered already (the callback raised _Refused)
            log.error("serving an HTTP request failed", exc_info=exc.__context__ or exc)
            self._refuse(500, "internal error while reading the request")
            return
        except httptools.HttpParserError as exc:
            log.warning("Invalid HTTP request received.")
            self._refuse(400, f"invalid HTTP request: {exc}")
            return
        if self._phase < _BODY:  # a header block still arriving: check it before reading more of it
            if len(self.headers) > self._max_headers:
                self._refuse(431, f"the request has more than {self._max_headers} header fields")
            elif self._seen - self._begin_at > self._max_header_bytes and self._header_block_over(
                in_progress=True
            ):
                self._refuse(431, f"the request's header block exceeds {self._max_header_bytes} bytes")

    # -- parser callbacks --------------------------------------------------------------------------------------

    def on_message_begin(self) -> None:
        self.url = b""
        self.headers = []
        self.expect_100_continue = False
        self._phase = _HEADER
        self._begin_at = self._chunk_start
        self._begin_end = self._seen

    def on_url(self, url: bytes) -> None:
        self.url += url

    def on_header(self, name: bytes, value: bytes) -> None:
        name = name.lower()
        # llhttp keeps trailing whitespace, which RFC 9110 section 5.5 excludes from the value.
        value = value.rstrip(b" \t")
        if name == b"expect" and value.lower() == b"100-continue":
            self.expect_100_continue = True
        self.headers.append((name, value))

    def on_headers_complete(self) -> None:
        if len(self.headers) > self._max_headers:
            self._refuse(431, f"the request has more than {self._max_headers} header fields")
            raise _Refused
        if self._seen - self._begin_at > self._max_header_bytes and self._header_block_over(
            in_progress=False
        ):
            self._refuse(431, f"the request's header block exceeds {self._max_header_bytes} bytes")
            raise _Refused
        if self.transport.is_closing():
            self._refused = True  # an earlier answer closed the connection: nothing new is started
            raise _Refused
        self._phase = _BODY
        previous = self.cycle
        idle = previous is None or previous.response_complete
        if idle and self._direct is not None and not self.expect_100_continue and self._start_direct():
            return
        self._start_asgi(idle)

    def on_body(self, body: bytes) -> None:
        cycle = self.cycle
        if type(cycle) is DirectCycle:
            cycle.chunks.append(body)  # at most the Content-Length, which the gateway bounded
            return
        assert isinstance(cycle, AsgiCycle)
        if cycle.response_complete:
            return  # answered without reading it
        cycle.body += body
        if len(cycle.body) > HIGH_WATER_BYTES:
            self.flow.pause_reading()
        cycle.message_event.set()

    def on_message_complete(self) -> None:
        self._phase = _IDLE
        cycle = self.cycle
        if type(cycle) is DirectCycle:
            cycle.body_complete()
            return
        assert isinstance(cycle, AsgiCycle)
        if not cycle.response_complete:
            cycle.more_body = False
            cycle.message_event.set()

    # -- requests ----------------------------------------------------------------------------------------------

    def _start_direct(self) -> bool:
        parser = self.parser
        if (
            parser.get_method() != b"POST"
            or parser.get_http_version() != "1.1"
            or not parser.should_keep_alive()
            or parser.should_upgrade()
        ):
            return False
        url = self.url
        if b"?" in url or b"#" in url or b"%" in url:
            return False  # the ASGI path parses and unquotes it
        try:
            path = url.decode("ascii")
        except UnicodeDecodeError:
            return False
        assert self._direct is not None
        ticket = self._direct.direct_infer("POST", path, wanted_headers(self.headers), time.monotonic_ns())
        if ticket is None:
            return False
        self.cycle = self._active = DirectCycle(self, ticket, url)
        return True

    def _start_asgi(self, idle: bool) -> None:
        parser = self.parser
        http_version = parser.get_http_version()
        try:
            parsed = httptools.parse_url(self.url)
        except httptools.HttpParserInvalidURLError:
            self._refuse(400, "invalid HTTP request: the request target is not a URL")
            raise _Refused from None
        raw_path = parsed.path
        path = raw_path.decode("ascii")
        if "%" in path:
            path = urllib.parse.unquote(path)
        root_path = self.root_path
        scope: Scope = {
            "type": "http",
            "asgi": {"version": self.asgi_version, "spec_version": "2.3"},
            "http_version": http_version,
            "server": self.server,
            "client": self.client,
            "scheme": self.scheme,
            "method": parser.get_method().decode("ascii"),
            "root_path": root_path,
            "path": root_path + path,
            "raw_path": root_path.encode("ascii") + raw_path,
            "query_string": parsed.query or b"",
            "headers": self.headers,
            "state": self.app_state.copy(),
        }
        app = self.app
        limit = self.limit_concurrency
        if limit is not None and (len(self.connections) >= limit or len(self.tasks) >= limit):
            log.warning("Exceeded concurrency limit.")
            app = _service_unavailable
        keep_alive = http_version != "1.0" and parser.should_keep_alive()
        cycle = AsgiCycle(self, scope, keep_alive, self.expect_100_continue)
        self.cycle = cycle
        if idle:
            self._run(cycle, app)
        else:
            # Behind an unfinished request: it waits its turn, and reading pauses meanwhile.
            self.flow.pause_reading()
            self.pipeline.append((cycle, app))

    def _run(self, cycle: AsgiCycle, app: App) -> None:
        self._active = cycle
        context = contextvars.Context() if self._reset_contextvars else None
        task = self.loop.create_task(cycle.run(app), context=context)
        task.add_done_callback(self.tasks.discard)
        self.tasks.add(task)

    def on_response_complete(self) -> None:
        """A request's answer is written: start the next one waiting, else the keep-alive time begins."""
        self.server_state.total_requests += 1
        self._active = None
        if self.transport.is_closing():
            return
        self.flow.resume_reading()
        if self.pipeline:
            cycle, app = self.pipeline.popleft()
            self._run(cycle, app)
        elif self._phase == _IDLE:
            self._phase = _KEEP_ALIVE

    def shutdown(self) -> None:
        """The server is stopping: close now if nothing is being answered, else after the latest answer."""
        cycle = self.cycle
        if cycle is None or cycle.response_complete:
            self.transport.close()
        else:
            cycle.keep_alive = False

    # -- refusals and time-outs --------------------------------------------------------------------------------

    def _header_block_over(self, in_progress: bool) -> bool:
        """Whether the current request's header block exceeds ``max_header_bytes`` (the request target and each
        header line); ``in_progress``: counting also the bytes of a field still arriving, which the parser
        holds back until it ends."""
        size = len(self.url) + sum(len(name) + len(value) + 4 for name, value in self.headers)
        if in_progress:
            size = max(size, self._seen - self._begin_end)
        return size > self._max_header_bytes

    def _answer_due(self) -> bool:
        """Whether an earlier request's answer is still to be written (a refusal written now would precede it)."""
        cycle = self.cycle
        return cycle is not None and not cycle.response_complete

    def _refuse(self, status: int, message: str, extra_headers: bytes = b"") -> None:
        """Answers ``status`` with ``{"error": message}`` and closes the connection. Nothing is written if an
        earlier request's answer is still due (it would be sent after this one); the connection just closes."""
        self._refused = True
        self._phase = _IDLE
        transport = self.transport
        if transport.is_closing():
            return
        if not self._answer_due():
            self._write_error(status, message, extra_headers)
        transport.close()

    def _write_error(self, status: int, message: str, extra_headers: bytes = b"") -> None:
        text = message.replace("\\", "/").replace('"', "'")
        body = b'{"error":"' + text.encode("ascii", "replace") + b'"}'
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
        if phase == _KEEP_ALIVE:
            if now - self._since >= self._keep_alive_s:
                self._phase = _IDLE
                if not self.transport.is_closing():
                    self.transport.close()
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
        cycle = self.cycle
        if phase == _HEADER and not self._answer_due():
            self._write_error(
                408, f"the request's header block did not arrive within {self.header_timeout_s} s"
            )
        elif (
            phase == _BODY
            and cycle is not None
            and not cycle.response_complete
            and not getattr(
                cycle, "response_started", False
            )  # a direct request answers all at once, if at all
        ):
            self._write_error(408, f"the request's body did not arrive within {self.body_timeout_s} s")
        transport.close()
