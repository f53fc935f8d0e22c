"""A small KServe v2 HTTP client for the job runner: one keep-alive connection per thread, standard library
only. The runner sends each request of a job to the gateway's own endpoint, like any client, so jobs go
through the same batching, metering and ledger as live traffic."""

from __future__ import annotations

import http.client
import threading
import time
from dataclasses import dataclass
from urllib.parse import quote, urlsplit

# Answers that mean "not executed, try again later": a full queue (429), a full spool or a model that is
# loading (503). Anything else is final: a request that reached a model is never sent twice.
RETRY_STATUSES = frozenset({429, 503})
_MAX_RETRY_AFTER_S = 30.0


@dataclass(frozen=True)
class InferAnswer:
    status: int  # 0: no HTTP answer (connection refused, reset, time-out)
    body: bytes
    error: str = ""

    @property
    def ok(self) -> bool:
        return self.status == 200


def infer_path(model: str, version: str) -> str:
    path = f"/v2/models/{quote(model, safe='')}"
    if version:
        path += f"/versions/{quote(version, safe='')}"
    return path + "/infer"


class GatewayClient:
    def __init__(
        self, base_url: str, api_key: str, *, timeout_s: float, attempts: int, backoff_s: float = 0.5
    ):
        parts = urlsplit(base_url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(f"not an http(s) address: {base_url!r}")
        self._https = parts.scheme == "https"
        self._host = parts.hostname
        self._port = parts.port or (443 if self._https else 80)
        self._prefix = parts.path.rstrip("/")
        self._headers = {"Authorization": f"Bearer {api_key}", "Content-Type": "application/json"}
        self._timeout_s = timeout_s
        self._attempts = attempts
        self._backoff_s = backoff_s
        self._local = threading.local()
        self._all: list[http.client.HTTPConnection] = []
        self._lock = threading.Lock()

    def _connection(self) -> http.client.HTTPConnection:
        conn: http.client.HTTPConnection | None = getattr(self._local, "conn", None)
        if conn is None:
            cls = http.client.HTTPSConnection if self._https else http.client.HTTPConnection
            conn = cls(self._host, self._port, timeout=self._timeout_s)
            self._local.conn = conn
            with self._lock:
                self._all.append(conn)
        return conn

    def _drop(self) -> None:
        conn = getattr(self._local, "conn", None)
        if conn is not None:
            conn.close()
            self._local.conn = None

    def _once(self, path: str, body: bytes) -> tuple[InferAnswer, bool, float]:
        """One POST: (answer, whether it may be sent again, seconds to wait first)."""
        conn = self._connection()
        try:
            conn.request("POST", self._prefix + path, body=body, headers=self._headers)
            response = conn.getresponse()
            data = response.read()
        except (OSError, http.client.HTTPException) as exc:
            self._drop()
            # Refused, or a kept-alive connection the server had closed: the request reached no model.
            # A time-out may have reached one: it is not sent again.
            unsent = isinstance(
                exc,
                ConnectionRefusedError
                | ConnectionResetError
                | BrokenPipeError
                | http.client.RemoteDisconnected,
            )
            return InferAnswer(0, b"", f"{type(exc).__name__}: {exc}"), unsent, 0.0
        if response.will_close:
            self._drop()
        wait = 0.0
        retry_after = response.getheader("Retry-After")
        if retry_after:
            try:
                wait = min(max(float(retry_after), 0.0), _MAX_RETRY_AFTER_S)
            except ValueError:
                wait = 0.0
        return InferAnswer(response.status, data), response.status in RETRY_STATUSES, wait

    def infer(self, path: str, body: bytes) -> InferAnswer:
        """POST one infer body; sent again (after a growing pause, or the server's Retry-After) only when it
        reached no model -- refused connection, 429, 503 -- at most ``attempts`` times in all."""
        answer = InferAnswer(0, b"", "not sent")
        for attempt in range(self._attempts):
            answer, again, wait = self._once(path, body)
            if answer.ok or not again:
                return answer
            if attempt + 1 < self._attempts:
                time.sleep(max(wait, self._backoff_s * (2**attempt)))
        return answer

    def close(self) -> None:
        with self._lock:
            for conn in self._all:
                conn.close()
            self._all.clear()
