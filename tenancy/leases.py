"""Database leases: a named claim held by one live process, kept alive by heartbeats, with a fencing token.

A lease row (``tenancy.Lease``) names what is claimed (``chain:<chain_id>``, ``device:<identity>``), the owner
(one string per process start, :func:`process_owner`), when it expires and a fencing ``token`` that goes up by
one every time the lease changes owner. The rules:

- :func:`claim_lease` takes a lease that is free or expired (the token goes up), re-claims one we already hold
  (the token stays, even when it lapsed: as long as the owner is still ours nobody else held it meanwhile) and
  raises :class:`LeaseHeld` naming the holder when another owner's lease is live. Owner strings are unique per
  process start (:func:`process_owner`), so a restarted process is a new owner.
- :func:`renew_lease` pushes the expiry forward while owner and token still match. It also renews a lease that
  expired without anyone taking it over: nobody else can have written meanwhile, since that needs a claim,
  which bumps the token. A lease taken over (owner or token changed) raises :class:`LeaseLost`.
- :func:`check_lease` is the fencing check, run inside the writer's own transaction: it locks the lease row
  (``SELECT ... FOR UPDATE`` on PostgreSQL; SQLite serializes writers anyway) and raises :class:`LeaseLost`
  unless owner and token match and the lease has not expired, so a takeover cannot slip between the check and
  the commit.
- :func:`release_lease` expires the lease now (the row stays, so the next claim still bumps the token).

Every time is the database's clock (PostgreSQL's ``clock_timestamp()``; on SQLite, one host, the process clock),
so replicas on hosts with drifting clocks still agree on who holds what.
"""

from __future__ import annotations

import contextlib
import logging
import os
import secrets
import socket
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, replace
from datetime import UTC, datetime, timedelta
from typing import Any

from django.db import IntegrityError, close_old_connections, connection, transaction
from django.db.models import F
from django.db.models.functions import Now
from django.utils import timezone

from tenancy.models import Lease

logger = logging.getLogger(__name__)

NAME_MAX = 200
OWNER_MAX = 200


@dataclass(frozen=True)
class LeaseGrant:
    name: str
    owner: str
    token: int
    expires_at: datetime


class LeaseHeld(Exception):
    """A live lease is held by another owner."""

    def __init__(self, name: str, owner: str, expires_at: datetime) -> None:
        self.name = name
        self.owner = owner
        self.expires_at = expires_at
        super().__init__(f"lease {name} is held by {owner} until {expires_at.isoformat()}")


class LeaseLost(Exception):
    """Our lease was taken over (or, for :func:`check_lease`, has expired)."""

    def __init__(self, name: str, detail: str = "expired or taken over by another owner") -> None:
        self.name = name
        super().__init__(f"lease {name} lost: {detail}")


_owner_lock = threading.Lock()
_owner: tuple[int, str] | None = None


def process_owner() -> str:
    """``<hostname>:<pid>:<random hex>``, one per process start (a forked child gets its own)."""
    global _owner
    pid = os.getpid()
    with _owner_lock:
        if _owner is None or _owner[0] != pid:
            host = socket.gethostname()[:120] or "host"
            _owner = (pid, f"{host}:{pid}:{secrets.token_hex(6)}")
        return _owner[1]


def _check_ttl(ttl_s: float) -> timedelta:
    if not ttl_s > 0:
        raise ValueError(f"a lease ttl must be positive, got {ttl_s!r}")
    return timedelta(seconds=ttl_s)


def _check_name_owner(name: str, owner: str) -> None:
    if not name or len(name) > NAME_MAX:
        raise ValueError(f"a lease name must be 1 to {NAME_MAX} characters, got {len(name)}")
    if not owner or len(owner) > OWNER_MAX:
        raise ValueError(f"a lease owner must be 1 to {OWNER_MAX} characters, got {len(owner)}")


def db_now() -> datetime:
    """The database's clock (aware, UTC)."""
    if connection.vendor == "postgresql":
        with connection.cursor() as cursor:
            cursor.execute("SELECT clock_timestamp()")
            value: datetime = cursor.fetchone()[0]
        return value.astimezone(UTC) if value.tzinfo else value.replace(tzinfo=UTC)
    return timezone.now()


def _now_expr() -> Any:
    """The database's clock inside a query (one round trip less than :func:`db_now` on PostgreSQL)."""
    return Now() if connection.vendor == "postgresql" else timezone.now()


def _grant(row: Lease) -> LeaseGrant:
    return LeaseGrant(name=row.name, owner=row.owner, token=row.token, expires_at=row.expires_at)


