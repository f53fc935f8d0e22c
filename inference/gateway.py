"""The inference gateway: a lean ASGI app for ``/v2/...`` (KServe v2, Triton-compatible) and ``/metrics``.

It is routed ahead of Django (carbonledger/asgi.py) because Django's request handler costs
more per request than the whole hot path here (ARCHITECTURE.md). Per request it only checks
the API key against an in-memory cache, decodes, validates, enqueues and awaits one future;
the model instance threads do the rest and post each batch's results back in one call.
"""

from __future__ import annotations

import asyncio
import gc
import logging
import time
from collections.abc import Awaitable, Callable, Iterable, Sequence
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any, Protocol

import numpy as np
import orjson

from inference.batcher import BatchHook, Pending
from inference.efficiency import prometheus_lines as efficiency_prometheus_lines
from inference.errors import (
    Forbidden,
    InferenceError,
    InvalidInput,
    NotFound,
    PayloadTooLarge,
    RequestTimeout,
    Unauthorized,
)
from inference.kserve import (
    InferRequest,
    decode_request,
    encode_response,
    error_body,
    parse_header_length,
    shape_signature,
    validate_request,
)
from inference.repository import GatewayOptions, ModelRepository, ModelVersion
from inference.stats import prometheus_text
from inference.variants import prometheus_lines as variant_prometheus_lines

log = logging.getLogger(__name__)

Scope = dict[str, Any]
Receive = Callable[[], Awaitable[dict[str, Any]]]
Send = Callable[[dict[str, Any]], Awaitable[None]]

SERVER_NAME = "carbonledger"
SERVER_VERSION = "0.1.0"
EXTENSIONS = [
    "binary_tensor_data",
    "parameters",
    "statistics",
    "model_repository",
    "model_configuration",
    "schedule_policy",
]


@dataclass(frozen=True, slots=True)
class Principal:
    """Who an API key speaks for: the organization every request is recorded under."""

    organization_id: int
    organization_slug: str
    key_id: int
    scopes: frozenset[str]


KeyResolver = Callable[[str], Awaitable[Principal | None]]


class InferCall:
    """The payload the batcher carries for one HTTP infer request."""

    __slots__ = ("future", "inputs", "ledger_id", "on_done", "principal", "received_ns", "request")

    def __init__(
        self,
        request: InferRequest,
        future: asyncio.Future[Any] | None,
        principal: Principal | None,
        received_ns: int,
    ) -> None:
        self.request = request
        self.inputs = request.inputs
        # Exactly one of the two receives the result on the event loop: the future (an ASGI request's
        # task awaits it) or on_done (a request served directly by the HTTP protocol, see DirectInfer).
        self.future = future
        self.on_done: Callable[[Any], None] | None = None
        self.principal = principal
        self.received_ns = received_ns
        self.ledger_id: str | None = None  # set by the ledger recorder before the answer is delivered


class KeyStoreUnavailable(InferenceError):
    status = 503

    def headers(self) -> list[tuple[bytes, bytes]]:
        return [(b"retry-after", b"1")]


_TEXT_EMPTY = [(b"content-type", b"text/plain"), (b"content-length", b"0")]


def _json_headers(n: int) -> list[tuple[bytes, bytes]]:
    return [(b"content-type", b"application/json"), (b"content-length", str(n).encode())]


class Service(Protocol):
    """Something the gateway starts before its models load and stops after they have stopped."""

    def start(self) -> None: ...

    def stop(self) -> None: ...


class Admission(Protocol):
    def admit(self) -> None: ...


