"""A Celery worker's heartbeat, in the database, for the gateways' /metrics.

When a worker is ready it leases ``worker:<its node name>`` (``tenancy.leases``, the same table the ledger
chains are leased in) for three heartbeat intervals and renews it every ``WORKER_HEARTBEAT_INTERVAL_S`` on a
thread of its own; a clean shutdown releases it. Every gateway reads those rows (``carbonledger/
replica_status.py``) and shows each worker as up while its lease is live: a worker that was killed or hangs
stops renewing, and shows down within three intervals. Nothing needs the broker's remote control (which the
embedded filesystem broker lacks) or a second endpoint to scrape.

Connected by importing this module from ``carbonledger/tasks.py``, which every worker imports at start.
"""

from __future__ import annotations

import contextlib
import logging
import threading
from typing import Any

from celery.signals import worker_ready, worker_shutdown
from django.conf import settings
from django.db import close_old_connections, connection

from inference.errors import THREAD_ERRORS
from tenancy.leases import (
    LeaseGrant,
    LeaseHeld,
    LeaseLost,
    claim_lease,
    process_owner,
    release_lease,
    renew_lease,
)

log = logging.getLogger(__name__)

WORKER_LEASE_PREFIX = "worker:"
# A worker shows down once it missed this many heartbeats (its lease's time is that many intervals).
MISSED_HEARTBEATS = 3


class WorkerHeartbeat:
    """Keeps the lease ``worker:<name>`` renewed every ``interval_s`` until ``stop``, which releases it."""

    def __init__(self, name: str, interval_s: float) -> None:
        self.lease_name = f"{WORKER_LEASE_PREFIX}{name}"[:200]
        self.interval_s = interval_s
        self.ttl_s = interval_s * MISSED_HEARTBEATS
        self.grant: LeaseGrant | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="worker-heartbeat", daemon=True)
        self._held_logged = False

    def start(self) -> WorkerHeartbeat:
        self._thread.start()
        return self

    def beat(self) -> None:
        """Claim the lease, or renew it; a live lease of another process of the same name is waited out."""
        try:
            if self.grant is None:
                self.grant = claim_lease(self.lease_name, owner=process_owner(), ttl_s=self.ttl_s)
                self._held_logged = False
            else:
                self.grant = renew_lease(self.grant, ttl_s=self.ttl_s)
        except LeaseHeld as exc:
            if not self._held_logged:
                log.warning("worker heartbeat: %s; another worker runs under this name, retrying", exc)
                self._held_logged = True
        except LeaseLost:
            self.grant = None  # taken over (a restart under the same name): claim again next time

    def _run(self) -> None:
        try:
            while True:
                try:
                    close_old_connections()
                    self.beat()
                except Exception as exc:  # the database may be down: beat again next interval
                    THREAD_ERRORS.record(exc, "the worker's heartbeat did not reach the database; retrying")
                finally:
                    # One short connection per beat: a worker's heartbeat holds none between beats.
                    with contextlib.suppress(Exception):
                        connection.close()
                if self._stop.wait(self.interval_s):
                    return
        finally:
            with contextlib.suppress(Exception):
                connection.close()

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(5)
        grant, self.grant = self.grant, None
        if grant is not None:
            try:
                release_lease(grant)
            except Exception:  # the database is gone: the lease simply expires
                log.warning("could not release the worker's heartbeat lease %s; it expires", grant.name)
            finally:
                with contextlib.suppress(Exception):
                    connection.close()


_heartbeat: WorkerHeartbeat | None = None


@worker_ready.connect
def _start_heartbeat(sender: Any = None, **_: Any) -> None:
    global _heartbeat
    if _heartbeat is None:
        name = str(getattr(sender, "hostname", "") or process_owner())
        _heartbeat = WorkerHeartbeat(name, settings.WORKER_HEARTBEAT_INTERVAL_S).start()


@worker_shutdown.connect
def _stop_heartbeat(sender: Any = None, **_: Any) -> None:
    global _heartbeat
    heartbeat, _heartbeat = _heartbeat, None
    if heartbeat is not None:
        heartbeat.stop()
