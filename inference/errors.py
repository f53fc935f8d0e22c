"""Errors of the gateway core, each carrying the HTTP status it maps to.

The KServe v2 HTTP protocol answers every error as ``{"error": "..."}``; the status
follows Triton's mapping (invalid argument 400, not found 404, unavailable 503). ``ThreadErrors`` counts the
exceptions background threads survived (``THREAD_ERRORS``, shown in /metrics).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

log = logging.getLogger(__name__)


class InferenceError(Exception):
    """An error that ends one request with ``status`` and ``{"error": message}``."""

    status: int = 500
    reason: str = "OTHER"  # Triton's failure reason label for nv_inference_request_failure

    def __init__(self, message: str, status: int | None = None) -> None:
        super().__init__(message)
        self.message = message
        if status is not None:
            self.status = status

    def headers(self) -> list[tuple[bytes, bytes]]:
        return []


class InvalidInput(InferenceError):
    status = 400


class NotFound(InferenceError):
    status = 404


class PayloadTooLarge(InferenceError):
    status = 413


class Unauthorized(InferenceError):
    status = 401


class Forbidden(InferenceError):
    status = 403


class ModelNotReady(InferenceError):
    status = 400


class QueueFull(InferenceError):
    """The priority level's queue is at ``max_queue_size``: rejected at once, never queued."""

    status = 429
    reason = "REJECTED"

    def __init__(self, message: str, retry_after_s: int = 1) -> None:
        super().__init__(message)
        self.retry_after_s = max(1, int(retry_after_s))

    def headers(self) -> list[tuple[bytes, bytes]]:
        return [(b"retry-after", str(self.retry_after_s).encode())]


class RequestTimeout(InferenceError):
    """The request waited in the queue past its timeout (Triton: 'Request timeout expired')."""

    status = 503
    reason = "REJECTED"


class BackendError(InferenceError):
    """The backend raised while executing a batch: fails that batch's requests only."""

    status = 500
    reason = "BACKEND"


class BackendUnavailable(InferenceError):
    """A remote backend (Triton) could not be reached within its time bound."""

    status = 503
    reason = "BACKEND"


class ShuttingDown(InferenceError):
    status = 503
    reason = "CANCELED"


class KeyStoreUnavailable(InferenceError):
    """The API key store cannot be reached and the key has no earlier answer to fall back on."""

    status = 503

    def headers(self) -> list[tuple[bytes, bytes]]:
        return [(b"retry-after", b"1")]


class ThreadErrors:
    """Exceptions that background threads survived, counted per thread name for ``/metrics``.

    A thread that fails in one iteration logs the failure, counts it here and goes on with the next. A failure
    that repeats (a meter unplugged, a database down) is logged with its traceback the first time and then at
    most once every ``log_every_s`` for the same thread and context, with the count meanwhile: a loop that
    fails on every turn must not flood the log.
    """

    def __init__(self, log_every_s: float = 300.0, clock: Callable[[], float] = time.monotonic) -> None:
        self._log_every_s = log_every_s
        self._clock = clock
        self._lock = threading.Lock()
        self._counts: dict[str, int] = {}
        self._logged: dict[tuple[str, str], tuple[float, int]] = {}  # when last logged, count then

    def record(self, exc: BaseException, context: str, thread: str | None = None) -> None:
        """Counts ``exc`` against ``thread`` (the calling thread's name by default) and logs it unless the same
        thread logged the same context within ``log_every_s``. ``context`` says what failed and what the thread
        does instead ("reading the meter of gpu0 failed; the next sample retries")."""
        name = thread if thread is not None else threading.current_thread().name
        now = self._clock()
        with self._lock:
            count = self._counts.get(name, 0) + 1
            self._counts[name] = count
            last = self._logged.get((name, context))
            if last is not None and now - last[0] < self._log_every_s:
                return
            self._logged[(name, context)] = (now, count)
        if last is None:
            log.error("%s (thread %s): %r", context, name, exc, exc_info=exc)
        else:
            log.error(
                "%s (thread %s): %r; %d errors in this thread since this was last logged",
                context,
                name,
                exc,
                count - last[1],
            )

    def count(self, thread: str) -> int:
        with self._lock:
            return self._counts.get(thread, 0)

    def counts(self) -> dict[str, int]:
        with self._lock:
            return dict(self._counts)


# The process's tally: the threads of every batcher, meter, recorder and service count here, and /metrics shows it.
THREAD_ERRORS = ThreadErrors()
