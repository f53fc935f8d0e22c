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
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
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

    __slots__ = ("future", "inputs", "ledger_id", "principal", "received_ns", "request")

    def __init__(
        self,
        request: InferRequest,
        future: asyncio.Future[Any],
        principal: Principal | None,
        received_ns: int,
    ) -> None:
        self.request = request
        self.inputs = request.inputs
        self.future = future
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

    async def _principal(self, headers: dict[bytes, bytes]) -> Principal | None:
        if self._resolve_key is None:
            return None
        raw = headers.get(b"authorization")
        if raw is None:
            raise Unauthorized("missing API key: send the header 'Authorization: Bearer <key>'")
        scheme, _, token = raw.decode("latin-1").partition(" ")
        token = token.strip()
        if scheme.lower() != "bearer" or not token:
            raise Unauthorized("malformed Authorization header: expected 'Bearer <key>'")
        now = time.monotonic()
        hit = self._key_cache.get(token)
        if hit is not None and hit[1] > now:
            principal = hit[0]
        else:
            try:
                found = await self._resolve_key(token)
            except Exception as exc:
                # The key store (the database) is unreachable. A key that was valid moments ago
                # stays valid through the outage, so serving goes on while the spool has room;
                # an unknown key cannot be checked and is refused as unavailable, not as invalid.
                if hit is not None:
                    log.warning("API key lookup failed (%s); using the last known answer for this key", exc)
                    principal = hit[0]
                else:
                    raise KeyStoreUnavailable(
                        "cannot check the API key right now: the key store is unreachable; retry shortly"
                    ) from exc
            else:
                if found is None:
                    self._key_cache.pop(token, None)
                    raise Unauthorized("invalid or revoked API key")
                principal = found
                if len(self._key_cache) > 10_000:
                    self._key_cache.clear()
                self._key_cache[token] = (principal, now + self._key_cache_s)
        if "infer" not in principal.scopes:
            raise Forbidden("this API key lacks the 'infer' scope")
        return principal

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
            headers = _wanted_headers(scope)
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
        extra = efficiency_prometheus_lines(planners) + variant_prometheus_lines(
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
        spec = mv.spec
        body = await self._read_body(headers, receive)
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
        loop = asyncio.get_running_loop()
        fut: asyncio.Future[Any] = loop.create_future()
        call = InferCall(req, fut, principal, received)
        pending = Pending(call, rows, shape_signature(spec, req), priority, timeout_us)
        assert mv.batcher is not None
        try:
            mv.batcher.enqueue(pending)
        except InferenceError as exc:
            mv.stats.record_failure(exc.reason, time.monotonic_ns() - received)
            raise
        result = await fut
        if isinstance(result, InferenceError):
            if isinstance(result, RequestTimeout):  # never reached a batch, so no hook counted it
                mv.stats.record_failure(result.reason, time.monotonic_ns() - received)
            raise result
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
            await self._send_json(send, 200, payload)
        else:
            await send(
                {
                    "type": "http.response.start",
                    "status": 200,
                    "headers": [
                        (b"content-type", b"application/octet-stream"),
                        (b"inference-header-content-length", str(json_len).encode()),
                        (b"content-length", str(len(payload)).encode()),
                    ],
                }
            )
            await send({"type": "http.response.body", "body": payload})
        planner = mv.batcher.planner
        if planner is not None:
            now = time.monotonic_ns()
            planner.response_done(now - received, now - pending.done_ns if pending.done_ns else 0)


_WANTED = frozenset({b"authorization", b"content-length", b"inference-header-content-length"})


def _wanted_headers(scope: Scope) -> dict[bytes, bytes]:
    """The few request headers the gateway reads, in one pass (names arrive lower-cased)."""
    return {k: v for k, v in scope["headers"] if k in _WANTED}


def _complete(items: list[tuple[Pending, Any]]) -> None:
    for p, result in items:
        fut = p.payload.future
        if not fut.done():
            fut.set_result(result)


def _schedule_params(req: InferRequest) -> tuple[int, int]:
    params = req.parameters
    priority = params.get("priority", 0)
    timeout = params.get("timeout", 0)
    for key, value in (("priority", priority), ("timeout", timeout)):
        if not isinstance(value, int) or isinstance(value, bool) or value < 0:
            raise InvalidInput(f"request parameter '{key}' must be a non-negative integer, got {value!r}")
    return priority, timeout
