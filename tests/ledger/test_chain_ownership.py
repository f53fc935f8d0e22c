"""Chain ownership with fencing (issue 23): a ledger chain (one per spool directory) is leased in the database by
one live process; a second claimant of a live chain is refused naming the chain and its holder; a lease that
expired is taken back; and every commit of the drainer checks the lease inside its own transaction, so a
process whose lease was taken over writes nothing. On SQLite, and on PostgreSQL when DATABASE_URL points there.
"""

from __future__ import annotations

import io
import logging
import sys
import time
from collections.abc import Callable
from datetime import timedelta
from pathlib import Path

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError
from django.test import override_settings

from inference.spool import Spool
from ledger.models import LedgerChain, LedgerRequest
from ledger.ownership import EXIT_CHAIN_HELD, ChainHeld, ChainLost, ChainOwnership, chain_lease_name
from ledger.selectors import chain_lease
from ledger.verify import verify_all
from ledger.writer import LedgerWriter
from tenancy.leases import claim_lease, db_now, process_owner
from tenancy.models import Lease
from tests.factories import OrganizationFactory
from tests.support.ledger import lines_for_batch

pytestmark = pytest.mark.django_db

OTHER = "replica-b:4242:0123456789ab"  # another process's owner string


def _spool(path: Path, batches: list[list[bytes]]) -> Spool:
    spool = Spool(path)
    for lines in batches:
        spool.append(b"".join(lines))
    return spool


def _take_over(chain_id: str, owner: str = OTHER, ttl_s: float = 60) -> None:
    """Another process takes the chain after our lease lapsed (a pause longer than the lease, say)."""
    name = chain_lease_name(chain_id)
    Lease.objects.filter(name=name).update(expires_at=db_now() - timedelta(seconds=1))
    claim_lease(name, owner=owner, ttl_s=ttl_s)


def _wait(predicate: Callable[[], bool], timeout_s: float) -> bool:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.02)
    return True


def _chain_state(chain_id: str) -> tuple[int, str, str]:
    chain = LedgerChain.objects.get(chain_id=chain_id)
    return chain.head_seq, chain.head_hash, chain.spool_position


def test_a_writer_claims_its_chain_in_the_database_when_it_recovers(tmp_path: Path) -> None:
    spool = _spool(tmp_path / "spool", [])
    writer = LedgerWriter(spool)
    writer.recover()

    lease = chain_lease(spool.chain_id)
    assert lease is not None
    assert lease.name == f"chain:{spool.chain_id}" and lease.owner == process_owner()
    assert lease.expires_at > db_now()
    assert writer.ownership is not None and writer.ownership.grant is not None
    assert writer.ownership.grant.token == lease.token
    writer.stop()
    spool.close()


def test_a_second_claimant_of_a_live_chain_is_refused_naming_the_chain_and_the_holder(tmp_path: Path) -> None:
    spool = _spool(tmp_path / "spool", [])
    claim_lease(chain_lease_name(spool.chain_id), owner=OTHER, ttl_s=60)
    writer = LedgerWriter(spool)

    with pytest.raises(ChainHeld) as held:
        writer.recover()

    message = str(held.value)
    assert spool.chain_id in message and OTHER in message
    assert "\n" not in message  # one line, for a log and a crash-looping pod's status
    assert (held.value.chain_id, held.value.holder) == (spool.chain_id, OTHER)
    assert chain_lease(spool.chain_id).owner == OTHER  # type: ignore[union-attr]
    spool.close()


def test_a_claim_refuses_at_once_a_holder_whose_lease_outlasts_the_wait(tmp_path: Path) -> None:
    claim_lease(chain_lease_name("c1"), owner=OTHER, ttl_s=60)
    started = time.monotonic()

    with pytest.raises(ChainHeld):
        ChainOwnership("c1", ttl_s=2).claim(wait_s=2)

    assert time.monotonic() - started < 1.5


