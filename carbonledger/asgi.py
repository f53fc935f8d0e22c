"""ASGI entry point: a path router in front of two apps.

``/v2/...`` and ``/metrics`` go to the lean inference gateway; everything else to Django.
The router answers the ASGI lifespan itself (Django's handler rejects lifespan events) and
uses it to start and stop the gateway's batchers.
"""

from __future__ import annotations

import logging
import os
from typing import Any

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "carbonledger.settings")
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

from django.core.asgi import get_asgi_application  # noqa: E402

django_app = get_asgi_application()

from carbonledger.gateway_app import build_gateway  # noqa: E402

log = logging.getLogger("carbonledger.asgi")


class Router:
    def __init__(self) -> None:
        self.gateway = build_gateway()

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        kind = scope["type"]
        if kind == "http":
            path = scope["path"]
            if path.startswith("/v2") or path == "/metrics":
                await self.gateway(scope, receive, send)
            else:
                await django_app(scope, receive, send)
        elif kind == "lifespan":
            await self._lifespan(receive, send)
        else:
            await django_app(scope, receive, send)

    async def _lifespan(self, receive: Any, send: Any) -> None:
        while True:
            message = await receive()
            if message["type"] == "lifespan.startup":
                try:
                    await self.gateway.startup()
                except Exception as exc:
                    log.exception("gateway start-up failed")
                    await send({"type": "lifespan.startup.failed", "message": str(exc)})
                    return
                await send({"type": "lifespan.startup.complete"})
            elif message["type"] == "lifespan.shutdown":
                await self.gateway.shutdown()
                await send({"type": "lifespan.shutdown.complete"})
                return


application = Router()
