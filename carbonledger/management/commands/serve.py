from __future__ import annotations

import os
import sys
from typing import Any

import uvicorn
from django.conf import settings
from django.core.management.base import BaseCommand, CommandError, CommandParser

from carbonledger.asgi import application
from inference.http_protocol import GatewayHttpProtocol


class Command(BaseCommand):
    help = (
        "Run the ASGI server with the settings measured fastest here: the gateway (/v2, /metrics) and Django "
        "(dashboard, API) with --role all (the default), one of them with --role gateway or --role web "
        "(docs/operations.md)."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--host", default="127.0.0.1")
        parser.add_argument("--port", type=int, default=None, help="defaults to $PORT, else 8000")
        parser.add_argument(
            "--role",
            choices=("all", "gateway", "web"),
            default=None,
            help="what this process serves: all (the default, from $CARBONLEDGER_ROLE), gateway (/v2 and "
            "/metrics) or web (the dashboard and the API)",
        )

    def handle(self, *args: Any, **opts: Any) -> None:

        port = opts["port"]
        if port is None:
            raw = os.environ.get("PORT", "8000")
            try:
                port = int(raw)
            except ValueError:
                raise CommandError(f"PORT must be an integer, got {raw!r}") from None
        if not 0 <= port <= 65535:  # 0: any free port
            raise CommandError(f"the port must be from 0 to 65535, got {port}")
        if os.environ.get("OPENBLAS_NUM_THREADS") is None:
            # manage.py sets it before numpy loads; setting it here would be too late to matter.
            self.stderr.write(
                "warning: OPENBLAS_NUM_THREADS is not set: numpy's OpenBLAS may run a spinning worker "
                "thread per core; start the server through manage.py or set OPENBLAS_NUM_THREADS=1"
            )
        # Background threads (model instances, meters, the ledger writer) hold the GIL for up
        # to the switch interval at a time; 5 ms (the default) shows up directly in the event
        # loop's p99. A shorter interval trades a little throughput for that tail.
        sys.setswitchinterval(settings.GATEWAY_SWITCH_INTERVAL_S)
        # The stdlib asyncio loop: uvloop measured no faster under this protocol (bench/README.md); httptools
        # beat h11 by 25-30 %, and one process with one batcher per model beat two workers (which split batches).
        # uvicorn runs the process, the socket and the lifespan; the HTTP protocol is ours (httptools on asyncio:
        # each answer in one write, infer requests without an ASGI task, read time-outs, header and connection
        # caps; see inference/http_protocol.py), measured faster than subclassing uvicorn's.
        protocol = GatewayHttpProtocol.with_limits(
            header_timeout_s=settings.GATEWAY_HEADER_TIMEOUT_S,
            body_timeout_s=settings.GATEWAY_BODY_TIMEOUT_S,
            max_headers=settings.GATEWAY_MAX_HEADERS,
            max_header_bytes=settings.GATEWAY_MAX_HEADER_BYTES,
            max_connections=settings.GATEWAY_MAX_CONNECTIONS,
        )
        # uvicorn imports the module by this name, so it serves the very router set here (the API's live model
        # statistics find the gateway through it too).
        application.role = opts["role"] or settings.SERVER_ROLE
        self.stderr.write(f"serving the role {application.role} on {opts['host']}:{port}")
        uvicorn.run(
            "carbonledger.asgi:application",
            host=opts["host"],
            port=port,
            loop="asyncio",
            http=protocol,
            lifespan="on",
            access_log=False,
            server_header=False,
            # Django alone decides what X-Forwarded-For and -Proto mean (TRUSTED_PROXIES,
            # SECURE_PROXY_SSL_HEADER); uvicorn's own default would believe any local peer.
            proxy_headers=False,
            date_header=False,
            log_level="info",
        )
