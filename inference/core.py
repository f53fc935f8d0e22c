"""The gateway's transport-neutral core: lifecycle, authentication and the infer path.

Front ends (the HTTP/ASGI app in gateway.py, the gRPC service in grpc_server.py) route a request, then call
in here: the core returns results or raises an ``InferenceError`` (errors.py: each carries the status it maps
to) and never builds a protocol's headers or messages, so every front end checks, counts and answers alike.

Threads: everything here runs on the event loop's thread except ``_deliver``, which the model instance
threads call with each batch's results; it only schedules ``complete`` on the loop (one wake-up a batch),
so no state here is shared with those threads and none needs a lock.
"""

from __future__ import annotations

import asyncio
import gc
import logging
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, Protocol

import numpy as np

from inference.batcher import BatchHook, Pending
from inference.config import TensorSpec
from inference.errors import Forbidden, InferenceError, InvalidInput, RequestTimeout, Unauthorized
from inference.keys import KeyCache, KeyLookup, Principal, PrincipalResolver
from inference.kserve import (
    InferRequest,
    RequestDecoder,
    encode_response,
    parse_header_length,
    shape_signature,
    validate_request,
)
from inference.repository import GatewayOptions, ModelRepository, ModelVersion

log = logging.getLogger(__name__)


class Service(Protocol):
    """Something the gateway starts before its models load and stops after they have stopped."""

    def start(self) -> None: ...

    def stop(self) -> None: ...


class Admission(Protocol):
    """Refuses new requests (raises an InferenceError) while something downstream cannot take them."""

    def admit(self) -> None: ...


class InferCall:
    """The payload the batcher carries for one infer request."""

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


