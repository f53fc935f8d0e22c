"""The KServe v2 gRPC front end: ``inference.GRPCInferenceService``, as Triton serves it, on the gateway's
event loop, over our own HTTP/2 transport (grpc_h2.py).

Same core, same answers as the HTTP front end (gateway.py): the API key (``authorization: Bearer <key>``
metadata) and its ``infer`` scope are checked by ``InferenceCore.authenticate``, the metadata documents come
from metadata.py, an infer request is decoded by grpc_codec.py into the core's ``InferRequest`` and then
validated, batched, recorded in the ledger and answered by the core (``submit_request``, ``answer_parts``);
the answer carries ``ledger_id`` (and ``variant``) in its parameters. Errors are the core's
``InferenceError``s, given the gRPC status Triton gives the same error (``grpc_status``).

Why on the event loop: the core and its key cache live on the event loop's thread (core.py), and a batch's
results arrive there in one wake-up. An infer call whose key the cache knows costs no task and no future: it is
queued from the connection's ``data_received`` and answered from the batch's completion callback, as the
HTTP/1.1 protocol serves its infer requests. Only calls that must await (a key store lookup, the non-infer
calls) run as tasks.

Why not grpc.aio, which served here before: its own work per call (three tasks, four completion-queue events
each handed from its poller thread to the loop) made a gRPC request cost 357-388 µs of CPU, against 111-152 µs
on grpc_h2.py (bench/README.md, compare_triton.py at concurrency 8 and 32, same host).

Requests arrive as bytes and are parsed here: a message that is not protobuf is answered INVALID_ARGUMENT
naming the problem. Methods this server does not serve (shared memory, model load and unload, trace and log
settings) are answered UNIMPLEMENTED.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Coroutine
from functools import partial
from typing import Any

import orjson
from google.protobuf import json_format
from google.protobuf.message import DecodeError
from tritonclient.grpc import service_pb2 as pb

from inference import grpc_h2 as h2
from inference import metadata
from inference.batcher import Pending
from inference.core import InferenceCore
from inference.errors import InferenceError, InvalidInput, QueueFull, Unauthorized
from inference.grpc_codec import decode_infer_request, encode_infer_response, encode_stream_response
from inference.grpc_h2 import Call, GrpcServer, Method
from inference.keys import KeyLookup, Principal
from inference.repository import ModelVersion

log = logging.getLogger(__name__)

SERVICE = "inference.GRPCInferenceService"

# The gRPC status of each HTTP status the core's errors carry (errors.py), as Triton maps its error codes
# (src/grpc/grpc_utils.cc: INVALID_ARG, NOT_FOUND, UNAVAILABLE, INTERNAL...). Keys and scopes, which Triton
# does not check, get gRPC's own codes; a queue at max_queue_size is UNAVAILABLE in Triton ("Exceeds maximum
# queue size"), here too; a message over the size limit is RESOURCE_EXHAUSTED, as grpc itself answers one.
GRPC_STATUS: dict[int, int] = {
    400: h2.INVALID_ARGUMENT,
    401: h2.UNAUTHENTICATED,
    403: h2.PERMISSION_DENIED,
    404: h2.NOT_FOUND,
    405: h2.UNIMPLEMENTED,
    413: h2.RESOURCE_EXHAUSTED,
    429: h2.UNAVAILABLE,
    499: h2.CANCELLED,
    500: h2.INTERNAL,
    503: h2.UNAVAILABLE,
}
# An error's message travels in the grpc-message trailer, which clients cap (8 KiB by default, and a longer
# one fails the call): a message echoing a client's huge field is cut here.
MAX_DETAILS_CHARS = 2000
# Stream requests one ModelStreamInfer call may have waiting for their answers; reading the stream pauses at
# this many, so that a client that never reads its answers cannot make the server hold an unbounded backlog.
MAX_STREAM_ANSWERS_DUE = 256
# How long a stream refused for its key waits for the client's first message before it ends (see
# _model_stream_infer).
REFUSED_STREAM_READ_S = 5.0
STOP_GRACE_S = 5.0
_MISSING_KEY = "missing API key: send the metadata 'authorization: Bearer <key>'"


def grpc_status(exc: InferenceError) -> int:
    """The gRPC status code (an int, as grpc-status carries it) of an error."""
    code = GRPC_STATUS.get(exc.status)
    if code is not None:
        return code
    return h2.INVALID_ARGUMENT if 400 <= exc.status < 500 else h2.INTERNAL


def _details(message: str) -> str:
    return message if len(message) <= MAX_DETAILS_CHARS else message[: MAX_DETAILS_CHARS - 3] + "..."


def _trailers(exc: InferenceError) -> tuple[tuple[str, str], ...]:
    if isinstance(exc, QueueFull):
        return (("retry-after", str(exc.retry_after_s)),)
    return ()


def _authorization(call: Call) -> bytes | None:
    """The ``authorization`` metadata value, as the HTTP header's bytes (whitespace around it dropped: a client
    splitting ``Name: value`` itself may keep the space)."""
    value = call.header(b"authorization")
    return value.strip() if value is not None else None


def _parse(message_type: Any, raw: bytes) -> Any:
    try:
        return message_type.FromString(raw)
    except DecodeError as exc:
        raise InvalidInput(
            f"the request is not a valid {message_type.DESCRIPTOR.full_name} message: {exc}"
        ) from None


def _from_json(document: bytes, message: Any) -> Any:
    return json_format.Parse(document, message, ignore_unknown_fields=True)


Handler = Callable[[Any, Any], Awaitable[Any]]


class GrpcFrontEnd:
    """``inference.GRPCInferenceService`` over an ``InferenceCore``: started once the core has started, on the
    same event loop, and stopped before it stops."""

    def __init__(
        self,
        core: InferenceCore,
        *,
        max_message_bytes: int,
        max_metadata_bytes: int = 16384,
        max_connections: int = 1000,
        header_timeout_s: float = 10.0,
        body_timeout_s: float = 60.0,
    ) -> None:
        self.core = core
        self.max_message_bytes = max_message_bytes
        self.max_metadata_bytes = max_metadata_bytes
        self.max_connections = max_connections
        self.header_timeout_s = header_timeout_s
        self.body_timeout_s = body_timeout_s
        self.port: int | None = None
        self._server: GrpcServer | None = None
        # Calls that wait on a coroutine (the non-infer calls, key store lookups), kept from the collector.
        self._tasks: set[asyncio.Task[None]] = set()

    # -- lifecycle ---------------------------------------------------------------------------

    async def start(self, host: str, port: int) -> int:
        """Listen on ``host:port`` (port 0: any free one); returns the port. Raises OSError when it cannot bind."""
        server = GrpcServer(
            self._methods(),
            max_message_bytes=self.max_message_bytes,
            max_metadata_bytes=self.max_metadata_bytes,
            max_connections=self.max_connections,
            header_timeout_s=self.header_timeout_s,
            body_timeout_s=self.body_timeout_s,
        )
        try:
            bound = await server.start(host, port)
        except OSError as exc:
            raise OSError(f"cannot listen for gRPC on {host}:{port}: {exc} (is the port in use?)") from None
        self._server = server
        self.port = bound
        log.info("KServe v2 gRPC listening on %s:%d", host, bound)
        return bound

    async def stop(self, grace_s: float = STOP_GRACE_S) -> None:
        """Stop taking calls; the calls in progress have ``grace_s`` to finish, then are cancelled."""
        server, self._server = self._server, None
        if server is not None:
            await server.stop(grace_s)
        for task in list(self._tasks):
            task.cancel()

    def _methods(self) -> dict[str, Method]:
        prefix = f"/{SERVICE}/"
        methods: dict[str, Method] = {
            prefix + "ModelInfer": Method(self._model_infer, admit=self._admit),
            prefix + "ModelStreamInfer": Method(self._model_stream_infer, streaming=True),
        }
        for name, message_type, call in (
            ("ServerLive", pb.ServerLiveRequest, self._server_live),
            ("ServerReady", pb.ServerReadyRequest, self._server_ready),
            ("ModelReady", pb.ModelReadyRequest, self._model_ready),
            ("ServerMetadata", pb.ServerMetadataRequest, self._server_metadata),
            ("ModelMetadata", pb.ModelMetadataRequest, self._model_metadata),
            ("ModelConfig", pb.ModelConfigRequest, self._model_config),
            ("ModelStatistics", pb.ModelStatisticsRequest, self._model_statistics),
            ("RepositoryIndex", pb.RepositoryIndexRequest, self._repository_index),
        ):
            keyed = name not in ("ServerLive", "ServerReady")
            methods[prefix + name] = Method(
                partial(self._unary, message_type, call), admit=self._admit if keyed else None
            )
        return methods

    def _admit(self, call: Call) -> None:
        """Refuses a call whose key the cache knows to be missing, malformed, unknown or without the scope, as
        its headers arrive: before its message is read. What the cache said stays in
        ``call.state`` (a principal, a KeyLookup for the key store to answer, or None: no keys checked)."""
        try:
            call.state = self._cached_principal(_authorization(call))
        except InferenceError as exc:
            _fail(call, exc)

    def _spawn(self, coroutine: Coroutine[Any, Any, None]) -> None:
        task = asyncio.get_running_loop().create_task(coroutine)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def _cached_principal(self, authorization: bytes | None) -> Principal | KeyLookup | None:
        """``InferenceCore.cached_principal``, its message for a missing key naming the gRPC metadata."""
        try:
            return self.core.cached_principal(authorization)
        except Unauthorized:
            if authorization is None:  # the core's message names the HTTP header
                raise Unauthorized(_MISSING_KEY) from None
            raise

    async def _authenticate(self, authorization: bytes | None) -> Principal | None:
        try:
            return await self.core.authenticate(authorization)
        except Unauthorized:
            if authorization is None:
                raise Unauthorized(_MISSING_KEY) from None
            raise

    async def _authorize(self, call: Call) -> Principal | None:
        """The caller of a keyed call: what the key cache said as its headers arrived (``_admit``, which refused
        the call had the cache known the key to be bad), or the key store's answer where the cache could not
        tell."""
        state = call.state
        if isinstance(state, KeyLookup):
            return await self._authenticate(_authorization(call))
        principal: Principal | None = state
        return principal

    # -- the non-infer calls -----------------------------------------------------------------

    def _unary(self, message_type: Any, handler: Handler, call: Call, raw: bytes | None) -> None:
        self._spawn(self._unary_call(message_type, handler, call, raw or b""))

    async def _unary_call(self, message_type: Any, handler: Handler, call: Call, raw: bytes) -> None:
        try:
            response = await handler(_parse(message_type, raw), call)
            call.reply(response.SerializeToString())
            return
        except InferenceError as exc:
            error = exc
        except Exception:
            log.exception("gRPC %s failed", message_type.DESCRIPTOR.name)
            error = InferenceError("internal error", 500)
        _fail(call, error)

    async def _server_live(self, request: Any, call: Call) -> Any:
        return pb.ServerLiveResponse(live=True)

    async def _server_ready(self, request: Any, call: Call) -> Any:
        # Like /v2/health/ready: no key needed, for probes.
        return pb.ServerReadyResponse(ready=metadata.server_ready(self.core.repository, self.core.started))

    async def _model_ready(self, request: Any, call: Call) -> Any:
        await self._authorize(call)
        try:
            metadata.check_model_ready(self.core.repository, request.name, request.version or None)
        except InferenceError as exc:
            if exc.status not in (400, 404):
                raise
            return pb.ModelReadyResponse(
                ready=False
            )  # Triton: unknown or not ready is ready=false, not an error
        return pb.ModelReadyResponse(ready=True)

    async def _server_metadata(self, request: Any, call: Call) -> Any:
        await self._authorize(call)
        return pb.ServerMetadataResponse(
            name=metadata.SERVER_NAME, version=metadata.SERVER_VERSION, extensions=metadata.EXTENSIONS
        )

    async def _model_metadata(self, request: Any, call: Call) -> Any:
        await self._authorize(call)
        document = metadata.model_metadata(self.core.repository, request.name, request.version or None)
        return _from_json(document, pb.ModelMetadataResponse())

    async def _model_config(self, request: Any, call: Call) -> Any:
        await self._authorize(call)
        document = metadata.model_config(self.core.repository, request.name, request.version or None)
        response = pb.ModelConfigResponse()
        _from_json(document, response.config)
        return response

    async def _model_statistics(self, request: Any, call: Call) -> Any:
        await self._authorize(call)
        document = metadata.statistics(self.core.repository, request.name or None, request.version or None)
        return _from_json(document, pb.ModelStatisticsResponse())

    async def _repository_index(self, request: Any, call: Call) -> Any:
        await self._authorize(call)
        rows = orjson.loads(metadata.repository_index(self.core.repository))
        if request.ready:
            rows = [row for row in rows if row.get("state") == "READY"]
        return _from_json(orjson.dumps({"models": rows}), pb.RepositoryIndexResponse())

    # -- infer -------------------------------------------------------------------------------

    def _accept(self, raw: bytes, principal: Principal | None, received: int) -> tuple[ModelVersion, Pending]:
        """Parse, decode and hand one infer request to the core; raises the InferenceError that refuses it."""
        core = self.core
        msg = _parse(pb.ModelInferRequest, raw)
        mv = core.repository.version(msg.model_name, msg.model_version or None)
        try:
            req = decode_infer_request(msg)
        except InferenceError:
            mv.stats.record_failure("OTHER", time.monotonic_ns() - received)
            raise
        return mv, core.submit_request(mv, req, principal, received, None)

    def _answer(self, mv: ModelVersion, pending: Pending, result: Any, final_response: bool = False) -> bytes:
        chosen, params = self.core.answer_parts(mv, pending, result)
        return encode_infer_response(
            mv.spec.name,
            mv.version,
            pending.payload.request.id,
            chosen,
            params,
            final_response=final_response,
        )

    def _model_infer(self, call: Call, raw: bytes | None) -> None:
        """A unary infer call, served without a task when the key cache knows its key: the request is queued
        here and answered from the batch's completion (``_infer_done``)."""
        received = time.monotonic_ns()
        principal = call.state  # what the key cache said as the headers arrived (_admit)
        if isinstance(principal, KeyLookup):  # the key store must answer: a coroutine
            self._spawn(self._infer_after_lookup(call, raw or b"", _authorization(call), received))
            return
        self._submit(call, raw or b"", principal, received)

    async def _infer_after_lookup(
        self, call: Call, raw: bytes, authorization: bytes | None, received: int
    ) -> None:
        try:
            principal = await self._authenticate(authorization)
        except InferenceError as exc:
            _fail(call, exc)
            return
        except Exception:  # the call must still be answered (and released)
            log.exception("looking up a gRPC call's API key failed")
            _fail(call, InferenceError("internal error while checking the API key", 500))
            return
        if call.done:  # cancelled meanwhile
            call.release()
            return
        self._submit(call, raw, principal, received)

    def _submit(self, call: Call, raw: bytes, principal: Principal | None, received: int) -> None:
        try:
            mv, pending = self._accept(raw, principal, received)
        except InferenceError as exc:
            _fail(call, exc)
            return
        except Exception:
            log.exception("a gRPC infer request failed")
            _fail(call, InferenceError("internal error while accepting the request", 500))
            return
        # Results are delivered on this (the loop's) thread by core.complete, so on_done is set in time.
        pending.payload.on_done = partial(self._infer_done, call, mv, pending, received)

    def _infer_done(self, call: Call, mv: ModelVersion, pending: Pending, received: int, result: Any) -> None:
        if call.done:  # cancelled by the client, or past its deadline: its work is over now
            call.release()
            return
        try:
            payload = self._answer(mv, pending, result)
        except InferenceError as exc:
            _fail(call, exc)
            return
        except Exception:
            log.exception("encoding a gRPC answer of model '%s' failed", mv.spec.name)
            _fail(call, InferenceError("internal error while encoding the response", 500))
            return
        call.reply(payload)
        self.core.response_sent(mv, pending, received)

    def _model_stream_infer(self, call: Call, raw: bytes | None) -> None:
        """Every request of the stream is answered on it, in the order the answers are ready (each carries its
        request's id); a refused request is answered with ``error_message`` and the stream goes on, as in
        Triton. A bad key ends the stream."""
        authorization = _authorization(call)
        try:
            principal = self._cached_principal(authorization)
        except InferenceError as exc:
            self._refuse_stream(call, exc)
            return
        if isinstance(principal, KeyLookup):
            call.pause()  # messages wait (and the client's window with them) until the key is known
            self._spawn(self._stream_after_lookup(call, authorization))
            return
        self._open_stream(call, principal)

    async def _stream_after_lookup(self, call: Call, authorization: bytes | None) -> None:
        try:
            principal = await self._authenticate(authorization)
        except InferenceError as exc:
            self._refuse_stream(call, exc)
            return
        except Exception:  # the stream must still be answered (and released)
            log.exception("looking up a gRPC stream's API key failed")
            self._refuse_stream(call, InferenceError("internal error while checking the API key", 500))
            return
        if call.done:  # cancelled meanwhile
            call.release()
            return
        self._open_stream(call, principal)
        call.resume()

    def _refuse_stream(self, call: Call, exc: InferenceError) -> None:
        # The status is sent once the client's first message (or the end of its stream) arrives, or after a few
        # seconds: a stream ended while its first message was still being sent shows the client an INTERNAL
        # error of its own send instead of this status.
        timer = asyncio.get_running_loop().call_later(REFUSED_STREAM_READ_S, _fail, call, exc)

        def refuse(*_: Any) -> None:
            timer.cancel()
            _fail(call, exc)

        def cancelled() -> None:
            timer.cancel()
            call.release()

        call.on_message = refuse
        call.on_end = refuse
        call.on_cancel = cancelled
        call.resume()

    def _open_stream(self, call: Call, principal: Principal | None) -> None:
        stream = _Stream(call)
        call.on_message = partial(self._stream_one, stream, principal)
        call.on_end = partial(self._stream_end, stream)
        call.on_cancel = partial(self._stream_cancelled, stream)

    def _stream_cancelled(self, stream: _Stream) -> None:
        if stream.due == 0:  # else the last answer due releases it
            stream.call.release()

    def _stream_one(self, stream: _Stream, principal: Principal | None, raw: bytes) -> None:
        received = time.monotonic_ns()
        stream.due += 1
        if stream.due >= MAX_STREAM_ANSWERS_DUE:
            stream.call.pause()
        try:
            mv, pending = self._accept(raw, principal, received)
        except InferenceError as exc:
            self._stream_answer(stream, _stream_error(exc))
            return
        except Exception:
            log.exception("a gRPC stream infer request failed")
            self._stream_answer(
                stream, _stream_error(InferenceError("internal error while accepting the request", 500))
            )
            return
        # Results are delivered on this (the loop's) thread by core.complete, so on_done is set in time.
        pending.payload.on_done = partial(self._stream_done, stream, mv, pending, received)

    def _stream_done(
        self, stream: _Stream, mv: ModelVersion, pending: Pending, received: int, result: Any
    ) -> None:
        try:
            # Triton flags the last response of a request (here the only one) when the client asks for it, as
            # perf_analyzer --streaming does.
            final = pending.payload.request.parameters.get("triton_enable_empty_final_response") is True
            answer = encode_stream_response(self._answer(mv, pending, result, final))
        except InferenceError as exc:
            answer = _stream_error(exc)
        except Exception:
            log.exception("encoding a gRPC stream answer of model '%s' failed", mv.spec.name)
            answer = _stream_error(InferenceError("internal error while encoding the response", 500))
        else:
            self._stream_answer(stream, answer)
            self.core.response_sent(mv, pending, received)
            return
        self._stream_answer(stream, answer)

    def _stream_answer(self, stream: _Stream, answer: bytes) -> None:
        call = stream.call
        call.send(answer)
        stream.due -= 1
        if stream.due == 0 and (stream.ended or call.done):
            call.finish()  # or, cancelled, says its work is over
        elif stream.due < MAX_STREAM_ANSWERS_DUE:
            call.resume()

    def _stream_end(self, stream: _Stream) -> None:
        stream.ended = True
        if stream.due == 0:
            stream.call.finish()


class _Stream:
    """One ModelStreamInfer call: its answers still due, and whether the client sent its last request. Reading
    the stream pauses while MAX_STREAM_ANSWERS_DUE answers are due, so that a client that never reads its
    answers cannot make the server hold an unbounded backlog."""

    __slots__ = ("call", "due", "ended")

    def __init__(self, call: Call) -> None:
        self.call = call
        self.due = 0
        self.ended = False


def _fail(call: Call, exc: InferenceError) -> None:
    call.fail(grpc_status(exc), _details(exc.message), _trailers(exc))


def _stream_error(exc: InferenceError) -> bytes:
    answer: bytes = pb.ModelStreamInferResponse(error_message=_details(exc.message)).SerializeToString()
    return answer