class Gateway:
    def __init__(
        self,
        repository_root: Path,
        options: GatewayOptions,
        resolve_key: KeyResolver | None,
        hooks: Sequence[Callable[[ModelVersion], BatchHook]] = (),
        key_cache_seconds: float = 5.0,
        services: Sequence[Service] = (),
        admission: Admission | None = None,
    ) -> None:
        self.options = options
        self._resolve_key = resolve_key
        self._key_cache: dict[str, tuple[Principal, float]] = {}
        self._key_cache_s = key_cache_seconds
        self._loop: asyncio.AbstractEventLoop | None = None
        self.repository = ModelRepository(repository_root, options, self._deliver, hooks)
        self.started = False
        self._services = list(services)
        self._admission = admission
        self._server_meta = orjson.dumps(
            {"name": SERVER_NAME, "version": SERVER_VERSION, "extensions": EXTENSIONS}
        )

    # -- lifecycle ---------------------------------------------------------------------------

    async def startup(self) -> None:
        self._loop = asyncio.get_running_loop()
        await self._loop.run_in_executor(None, self._start_blocking)
        self.started = True

    def _start_blocking(self) -> None:
        for service in self._services:
            service.start()
        self.repository.load()
        if self.options.freeze_heap_after_start:
            gc.collect()
            gc.freeze()
            log.info("gateway started: %d objects frozen out of the garbage collector", gc.get_freeze_count())

    async def shutdown(self) -> None:
        self.started = False
        if self._loop is not None:
            await self._loop.run_in_executor(None, self._stop_blocking)

    def _stop_blocking(self) -> None:
        # Models first (their last batches get recorded), then services in reverse order.
        self.repository.stop()
        for service in reversed(self._services):
            try:
                service.stop()
            except Exception:
                log.exception("stopping %s failed", type(service).__name__)

    def _deliver(self, items: list[tuple[Pending, Any]]) -> None:
        # Called on instance threads: one loop wake-up per batch.
        loop = self._loop
        if loop is not None and not loop.is_closed():
            loop.call_soon_threadsafe(_complete, items)

    # -- auth --------------------------------------------------------------------------------

    def _cached_principal(self, headers: dict[bytes, bytes]) -> Principal | _KeyLookup | None:
        """The request's principal when the key cache answers; a ``_KeyLookup`` when the key store must.

        Raises Unauthorized or Forbidden for a missing, malformed or under-scoped key.
        """
        if self._resolve_key is None:
            return None
        raw = headers.get(b"authorization")
        if raw is None:
            raise Unauthorized("missing API key: send the header 'Authorization: Bearer <key>'")
        scheme, _, token = raw.decode("latin-1").partition(" ")
        token = token.strip()
        if scheme.lower() != "bearer" or not token:
            raise Unauthorized("malformed Authorization header: expected 'Bearer <key>'")
        hit = self._key_cache.get(token)
        if hit is not None and hit[1] > time.monotonic():
            return _with_infer_scope(hit[0])
        return _KeyLookup(token, hit)

    async def _principal(self, headers: dict[bytes, bytes]) -> Principal | None:
        found = self._cached_principal(headers)
        if not isinstance(found, _KeyLookup):
            return found
        assert self._resolve_key is not None
        token, hit = found.token, found.stale
        try:
            resolved = await self._resolve_key(token)
        except Exception as exc:
            # The key store (the database) is unreachable. A key that was valid moments ago
            # stays valid through the outage, so serving goes on while the spool has room;
            # an unknown key cannot be checked and is refused as unavailable, not as invalid.
            if hit is not None:
                log.warning("API key lookup failed (%s); using the last known answer for this key", exc)
                return _with_infer_scope(hit[0])
            raise KeyStoreUnavailable(
                "cannot check the API key right now: the key store is unreachable; retry shortly"
            ) from exc
        if resolved is None:
            self._key_cache.pop(token, None)
            raise Unauthorized("invalid or revoked API key")
        if len(self._key_cache) > 10_000:
            self._key_cache.clear()
        self._key_cache[token] = (resolved, time.monotonic() + self._key_cache_s)
        return _with_infer_scope(resolved)

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
        try:
            if path == "/metrics":
                await self._send(
                    send,
                    200,
                    self.metrics(),
                    [(b"content-type", b"text/plain; version=0.0.4; charset=utf-8")],
                )
                return
            if path.startswith("/v2/health/"):
                await self._health(path, send)
                return
            headers = wanted_headers(scope["headers"])
            principal = await self._principal(headers)
            parts = path.split("/")
            # ['', 'v2', 'models', name, ('versions', v)?, action?]
            if path in ("/v2", "/v2/"):
                await self._send_json(send, 200, self._server_meta)
                return
            if len(parts) >= 3 and parts[2] == "repository":
                if path == "/v2/repository/index" and method == "POST":
                    await self._send_json(send, 200, orjson.dumps(self.repository.index()))
                    return
                raise NotFound(f"no route {method} {path}")
            if len(parts) < 4 or parts[2] != "models" or not parts[3]:
                raise NotFound(f"no route {method} {path}")
            if parts[3] == "stats" and len(parts) == 4:
                await self._stats(send, None, None)
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
                await self._metadata(send, name, version)
            elif action == "ready":
                await self._model_ready(send, name, version)
            elif action == "config":
                entry = self.repository.entry(name)
                if entry.spec is None:
                    raise InferenceError(f"model '{name}' has a broken config: {entry.reason}", 400)
                if version:
                    self.repository.version(name, version)
                await self._send_json(
                    send,
                    200,
                    next(iter(entry.versions.values())).config_bytes
                    if entry.versions
                    else orjson.dumps(entry.spec.config_dict),
                )
            elif action == "stats":
                await self._stats(send, name, version)
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
            ready = self.started and all(e.ready_versions for e in self.repository.models.values())
            await self._empty(send, 200 if ready else 400)
        else:
            raise NotFound(f"no route {path}")

    async def _metadata(self, send: Send, name: str, version: str | None) -> None:
        entry = self.repository.entry(name)
        if version:
            self.repository.version(name, version)
        elif not entry.ready_versions:
            self.repository.version(name, None)  # raises with the reason
        await self._send_json(send, 200, entry.metadata_bytes)

    async def _model_ready(self, send: Send, name: str, version: str | None) -> None:
        entry = self.repository.entry(name)
        if version:
            mv = entry.versions.get(version)
            if mv is None:
                raise NotFound(f"Request for unknown model: '{name}' version {version} is not found")
            ok, reason = mv.ready, mv.reason
        else:
            ok = bool(entry.ready_versions)
            reason = entry.reason
        if ok:
            await self._empty(send, 200)
        else:
            raise InferenceError(
                f"Model version not ready: {reason}" if reason else "Model version not ready", 400
            )

    async def _stats(self, send: Send, name: str | None, version: str | None) -> None:
        if name is None:
            versions = self.repository.all_versions()
        elif version:
            versions = [self.repository.version(name, version)]
        else:
            versions = list(self.repository.entry(name).versions.values())
        doc = {"model_stats": [mv.stats.as_triton() for mv in versions]}
        await self._send_json(send, 200, orjson.dumps(doc))

    def metrics(self) -> bytes:
        versions = self.repository.all_versions()
        entries = [(mv.stats, mv.batcher.pending_count if mv.batcher is not None else 0) for mv in versions]
        planners = [
            (mv.spec.name, mv.version, mv.batcher.planner)
            for mv in versions
            if mv.batcher is not None and mv.batcher.planner is not None
        ]
        policies = [(mv.spec.name, mv.variant_policy) for mv in versions if mv.variant_policy is not None]
        extra = efficiency_prometheus_lines(planners, time.monotonic_ns()) + variant_prometheus_lines(
            self.repository.grid, policies
        )
        return prometheus_text(entries, extra)

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
        mv = self.repository.version(name, version)
        body = await self._read_body(headers, receive)
        fut: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        pending = self._submit(mv, headers, body, principal, received, fut)
        result = await fut
        payload, response_headers = self._answer(mv, pending, result)
        response_headers.append((b"content-length", str(len(payload)).encode()))
        await send({"type": "http.response.start", "status": 200, "headers": response_headers})
        await send({"type": "http.response.body", "body": payload})
        self._response_sent(mv, pending, received)

    def _submit(
        self,
        mv: ModelVersion,
        headers: dict[bytes, bytes],
        body: bytes,
        principal: Principal | None,
        received: int,
        future: asyncio.Future[Any] | None,
    ) -> Pending:
        """Decode, validate and enqueue one infer request; raises the InferenceError that refuses it."""
        spec = mv.spec
        header_len = headers.get(b"inference-header-content-length")
        try:
            req = decode_request(body, parse_header_length(header_len, len(body)))
            rows = validate_request(spec, req)
            priority, timeout_us = _schedule_params(req)
            if self._admission is not None:
                self._admission.admit()
        except InferenceError:
            mv.stats.record_failure("OTHER", time.monotonic_ns() - received)
            raise
        call = InferCall(req, future, principal, received)
        pending = Pending(call, rows, shape_signature(spec, req), priority, timeout_us)
        assert mv.batcher is not None
        try:
            mv.batcher.enqueue(pending)
        except InferenceError as exc:
            mv.stats.record_failure(exc.reason, time.monotonic_ns() - received)
            raise
        return pending

    def _answer(
        self, mv: ModelVersion, pending: Pending, result: Any
    ) -> tuple[bytes, list[tuple[bytes, bytes]]]:
        """The 200 response's body and headers (without Content-Length) for a delivered result.

        Raises the InferenceError the request ended with instead (queue timeout, backend error...).
        """
        call: InferCall = pending.payload
        if isinstance(result, InferenceError):
            if isinstance(result, RequestTimeout):  # never reached a batch, so no hook counted it
                mv.stats.record_failure(result.reason, time.monotonic_ns() - call.received_ns)
            raise result
        spec = mv.spec
        req = call.request
        outputs: dict[str, np.ndarray[Any, Any]] = result
        requested = req.outputs
        if requested is None:
            chosen = [(t, outputs[t.name], req.binary_output_all) for t in spec.outputs]
        else:
            chosen = [(mv.output_specs[o.name], outputs[o.name], o.binary) for o in requested]
        params: dict[str, str] | None = None
        if call.ledger_id is not None or pending.variant:
            params = {}
            if call.ledger_id is not None:
                params["ledger_id"] = call.ledger_id
            if pending.variant:
                params["variant"] = pending.variant  # which variant served it (fp32, int8...)
        payload, json_len = encode_response(spec.name, mv.version, req.id, chosen, params)
        if json_len is None:
            return payload, [(b"content-type", b"application/json")]
        return payload, [
            (b"content-type", b"application/octet-stream"),
            (b"inference-header-content-length", str(json_len).encode()),
        ]

    def _response_sent(self, mv: ModelVersion, pending: Pending, received: int) -> None:
        planner = mv.batcher.planner if mv.batcher is not None else None
        if planner is not None:
            now = time.monotonic_ns()
            planner.response_done(now - received, now - pending.done_ns if pending.done_ns else 0, now)

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
        if method != "POST" or not self.started:
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
            principal = self._cached_principal(headers)
        except InferenceError as exc:
            return DirectInfer(self, name, version, headers, None, received_ns, exc)
        if isinstance(principal, _KeyLookup):
            return None
        return DirectInfer(self, name, version, headers, principal, received_ns, None)

    def _answer_direct(self, mv: ModelVersion, pending: Pending, respond: Respond, result: Any) -> None:
        try:
            payload, headers = self._answer(mv, pending, result)
        except InferenceError as exc:
            _respond_error(respond, exc)
            return
        except Exception:
            log.exception("encoding the answer of model '%s' failed", mv.spec.name)
            respond(500, [_JSON], error_body("internal error while encoding the response"))
            return
        respond(200, headers, payload)
        self._response_sent(mv, pending, pending.payload.received_ns)


