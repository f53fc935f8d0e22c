"""Chain ownership with fencing: one live process writes a ledger chain.

A chain belongs to a spool directory (its ``chain_id`` file). A spool folder copied into a second replica (an
image or a volume made from a running one) carries the same ``chain_id``: two writers on one chain would each
chain records from a head the other keeps moving and skip each other's checkpoint. So a chain is leased in the
database (``tenancy.leases``, lease name ``chain:<chain_id>``) by the process that serves or drains it:

- at start-up the gateway (and ``drain_ledger`` run on its own) claims the chain. A live lease held by another
  process refuses the start with one line naming the chain and the holder (:class:`ChainHeld`); a lease whose
  holder stopped renewing (killed, crashed) is waited for, at most one lease time, and then taken over;
- a keeper thread renews the lease every third of ``LEDGER_CHAIN_LEASE_TTL_S``;
- every commit of the drainer checks the lease inside its own transaction (:meth:`ChainOwnership.check`: owner
  and fencing token, row locked), so a process whose lease was taken over writes nothing: its drain stops with
  :class:`ChainLost`, counted and shown in /metrics.

A drainer process started by the gateway claims with the gateway's owner string (``drain_ledger --lease-owner``):
the two share one lease, one token, and the gateway releases it when it stops.
"""

from __future__ import annotations

import logging
import threading
import time
from datetime import datetime
from typing import Any

from django.conf import settings

from tenancy.leases import (
    LeaseGrant,
    LeaseHeld,
    LeaseKeeper,
    LeaseLost,
    check_lease,
    claim_lease,
    db_now,
    lease_holder,
    process_owner,
    release_lease,
    renew_lease,
)

log = logging.getLogger(__name__)

CHAIN_LEASE_PREFIX = "chain:"
# drain_ledger's exit status when its chain is another live process's (at start) or was taken from it: the
# gateway's watchdog does not restart a drainer that exits so (it would only be refused again).
EXIT_CHAIN_HELD = 75


def chain_lease_name(chain_id: str) -> str:
    return f"{CHAIN_LEASE_PREFIX}{chain_id}"


class ChainHeld(Exception):
    """Another live process holds the chain: this one must not start on it."""

    def __init__(self, chain_id: str, holder: str, expires_at: datetime) -> None:
        self.chain_id = chain_id
        self.holder = holder
        self.expires_at = expires_at
        super().__init__(
            f"ledger chain {chain_id} is held by {holder} (its lease runs until "
            f"{expires_at.isoformat(timespec='seconds')}): another live process serves this spool directory or a "
            "copy of it (same chain_id file); refusing to start. Give each replica its own spool directory "
            "(SPOOL_DIR), never a copy of another's"
        )


class ChainLost(Exception):
    """This process's lease on its chain was taken over: it must not write to the chain any more."""

    def __init__(self, chain_id: str, detail: str) -> None:
        self.chain_id = chain_id
        self.detail = detail
        super().__init__(
            f"ledger chain {chain_id}: this process no longer holds the chain's lease ({detail}); "
            "it stops writing to it"
        )


