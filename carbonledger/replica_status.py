"""What a replica says about itself beyond its models: /readyz's checks, and /metrics' lines for its ledger spool
and drainer and for the Celery workers' heartbeats.

``ReplicaStatus`` is a gateway service with a thread of its own: every ``tick_s`` it samples how long the oldest
spooled record has waited for the database (``inference.metrics.DrainLag``) and what the drainer published, and
every ``interval_s`` it reads the workers' heartbeat leases from the database. A scrape or a probe on the event
loop reads that snapshot (and a few in-memory fields), never the database; the one thing /readyz asks the
database, ``database_checks``, runs on readiness's own thread with a time bound (inference/readiness.py).
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import Protocol

from django.db import DatabaseError, close_old_connections, connection

from carbonledger.worker_heartbeat import WORKER_LEASE_PREFIX
from inference.errors import THREAD_ERRORS
from inference.metrics import DrainerState, DrainLag, drainer_lines, family, labels
from inference.readiness import Check
from inference.spool import Spool
from ledger.selectors import quarantined_count
from tenancy.leases import db_now
from tenancy.selectors import leases_with_prefix

log = logging.getLogger(__name__)

# A worker whose heartbeat lapsed is shown down for this many of its lease times, then dropped: a worker that
# was scaled away is not down for ever.
WORKER_SHOWN_DOWN_LEASES = 20


class Drainer(Protocol):
    """The gateway's ledger drainer, as readiness and /metrics see it (a process of its own, or a thread)."""

    restarts: int

    def alive(self) -> bool: ...

    def written_and_healthy(self) -> tuple[int, bool | None]:
        """(records committed since the gateway started, whether its last attempt succeeded; None: unknown)."""
        ...


@dataclass(frozen=True)
class WorkerBeat:
    name: str
    up: bool
    age_s: float  # since its last heartbeat


def _first_line(exc: BaseException) -> str:
    text = f"{type(exc).__name__}: {exc}".strip()
    return (text.splitlines() or [type(exc).__name__])[0][:500]


def database_checks(chain_id: str | None) -> list[Check]:
    """/readyz's checks that need the database: it answers, and no quarantined record of this replica's chain
    waits for an operator. Runs on readiness's thread; its connection is closed before it returns, so a probe
    never holds one."""
    checks: list[Check] = []
    try:
        began = time.monotonic()
        with connection.cursor() as cursor:
            cursor.execute("SELECT 1")
            cursor.fetchone()
        checks.append(Check("database", True, f"answered in {1000 * (time.monotonic() - began):.0f} ms"))
        if chain_id is not None:
            waiting = quarantined_count(chain_id)
            checks.append(
                Check("ledger_quarantine", True, "no quarantined record waits")
                if waiting == 0
                else Check(
                    "ledger_quarantine",
                    False,
                    f"{waiting} quarantined record(s) of chain {chain_id} wait for an operator: manage.py "
                    "ledger_quarantine (--retry after a fix, or --dismiss)",
                )
            )
    except DatabaseError as exc:
        checks.append(Check("database", False, _first_line(exc)))
        if chain_id is not None:
            checks.append(Check("ledger_quarantine", False, "unknown: the database does not answer"))
    finally:
        with contextlib.suppress(Exception):
            connection.close()
    return checks