Respond = Callable[[int, list[tuple[bytes, bytes]], bytes], None]
"""Writes one whole response: status, headers without Content-Length, body."""

_JSON = (b"content-type", b"application/json")


def _respond_error(respond: Respond, exc: InferenceError) -> None:
    respond(exc.status, [_JSON, *exc.headers()], error_body(exc.message))


class DirectInfer:
    """One infer request accepted for the direct path (``Gateway.direct_infer``), waiting for its body.

    The HTTP protocol collects the body and calls ``serve``; the answer goes to ``respond`` exactly
    once, on the event loop, either at once (a refused request) or when the batch's results arrive.
    Same checks, statistics, ledger and answers as the ASGI path; what it saves is the ASGI task, its
    receive/send messages and the future per request.
    """

    __slots__ = ("_error", "_gateway", "_headers", "_name", "_principal", "_version", "received_ns")

    def __init__(
        self,
        gateway: Gateway,
        name: str,
        version: str | None,
        headers: dict[bytes, bytes],
        principal: Principal | None,
        received_ns: int,
        error: InferenceError | None,
    ) -> None:
        self._gateway = gateway
        self._name = name
        self._version = version
        self._headers = headers
        self._principal = principal
        self.received_ns = received_ns
        self._error = error

    def serve(self, body: bytes, respond: Respond) -> None:
        gateway = self._gateway
        mv: ModelVersion | None = None
        try:
            if self._error is not None:
                raise self._error
            mv = gateway.repository.version(self._name, self._version)
            pending = gateway._submit(mv, self._headers, body, self._principal, self.received_ns, None)
        except InferenceError as exc:
            _respond_error(respond, exc)
            return
        except Exception:
            log.exception("accepting an infer request for model '%s' failed", self._name)
            respond(500, [_JSON], error_body("internal error while accepting the request"))
            return
        # The result is delivered by _complete on this (the event loop's) thread, so it cannot arrive
        # before on_done is set here.
        pending.payload.on_done = partial(gateway._answer_direct, mv, pending, respond)


