"""ASGI entry point: a path router in front of two apps.

``/v2/...`` and ``/metrics`` go to the lean inference gateway; everything else to Django.
The router answers the ASGI lifespan itself (Django's handler rejects lifespan events) and
uses it to start and stop the gateway's batchers.
"""

from __future__ import annotations

import json
import os
from typing import Any

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "carbonledger.settings")
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

from django.conf import settings
from django.core.asgi import get_asgi_application
from django.http.request import split_domain_port, validate_host

django_app = get_asgi_application()

from carbonledger.gateway_app import build_gateway  # noqa: E402
from inference.gateway import DirectInfer, Gateway  # noqa: E402

# Probes call these by address (a pod's IP, localhost), and Prometheus scrapes /metrics the same way: they are
# answered whatever the Host header says. Every other /v2 path checks it against ALLOWED_HOSTS, as Django does.
_ANY_HOST = frozenset({"/v2/health/live", "/v2/health/ready", "/metrics"})


def _allowed_host(host: bytes | None) -> bool:
    """Whether a request naming ``host`` (the Host header; None: none sent, HTTP/1.0) may be served, by Django's
    own rule: ALLOWED_HOSTS, with the localhost names when DEBUG is on and the list is empty."""
    if host is None:
        return True  # no name to check: the server's own address answers, as Django's get_host() falls back
    allowed = settings.ALLOWED_HOSTS
    # Every infer request asks, and Django's check costs several µs: the answers are kept per Host value for
    # the settings they were given under (a new ALLOWED_HOSTS list, as a test's override makes, starts afresh),
    # and the table is emptied when full, so that made-up Host values cannot grow it.
    key = (host, id(allowed), settings.DEBUG)
    known = _HOST_ANSWERS.get(key)
    if known is not None:
        return known
    if settings.DEBUG and not allowed:
        allowed = [".localhost", "127.0.0.1", "[::1]"]
    if "*" in allowed:
        answer = True
    else:
        domain, _port = split_domain_port(host.decode("latin-1"))
        answer = bool(domain) and validate_host(domain, allowed)
    if len(_HOST_ANSWERS) >= _HOST_ANSWERS_MAX:
        _HOST_ANSWERS.clear()
    _HOST_ANSWERS[key] = answer
    return answer


_HOST_ANSWERS: dict[tuple[bytes, int, bool], bool] = {}
_HOST_ANSWERS_MAX = 256


def _host_header(headers: list[tuple[bytes, bytes]]) -> bytes | None:
    for name, value in headers:
        if name == b"host":
            return value
    return None


class Router:
    """The gateway is built on first use (the lifespan start-up), not at import: building it
    opens the spool and detects meters, which a module import must not do."""

    def __init__(self) -> None:
        self._gateway: Gateway | None = None

    @property
    def gateway(self) -> Gateway:
        if self._gateway is None:
            self._gateway = build_gateway()
        return self._gateway

    def direct_infer(
        self, method: str, path: str, headers: dict[bytes, bytes], received_ns: int
    ) -> DirectInfer | None:
        """See ``Gateway.direct_infer``; None until the lifespan has built the gateway."""
        gateway = self._gateway
        # Only a Host header seen and allowed takes the fast path; anything else goes the ASGI way, which
        # checks it and answers a bad one with 400.
        if gateway is None or not _allowed_host(headers.get(b"host", b"")):
            return None
        return gateway.direct_infer(method, path, headers, received_ns)

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        kind = scope["type"]
        if kind == "http":
            path = scope["path"]
            if path.startswith("/v2") or path == "/metrics":
                host = _host_header(scope.get("headers", ()))
                if path not in _ANY_HOST and not _allowed_host(host):
                    await _bad_host(send, host)
                    return
                await self.gateway(scope, receive, send)
            else:
                await django_app(scope, receive, send)
        elif kind == "lifespan":
            await self.gateway.lifespan(receive, send)
        else:
            await django_app(scope, receive, send)


async def _bad_host(send: Any, host: bytes | None) -> None:
    shown = (host or b"").decode("latin-1")[:255]
    body = json.dumps({"error": f"invalid Host header {shown!r}: not in ALLOWED_HOSTS"}).encode()
    await send(
        {
            "type": "http.response.start",
            "status": 400,
            "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())],
        }
    )
    await send({"type": "http.response.body", "body": body})


application = Router()
