"""Run an ASGI app under uvicorn on a free loopback port, in a thread of the test process."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import uvicorn

from inference.http_protocol import GatewayHttpProtocol


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def free_port_block(n: int) -> int:
    """A port P with P .. P+n-1 all free on 127.0.0.1 right now (Triton takes HTTP, gRPC, metrics)."""
    import random

    rng = random.Random()
    for _ in range(200):
        base = rng.randrange(20000, 60000 - n)
        socks: list[socket.socket] = []
        try:
            for p in range(base, base + n):
                s = socket.socket()
                socks.append(s)
                s.bind(("127.0.0.1", p))
            return base
        except OSError:
            continue
        finally:
            for s in socks:
                s.close()
    raise RuntimeError("no block of free loopback ports")


@contextmanager
def serve_asgi(
    app: Any,
    timeout_s: float = 30.0,
    protocol: type[GatewayHttpProtocol] = GatewayHttpProtocol,
    **config_options: Any,
) -> Iterator[str]:
    """Yield ``host:port`` once the app's lifespan start-up has completed; ``protocol`` is the serving protocol
    (a subclass with other limits, say); ``config_options`` go to ``uvicorn.Config`` (``timeout_keep_alive``,
    say) and may replace the defaults below (``lifespan``, ``log_level``)."""
    port = free_port()
    options: dict[str, Any] = {
        "lifespan": "on",
        "access_log": False,
        "log_level": "warning",
        **config_options,
    }
    # The protocol and loop as `manage.py serve` serves.
    config = uvicorn.Config(app, host="127.0.0.1", port=port, loop="asyncio", http=protocol, **options)
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, name=f"uvicorn-{port}", daemon=True)
    thread.start()
    deadline = time.monotonic() + timeout_s
    while not server.started:
        if not thread.is_alive():
            raise RuntimeError("the test server exited during start-up")
        if time.monotonic() > deadline:
            raise RuntimeError("the test server did not start in time")
        time.sleep(0.01)
    try:
        yield f"127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(timeout_s)
