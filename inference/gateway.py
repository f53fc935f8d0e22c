"""The inference gateway: a lean ASGI app for ``/v2/...`` (KServe v2, Triton-compatible), ``/metrics`` and
``/readyz``.

It is routed ahead of Django (carbonledger/asgi.py) because Django's request handler costs
more per request than the whole hot path here (bench/compare_triton.py measures the path). Per request it only checks
the API key against an in-memory cache, decodes, validates, enqueues and awaits one future;
the model instance threads do the rest and post each batch's results back in one call.

This module is the HTTP front end: routing, status lines, headers and bodies. What a request does is
core.py's (lifecycle, API keys, infer) and metadata.py's (metadata, statistics, metrics): they return
bytes or raise an ``InferenceError``, whose status and headers are written here. Everything in this
module runs on the event loop's thread.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor
from functools import partial
from pathlib import Path
from typing import Any

from inference import metadata
from inference.batcher import BatchHook, Pending
from inference.core import Admission, InferenceCore, Service
from inference.errors import InferenceError, InvalidInput, NotFound, PayloadTooLarge
from inference.keys import KeyLookup, Principal, PrincipalResolver
from inference.kserve import InferRequest, error_body
from inference.metrics import key_store_lines
from inference.readiness import Check, Readiness
from inference.repository import GatewayOptions, ModelVersion

__all__ = ["DirectInfer", "Gateway", "Principal", "Respond", "wanted_headers"]

log = logging.getLogger(__name__)

Scope = dict[str, Any]
Receive = Callable[[], Awaitable[dict[str, Any]]]
Send = Callable[[dict[str, Any]], Awaitable[None]]

_TEXT_EMPTY = [(b"content-type", b"text/plain"), (b"content-length", b"0")]
_METRICS_HEADERS = [(b"content-type", b"text/plain; version=0.0.4; charset=utf-8")]
_JSON = (b"content-type", b"application/json")
# A body at least this large is decoded on a thread of its own rather than on the event loop: decoding grows with
# the body (seconds for 64 MiB of small BYTES elements), and meanwhile every other request would wait. Smaller
# bodies, the common case, are decoded in place, where a thread hand-off would cost more than the decoding. One
# thread: large bodies wait for each other, never for more threads or memory.
DECODE_OFF_LOOP_BYTES = 1 << 20
_DECODER = ThreadPoolExecutor(max_workers=1, thread_name_prefix="decode-large")
_OCTET_STREAM = (b"content-type", b"application/octet-stream")


def _json_headers(n: int) -> list[tuple[bytes, bytes]]:
    return [_JSON, (b"content-length", str(n).encode())]


def _answer_headers(json_len: int | None) -> list[tuple[bytes, bytes]]:
    """A 200 infer answer's headers without Content-Length (a new list: the caller may append to it)."""
    if json_len is None:
        return [_JSON]
    return [_OCTET_STREAM, (b"inference-header-content-length", str(json_len).encode())]