def claim_lease(name: str, *, owner: str, ttl_s: float) -> LeaseGrant:
    """Claim ``name`` for ``owner`` for ``ttl_s`` seconds. Raises :class:`LeaseHeld` when another owner's
    lease is live. Each step is one conditional UPDATE or INSERT, so two claimants racing cannot both win."""
    _check_name_owner(name, owner)
    ttl = _check_ttl(ttl_s)
    for _ in range(3):
        with transaction.atomic():
            now = db_now()
            expires_at = now + ttl
            # Ours (live, or lapsed with nobody taking it since): extend it, same token.
            if Lease.objects.filter(name=name, owner=owner).update(expires_at=expires_at, heartbeat_at=now):
                return _grant(Lease.objects.get(name=name))
            # Free (expired or released): take it over, the token goes up.
            if Lease.objects.filter(name=name, expires_at__lte=now).update(
                owner=owner, token=F("token") + 1, claimed_at=now, heartbeat_at=now, expires_at=expires_at
            ):
                grant = _grant(Lease.objects.get(name=name))
                logger.info("lease %s claimed by %s (token %d)", name, owner, grant.token)
                return grant
            row = Lease.objects.filter(name=name).first()
            if row is None:
                try:
                    with transaction.atomic():
                        row = Lease.objects.create(
                            name=name,
                            owner=owner,
                            token=1,
                            claimed_at=now,
                            heartbeat_at=now,
                            expires_at=expires_at,
                        )
                except IntegrityError:
                    continue  # another claimant inserted it first: look again
                logger.info("lease %s claimed by %s (token 1)", name, owner)
                return _grant(row)
            if row.owner != owner and row.expires_at > now:
                raise LeaseHeld(name, row.owner, row.expires_at)
        # The row changed between our statements (expired or released just now): look again.
    row = Lease.objects.get(name=name)
    raise LeaseHeld(name, row.owner, row.expires_at)


def renew_lease(grant: LeaseGrant, *, ttl_s: float) -> LeaseGrant:
    """Extend ``grant``. Raises :class:`LeaseLost` when owner or token changed (someone took it over)."""
    ttl = _check_ttl(ttl_s)
    now = db_now()
    expires_at = now + ttl
    updated = Lease.objects.filter(name=grant.name, owner=grant.owner, token=grant.token).update(
        expires_at=expires_at, heartbeat_at=now
    )
    if not updated:
        raise LeaseLost(grant.name, _holder_detail(grant.name))
    return replace(grant, expires_at=expires_at)


def release_lease(grant: LeaseGrant) -> None:
    """Give the lease up now (no-op when it was already taken over). The row stays, so the next claimant's
    token is still higher than ours."""
    Lease.objects.filter(name=grant.name, owner=grant.owner, token=grant.token).update(expires_at=_now_expr())


def check_lease(grant: LeaseGrant) -> None:
    """The fencing check, inside the caller's transaction: lock the lease row and raise :class:`LeaseLost`
    unless it is still ours (owner and token) and live."""
    if not connection.in_atomic_block:
        raise RuntimeError("check_lease must run inside the writer's transaction (transaction.atomic)")
    # Plain SQL: the ledger writer runs this once a chunk, on the thread that feeds the database.
    table = Lease._meta.db_table
    if connection.vendor == "postgresql":
        now_sql, params = "clock_timestamp()", [grant.name, grant.owner, grant.token]
    else:
        now_sql = "%s"
        params = [
            grant.name,
            grant.owner,
            grant.token,
            connection.ops.adapt_datetimefield_value(timezone.now()),
        ]
    lock = " FOR UPDATE" if connection.features.has_select_for_update else ""
    with connection.cursor() as cursor:
        cursor.execute(
            f"SELECT 1 FROM {table} WHERE name = %s AND owner = %s AND token = %s AND expires_at > {now_sql}{lock}",
            params,
        )
        held = cursor.fetchone() is not None
    if not held:
        raise LeaseLost(grant.name, _holder_detail(grant.name, grant))


def lease_holder(name: str) -> LeaseGrant | None:
    """The current row for ``name`` (live or not), or None."""
    row = Lease.objects.filter(name=name).first()
    return None if row is None else _grant(row)


def _holder_detail(name: str, grant: LeaseGrant | None = None) -> str:
    row = Lease.objects.filter(name=name).first()
    if row is None:
        return "no such lease"
    if grant is not None and row.owner == grant.owner and row.token == grant.token:
        return f"expired at {row.expires_at.isoformat()}"
    return f"now held by {row.owner} (token {row.token})"


