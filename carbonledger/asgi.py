"""ASGI entry point: a path router in front of two apps.

``/v2/...`` and ``/metrics`` go to the lean inference gateway; everything else to Django.
The router answers the ASGI lifespan itself (Django's handler rejects lifespan events) and
uses it to start and stop the gateway's batchers.
"""

from __future__ import annotations

import os
from typing import Any

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "carbonledger.settings")
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

from django.core.asgi import get_asgi_application

django_app = get_asgi_application()

from carbonledger.gateway_app import build_gateway  # noqa: E402
from inference.gateway import DirectInfer, Gateway  # noqa: E402


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
        if gateway is None:
            return None
        return gateway.direct_infer(method, path, headers, received_ns)

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        kind = scope["type"]
        if kind == "http":
            path = scope["path"]
            if path.startswith("/v2") or path == "/metrics":
                await self.gateway(scope, receive, send)
            else:
                await django_app(scope, receive, send)
        elif kind == "lifespan":
            await self.gateway.lifespan(receive, send)
        else:
            await django_app(scope, receive, send)


application = Router()
