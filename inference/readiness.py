"""``/readyz``: whether this replica should get traffic, check by check.

``/v2/health/ready`` keeps KServe's meaning (the models are loaded). ``/readyz`` adds what serving depends on
behind the models: the database answers, the ledger drainer is alive and keeps up, the spool has room, no
quarantined record waits for an operator, the chain lease is held. 200 when every check passes, else 503; the
JSON body names every check, and the failed ones in ``failed``.

The checks that ask the database (``blocking``) run on a thread of their own, never on the event loop, bounded
by ``timeout_s``: a database that does not answer is a failed check after that long, not a stuck probe. At most
one such thread runs at a time (a probe arriving meanwhile waits for the same one, and a thread stuck past its
bound is not joined by another), and the whole answer is kept ``cache_s`` seconds, so probes from several
kubelets and load balancers cannot pile work up. The ``inline`` checks read in-memory state and run on the loop.
Framework-free: the Django side (carbonledger/gateway_app.py) supplies the checks.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import orjson

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class Check:
    name: str
    ok: bool
    detail: str


Checks = Callable[[], Sequence[Check]]


def _failure(exc: BaseException) -> str:
    text = f"{type(exc).__name__}: {exc}".strip()
    return text.splitlines()[0][:500] if text else type(exc).__name__


class Readiness:
    def __init__(
        self,
        blocking: Checks | None = None,
        inline: Checks | None = None,
        *,
        timeout_s: float = 2.0,
        cache_s: float = 1.0,
        blocking_names: Sequence[str] = ("database",),
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        """``blocking_names``: the checks ``blocking`` answers, named failed when it raises or times out."""
        self._blocking = blocking
        self._inline = inline
        self.timeout_s = timeout_s
        self.cache_s = cache_s
        self._blocking_names = tuple(blocking_names)
        self._clock = clock
        self._cached: tuple[float, int, bytes] | None = None
        self._answering: asyncio.Future[tuple[int, bytes]] | None = None
        self._thread_answer: asyncio.Future[Sequence[Check]] | None = None

    async def probe(self, first: Sequence[Check] = ()) -> tuple[int, bytes]:
        """(status, JSON body); ``first``: checks the caller already made (the models'), listed first."""
        cached = self._cached
        if cached is not None and self._clock() - cached[0] < self.cache_s:
            return cached[1], cached[2]
        if self._answering is None or self._answering.done():
            self._answering = asyncio.ensure_future(self._answer(tuple(first)))
        return await asyncio.shield(self._answering)

    async def _answer(self, first: tuple[Check, ...]) -> tuple[int, bytes]:
        checks = [*first, *(await self._blocking_checks()), *self._inline_checks()]
        failed = [c.name for c in checks if not c.ok]
        body = orjson.dumps(
            {
                "ready": not failed,
                "failed": failed,
                "checks": {c.name: {"ok": c.ok, "detail": c.detail} for c in checks},
            }
        )
        status = 503 if failed else 200
        self._cached = (self._clock(), status, body)
        return status, body

    def _inline_checks(self) -> Sequence[Check]:
        if self._inline is None:
            return ()
        try:
            return self._inline()
        except Exception as exc:  # a bug in a check must say so, not answer 500
            log.exception("a readiness check failed")
            return (Check("checks", False, f"the in-process checks failed: {_failure(exc)}"),)

    async def _blocking_checks(self) -> Sequence[Check]:
        if self._blocking is None:
            return ()
        running = self._thread_answer
        if running is None or running.done():
            running = self._thread_answer = self._start_thread(self._blocking)
        try:
            return await asyncio.wait_for(asyncio.shield(running), self.timeout_s)
        except TimeoutError:
            return [Check(n, False, f"no answer within {self.timeout_s:g} s") for n in self._blocking_names]

    def _start_thread(self, blocking: Checks) -> asyncio.Future[Sequence[Check]]:
        """Run ``blocking`` on a daemon thread of its own (one that hangs must not hold the process at exit)."""
        loop = asyncio.get_running_loop()
        answer: asyncio.Future[Sequence[Check]] = loop.create_future()
        names = self._blocking_names

        def deliver(checks: Sequence[Check]) -> None:
            if not answer.done():
                answer.set_result(checks)

        def run() -> None:
            try:
                checks: Sequence[Check] = list(blocking())
            except Exception as exc:
                checks = [Check(n, False, _failure(exc)) for n in names]
            # RuntimeError: the loop closed meanwhile (the server stopped), and nobody waits for the answer.
            with contextlib.suppress(RuntimeError):
                loop.call_soon_threadsafe(deliver, checks)

        threading.Thread(target=run, name="readiness-check", daemon=True).start()
        return answer
