"""Database leases (tenancy.leases): claim, renew, release, take-over after expiry with a fencing token, the
fencing check inside a writer's transaction, and the keeper thread. On SQLite, and on PostgreSQL when
DATABASE_URL points there."""

from __future__ import annotations

import threading
import time
from datetime import timedelta

import pytest
from django.conf import settings
from django.db import OperationalError, connection, transaction

import tenancy.leases
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
from tenancy.models import Lease

pytestmark = pytest.mark.django_db

# SQLite serializes writers (IMMEDIATE transactions on a file); pytest-django's in-memory SQLite database answers a
# second connection's write with "table is locked" instead of waiting, so races run on PostgreSQL only.
RACES_NEED_POSTGRES = pytest.mark.skipif(
    "postgresql" not in settings.DATABASES["default"]["ENGINE"],
    reason="racing claimants on their own connections: PostgreSQL only (DATABASE_URL)",
)


def _expire(name: str) -> None:
    """Move the lease's expiry into the past, as if its holder had stopped renewing a while ago."""
    Lease.objects.filter(name=name).update(expires_at=db_now() - timedelta(seconds=1))


def test_a_first_claim_creates_the_lease_with_token_one_for_its_owner() -> None:
    before = db_now()
    grant = claim_lease("chain:a", owner="host:1:aa", ttl_s=30)

    assert (grant.name, grant.owner, grant.token) == ("chain:a", "host:1:aa", 1)
    assert before + timedelta(seconds=29) < grant.expires_at <= db_now() + timedelta(seconds=30)
    row = Lease.objects.get(name="chain:a")
    assert (row.owner, row.token, row.expires_at) == ("host:1:aa", 1, grant.expires_at)
    assert row.claimed_at == row.heartbeat_at


def test_reclaiming_our_own_live_lease_extends_it_and_keeps_the_token() -> None:
    first = claim_lease("chain:a", owner="host:1:aa", ttl_s=5)
    again = claim_lease("chain:a", owner="host:1:aa", ttl_s=60)

    assert again.token == first.token == 1
    assert again.expires_at > first.expires_at + timedelta(seconds=50)


def test_reclaiming_our_own_lease_that_lapsed_with_nobody_taking_it_keeps_the_token() -> None:
    # A drainer process claiming as its gateway's owner after a pause longer than the lease: still one writer.
    first = claim_lease("chain:a", owner="host:1:aa", ttl_s=30)
    _expire("chain:a")

    again = claim_lease("chain:a", owner="host:1:aa", ttl_s=30)

    assert again.token == first.token and again.expires_at > db_now()
    with transaction.atomic():
        check_lease(first)


def test_a_second_claimant_of_a_live_lease_gets_lease_held_naming_the_holder() -> None:
    held = claim_lease("chain:a", owner="host:1:aa", ttl_s=30)

    with pytest.raises(LeaseHeld) as caught:
        claim_lease("chain:a", owner="host:2:bb", ttl_s=30)

    assert (caught.value.name, caught.value.owner, caught.value.expires_at) == (
        "chain:a",
        "host:1:aa",
        held.expires_at,
    )
    assert "chain:a" in str(caught.value) and "host:1:aa" in str(caught.value)
    assert Lease.objects.get(name="chain:a").owner == "host:1:aa"  # nothing changed


def test_renewing_moves_the_expiry_forward_and_keeps_the_token() -> None:
    grant = claim_lease("chain:a", owner="host:1:aa", ttl_s=2)
    renewed = renew_lease(grant, ttl_s=60)

    assert renewed.token == grant.token and renewed.owner == grant.owner
    assert renewed.expires_at > grant.expires_at + timedelta(seconds=50)
    assert Lease.objects.get(name="chain:a").expires_at == renewed.expires_at


def test_an_expired_lease_is_taken_over_and_the_token_goes_up() -> None:
    old = claim_lease("chain:a", owner="host:1:aa", ttl_s=30)
    _expire("chain:a")

    new = claim_lease("chain:a", owner="host:2:bb", ttl_s=30)

    assert (new.owner, new.token) == ("host:2:bb", old.token + 1)
    row = Lease.objects.get(name="chain:a")
    assert (row.owner, row.token) == ("host:2:bb", 2)
    assert row.claimed_at >= old.expires_at - timedelta(seconds=30)


