"""One gateway meters each device: the device leases of a gateway process, and the recorder that claims its
meters when it starts.

Each metered device is leased in the database (``tenancy.leases``, lease name ``device:<device id>``) by the
gateway that meters it, renewed every third of ``DEVICE_LEASE_TTL_S`` and released when the gateway stops. The
policy when a device is another live gateway's is ``inference.meters.claims``' (one gateway per GPU: refuse to
start; a RAPL package taken: this process's own modelled CPU instead). A holder that stopped renewing (killed)
is waited for, at most one lease time, then taken over, so a restarted gateway gets its devices back.

A meter books energy only while its lease is surely this process's (``FencedMeter``): from a claim or renewal
until one lease time after it began. A lease taken over by another gateway (after this one could not renew it
for a lease time) stops this meter for good: the device's energy is then the other's alone, never both's.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections.abc import Callable
from typing import Any

from django.db import close_old_connections, connection

from carbonledger.db_wait import call_until_database_answers
from inference.meters import Meter
from inference.meters.claims import FALLBACK, FencedMeter, claim_devices, lease_name
from inference.recorder import DeviceAccount, LedgerRecorder, RecorderOptions
from inference.spool import Spool
from tenancy.leases import (
    LeaseGrant,
    LeaseHeld,
    LeaseLost,
    claim_lease,
    db_now,
    lease_holder,
    process_owner,
    release_lease,
    renew_lease,
)

log = logging.getLogger(__name__)


class DeviceLeases:
    """This process's leases on its metered devices, and the thread that renews them.

    ``live(device_id)`` gives a meter's fence: true from a claim or renewal of the device's lease until one
    lease time after the call began (nobody can claim it before that), false for good once it was taken over.
    """

    def __init__(
        self,
        ttl_s: float,
        *,
        owner: str | None = None,
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        if not ttl_s > 0:
            raise ValueError(f"ttl_s must be > 0, got {ttl_s!r}")
        self.ttl_s = ttl_s
        self.owner = owner or process_owner()
        self._monotonic = monotonic
        self._lock = threading.Lock()
        self._grants: dict[str, LeaseGrant] = {}
        self._valid_until: dict[str, float] = {}
        self.lost: dict[str, str] = {}  # device id -> why
        self.renewal_failures_total = 0
        self._failing = False
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    # -- claims ---------------------------------------------------------------------------------

    def claim(self, device_id: str) -> str | None:
        """Claim ``device_id``: None once this process holds it, else the live holder (owner string). A holder
        whose lease runs out within one lease time is taken to have stopped without releasing it, and waited
        for; one that renews it meanwhile is live."""
        name = lease_name(device_id)
        deadline = self._monotonic() + self.ttl_s
        while True:
            began = self._monotonic()
            try:
                grant = claim_lease(name, owner=self.owner, ttl_s=self.ttl_s)
            except LeaseHeld as held:
                left_s = (held.expires_at - db_now()).total_seconds()
                if self._monotonic() + left_s > deadline:
                    return held.owner
                time.sleep(min(0.5, max(0.05, left_s + 0.05)))
                continue
            with self._lock:
                self._grants[device_id] = grant
                self._valid_until[device_id] = began + self.ttl_s
                self.lost.pop(device_id, None)
            log.info("device %s leased by %s (token %d)", device_id, self.owner, grant.token)
            return None

    def release(self, device_id: str) -> None:
        with self._lock:
            grant = self._grants.pop(device_id, None)
            self._valid_until.pop(device_id, None)
        if grant is not None:
            try:
                release_lease(grant)
            except Exception:  # the database is gone: the lease simply expires
                log.warning("could not release the lease of device %s; it expires", device_id)

    def live(self, device_id: str) -> Callable[[], bool]:
        def live() -> bool:
            until = self._valid_until.get(device_id)
            return until is not None and self._monotonic() < until

        return live

    def held(self) -> list[str]:
        with self._lock:
            return sorted(self._grants)

    # -- renewals -------------------------------------------------------------------------------

    def renew_all(self) -> None:
        """One round of renewals (the thread runs one every third of the lease time)."""
        with self._lock:
            grants = list(self._grants.items())
        failed = False
        for device_id, grant in grants:
            began = self._monotonic()
            try:
                renewed = renew_lease(grant, ttl_s=self.ttl_s)
            except LeaseLost:
                holder = lease_holder(grant.name)
                why = (
                    "taken over" if holder is None else f"taken over by {holder.owner} (token {holder.token})"
                )
                with self._lock:
                    self._grants.pop(device_id, None)
                    self._valid_until.pop(device_id, None)
                    self.lost[device_id] = why
                log.error(
                    "device %s: this gateway's lease was %s; it books no more energy on it (restart it to "
                    "meter it again once the other gateway stops)",
                    device_id,
                    why,
                )
            except Exception:
                failed = True
                self.renewal_failures_total += 1
                if not self._failing:
                    log.exception(
                        "renewing the lease of device %s failed; retrying every %.1f s (its meter holds its "
                        "energy from %.0f s after the last renewal until one succeeds)",
                        device_id,
                        self.ttl_s / 3,
                        self.ttl_s,
                    )
                self._failing = True
                with contextlib.suppress(Exception):
                    connection.close()
            else:
                with self._lock:
                    if device_id in self._grants:
                        self._grants[device_id] = renewed
                        self._valid_until[device_id] = began + self.ttl_s
        if not failed and self._failing:
            log.warning("device lease renewals work again")
            self._failing = False

    def _run(self) -> None:
        try:
            while not self._stop.wait(self.ttl_s / 3):
                close_old_connections()
                try:
                    self.renew_all()
                except Exception:  # never let the renewals stop
                    self.renewal_failures_total += 1
                    log.exception("a round of device lease renewals failed")
                finally:
                    # Given back between rounds: with a bounded pool, a keeper sitting on a connection while it
                    # waits would hold one of the serving threads' slots.
                    with contextlib.suppress(Exception):
                        connection.close()
        finally:
            with contextlib.suppress(Exception):
                connection.close()

    def start(self) -> None:
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="device-lease-keeper", daemon=True)
            self._thread.start()

    def stop(self) -> None:
        """Stop renewing and release every lease still held."""
        self._stop.set()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(5)
        for device_id in self.held():
            self.release(device_id)

    def prometheus_lines(self) -> list[str]:
        with self._lock:
            held = sorted(self._grants)
            lost = sorted(self.lost)
        now = self._monotonic()
        name, failures = "carbonledger_device_lease_held", "carbonledger_device_lease_renewal_failures_total"
        lines = [
            f"# HELP {name} 1 while this gateway surely holds the lease of a device it meters (its meter books "
            "energy), 0 while a renewal is overdue or after another gateway took the device over",
            f"# TYPE {name} gauge",
        ]
        for device_id in held:
            live = self._valid_until.get(device_id, 0.0) > now
            lines.append(f'{name}{{device="{device_id}"}} {1 if live else 0}')
        lines += [f'{name}{{device="{device_id}"}} 0' for device_id in lost]
        lines += [
            f"# HELP {failures} renewals of device leases that failed (database unreachable); retried",
            f"# TYPE {failures} counter",
            f"{failures} {self.renewal_failures_total}",
        ]
        return lines


def claim_meters(
    leases: DeviceLeases,
    meters: list[tuple[Meter, str]],
    fallback: Callable[[], Meter],
    *,
    database_wait_s: float = 60.0,
) -> list[tuple[Meter, str]]:
    """``meters`` claimed by the policy of ``inference.meters.claims``, each fenced by its lease. A database
    that does not answer at start-up is waited for, a while: a device nobody is known to hold is not metered.

    Each claim is retried on its own (claiming again what this process holds only extends it): the policy
    closes every meter when a claim fails, so retrying the whole policy would start closed meters."""
    deadline = time.monotonic() + database_wait_s

    def claim(device_id: str) -> str | None:
        return call_until_database_answers(
            lambda: leases.claim(device_id), what=f"claim the device {device_id}", deadline=deadline
        )

    claimed = claim_devices(meters, claim, leases.release, fallback=fallback)
    for _meter, why in claimed:
        if why.startswith(FALLBACK):
            log.warning("%s", why)
    return [(FencedMeter(meter, leases.live(meter.device_id)), why) for meter, why in claimed]


class LeasedRecorder(LedgerRecorder):
    """The ledger recorder, its meters claimed when it starts: after the ledger chain's lease (a copy of a
    spool is refused as such first), off the event loop. Until then it holds the meters detected at build."""

    def __init__(
        self,
        spool: Spool,
        meters: list[tuple[Meter, str]],
        options: RecorderOptions,
        *,
        leases: DeviceLeases,
        fallback: Callable[[], Meter],
        **kwargs: Any,
    ) -> None:
        super().__init__(spool, meters, options, **kwargs)
        self.leases = leases
        self._detected = meters
        self._fallback = fallback

    def start(self) -> None:
        meters = claim_meters(self.leases, self._detected, self._fallback)
        self.devices = [
            DeviceAccount(meter, why, self.options.idle_power_w, self.options.idle_carry_s)
            for meter, why in meters
        ]
        self.leases.start()
        try:
            super().start()
        except BaseException:
            self.leases.stop()
            raise

    def stop(self) -> None:
        try:
            super().stop()
        finally:
            self.leases.stop()