class LeaseKeeper:
    """A daemon thread that renews a set of grants every ``ttl_s / 3`` seconds.

    A failed renewal (database unreachable) is logged once per outage, counted, and tried again next round; the
    lease is only given up when :func:`renew_lease` says it was taken over, then its name goes into ``lost``
    and ``on_lost`` is called. ``stop()`` releases what is still held."""

    def __init__(
        self,
        grants: Iterable[LeaseGrant] = (),
        *,
        ttl_s: float,
        on_lost: Callable[[str], None] | None = None,
        thread_name: str = "lease-keeper",
    ) -> None:
        _check_ttl(ttl_s)
        self.ttl_s = ttl_s
        self.interval_s = ttl_s / 3
        self.on_lost = on_lost
        self.lost: set[str] = set()
        self.renewals_total = 0
        self.renewal_failures_total = 0
        self.lost_total = 0
        self.last_renewal_at: float | None = None  # time.monotonic() of the last full successful round
        self._grants: dict[str, LeaseGrant] = {g.name: g for g in grants}
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._failing = False
        self._thread = threading.Thread(target=self._run, name=thread_name, daemon=True)

    # -- what callers use ---------------------------------------------------------------------------------
    def start(self) -> LeaseKeeper:
        self._thread.start()
        return self

    def add(self, grant: LeaseGrant) -> None:
        with self._lock:
            self._grants[grant.name] = grant
            self.lost.discard(grant.name)

    def grant(self, name: str) -> LeaseGrant | None:
        with self._lock:
            return self._grants.get(name)

    def held(self) -> dict[str, LeaseGrant]:
        with self._lock:
            return dict(self._grants)

    @property
    def alive(self) -> bool:
        return self._thread.is_alive()

    def snapshot(self) -> dict[str, Any]:
        """Counters for /metrics and readiness."""
        with self._lock:
            held = sorted(self._grants)
            lost = sorted(self.lost)
        return {
            "alive": self.alive,
            "held": held,
            "lost": lost,
            "renewals_total": self.renewals_total,
            "renewal_failures_total": self.renewal_failures_total,
            "lost_total": self.lost_total,
            "seconds_since_renewal": (
                None if self.last_renewal_at is None else time.monotonic() - self.last_renewal_at
            ),
        }

    def stop(self, *, release: bool = True, timeout_s: float = 5.0) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout_s)
        if release:
            for grant in self.held().values():
                try:
                    release_lease(grant)
                except Exception:  # the database is gone: the lease simply expires
                    logger.warning("could not release lease %s; it will expire", grant.name, exc_info=True)
            with self._lock:
                self._grants.clear()

    # -- the thread ---------------------------------------------------------------------------------------
    def renew_all(self) -> None:
        """One round (the thread calls it every interval; tests may call it directly)."""
        failed = False
        for grant in self.held().values():
            try:
                renewed = renew_lease(grant, ttl_s=self.ttl_s)
            except LeaseLost as exc:
                with self._lock:
                    self._grants.pop(grant.name, None)
                    self.lost.add(grant.name)
                self.lost_total += 1
                logger.error("%s; this process stops using it", exc)
                if self.on_lost is not None:
                    try:
                        self.on_lost(grant.name)
                    except Exception:
                        logger.exception("on_lost callback for lease %s failed", grant.name)
            except Exception:
                failed = True
                self.renewal_failures_total += 1
                if not self._failing:
                    logger.exception(
                        "renewing lease %s failed; retrying every %.1f s", grant.name, self.interval_s
                    )
                self._failing = True
                # Start the next round on a fresh connection.
                with contextlib.suppress(Exception):
                    connection.close()
            else:
                with self._lock:
                    if grant.name in self._grants:
                        self._grants[grant.name] = renewed
                self.renewals_total += 1
        if not failed:
            if self._failing:
                logger.warning("lease renewals work again")
            self._failing = False
            self.last_renewal_at = time.monotonic()

    def _run(self) -> None:
        try:
            while not self._stop.wait(self.interval_s):
                close_old_connections()
                try:
                    self.renew_all()
                except Exception:  # never let the keeper die
                    self.renewal_failures_total += 1
                    logger.exception("lease keeper round failed")
                finally:
                    # Given back between rounds: with a bounded pool, a keeper sitting on a connection while it
                    # waits would hold one of the serving threads' slots.
                    with contextlib.suppress(Exception):
                        connection.close()
        finally:
            with contextlib.suppress(Exception):
                connection.close()
