"""One timer that times out a server's connections: the HTTP/1.1 protocol's (http_protocol.py) and the gRPC
transport's (grpc_h2.py).

A connection only notes when its current phase began; about every ``interval_s``, while any connection is open,
the sweep hands each one the time and the connection closes (or answers) what is past its time-out. So the
request path arms and cancels no timer per request, and a time-out fires between one and two intervals late,
never early.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from typing import Any

log = logging.getLogger(__name__)

# A sweep runs at least this often, and four times within the shortest time-out it serves (see interval_for).
SWEEP_MAX_S = 1.0


def interval_for(*timeouts_s: float) -> float:
    """The sweep interval for connections with these time-outs: a quarter of the shortest, at most SWEEP_MAX_S."""
    return min(SWEEP_MAX_S, *(t / 4 for t in timeouts_s))


class Sweeper:
    """Calls ``visit(connection, now)`` for each connection in ``connections`` (a set the server keeps) about
    every ``interval_s`` while the set is not empty; ``watch`` (re)starts it, typically as a connection opens."""

    def __init__(
        self,
        loop: asyncio.AbstractEventLoop,
        connections: set[Any],
        interval_s: float,
        visit: Callable[[Any, float], None],
    ) -> None:
        self._loop = loop
        self._connections = connections
        self._interval_s = interval_s
        self._visit = visit
        self._handle: asyncio.TimerHandle | None = None

    def watch(self) -> None:
        if self._handle is None:
            self._handle = self._loop.call_later(self._interval_s, self._sweep)

    def cancel(self) -> None:
        if self._handle is not None:
            self._handle.cancel()
            self._handle = None

    def _sweep(self) -> None:
        self._handle = None
        now = time.monotonic()
        for conn in list(self._connections):  # closing one may change the set
            try:
                self._visit(conn, now)
            except Exception:  # one connection's failure must not stop the sweeps of the others
                log.exception("sweeping a connection for its time-outs failed")
        if self._connections:
            self.watch()