def test_the_previous_holder_cannot_renew_or_pass_the_fencing_check_after_a_take_over() -> None:
    old = claim_lease("chain:a", owner="host:1:aa", ttl_s=30)
    _expire("chain:a")
    claim_lease("chain:a", owner="host:2:bb", ttl_s=30)

    with pytest.raises(LeaseLost) as lost:
        renew_lease(old, ttl_s=30)
    assert lost.value.name == "chain:a" and "host:2:bb" in str(lost.value)
    with pytest.raises(LeaseLost), transaction.atomic():
        check_lease(old)
    assert Lease.objects.get(name="chain:a").owner == "host:2:bb"


def test_a_lease_that_expired_without_a_take_over_is_still_ours_to_renew() -> None:
    # Nobody else can have written meanwhile: that needs a claim, which changes the owner and the token.
    grant = claim_lease("chain:a", owner="host:1:aa", ttl_s=30)
    _expire("chain:a")

    with pytest.raises(LeaseLost), transaction.atomic():
        check_lease(grant)  # the fencing check itself wants a live lease
    renewed = renew_lease(grant, ttl_s=30)

    assert renewed.token == grant.token
    with transaction.atomic():
        check_lease(renewed)


def test_released_lease_is_claimed_at_once_by_the_next_owner_with_a_higher_token() -> None:
    old = claim_lease("chain:a", owner="host:1:aa", ttl_s=30)
    release_lease(old)

    new = claim_lease("chain:a", owner="host:2:bb", ttl_s=30)

    assert new.token == old.token + 1
    with pytest.raises(LeaseLost), transaction.atomic():
        check_lease(old)


def test_releasing_a_lease_taken_over_meanwhile_leaves_the_new_holder_alone() -> None:
    old = claim_lease("chain:a", owner="host:1:aa", ttl_s=30)
    _expire("chain:a")
    new = claim_lease("chain:a", owner="host:2:bb", ttl_s=30)

    release_lease(old)

    with transaction.atomic():
        check_lease(new)


def test_the_fencing_check_passes_for_the_live_holder_and_must_run_in_a_transaction() -> None:
    grant = claim_lease("chain:a", owner="host:1:aa", ttl_s=30)

    with transaction.atomic():
        check_lease(grant)
    if not connection.in_atomic_block:  # pytest-django's test transaction counts as one
        with pytest.raises(RuntimeError, match="transaction"):
            check_lease(grant)


def test_the_fencing_check_refuses_a_made_up_token() -> None:
    grant = claim_lease("chain:a", owner="host:1:aa", ttl_s=30)
    forged = LeaseGrant(grant.name, grant.owner, grant.token + 1, grant.expires_at)

    with pytest.raises(LeaseLost), transaction.atomic():
        check_lease(forged)


def test_claims_validate_their_name_owner_and_ttl() -> None:
    with pytest.raises(ValueError, match="ttl"):
        claim_lease("chain:a", owner="o", ttl_s=0)
    with pytest.raises(ValueError, match="name"):
        claim_lease("x" * 201, owner="o", ttl_s=1)
    with pytest.raises(ValueError, match="owner"):
        claim_lease("chain:a", owner="", ttl_s=1)
    assert not Lease.objects.exists()


def test_the_process_owner_names_host_and_pid_and_is_stable_for_the_process() -> None:
    import os
    import socket

    owner = process_owner()
    host, pid, nonce = owner.rsplit(":", 2)
    assert host == socket.gethostname()[:120] and int(pid) == os.getpid() and len(nonce) == 12
    assert process_owner() == owner
    assert lease_holder("chain:none") is None


# Claimants on their own connections, racing: exactly one wins.
@RACES_NEED_POSTGRES
@pytest.mark.django_db(transaction=True)
def test_racing_claimants_of_a_new_lease_give_it_to_exactly_one() -> None:
    claimants = 4
    barrier = threading.Barrier(claimants)
    won: list[LeaseGrant] = []
    refused: list[LeaseHeld] = []
    failed: list[BaseException] = []

    def claim(i: int) -> None:
        try:
            barrier.wait(5)
            won.append(claim_lease("chain:race", owner=f"host:{i}:cc", ttl_s=30))
        except LeaseHeld as exc:
            refused.append(exc)
        except BaseException as exc:  # reported below
            failed.append(exc)
        finally:
            connection.close()

    threads = [threading.Thread(target=claim, args=(i,)) for i in range(claimants)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)

    assert not failed, failed
    assert len(won) == 1 and len(refused) == claimants - 1
    assert {exc.owner for exc in refused} == {won[0].owner}
    assert Lease.objects.get(name="chain:race").owner == won[0].owner