def test_a_restarted_process_takes_its_chain_back_once_the_lease_expires(tmp_path: Path) -> None:
    # The previous process died holding the lease: it expires soon, and the new claim waits for it.
    dead = claim_lease(chain_lease_name("c1"), owner="replica-a:99:deadbeef0000", ttl_s=0.6)
    started = time.monotonic()

    grant = ChainOwnership("c1", ttl_s=5).claim(wait_s=5)

    assert 0.3 < time.monotonic() - started < 4
    assert grant.owner == process_owner() and grant.token == dead.token + 1


def test_the_chain_lease_ttl_setting_is_validated_and_named() -> None:
    from django.core.exceptions import ImproperlyConfigured

    from carbonledger.env import env_float

    for bad in ("0", "-1", "soon", "7200"):
        with pytest.raises(ImproperlyConfigured, match="LEDGER_CHAIN_LEASE_TTL_S"):
            env_float(
                "LEDGER_CHAIN_LEASE_TTL_S",
                30.0,
                minimum=1.0,
                maximum=3600.0,
                environ={"LEDGER_CHAIN_LEASE_TTL_S": bad},
            )
    from django.conf import settings

    assert settings.LEDGER_CHAIN_LEASE_TTL_S == 30.0


def test_a_writer_whose_lease_was_taken_over_writes_nothing(tmp_path: Path) -> None:
    org = OrganizationFactory()
    first, first_ids = lines_for_batch(org.pk, prefix="f1")
    spool = _spool(tmp_path / "spool", [first])
    writer = LedgerWriter(spool)
    writer.recover()
    writer.drain_all()
    assert LedgerRequest.objects.filter(request_id__in=first_ids).count() == len(first_ids)
    before = _chain_state(spool.chain_id)
    records_before = LedgerRequest.objects.count()

    _take_over(spool.chain_id)
    second, _ = lines_for_batch(org.pk, prefix="f2")
    spool.append(b"".join(second))

    with pytest.raises(ChainLost) as lost:
        writer.drain_all()

    assert spool.chain_id in str(lost.value) and OTHER in str(lost.value)
    assert LedgerRequest.objects.count() == records_before  # nothing of the second batch
    assert _chain_state(spool.chain_id) == before  # head and checkpoint untouched
    assert writer.fenced and writer.lease_lost_total == 1
    assert writer.ownership is not None and writer.ownership.lost
    assert writer.ownership.snapshot()["fenced_commits_total"] == 1
    metrics = "\n".join(writer.ownership.prometheus_lines())
    assert f'carbonledger_ledger_chain_lease_held{{chain="{spool.chain_id}"}} 0' in metrics
    assert f'carbonledger_ledger_chain_fenced_commits_total{{chain="{spool.chain_id}"}} 1' in metrics
    assert chain_lease(spool.chain_id).owner == OTHER  # type: ignore[union-attr]
    assert [r.broken for r in verify_all()] == [None]
    spool.close()


def test_a_lease_that_lapsed_without_a_take_over_is_renewed_and_the_drain_goes_on(tmp_path: Path) -> None:
    # A database outage longer than the lease: nobody claimed the chain meanwhile, so it is still ours.
    org = OrganizationFactory()
    lines, ids = lines_for_batch(org.pk, prefix="l1")
    spool = _spool(tmp_path / "spool", [lines])
    writer = LedgerWriter(spool)
    writer.recover()
    name = chain_lease_name(spool.chain_id)
    Lease.objects.filter(name=name).update(expires_at=db_now() - timedelta(seconds=5))

    writer.drain_all()

    assert LedgerRequest.objects.filter(request_id__in=ids).count() == len(ids)
    assert not writer.fenced and writer.lease_lost_total == 0
    assert Lease.objects.get(name=name).expires_at > db_now()
    assert [r.broken for r in verify_all()] == [None]
    writer.stop()
    spool.close()