class Gateway:
    """The ASGI app in front of an ``InferenceCore`` (built here from the same arguments)."""

    def __init__(
        self,
        repository_root: Path,
        options: GatewayOptions,
        resolve_key: PrincipalResolver | None,
        hooks: Sequence[Callable[[ModelVersion], BatchHook]] = (),
        key_cache_seconds: float = 5.0,
        services: Sequence[Service] = (),
        admission: Admission | None = None,
    ) -> None:
        self.core = InferenceCore(
            repository_root, options, resolve_key, hooks, key_cache_seconds, services, admission
        )
        self.options = options
        self.repository = self.core.repository
        # /readyz: the models' readiness alone unless the owner configures more checks (gateway_app does).
        self.readiness = Readiness()
        # More Prometheus lines for /metrics (energy, ledger...): each called per scrape, on the event loop, so
        # each must only read a snapshot.
        self.metric_sources: list[Callable[[], list[str]]] = []

    @property
    def started(self) -> bool:
        return self.core.started

    async def startup(self) -> None:
        await self.core.startup()

    async def shutdown(self) -> None:
        await self.core.shutdown()

    def metrics(self) -> bytes:
        lines = key_store_lines(self.core.key_store_errors())
        for source in self.metric_sources:
            lines.extend(source())
        return metadata.metrics_text(self.repository) + "".join(f"{line}\n" for line in lines).encode()

    def models_check(self) -> Check:
        """KServe's readiness (``/v2/health/ready``) as one of /readyz's checks."""
        if metadata.server_ready(self.repository, self.core.started):
            return Check("models", True, "every model has a ready version")
        if not self.core.started:
            return Check("models", False, "the gateway is starting or stopping")
        broken = sorted(name for name, entry in self.repository.models.items() if not entry.ready_versions)
        return Check("models", False, f"no ready version of {', '.join(broken)}")

    # -- ASGI --------------------------------------------------------------------------------

    async def lifespan(self, receive: Receive, send: Send) -> None:
        """Serve the ASGI lifespan protocol: start the batchers, and stop them at shutdown."""
        while True:
            message = await receive()
            if message["type"] == "lifespan.startup":
                try:
                    await self.startup()
                except Exception as exc:
                    log.exception("gateway start-up failed")
                    await send({"type": "lifespan.startup.failed", "message": str(exc)})
                    return
                await send({"type": "lifespan.startup.complete"})
            elif message["type"] == "lifespan.shutdown":
                await self.shutdown()
                await send({"type": "lifespan.shutdown.complete"})
                return

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "lifespan":
            await self.lifespan(receive, send)
            return
        if scope["type"] != "http":
            return
        path: str = scope["path"]
        method: str = scope["method"]
        repository = self.repository
        try:
            if path == "/metrics":
                await self._send(send, 200, self.metrics(), _METRICS_HEADERS)
                return
            if path == "/readyz":
                status, body = await self.readiness.probe((self.models_check(),))
                await self._send_json(send, status, body)
                return
            if path.startswith("/v2/health/"):
                await self._health(path, send)
                return
            headers = wanted_headers(scope["headers"])
            principal = await self.core.authenticate(headers.get(b"authorization"))
            parts = path.split("/")
            # ['', 'v2', 'models', name, ('versions', v)?, action?]
            if path in ("/v2", "/v2/"):
                await self._send_json(send, 200, metadata.SERVER_METADATA)
                return
            if len(parts) >= 3 and parts[2] == "repository":
                if path == "/v2/repository/index" and method == "POST":
                    await self._send_json(send, 200, metadata.repository_index(repository))
                    return
                raise NotFound(f"no route {method} {path}")
            if len(parts) < 4 or parts[2] != "models" or not parts[3]:
                raise NotFound(f"no route {method} {path}")
            if parts[3] == "stats" and len(parts) == 4:
                await self._send_json(send, 200, metadata.statistics(repository, None, None))
                return
            name = parts[3]
            rest = parts[4:]
            version: str | None = None
            if len(rest) >= 2 and rest[0] == "versions":
                version = rest[1]
                rest = rest[2:]
            action = rest[0] if rest else ""
            if len(rest) > 1:
                raise NotFound(f"no route {method} {path}")
            if action == "infer":
                if method != "POST":
                    raise InferenceError(f"use POST for {path}", 405)
                await self._infer(headers, receive, send, name, version, principal)
            elif action == "":
                await self._send_json(send, 200, metadata.model_metadata(repository, name, version))
            elif action == "ready":
                metadata.check_model_ready(repository, name, version)
                await self._empty(send, 200)
            elif action == "config":
                await self._send_json(send, 200, metadata.model_config(repository, name, version))
            elif action == "stats":
                await self._send_json(send, 200, metadata.statistics(repository, name, version))
            else:
                raise NotFound(f"no route {method} {path}")
        except InferenceError as exc:
            await self._send_json(send, exc.status, error_body(exc.message), exc.headers())

    async def _send(self, send: Send, status: int, body: bytes, headers: list[tuple[bytes, bytes]]) -> None:
        await send(
            {
                "type": "http.response.start",
                "status": status,
                "headers": [*headers, (b"content-length", str(len(body)).encode())],
            }
        )
        await send({"type": "http.response.body", "body": body})

    async def _send_json(
        self, send: Send, status: int, body: bytes, extra: list[tuple[bytes, bytes]] | None = None
    ) -> None:
        headers = _json_headers(len(body))
        if extra:
            headers.extend(extra)
        await send({"type": "http.response.start", "status": status, "headers": headers})
        await send({"type": "http.response.body", "body": body})

    async def _empty(self, send: Send, status: int) -> None:
        await send({"type": "http.response.start", "status": status, "headers": _TEXT_EMPTY})
        await send({"type": "http.response.body", "body": b""})

    async def _health(self, path: str, send: Send) -> None:
        if path == "/v2/health/live":
            await self._empty(send, 200)
        elif path == "/v2/health/ready":
            await self._empty(send, 200 if metadata.server_ready(self.repository, self.core.started) else 400)
        else:
            raise NotFound(f"no route {path}")

    async def _read_body(self, headers: dict[bytes, bytes], receive: Receive) -> bytes:
        limit = self.options.max_body_bytes
        raw_length = headers.get(b"content-length")
        if raw_length is not None:
            try:
                declared = int(raw_length)
            except ValueError:
                raise InvalidInput("Content-Length is not a number") from None
            if declared > limit:
                raise PayloadTooLarge(f"request body of {declared} bytes exceeds the limit of {limit} bytes")
        message = await receive()
        body: bytes = message.get("body", b"")
        if not message.get("more_body"):
            return body
        chunks = [body]
        size = len(body)
        while message.get("more_body"):
            message = await receive()
            if message["type"] == "http.disconnect":
                raise InferenceError("client disconnected", 499)
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > limit:
                raise PayloadTooLarge(f"request body exceeds the limit of {limit} bytes")
            chunks.append(chunk)
        return b"".join(chunks)

    async def _infer(
        self,
        headers: dict[bytes, bytes],
        receive: Receive,
        send: Send,
        name: str,
        version: str | None,
        principal: Principal | None,
    ) -> None:
        received = time.monotonic_ns()
        core = self.core
        mv = core.repository.version(name, version)
        body = await self._read_body(headers, receive)
        loop = asyncio.get_running_loop()
        fut: asyncio.Future[Any] = loop.create_future()
        header_length = headers.get(b"inference-header-content-length")
        if len(body) >= DECODE_OFF_LOOP_BYTES:
            req = await loop.run_in_executor(_DECODER, core.decode, mv, body, header_length, received)
            pending = core.submit_request(mv, req, principal, received, fut)
        else:
            pending = core.submit(mv, body, header_length, principal, received, fut)
        result = await fut
        payload, json_len = core.answer(mv, pending, result)
        response_headers = _answer_headers(json_len)
        response_headers.append((b"content-length", str(len(payload)).encode()))
        await send({"type": "http.response.start", "status": 200, "headers": response_headers})
        await send({"type": "http.response.body", "body": payload})
        core.response_sent(mv, pending, received)

    # -- served directly by the HTTP protocol ---------------------------------------------

    def direct_infer(
        self, method: str, path: str, headers: dict[bytes, bytes], received_ns: int
    ) -> DirectInfer | None:
        """An infer request the HTTP server may serve without an ASGI task, or None.

        Only the common case qualifies: a started gateway, ``POST /v2/models/<m>[/versions/<v>]/infer``
        with a Content-Length within the limit, and an API key the cache answers (or one refused at
        once). Anything else (a key to look up, a chunked or oversized body, another route) goes
        through the ASGI app, which answers it the same way. ``headers`` holds at least the ones
        ``wanted_headers`` keeps. Must be called on the event loop's thread.
        """
        core = self.core
        if method != "POST" or not core.started:
            return None
        parts = path.split("/")
        n = len(parts)
        if n == 5 and parts[4] == "infer":
            version = None
        elif n == 7 and parts[4] == "versions" and parts[6] == "infer" and parts[5]:
            version = parts[5]
        else:
            return None
        name = parts[3]
        if parts[0] or parts[1] != "v2" or parts[2] != "models" or not name:
            return None
        raw_length = headers.get(b"content-length")
        if raw_length is None or not raw_length.isdigit() or int(raw_length) > self.options.max_body_bytes:
            return None
        try:
            principal = core.cached_principal(headers.get(b"authorization"))
        except InferenceError as exc:
            return DirectInfer(core, name, version, headers, None, received_ns, exc)
        if isinstance(principal, KeyLookup):
            return None
        return DirectInfer(core, name, version, headers, principal, received_ns, None)


