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
"""

from __future__ import annotations

import asyncio
import time
from typing import Any, Protocol

import httptools
from uvicorn.protocols.http.httptools_impl import STATUS_LINE, HttpToolsProtocol

from inference.gateway import DirectInfer, wanted_headers

_STATUS_LINE_START = b"HTTP/1.1 "
_CONTINUE = b"HTTP/1.1 100 "
_HEADER_END = b"\r\n\r\n"
_MAX_HELD = 16 * 1024  # a header block is far smaller; anything larger is not one
_JOIN_LIMIT = 16 * 1024  # a body at least this large goes out in its own write rather than be copied


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


class CoalescingHttpToolsProtocol(HttpToolsProtocol):
    """HttpToolsProtocol whose responses leave in one write when the body follows at once, and
    which serves the common infer request directly (module docstring)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        direct_ok = self.limit_concurrency is None and not self.root_path
        self._direct = direct_target(self.app) if direct_ok else None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        super().connection_made(HeaderHoldingTransport(transport, self.loop))  # type: ignore[arg-type]

    def on_message_begin(self) -> None:
        super().on_message_begin()
        # uvicorn stops the keep-alive timer only when data arrives or a response completes. A direct
        # refusal is answered inside the parser, and its completion arms the timer; a request that follows
        # in the same packet must stop it, or the timer closes the connection while that request runs.
        self._unset_keepalive_if_required()

    def on_headers_complete(self) -> None:
        if self._direct is not None and self._start_direct():
            return
        super().on_headers_complete()

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
        cycle: Any = self.cycle
        if type(cycle) is DirectCycle:
            cycle.body_complete()
            return
        super().on_message_complete()
