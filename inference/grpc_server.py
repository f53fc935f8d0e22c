"""The KServe v2 gRPC front end: ``inference.GRPCInferenceService``, as Triton serves it, on the gateway's
event loop (grpc.aio).

Same core, same answers as the HTTP front end (gateway.py): the API key (``authorization: Bearer <key>``
metadata) and its ``infer`` scope are checked by ``InferenceCore.authenticate``, the metadata documents come
from metadata.py, an infer request is decoded by grpc_codec.py into the core's ``InferRequest`` and then
validated, batched, recorded in the ledger and answered by the core (``submit_request``, ``answer_parts``);
the answer carries ``ledger_id`` (and ``variant``) in its parameters. Errors are the core's
``InferenceError``s, given the gRPC status Triton gives the same error (``grpc_status``).

Why on the event loop: the core and its key cache live on the event loop's thread (core.py), and a batch's
results arrive there in one wake-up. grpc.aio runs each call as a task on that loop, so an infer call costs
one task and one future; a grpc thread-pool server would hop to the loop and back for every call
(``run_coroutine_threadsafe``), adding two thread switches and their GIL hand-overs per request.

Where a request's CPU goes (perf_analyzer -i grpc on ``linear``, 2 cores, December 2026): grpc.aio's own work
per call (three tasks, four completion-queue events each handed from its poller thread to the loop) cost about
175 µs of CPU for a handler that only returns canned bytes, 125 µs of it on the loop's thread; a sync
``grpc.server`` with a thread pool measured 150-230 µs for the same, before any hand-over to the loop, so it
would not pay. What is ours is kept small: the key cache is asked without a coroutine, a request is decoded
without checking what it does not carry, and the answer's bytes are written by grpc_codec.py, not built from
protobuf messages.

Requests arrive as bytes and are parsed here, not by grpc's deserializer: a message that is not protobuf is
then answered INVALID_ARGUMENT naming the problem, where grpc would answer INTERNAL. Methods this server does
not serve (shared memory, model load and unload, trace and log settings) are answered UNIMPLEMENTED by grpc.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from functools import partial
from typing import Any

import grpc
import orjson
from google.protobuf import json_format
from google.protobuf.message import DecodeError
from tritonclient.grpc import service_pb2 as pb

from inference import metadata
from inference.batcher import Pending
from inference.core import InferenceCore
from inference.errors import InferenceError, InvalidInput, QueueFull, Unauthorized
from inference.grpc_codec import decode_infer_request, encode_infer_response, encode_stream_response
from inference.keys import KeyLookup, Principal
from inference.repository import ModelVersion

log = logging.getLogger(__name__)

SERVICE = "inference.GRPCInferenceService"

# The gRPC status of each HTTP status the core's errors carry (errors.py), as Triton maps its error codes
# (src/grpc/grpc_utils.cc: INVALID_ARG, NOT_FOUND, UNAVAILABLE, INTERNAL...). Keys and scopes, which Triton
# does not check, get gRPC's own codes; a queue at max_queue_size is UNAVAILABLE in Triton ("Exceeds maximum
# queue size"), here too; a message over the size limit is RESOURCE_EXHAUSTED, as grpc itself answers one.
GRPC_STATUS: dict[int, grpc.StatusCode] = {
    400: grpc.StatusCode.INVALID_ARGUMENT,
    401: grpc.StatusCode.UNAUTHENTICATED,
    403: grpc.StatusCode.PERMISSION_DENIED,
    404: grpc.StatusCode.NOT_FOUND,
    405: grpc.StatusCode.UNIMPLEMENTED,
    413: grpc.StatusCode.RESOURCE_EXHAUSTED,
    429: grpc.StatusCode.UNAVAILABLE,
    499: grpc.StatusCode.CANCELLED,
    500: grpc.StatusCode.INTERNAL,
    503: grpc.StatusCode.UNAVAILABLE,
}
# An error's message travels in the grpc-message trailer, which clients cap (8 KiB by default, and a longer
# one fails the call): a message echoing a client's huge field is cut here.
MAX_DETAILS_CHARS = 2000
# Stream requests one ModelStreamInfer call may have waiting for their answers; reading the stream pauses at
# this many, so that a client that never reads its answers cannot make the server hold an unbounded backlog.
STREAM_WINDOW = 256
# How long a stream refused for its key waits for the client's first message before it ends (see
# _model_stream_infer).
REFUSED_STREAM_READ_S = 5.0
STOP_GRACE_S = 5.0
_MISSING_KEY = "missing API key: send the metadata 'authorization: Bearer <key>'"


def grpc_status(exc: InferenceError) -> grpc.StatusCode:
    code = GRPC_STATUS.get(exc.status)
    if code is not None:
        return code
    return grpc.StatusCode.INVALID_ARGUMENT if 400 <= exc.status < 500 else grpc.StatusCode.INTERNAL


def _details(message: str) -> str:
    return message if len(message) <= MAX_DETAILS_CHARS else message[: MAX_DETAILS_CHARS - 3] + "..."


def _trailers(exc: InferenceError) -> tuple[tuple[str, str], ...]:
    if isinstance(exc, QueueFull):
        return (("retry-after", str(exc.retry_after_s)),)
    return ()


def _authorization(context: Any) -> bytes | None:
    """The ``authorization`` metadata value, as the HTTP header's bytes (whitespace around it dropped: a client
    splitting ``Name: value`` itself may keep the space)."""
    for key, value in context.invocation_metadata() or ():
        if key == "authorization":
            text = value if isinstance(value, str) else value.decode("latin-1")
            return text.strip().encode("utf-8")
    return None


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
        self, core: InferenceCore, *, max_message_bytes: int, max_metadata_bytes: int = 16384
    ) -> None:
        self.core = core
        self.max_message_bytes = max_message_bytes
        self.max_metadata_bytes = max_metadata_bytes
        self.port: int | None = None
        self._server: grpc.aio.Server | None = None

    # -- lifecycle ---------------------------------------------------------------------------

    async def start(self, host: str, port: int) -> int:
        """Listen on ``host:port`` (port 0: any free one); returns the port. Raises OSError when it cannot bind."""
        server = grpc.aio.server(
            options=[
                ("grpc.max_receive_message_length", self.max_message_bytes),
                ("grpc.max_send_message_length", -1),
                # Both limits: past the soft one grpc refuses a growing share of calls, past the hard one all.
                ("grpc.max_metadata_size", self.max_metadata_bytes),
                ("grpc.absolute_max_metadata_size", self.max_metadata_bytes),
                # grpc binds with SO_REUSEPORT by default: a second server on the same port would then share
                # its connections silently instead of failing to start.
                ("grpc.so_reuseport", 0),
            ]
        )
        server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(SERVICE, self._handlers()),))
        address = f"[{host}]:{port}" if ":" in host and not host.startswith("[") else f"{host}:{port}"
        try:
            bound = int(server.add_insecure_port(address))
        except RuntimeError as exc:
            raise OSError(f"cannot listen for gRPC on {address}: {exc} (is the port in use?)") from None
        await server.start()
        self._server = server
        self.port = bound
        log.info("KServe v2 gRPC listening on %s", address.rsplit(":", 1)[0] + f":{bound}")
        return bound

    async def stop(self, grace_s: float = STOP_GRACE_S) -> None:
        """Stop taking calls; the calls in progress have ``grace_s`` to finish, then are cancelled."""
        server, self._server = self._server, None
        if server is not None:
            await server.stop(grace_s)

    def _handlers(self) -> dict[str, grpc.RpcMethodHandler]:
        unary = grpc.unary_unary_rpc_method_handler
        handlers: dict[str, grpc.RpcMethodHandler] = {
            "ModelInfer": unary(self._model_infer),
            "ModelStreamInfer": grpc.stream_stream_rpc_method_handler(self._model_stream_infer),
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
            handlers[name] = unary(partial(self._unary, message_type, call))
        return handlers

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

    async def _authorize(self, context: Any) -> Principal | None:
        return await self._authenticate(_authorization(context))

    # -- the non-infer calls -----------------------------------------------------------------

    async def _unary(self, message_type: Any, call: Handler, raw: bytes, context: Any) -> bytes:
        try:
            response = await call(_parse(message_type, raw), context)
            answer: bytes = response.SerializeToString()
            return answer
        except InferenceError as exc:
            error = exc
        except Exception:
            log.exception("gRPC %s failed", message_type.DESCRIPTOR.name)
            error = InferenceError("internal error", 500)
        await context.abort(grpc_status(error), _details(error.message), _trailers(error))
        raise AssertionError("unreachable: abort raises")

    async def _server_live(self, request: Any, context: Any) -> Any:
        return pb.ServerLiveResponse(live=True)

    async def _server_ready(self, request: Any, context: Any) -> Any:
        # Like /v2/health/ready: no key needed, for probes.
        return pb.ServerReadyResponse(ready=metadata.server_ready(self.core.repository, self.core.started))

    async def _model_ready(self, request: Any, context: Any) -> Any:
        await self._authorize(context)
        try:
            metadata.check_model_ready(self.core.repository, request.name, request.version or None)
        except InferenceError as exc:
            if exc.status not in (400, 404):
                raise
            return pb.ModelReadyResponse(
                ready=False
            )  # Triton: unknown or not ready is ready=false, not an error
        return pb.ModelReadyResponse(ready=True)

    async def _server_metadata(self, request: Any, context: Any) -> Any:
        await self._authorize(context)
        return pb.ServerMetadataResponse(
            name=metadata.SERVER_NAME, version=metadata.SERVER_VERSION, extensions=metadata.EXTENSIONS
        )

    async def _model_metadata(self, request: Any, context: Any) -> Any:
        await self._authorize(context)
        document = metadata.model_metadata(self.core.repository, request.name, request.version or None)
        return _from_json(document, pb.ModelMetadataResponse())

    async def _model_config(self, request: Any, context: Any) -> Any:
        await self._authorize(context)
        document = metadata.model_config(self.core.repository, request.name, request.version or None)
        response = pb.ModelConfigResponse()
        _from_json(document, response.config)
        return response

    async def _model_statistics(self, request: Any, context: Any) -> Any:
        await self._authorize(context)
        document = metadata.statistics(self.core.repository, request.name or None, request.version or None)
        return _from_json(document, pb.ModelStatisticsResponse())

    async def _repository_index(self, request: Any, context: Any) -> Any:
        await self._authorize(context)
        rows = orjson.loads(metadata.repository_index(self.core.repository))
        if request.ready:
            rows = [row for row in rows if row.get("state") == "READY"]
        return _from_json(orjson.dumps({"models": rows}), pb.RepositoryIndexResponse())

    # -- infer -------------------------------------------------------------------------------

    def _accept(
        self, raw: bytes, principal: Principal | None, received: int, future: Any
    ) -> tuple[ModelVersion, Pending]:
        """Parse, decode and hand one infer request to the core; raises the InferenceError that refuses it."""
        core = self.core
        msg = _parse(pb.ModelInferRequest, raw)
        mv = core.repository.version(msg.model_name, msg.model_version or None)
        try:
            req = decode_infer_request(msg)
        except InferenceError:
            mv.stats.record_failure("OTHER", time.monotonic_ns() - received)
            raise
        return mv, core.submit_request(mv, req, principal, received, future)

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

    async def _model_infer(self, raw: bytes, context: Any) -> bytes:
        received = time.monotonic_ns()
        core = self.core
        try:
            # The key cache answers almost every call: the key store only on a miss (a coroutine to await).
            authorization = _authorization(context)
            principal = self._cached_principal(authorization)
            if isinstance(principal, KeyLookup):
                principal = await self._authenticate(authorization)
            future: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
            mv, pending = self._accept(raw, principal, received, future)
            payload = self._answer(mv, pending, await future)
        except InferenceError as exc:
            error = exc
        except Exception:
            log.exception("a gRPC infer request failed")
            error = InferenceError("internal error while serving the request", 500)
        else:
            core.response_sent(mv, pending, received)
            return payload
        await context.abort(grpc_status(error), _details(error.message), _trailers(error))
        raise AssertionError("unreachable: abort raises")

    async def _model_stream_infer(self, requests: AsyncIterator[bytes], context: Any) -> AsyncIterator[bytes]:
        """Every request of the stream is answered on it, in the order the answers are ready (each carries its
        request's id); a refused request is answered with ``error_message`` and the stream goes on, as in
        Triton. A bad key ends the stream."""
        try:
            principal = await self._authorize(context)
        except InferenceError as exc:
            # The client's first message is taken (or the stream's end, or a few seconds) before the stream ends:
            # ended while that message was still being sent, the client would see an INTERNAL error of its own
            # send instead of this status.
            with contextlib.suppress(StopAsyncIteration, TimeoutError, grpc.RpcError):
                await asyncio.wait_for(anext(aiter(requests)), REFUSED_STREAM_READ_S)
            await context.abort(grpc_status(exc), _details(exc.message), _trailers(exc))
            return
        stream = _Stream()
        reader = asyncio.get_running_loop().create_task(self._read_stream(requests, principal, stream))
        written = 0
        try:
            while not stream.closed or written < stream.read:
                answer = await stream.answers.get()
                if answer is None:  # the client sent its last request
                    stream.closed = True
                    continue
                written += 1
                stream.window.release()
                yield answer
        finally:
            reader.cancel()

    async def _read_stream(
        self, requests: AsyncIterator[bytes], principal: Principal | None, stream: _Stream
    ) -> None:
        try:
            async for raw in requests:
                await stream.window.acquire()
                stream.read += 1
                self._stream_one(raw, principal, stream.answers)
        finally:
            stream.answers.put_nowait(None)

    def _stream_one(
        self, raw: bytes, principal: Principal | None, answers: asyncio.Queue[bytes | None]
    ) -> None:
        received = time.monotonic_ns()
        try:
            mv, pending = self._accept(raw, principal, received, None)
        except InferenceError as exc:
            answers.put_nowait(_stream_error(exc))
            return
        except Exception:
            log.exception("a gRPC stream infer request failed")
            answers.put_nowait(
                _stream_error(InferenceError("internal error while accepting the request", 500))
            )
            return
        # Results are delivered on this (the loop's) thread by core.complete, so on_done is set in time.
        pending.payload.on_done = partial(self._stream_done, mv, pending, answers, received)

    def _stream_done(
        self,
        mv: ModelVersion,
        pending: Pending,
        answers: asyncio.Queue[bytes | None],
        received: int,
        result: Any,
    ) -> None:
        try:
            # Triton flags the last response of a request (here the only one) when the client asks for it, as
            # perf_analyzer --streaming does.
            final = pending.payload.request.parameters.get("triton_enable_empty_final_response") is True
            answer = encode_stream_response(self._answer(mv, pending, result, final))
        except InferenceError as exc:
            answers.put_nowait(_stream_error(exc))
            return
        except Exception:
            log.exception("encoding a gRPC stream answer of model '%s' failed", mv.spec.name)
            answers.put_nowait(
                _stream_error(InferenceError("internal error while encoding the response", 500))
            )
            return
        answers.put_nowait(answer)
        self.core.response_sent(mv, pending, received)


class _Stream:
    """One ModelStreamInfer call: the answers ready to write (None once the client sent its last request), how
    many requests were read, and the window that pauses reading while STREAM_WINDOW answers are due."""

    __slots__ = ("answers", "closed", "read", "window")

    def __init__(self) -> None:
        self.answers: asyncio.Queue[bytes | None] = asyncio.Queue()
        self.window = asyncio.Semaphore(STREAM_WINDOW)
        self.read = 0
        self.closed = False


def _stream_error(exc: InferenceError) -> bytes:
    answer: bytes = pb.ModelStreamInferResponse(error_message=_details(exc.message)).SerializeToString()
    return answer