@RACES_NEED_POSTGRES
@pytest.mark.django_db(transaction=True)
def test_racing_claimants_of_an_expired_lease_bump_the_token_once() -> None:
    claim_lease("chain:race", owner="host:0:dead", ttl_s=30)
    _expire("chain:race")
    claimants = 4
    barrier = threading.Barrier(claimants)
    won: list[LeaseGrant] = []
    refused: list[LeaseHeld] = []

    def claim(i: int) -> None:
        try:
            barrier.wait(5)
            won.append(claim_lease("chain:race", owner=f"host:{i}:cc", ttl_s=30))
        except LeaseHeld as exc:
            refused.append(exc)
        finally:
            connection.close()

    threads = [threading.Thread(target=claim, args=(i,)) for i in range(claimants)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)

    assert len(won) == 1 and len(refused) == claimants - 1
    assert won[0].token == 2 and Lease.objects.get(name="chain:race").token == 2


# The keeper renews on its own connection, outside a test's transaction.
@pytest.mark.django_db(transaction=True)
def test_the_keeper_renews_its_grants_and_releases_them_on_stop() -> None:
    grant = claim_lease("device:a", owner="host:1:aa", ttl_s=1.5)
    keeper = LeaseKeeper([grant], ttl_s=1.5).start()
    try:
        time.sleep(2.5)  # past the first expiry: renewed every 0.5 s meanwhile
        row = Lease.objects.get(name="device:a")
        assert row.expires_at > db_now() and row.token == 1 and row.owner == "host:1:aa"
        assert keeper.renewals_total >= 3 and keeper.renewal_failures_total == 0
        assert keeper.snapshot()["held"] == ["device:a"] and keeper.alive
    finally:
        keeper.stop()

    assert not keeper.alive
    assert Lease.objects.get(name="device:a").expires_at <= db_now()  # released: free for the next claimant
    assert claim_lease("device:a", owner="host:2:bb", ttl_s=30).token == 2


@pytest.mark.django_db(transaction=True)
def test_the_keeper_marks_a_lease_taken_over_as_lost_and_says_so() -> None:
    grant = claim_lease("device:a", owner="host:1:aa", ttl_s=30)
    lost_names: list[str] = []
    keeper = LeaseKeeper([grant], ttl_s=30, on_lost=lost_names.append)
    _expire("device:a")
    claim_lease("device:a", owner="host:2:bb", ttl_s=30)

    keeper.renew_all()

    assert keeper.lost == {"device:a"} and lost_names == ["device:a"]
    assert keeper.lost_total == 1 and keeper.held() == {}
    keeper.stop()  # releases nothing: the lease is someone else's now
    assert Lease.objects.get(name="device:a").owner == "host:2:bb"
    assert Lease.objects.get(name="device:a").expires_at > db_now()


@pytest.mark.django_db(transaction=True)
def test_the_keeper_survives_failed_renewals_logs_once_and_keeps_the_lease(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    grant = claim_lease("device:a", owner="host:1:aa", ttl_s=30)
    keeper = LeaseKeeper([grant], ttl_s=30)
    real = tenancy.leases.renew_lease
    failures = [0]

    def unreachable(g: LeaseGrant, *, ttl_s: float) -> LeaseGrant:
        if failures[0] < 3:
            failures[0] += 1
            raise OperationalError("connection to server at 127.0.0.1, port 5432 failed: Connection refused")
        return real(g, ttl_s=ttl_s)

    monkeypatch.setattr(tenancy.leases, "renew_lease", unreachable)
    for _ in range(4):
        keeper.renew_all()

    assert keeper.renewal_failures_total == 3 and keeper.renewals_total == 1
    assert keeper.lost == set() and "device:a" in keeper.held()
    assert len([r for r in caplog.records if r.levelname == "ERROR"]) == 1
    keeper.stop()
