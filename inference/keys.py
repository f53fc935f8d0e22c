"""API keys: who a bearer token speaks for, and the in-memory cache in front of the key store.

The key store (the project's database, reached through ``PrincipalResolver``) is far too slow to ask per
request, so answers are kept for a few seconds. Locking: a ``KeyCache`` is used on the event loop's thread
only (the gateway's requests run there), so its dictionaries need no lock; the resolver may run its lookup
on another thread, but its answer is stored back on the loop.

Two things keep a busy key from ever waiting on the store. A lookup in the last part of an entry's life starts
one refresh in the background and still answers from the entry, so a key in steady use is renewed before it
expires (an entry is never served past its expiry, so a revocation still takes effect within the time-to-live).
And lookups of a token the cache cannot answer share one store query: when an entry did run out under load,
every request in flight would otherwise have asked the store at once, each from a thread of the pool.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable
from dataclasses import dataclass
from typing import Protocol

from inference.errors import KeyStoreUnavailable

log = logging.getLogger(__name__)

# The cache is emptied rather than grown past this: a client cycling through bogus or short-lived keys must
# not make it grow without bound, and the live keys come back on their next request.
MAX_CACHED_KEYS = 10_000
# An entry is refreshed ahead of its expiry during the last fifth of its life, but never earlier than one
# second before it: enough for a store query under load, few extra queries.
REFRESH_AHEAD_FRACTION = 0.2
REFRESH_AHEAD_MAX_S = 1.0


@dataclass(frozen=True, slots=True)
class Principal:
    """Who an API key speaks for: the organization every request is recorded under."""

    organization_id: int
    organization_slug: str
    key_id: int
    scopes: frozenset[str]


class PrincipalResolver(Protocol):
    """The key store: the Principal a raw bearer token belongs to, or None for an unknown or revoked key.

    Raises when the store cannot be reached (the cache then falls back to its last answer). The Django
    side implements it (``carbonledger.gateway_app.resolve_principal``); it must not block the event loop.
    """

    def __call__(self, token: str, /) -> Awaitable[Principal | None]: ...


class KeyLookup:
    """A token the cache cannot answer: the key store must (``stale`` is the expired entry, if any)."""

    __slots__ = ("stale", "token")

    def __init__(self, token: str, stale: tuple[Principal, float] | None) -> None:
        self.token = token
        self.stale = stale


class KeyCache:
    """Key store answers, each kept ``ttl_s`` seconds; an expired one still serves while the store is down."""

    __slots__ = ("_entries", "_inflight", "_refresh_ahead_s", "_resolve", "_ttl_s", "errors")

    def __init__(self, resolve: PrincipalResolver, ttl_s: float) -> None:
        self._resolve = resolve
        self._ttl_s = ttl_s
        self._refresh_ahead_s = min(REFRESH_AHEAD_MAX_S, ttl_s * REFRESH_AHEAD_FRACTION)
        # token -> (principal, monotonic expiry)
        self._entries: dict[str, tuple[Principal, float]] = {}
        # token -> the store query under way for it, which every lookup of the token meanwhile awaits.
        self._inflight: dict[str, asyncio.Future[Principal | None]] = {}
        # Failed key store lookups by what was done instead (/metrics): "stale_answer" or "refused".
        self.errors: dict[str, int] = {"stale_answer": 0, "refused": 0}

    def lookup(self, token: str) -> Principal | KeyLookup:
        """The cached principal while its entry is fresh; otherwise what ``resolve`` needs to ask the store."""
        hit = self._entries.get(token)
        if hit is not None:
            remaining = hit[1] - time.monotonic()
            if remaining > 0:
                if remaining < self._refresh_ahead_s and token not in self._inflight:
                    self._refresh_ahead(token, hit)
                return hit[0]
        return KeyLookup(token, hit)

    def _refresh_ahead(self, token: str, hit: tuple[Principal, float]) -> None:
        try:
            asyncio.get_running_loop()
        except RuntimeError:  # not on the event loop (a management command, a test): the entry serves on
            return
        self._query(KeyLookup(token, hit)).add_done_callback(_consume_outcome)

    async def resolve(self, lookup: KeyLookup) -> Principal | None:
        """Asks the key store and caches its answer; None for an unknown or revoked key (forgotten at once).

        Raises KeyStoreUnavailable when the store is unreachable and the key has no earlier answer. Concurrent
        calls for one token share one store query.
        """
        return await asyncio.shield(self._query(lookup))

    def _query(self, lookup: KeyLookup) -> asyncio.Future[Principal | None]:
        token = lookup.token
        pending = self._inflight.get(token)
        if pending is None:
            pending = asyncio.ensure_future(self._fetch(lookup))
            self._inflight[token] = pending
            pending.add_done_callback(lambda _done: self._inflight.pop(token, None))
        return pending

    async def _fetch(self, lookup: KeyLookup) -> Principal | None:
        token = lookup.token
        try:
            resolved = await self._resolve(token)
        except Exception as exc:
            # The key store (the database) is unreachable. A key that was valid moments ago
            # stays valid through the outage, so serving goes on while the spool has room;
            # an unknown key cannot be checked and is refused as unavailable, not as invalid.
            if lookup.stale is not None:
                self.errors["stale_answer"] += 1
                log.warning("API key lookup failed (%s); using the last known answer for this key", exc)
                return lookup.stale[0]
            self.errors["refused"] += 1
            raise KeyStoreUnavailable(
                "cannot check the API key right now: the key store is unreachable; retry shortly"
            ) from exc
        if resolved is None:
            self._entries.pop(token, None)
            return None
        if len(self._entries) > MAX_CACHED_KEYS:
            self._entries.clear()
        self._entries[token] = (resolved, time.monotonic() + self._ttl_s)
        return resolved


def _consume_outcome(done: asyncio.Future[Principal | None]) -> None:
    """A refresh nobody awaits: its failure was counted and logged by ``_fetch``; retrieving it here keeps
    asyncio from reporting it again as never retrieved."""
    if not done.cancelled():
        done.exception()
