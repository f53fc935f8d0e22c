"""ASGI entry point: a path router in front of two apps.

``/v2/...``, ``/metrics`` and ``/readyz`` go to the lean inference gateway; everything else to Django.
The router answers the ASGI lifespan itself (Django's handler rejects lifespan events) and
uses it to start and stop the gateway's batchers.

A process has a role (docs/operations.md): ``all`` serves both apps (the one-box default), ``gateway`` the
gateway's paths only, ``web`` Django's only, without building the gateway (no models, meters, spool or
ledger writer in that process). A path of the other role is a 404 that names this process's role.
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

from inference.meters.serving_cpu import SERVING_CPU

# Django's work on the event loop is timed and left out of the serving CPU time the modelled meter books on the
# inference device (inference/meters/serving_cpu.py): the dashboard and the API are not inference.
django_app = SERVING_CPU.web_app(get_asgi_application())

from carbonledger.gateway_app import build_gateway  # noqa: E402
from inference.gateway import DirectInfer, Gateway  # noqa: E402

# Probes call these by address (a pod's IP, localhost), and Prometheus scrapes /metrics the same way: they are
# answered whatever the Host header says. Every other /v2 path checks it against ALLOWED_HOSTS, as Django does.
_ANY_HOST = frozenset({"/v2/health/live", "/v2/health/ready", "/readyz", "/metrics"})


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


ROLES = ("all", "gateway", "web")


def _gateway_path(path: str) -> bool:
    return path.startswith("/v2") or path in ("/metrics", "/readyz")


class Router:
    """The gateway is built on first use (the lifespan start-up), not at import: building it
    opens the spool and detects meters, which a module import must not do."""

    def __init__(self, role: str = "all") -> None:
        self._gateway: Gateway | None = None
        self.role = role

    @property
    def role(self) -> str:
        return self._role

    @role.setter
    def role(self, role: str) -> None:
        if role not in ROLES:
            raise ValueError(f"the role must be one of {', '.join(ROLES)}, got {role!r}")
        self._role = role

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
            if _gateway_path(path):
                if self._role == "web":
                    await _not_served(send, path, self._role)
                    return
                host = _host_header(scope.get("headers", ()))
                if path not in _ANY_HOST and not _allowed_host(host):
                    await _bad_host(send, host)
                    return
                await self.gateway(scope, receive, send)
            elif self._role == "gateway":
                await _not_served(send, path, self._role)
            else:
                await django_app(scope, receive, send)
        elif kind == "lifespan":
            if self._role == "web":
                await _bare_lifespan(receive, send)
            else:
                await self.gateway.lifespan(receive, send)
        elif self._role != "gateway":
            await django_app(scope, receive, send)


async def _bare_lifespan(receive: Any, send: Any) -> None:
    """The lifespan of a process without the gateway: nothing to start or stop."""
    while True:
        message = await receive()
        if message["type"] == "lifespan.startup":
            await send({"type": "lifespan.startup.complete"})
        elif message["type"] == "lifespan.shutdown":
            await send({"type": "lifespan.shutdown.complete"})
            return


async def _not_served(send: Any, path: str, role: str) -> None:
    served = "/v2, /metrics and /readyz" if role == "gateway" else "the dashboard and the API"
    elsewhere = "a web or all" if role == "gateway" else "a gateway or all"
    body = json.dumps(
        {
            "error": f"{path[:200]!r} is not served here: this process has the role {role} ({served} only);"
            f" {elsewhere} process serves it"
        }
    ).encode()
    await send(
        {
            "type": "http.response.start",
            "status": 404,
            "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())],
        }
    )
    await send({"type": "http.response.body", "body": body})


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


application = Router(settings.SERVER_ROLE)
