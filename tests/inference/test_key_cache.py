"""KeyCache in inference/keys.py: one key store lookup per token at a time, and a busy key refreshed before it
expires, so that traffic on one key never sends a burst of lookups to the store when its entry runs out."""

from __future__ import annotations

import asyncio

import pytest

from inference.keys import KeyCache, KeyLookup, Principal

ALICE = Principal(organization_id=1, organization_slug="acme", key_id=7, scopes=frozenset({"infer"}))


class Store:
    """A key store that answers after ``delay_s`` and counts its lookups."""

    def __init__(self, answer: Principal | None = ALICE, delay_s: float = 0.05) -> None:
        self.answer = answer
        self.delay_s = delay_s
        self.calls = 0
        self.fail = False

    async def __call__(self, token: str) -> Principal | None:
        self.calls += 1
        await asyncio.sleep(self.delay_s)
        if self.fail:
            raise ConnectionError("the key store is down")
        return self.answer


async def test_concurrent_lookups_of_one_token_ask_the_store_once() -> None:
    store = Store()
    cache = KeyCache(store, ttl_s=5.0)
    lookups = [cache.lookup("tok") for _ in range(32)]
    assert all(isinstance(found, KeyLookup) for found in lookups)
    answers = await asyncio.gather(
        *(cache.resolve(found) for found in lookups if isinstance(found, KeyLookup))
    )
    assert answers == [ALICE] * 32
    assert store.calls == 1
    assert cache.lookup("tok") == ALICE


async def test_a_key_in_use_is_refreshed_before_it_expires_so_it_never_misses() -> None:
    store = Store(delay_s=0.01)
    cache = KeyCache(store, ttl_s=0.5)
    first = cache.lookup("tok")
    assert isinstance(first, KeyLookup)
    await cache.resolve(first)
    # Steady traffic for three lifetimes of the entry: every lookup answers from the cache, and the store is
    # asked about once per lifetime, never once per request.
    loop = asyncio.get_running_loop()
    end = loop.time() + 1.5
    misses = 0
    served = 0
    while loop.time() < end:
        for _ in range(20):
            misses += isinstance(cache.lookup("tok"), KeyLookup)
            served += 1
        await asyncio.sleep(0.005)
    assert misses == 0, f"{misses} of {served} lookups had to wait for the store"
    assert 2 <= store.calls <= 6


async def test_a_key_revoked_meanwhile_is_refused_once_the_refresh_says_so() -> None:
    store = Store(delay_s=0.01)
    cache = KeyCache(store, ttl_s=0.3)
    await cache.resolve(KeyLookup("tok", None))
    store.answer = None  # revoked in the store
    loop = asyncio.get_running_loop()
    end = loop.time() + 0.6
    found: Principal | KeyLookup = ALICE
    while loop.time() < end:
        found = cache.lookup("tok")
        if isinstance(found, KeyLookup):
            break
        await asyncio.sleep(0.01)
    assert isinstance(found, KeyLookup)
    assert await cache.resolve(found) is None


async def test_a_refresh_that_fails_keeps_the_entry_until_it_expires_and_counts_the_error() -> None:
    store = Store(delay_s=0.01)
    cache = KeyCache(store, ttl_s=0.3)
    await cache.resolve(KeyLookup("tok", None))
    store.fail = True
    loop = asyncio.get_running_loop()
    end = loop.time() + 0.25
    while loop.time() < end:
        assert cache.lookup("tok") == ALICE
        await asyncio.sleep(0.01)
    await asyncio.sleep(0.1)
    expired = cache.lookup("tok")
    assert isinstance(expired, KeyLookup) and expired.stale is not None
    assert await cache.resolve(expired) == ALICE  # the store is down: the last answer serves
    assert cache.errors["stale_answer"] >= 1


@pytest.mark.parametrize("ttl_s", [0.0])
async def test_with_no_cache_every_lookup_asks_the_store(ttl_s: float) -> None:
    store = Store(delay_s=0.0)
    cache = KeyCache(store, ttl_s=ttl_s)
    for _ in range(3):
        found = cache.lookup("tok")
        assert isinstance(found, KeyLookup)
        assert await cache.resolve(found) == ALICE
    assert store.calls == 3


def test_a_lookup_outside_the_event_loop_answers_from_the_cache_without_refreshing() -> None:
    store = Store(delay_s=0.0)
    cache = KeyCache(store, ttl_s=5.0)
    asyncio.run(cache.resolve(KeyLookup("tok", None)))
    assert cache.lookup("tok") == ALICE