Respond = Callable[[int, list[tuple[bytes, bytes]], bytes], None]
"""Writes one whole response: status, headers without Content-Length, body."""


def _respond_error(respond: Respond, exc: InferenceError) -> None:
    respond(exc.status, [_JSON, *exc.headers()], error_body(exc.message))


def _answer_direct(
    core: InferenceCore, mv: ModelVersion, pending: Pending, respond: Respond, result: Any
) -> None:
    try:
        payload, json_len = core.answer(mv, pending, result)
    except InferenceError as exc:
        _respond_error(respond, exc)
        return
    except Exception:
        log.exception("encoding the answer of model '%s' failed", mv.spec.name)
        respond(500, [_JSON], error_body("internal error while encoding the response"))
        return
    respond(200, _answer_headers(json_len), payload)
    core.response_sent(mv, pending, pending.payload.received_ns)


class DirectInfer:
    """One infer request accepted for the direct path (``Gateway.direct_infer``), waiting for its body.

    The HTTP protocol collects the body and calls ``serve``; the answer goes to ``respond`` exactly
    once, on the event loop, either at once (a refused request) or when the batch's results arrive.
    Same checks, statistics, ledger and answers as the ASGI path; what it saves is the ASGI task, its
    receive/send messages and the future per request.
    """

    __slots__ = ("_core", "_error", "_headers", "_name", "_principal", "_version", "received_ns")

    def __init__(
        self,
        core: InferenceCore,
        name: str,
        version: str | None,
        headers: dict[bytes, bytes],
        principal: Principal | None,
        received_ns: int,
        error: InferenceError | None,
    ) -> None:
        self._core = core
        self._name = name
        self._version = version
        self._headers = headers
        self._principal = principal
        self.received_ns = received_ns
        self._error = error

    def serve(self, body: bytes, respond: Respond) -> None:
        core = self._core
        try:
            if self._error is not None:
                raise self._error
            mv = core.repository.version(self._name, self._version)
            header_length = self._headers.get(b"inference-header-content-length")
            if len(body) >= DECODE_OFF_LOOP_BYTES:
                decoding = asyncio.get_running_loop().run_in_executor(
                    _DECODER, core.decode, mv, body, header_length, self.received_ns
                )
                decoding.add_done_callback(partial(self._decoded, mv, respond))
                return
            pending = core.submit(mv, body, header_length, self._principal, self.received_ns, None)
        except Exception as exc:
            self._refuse(respond, exc)
            return
        self._answer_when_done(mv, pending, respond)

    def _decoded(self, mv: ModelVersion, respond: Respond, decoding: asyncio.Future[InferRequest]) -> None:
        """A large body's decoding ended (on the event loop's thread, as a done callback)."""
        try:
            pending = self._core.submit_request(
                mv, decoding.result(), self._principal, self.received_ns, None
            )
        except Exception as exc:
            self._refuse(respond, exc)
            return
        self._answer_when_done(mv, pending, respond)

    def _answer_when_done(self, mv: ModelVersion, pending: Pending, respond: Respond) -> None:
        # The result is delivered by core.complete on this (the event loop's) thread, so it cannot arrive
        # before on_done is set here.
        pending.payload.on_done = partial(_answer_direct, self._core, mv, pending, respond)

    def _refuse(self, respond: Respond, exc: Exception) -> None:
        if isinstance(exc, InferenceError):
            _respond_error(respond, exc)
            return
        log.error("accepting an infer request for model '%s' failed", self._name, exc_info=exc)
        respond(500, [_JSON], error_body("internal error while accepting the request"))


_WANTED = frozenset({b"authorization", b"content-length", b"host", b"inference-header-content-length"})


def wanted_headers(pairs: Iterable[tuple[bytes, bytes]]) -> dict[bytes, bytes]:
    """The few request headers the gateway reads, in one pass (names arrive lower-cased)."""
    return {k: v for k, v in pairs if k in _WANTED}