# The writer and keeper threads commit on their own connections, outside a test's transaction.
@pytest.mark.django_db(transaction=True)
@override_settings(LEDGER_CHAIN_LEASE_TTL_S=1.0)
def test_the_writer_thread_stops_loudly_when_its_chain_is_taken_and_says_so(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    org = OrganizationFactory()
    first, first_ids = lines_for_batch(org.pk, prefix="t1")
    spool = _spool(tmp_path / "spool", [first])
    writer = LedgerWriter(spool, interval_s=0.02, max_backoff_s=0.05)
    writer.recover()
    writer.start()
    try:
        assert _wait(lambda: spool.backlog_bytes == 0, timeout_s=10)
        before = _chain_state(spool.chain_id)
        _take_over(spool.chain_id)
        second, second_ids = lines_for_batch(org.pk, prefix="t2")
        spool.append(b"".join(second))

        assert _wait(lambda: writer.fenced, timeout_s=10), writer.last_error
        assert _wait(lambda: not writer.alive, timeout_s=5)  # stopped draining, not retrying for ever
    finally:
        writer.stop(timeout_s=5)

    assert LedgerRequest.objects.filter(request_id__in=first_ids).count() == len(first_ids)
    assert not LedgerRequest.objects.filter(request_id__in=second_ids).exists()
    assert _chain_state(spool.chain_id) == before
    assert not writer.healthy and OTHER in writer.last_error
    errors = [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR]
    assert any(spool.chain_id in m and OTHER in m for m in errors), errors
    assert chain_lease(spool.chain_id).owner == OTHER  # type: ignore[union-attr]  # stop() released nothing
    spool.close()


@pytest.mark.django_db(transaction=True)
@override_settings(LEDGER_CHAIN_LEASE_TTL_S=1.0)
def test_the_writer_keeps_its_chain_leased_while_it_runs_and_frees_it_on_stop(tmp_path: Path) -> None:
    spool = _spool(tmp_path / "spool", [])
    writer = LedgerWriter(spool, interval_s=0.05)
    writer.recover()
    writer.start()
    try:
        time.sleep(2.0)  # twice the lease: renewed meanwhile
        lease = chain_lease(spool.chain_id)
        assert lease is not None and lease.expires_at > db_now() and lease.owner == process_owner()
        assert not writer.fenced and writer.alive
    finally:
        writer.stop(timeout_s=5)

    # A clean stop frees the chain for the next process at once.
    assert chain_lease(spool.chain_id).expires_at <= db_now()  # type: ignore[union-attr]
    spool.close()


@pytest.fixture
def drainer_settings() -> object:
    """drain_ledger in this process: no nice (it would stay with the test process), its switch interval undone."""
    interval = sys.getswitchinterval()
    with override_settings(LEDGER_WRITER_NICE=0, LEDGER_CHAIN_LEASE_TTL_S=1.0):
        yield
    sys.setswitchinterval(interval)


def test_drain_ledger_on_a_chain_held_live_by_another_process_refuses_with_one_line(
    tmp_path: Path, drainer_settings: object
) -> None:
    org = OrganizationFactory()
    lines, ids = lines_for_batch(org.pk, prefix="d1")
    _spool(tmp_path / "spool", [lines]).close()
    chain_id = (tmp_path / "spool" / "chain_id").read_text().strip()
    claim_lease(chain_lease_name(chain_id), owner=OTHER, ttl_s=60)

    with pytest.raises(CommandError) as refused:
        call_command("drain_ledger", "--spool", str(tmp_path / "spool"), "--once", stdout=io.StringIO())

    assert refused.value.returncode == EXIT_CHAIN_HELD
    message = str(refused.value)
    assert chain_id in message and OTHER in message and "\n" not in message
    assert not LedgerRequest.objects.filter(request_id__in=ids).exists()


def test_drain_ledger_takes_back_a_chain_whose_holder_died_once_its_lease_expires(
    tmp_path: Path, drainer_settings: object
) -> None:
    org = OrganizationFactory()
    lines, ids = lines_for_batch(org.pk, prefix="d2")
    _spool(tmp_path / "spool", [lines]).close()
    chain_id = (tmp_path / "spool" / "chain_id").read_text().strip()
    claim_lease(chain_lease_name(chain_id), owner="replica-a:99:deadbeef0000", ttl_s=0.5)

    out = io.StringIO()
    call_command("drain_ledger", "--spool", str(tmp_path / "spool"), "--once", stdout=out)

    assert LedgerRequest.objects.filter(request_id__in=ids).count() == len(ids)
    lease = chain_lease(chain_id)
    assert lease is not None and lease.token == 2
    assert [r.broken for r in verify_all()] == [None]