class _KeyLookup:
    """An API key the cache cannot answer: the key store must (``stale`` is the expired entry, if any)."""

    __slots__ = ("stale", "token")

    def __init__(self, token: str, stale: tuple[Principal, float] | None) -> None:
        self.token = token
        self.stale = stale


def _with_infer_scope(principal: Principal) -> Principal:
    if "infer" not in principal.scopes:
        raise Forbidden("this API key lacks the 'infer' scope")
    return principal


_WANTED = frozenset({b"authorization", b"content-length", b"inference-header-content-length"})


def wanted_headers(pairs: Iterable[tuple[bytes, bytes]]) -> dict[bytes, bytes]:
    """The few request headers the gateway reads, in one pass (names arrive lower-cased)."""
    return {k: v for k, v in pairs if k in _WANTED}


def _complete(items: list[tuple[Pending, Any]]) -> None:
    for p, result in items:
        call: InferCall = p.payload
        on_done = call.on_done
        if on_done is not None:
            try:
                on_done(result)
            except Exception:  # one failed answer must not keep the batch's other requests waiting
                log.exception("answering an infer request failed")
        elif call.future is not None and not call.future.done():
            call.future.set_result(result)


def _schedule_params(req: InferRequest) -> tuple[int, int]:
    params = req.parameters
    priority = params.get("priority", 0)
    timeout = params.get("timeout", 0)
    for key, value in (("priority", priority), ("timeout", timeout)):
        if not isinstance(value, int) or isinstance(value, bool) or value < 0:
            raise InvalidInput(f"request parameter '{key}' must be a non-negative integer, got {value!r}")
    return priority, timeout