class ChainOwnership:
    """This process's claim on one chain: the lease grant, its keeper, and whether it was lost."""

    def __init__(self, chain_id: str, *, owner: str | None = None, ttl_s: float | None = None) -> None:
        self.chain_id = chain_id
        self.name = chain_lease_name(chain_id)
        self.owner = owner or process_owner()
        self.ttl_s = float(ttl_s if ttl_s is not None else settings.LEDGER_CHAIN_LEASE_TTL_S)
        self.grant: LeaseGrant | None = None
        self.keeper: LeaseKeeper | None = None
        self.lost_reason = ""
        self.fenced_commits_total = 0  # commits refused by the fencing check, the chain then being lost
        self._lock = threading.Lock()

    # -- claiming -------------------------------------------------------------------------------------
    def claim(self, *, wait_s: float | None = None) -> LeaseGrant:
        """Claim the chain. A holder whose lease runs out within ``wait_s`` (default: one lease time) is taken
        to have stopped without releasing it, and waited for; a holder that renews it meanwhile is alive, and
        :class:`ChainHeld` is raised."""
        deadline = time.monotonic() + (self.ttl_s if wait_s is None else wait_s)
        logged = False
        while True:
            try:
                grant = claim_lease(self.name, owner=self.owner, ttl_s=self.ttl_s)
            except LeaseHeld as held:
                left_s = (held.expires_at - db_now()).total_seconds()
                if time.monotonic() + left_s > deadline:
                    raise ChainHeld(self.chain_id, held.owner, held.expires_at) from None
                if not logged:
                    log.warning(
                        "ledger chain %s is held by %s until %s; waiting for that lease to expire (a process "
                        "that stopped without releasing it)",
                        self.chain_id,
                        held.owner,
                        held.expires_at.isoformat(timespec="seconds"),
                    )
                    logged = True
                # Polled, not slept through: a holder that releases the lease (a drainer finishing after its
                # gateway was killed) hands it over at once.
                time.sleep(min(0.5, max(0.05, left_s + 0.05), max(0.05, deadline - time.monotonic())))
                continue
            with self._lock:
                self.grant, self.lost_reason = grant, ""
            log.info(
                "ledger chain %s leased by %s (fencing token %d)", self.chain_id, self.owner, grant.token
            )
            return grant

    def start_keeper(self) -> None:
        """Renew the lease every third of its time on a thread of its own, until :meth:`release`."""
        if self.grant is None:
            raise RuntimeError(f"ledger chain {self.chain_id} is not claimed")
        if self.keeper is None:
            self.keeper = LeaseKeeper(
                [self.grant], ttl_s=self.ttl_s, on_lost=self._keeper_lost, thread_name="chain-lease-keeper"
            ).start()

    def _keeper_lost(self, name: str) -> None:
        holder = lease_holder(name)
        self.mark_lost(
            "its renewal was refused"
            if holder is None
            else f"now held by {holder.owner} (token {holder.token}); its renewal was refused"
        )

    def release(self) -> None:
        """Stop renewing and give the chain up (a clean stop: the next process claims it at once)."""
        keeper, self.keeper = self.keeper, None
        if keeper is not None:
            keeper.stop(release=not self.lost)
        elif self.grant is not None and not self.lost:
            try:
                release_lease(self.grant)
            except Exception:  # the database is gone: the lease simply expires
                log.warning("could not release the lease of ledger chain %s; it expires", self.chain_id)

    def stop_keeper(self) -> None:
        """Stop renewing without releasing (the lease is shared with a process that keeps it)."""
        keeper, self.keeper = self.keeper, None
        if keeper is not None:
            keeper.stop(release=False)

    # -- fencing --------------------------------------------------------------------------------------
    def check(self) -> None:
        """The fencing check, inside the caller's transaction; raises :class:`ChainLost` when the chain is not
        (or no longer) ours. A lease that lapsed without anyone taking it (a pause, a database outage longer
        than the lease) is renewed and the check passes: nobody else can have written meanwhile."""
        grant = self.grant
        if grant is None:
            raise ChainLost(self.chain_id, "never claimed")
        if self.lost:
            raise ChainLost(self.chain_id, self.lost_reason)
        try:
            check_lease(grant)
        except LeaseLost as lost:
            try:
                renew_lease(grant, ttl_s=self.ttl_s)
                check_lease(grant)
            except LeaseLost as again:
                detail = str(again).removeprefix(f"lease {self.name} lost: ")
                self.fenced_commits_total += 1
                self.mark_lost(detail)
                raise ChainLost(self.chain_id, detail) from lost
            log.warning(
                "the lease of ledger chain %s had lapsed; renewed (nobody took it meanwhile)", self.chain_id
            )

    def mark_lost(self, reason: str) -> None:
        with self._lock:
            if not self.lost_reason:
                self.lost_reason = reason or "lost"
                log.error(
                    "ledger chain %s: %s lost its lease (%s)", self.chain_id, self.owner, self.lost_reason
                )

    @property
    def lost(self) -> bool:
        return bool(self.lost_reason)

    @property
    def held(self) -> bool:
        """Claimed and not lost (as far as this process knows: the next check or renewal may say otherwise)."""
        return self.grant is not None and not self.lost

    def snapshot(self) -> dict[str, Any]:
        """For /metrics and readiness: whether this process holds its chain, and what the keeper saw."""
        grant = self.grant
        keeper = self.keeper.snapshot() if self.keeper is not None else None
        return {
            "chain_id": self.chain_id,
            "owner": self.owner,
            "token": None if grant is None else grant.token,
            "held": self.held,
            "lost": self.lost,
            "lost_reason": self.lost_reason,
            "fenced_commits_total": self.fenced_commits_total,
            "keeper": keeper,
        }

    def prometheus_lines(self) -> list[str]:
        held, fenced = (
            "carbonledger_ledger_chain_lease_held",
            "carbonledger_ledger_chain_fenced_commits_total",
        )
        label = f'{{chain="{self.chain_id}"}}'
        lines = [
            f"# HELP {held} 1 while this process holds the database lease of its ledger chain; 0 once another "
            "process took it (this one then writes nothing to the chain)",
            f"# TYPE {held} gauge",
            f"{held}{label} {1 if self.held else 0}",
            f"# HELP {fenced} drainer commits refused because the chain's lease was no longer this process's",
            f"# TYPE {fenced} counter",
            f"{fenced}{label} {self.fenced_commits_total}",
        ]
        if self.keeper is not None:
            failures = "carbonledger_ledger_chain_lease_renewal_failures_total"
            lines += [
                f"# HELP {failures} renewals of the chain's lease that failed (database unreachable); retried",
                f"# TYPE {failures} counter",
                f"{failures}{label} {self.keeper.renewal_failures_total}",
            ]
        return lines


__all__ = [
    "CHAIN_LEASE_PREFIX",
    "EXIT_CHAIN_HELD",
    "ChainHeld",
    "ChainLost",
    "ChainOwnership",
    "chain_lease_name",
]