class ReplicaStatus:
    def __init__(
        self,
        *,
        spool: Spool | None,
        drainer: Drainer | None,
        interval_s: float,
        max_drain_lag_s: float,
        max_spool_fraction: float,
        worker_heartbeat_s: float,
        chain_lease: Callable[[], tuple[bool, str]] | None = None,
        tick_s: float = 0.25,
    ) -> None:
        """``chain_lease``: whether this replica holds its ledger chain's lease, and why not (ledger/ownership.py)."""
        self.spool = spool
        self.drainer = drainer
        self.chain = spool.chain_id if spool is not None else None
        self.interval_s = interval_s
        self.max_drain_lag_s = max_drain_lag_s
        self.max_spool_fraction = max_spool_fraction
        self.worker_heartbeat_s = worker_heartbeat_s
        self.chain_lease = chain_lease
        self.tick_s = tick_s
        self.lag = DrainLag()
        self.drainer_state: DrainerState | None = None
        self.workers: list[WorkerBeat] | None = None  # None until first read
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    # -- the thread ---------------------------------------------------------------------------------------

    def tick(self) -> None:
        """Sample the drain lag and the drainer's state (no database)."""
        spool, drainer = self.spool, self.drainer
        if spool is None or drainer is None or self.chain is None:
            return
        appended, backlog = spool.drain_totals()
        lag_s = self.lag.sample(appended, backlog)
        written, healthy = drainer.written_and_healthy()
        self.drainer_state = DrainerState(
            chain=self.chain,
            up=drainer.alive(),
            restarts=drainer.restarts,
            records_written=written,
            healthy=healthy,
            lag_s=lag_s,
            backlog_bytes=backlog,
            max_backlog_bytes=spool.max_backlog_bytes,
        )

    def refresh_workers(self) -> None:
        """The Celery workers' heartbeat leases (carbonledger/worker_heartbeat.py), by the database's clock."""
        now = db_now()
        keep_s = WORKER_SHOWN_DOWN_LEASES * self.worker_heartbeat_s * 3
        beats = []
        for lease in leases_with_prefix(WORKER_LEASE_PREFIX):
            lapsed_s = (now - lease.expires_at).total_seconds()
            if lapsed_s > keep_s:
                continue
            beats.append(
                WorkerBeat(
                    name=lease.name[len(WORKER_LEASE_PREFIX) :],
                    up=lapsed_s < 0,
                    age_s=max(0.0, (now - lease.heartbeat_at).total_seconds()),
                )
            )
        self.workers = beats

    def _run(self) -> None:
        next_refresh = 0.0
        try:
            while True:
                try:
                    self.tick()
                except Exception as exc:
                    THREAD_ERRORS.record(
                        exc, "sampling the ledger drainer's state failed; the next tick retries"
                    )
                if time.monotonic() >= next_refresh:
                    next_refresh = time.monotonic() + self.interval_s
                    try:
                        close_old_connections()
                        self.refresh_workers()
                    except Exception as exc:  # the database may be down: /metrics keeps the last answer
                        THREAD_ERRORS.record(exc, "the workers' heartbeats not read; /metrics keeps the last")
                    finally:
                        with contextlib.suppress(Exception):
                            connection.close()  # one short connection per read: none held between reads
                if self._stop.wait(self.tick_s):
                    return
        finally:
            with contextlib.suppress(Exception):
                connection.close()

    def start(self) -> None:
        try:
            self.tick()  # /metrics shows the drainer from the first scrape on
        except Exception as exc:
            THREAD_ERRORS.record(exc, "sampling the ledger drainer's state failed; the next tick retries")
        self._thread = threading.Thread(target=self._run, name="replica-status", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(5)

    # -- what /metrics and /readyz read (on the event loop) -------------------------------------------------

    def prometheus_lines(self) -> list[str]:
        state = self.drainer_state
        # The lag as of the scrape (it grows between samples while a record waits), as /readyz reads it.
        lines = drainer_lines(None if state is None else replace(state, lag_s=self.lag.seconds()))
        workers = self.workers
        if workers is not None:
            lines += family(
                "carbonledger_celery_worker_up",
                "gauge",
                "1 while a Celery worker renews its heartbeat (every WORKER_HEARTBEAT_INTERVAL_S), 0 once it "
                "missed three; a worker gone longer is left out",
                [(labels(worker=w.name), 1 if w.up else 0) for w in workers],
            )
            lines += family(
                "carbonledger_celery_worker_heartbeat_age_seconds",
                "gauge",
                "Seconds since a Celery worker's last heartbeat reached the database",
                [(labels(worker=w.name), round(w.age_s, 3)) for w in workers],
            )
            lines += family(
                "carbonledger_celery_workers_up",
                "gauge",
                "Celery workers whose heartbeat is live (the one to alert on: zero means queued work waits)",
                [("", sum(1 for w in workers if w.up))],
            )
        return lines

    def checks(self) -> Sequence[Check]:
        """/readyz's in-memory checks: the drainer is alive and keeps up, the spool has room, the chain's lease
        is held. Each one that raises is a failed check of its own name."""
        out: list[Check] = []
        for name, check in (
            ("chain_lease", self._chain_lease_check),
            ("drainer", self._drainer_check),
            ("drainer_lag", self._lag_check),
            ("spool", self._spool_check),
        ):
            try:
                found = check()
            except Exception as exc:
                log.exception("readiness check %s failed", name)
                found = Check(name, False, f"the check failed: {_first_line(exc)}")
            if found is not None:
                out.append(found)
        return out

    def _chain_lease_check(self) -> Check | None:
        if self.chain_lease is None:
            return None
        held, why = self.chain_lease()
        if held:
            return Check("chain_lease", True, f"this replica holds ledger chain {self.chain}")
        return Check("chain_lease", False, why or f"this replica does not hold ledger chain {self.chain}")

    def _drainer_check(self) -> Check | None:
        if self.drainer is None:
            return None
        if self.drainer.alive():
            return Check("drainer", True, "the ledger drainer runs")
        return Check("drainer", False, "the ledger drainer is not running (its watchdog restarts a process)")

    def _lag_check(self) -> Check | None:
        if self.drainer is None:
            return None
        lag_s = self.lag.seconds()
        limit = self.max_drain_lag_s
        if lag_s <= limit:
            return Check(
                "drainer_lag", True, f"the oldest spooled record has waited {lag_s:.1f} s (limit {limit:g} s)"
            )
        return Check(
            "drainer_lag",
            False,
            f"the oldest spooled record has waited {lag_s:.1f} s for the database, over READY_MAX_DRAIN_LAG_S "
            f"({limit:g} s)",
        )

    def _spool_check(self) -> Check | None:
        spool = self.spool
        if spool is None:
            return None
        used = spool.backlog_bytes / spool.max_backlog_bytes
        detail = f"{spool.backlog_bytes} of {spool.max_backlog_bytes} bytes ({100 * used:.1f} %) wait"
        if used < self.max_spool_fraction:
            return Check("spool", True, detail)
        return Check(
            "spool", False, f"{detail}: at or over READY_SPOOL_MAX_FRACTION ({self.max_spool_fraction:g})"
        )
