"""Errors of the gateway core, each carrying the HTTP status it maps to.

The KServe v2 HTTP protocol answers every error as ``{"error": "..."}``; the status
follows Triton's mapping (invalid argument 400, not found 404, unavailable 503).
"""

from __future__ import annotations


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