class InferenceCore:
    """The model repository with its batchers, the API key cache and the services around them."""

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
        self.options = options
        # None: no authentication at all (every request is served, with no principal).
        self._keys = KeyCache(resolve_key, key_cache_seconds) if resolve_key is not None else None
        self._loop: asyncio.AbstractEventLoop | None = None
        self.repository = ModelRepository(repository_root, options, self._deliver, hooks)
        self.started = False
        self._services = list(services)
        self._admission = admission
        self._decoder = RequestDecoder()  # remembers recent binary requests' JSON headers (kserve.py)

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
            loop.call_soon_threadsafe(complete, items)

    # -- authentication ----------------------------------------------------------------------

    def key_store_errors(self) -> dict[str, int]:
        """Failed key store lookups by what was done instead (``KeyCache.errors``); empty without keys."""
        return dict(self._keys.errors) if self._keys is not None else {}

    def cached_principal(self, authorization: bytes | None) -> Principal | KeyLookup | None:
        """The principal for an ``Authorization`` value when the key cache answers; a ``KeyLookup`` when the
        key store must (``authenticate`` asks it); None when the gateway checks no keys.

        Raises Unauthorized or Forbidden for a missing, malformed or under-scoped key.
        """
        keys = self._keys
        if keys is None:
            return None
        if authorization is None:
            raise Unauthorized("missing API key: send the header 'Authorization: Bearer <key>'")
        scheme, _, token = authorization.decode("latin-1").partition(" ")
        token = token.strip()
        if scheme.lower() != "bearer" or not token:
            raise Unauthorized("malformed Authorization header: expected 'Bearer <key>'")
        found = keys.lookup(token)
        if isinstance(found, KeyLookup):
            return found
        return _with_infer_scope(found)

    async def authenticate(self, authorization: bytes | None) -> Principal | None:
        """As ``cached_principal``, asking the key store when the cache cannot answer."""
        found = self.cached_principal(authorization)
        if not isinstance(found, KeyLookup):
            return found
        assert self._keys is not None
        resolved = await self._keys.resolve(found)
        if resolved is None:
            raise Unauthorized("invalid or revoked API key")
        return _with_infer_scope(resolved)

    # -- infer -------------------------------------------------------------------------------

    def submit(
        self,
        mv: ModelVersion,
        body: bytes,
        header_length: bytes | None,
        principal: Principal | None,
        received: int,
        future: asyncio.Future[Any] | None,
    ) -> Pending:
        """Decode, validate and enqueue one KServe v2 infer request; raises the InferenceError that refuses it.

        ``header_length`` is the binary tensor extension's JSON header length (None: all JSON). The result
        reaches ``future``, or the call's ``on_done`` once the caller sets it (on the event loop, before the
        batch can complete).
        """
        return self.submit_request(
            mv, self.decode(mv, body, header_length, received), principal, received, future
        )

    def decode(
        self, mv: ModelVersion, body: bytes, header_length: bytes | None, received: int
    ) -> InferRequest:
        """Decodes and checks an infer request body for ``mv``, counting a refusal in its statistics; any thread
        may call it (the statistics take their own lock, and the decoder's plans are safe across threads)."""
        try:
            return self._decoder.decode(body, parse_header_length(header_length, len(body)))
        except InferenceError:
            mv.stats.record_failure("OTHER", time.monotonic_ns() - received)
            raise

    def submit_request(
        self,
        mv: ModelVersion,
        req: InferRequest,
        principal: Principal | None,
        received: int,
        future: asyncio.Future[Any] | None,
    ) -> Pending:
        """``submit`` for a request another front end decoded (the gRPC codec builds the same InferRequest):
        validate it against the model, then enqueue it. A front end that refuses a request before this counts
        it with ``mv.stats.record_failure("OTHER", ...)``, as ``submit`` does."""
        spec = mv.spec
        try:
            rows = validate_request(spec, req)
            priority, timeout_us = schedule_params(req)
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

    def answer(self, mv: ModelVersion, pending: Pending, result: Any) -> tuple[bytes, int | None]:
        """The encoded answer for a delivered result: the payload, and the length of its JSON header when
        binary tensors follow it (None: the payload is all JSON).

        Raises the InferenceError the request ended with instead (queue timeout, backend error...).
        """
        chosen, params = self.answer_parts(mv, pending, result)
        return encode_response(mv.spec.name, mv.version, pending.payload.request.id, chosen, params)

    def answer_parts(
        self, mv: ModelVersion, pending: Pending, result: Any
    ) -> tuple[list[tuple[TensorSpec, np.ndarray[Any, Any], bool]], dict[str, str] | None]:
        """What ``answer`` encodes, for a front end with its own encoding (gRPC): the requested outputs (spec,
        array, binary wanted) and the response parameters (``ledger_id``, ``variant``).

        Raises the InferenceError the request ended with instead.
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
        return chosen, params

    def response_sent(self, mv: ModelVersion, pending: Pending, received: int) -> None:
        """Tells the batcher's planner how long the answer took, once it has been handed to the transport."""
        planner = mv.batcher.planner if mv.batcher is not None else None
        if planner is not None:
            now = time.monotonic_ns()
            planner.response_done(now - received, now - pending.done_ns if pending.done_ns else 0, now)


def complete(items: list[tuple[Pending, Any]]) -> None:
    """Hands a batch's results to their requests, on the event loop's thread."""
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


# The longest queue timeout a client may ask for (docs/gateway.md): one hour. A request that waits longer in a
# queue is lost anyway, and an unbounded one overflowed the reaper's wait.
MAX_CLIENT_TIMEOUT_US = 3_600_000_000


def schedule_params(req: InferRequest) -> tuple[int, int]:
    """The request's ``priority`` and ``timeout`` (µs) parameters, 0 when absent."""
    params = req.parameters
    priority = params.get("priority", 0)
    timeout = params.get("timeout", 0)
    for key, value in (("priority", priority), ("timeout", timeout)):
        if not isinstance(value, int) or isinstance(value, bool) or value < 0:
            raise InvalidInput(f"request parameter '{key}' must be a non-negative integer, got {value!r}")
    if timeout > MAX_CLIENT_TIMEOUT_US:
        raise InvalidInput(
            f"request parameter 'timeout' must be at most {MAX_CLIENT_TIMEOUT_US} microseconds (one hour), "
            f"got {timeout}"
        )
    return priority, timeout


def _with_infer_scope(principal: Principal) -> Principal:
    if "infer" not in principal.scopes:
        raise Forbidden("this API key lacks the 'infer' scope")
    return principal
