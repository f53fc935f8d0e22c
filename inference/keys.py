"""API keys: who a bearer token speaks for, and the in-memory cache in front of the key store.

The key store (the project's database, reached through ``PrincipalResolver``) is far too slow to ask per
request, so answers are kept for a few seconds. Locking: a ``KeyCache`` is used on the event loop's thread
only (the gateway's requests run there), so its dictionary needs no lock; the resolver may run its lookup
on another thread, but its answer is stored back on the loop.
"""

from __future__ import annotations

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

    __slots__ = ("_entries", "_resolve", "_ttl_s")

    def __init__(self, resolve: PrincipalResolver, ttl_s: float) -> None:
        self._resolve = resolve
        self._ttl_s = ttl_s
        # token -> (principal, monotonic expiry)
        self._entries: dict[str, tuple[Principal, float]] = {}

    def lookup(self, token: str) -> Principal | KeyLookup:
        """The cached principal while its entry is fresh; otherwise what ``resolve`` needs to ask the store."""
        hit = self._entries.get(token)
        if hit is not None and hit[1] > time.monotonic():
            return hit[0]
        return KeyLookup(token, hit)

    async def resolve(self, lookup: KeyLookup) -> Principal | None:
        """Asks the key store and caches its answer; None for an unknown or revoked key (forgotten at once).

        Raises KeyStoreUnavailable when the store is unreachable and the key has no earlier answer.
        """
        token = lookup.token
        try:
            resolved = await self._resolve(token)
        except Exception as exc:
            # The key store (the database) is unreachable. A key that was valid moments ago
            # stays valid through the outage, so serving goes on while the spool has room;
            # an unknown key cannot be checked and is refused as unavailable, not as invalid.
            if lookup.stale is not None:
                log.warning("API key lookup failed (%s); using the last known answer for this key", exc)
                return lookup.stale[0]
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
