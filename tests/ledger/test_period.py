"""Every ledger record is placed in a month (``period``, yyyymm): the month of its own time, or the period of the
record before it in its chain when that is later, so that the period never decreases along a chain
(docs/ledger-partitioning.md). Runs on SQLite and PostgreSQL."""

from __future__ import annotations

import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import orjson
import pytest
from django.core.management import call_command
from django.db import connection
from django.db.migrations.executor import MigrationExecutor

from inference.spool import Spool
from ledger.models import LedgerAdjustment, LedgerChain, LedgerRequest, period_of_ns
from ledger.records import KINDS
from ledger.services import ledger_adjust
from ledger.verify import verify_all
from ledger.writer import LedgerWriter, append_records
from tests.factories import OrganizationFactory
from tests.support.ledger import batch_energy_record, one_request_records

pytestmark = pytest.mark.django_db

NOV_LAST = int(datetime(2026, 11, 30, 23, 59, 59, tzinfo=UTC).timestamp()) * 1_000_000_000
DEC_FIRST = int(datetime(2026, 12, 1, 0, 0, 1, tzinfo=UTC).timestamp()) * 1_000_000_000


def _periods(chain_id: str) -> list[tuple[int, str, int]]:
    """(seq, kind, period) of every record of a chain, in seq order."""
    chain = LedgerChain.objects.get(chain_id=chain_id)
    rows = [
        (seq, kind.kind, period)
        for kind in KINDS.values()
        for seq, period in kind.model._default_manager.filter(chain=chain).values_list("seq", "period")
    ]
    return sorted(rows)


def _request(prefix: str, n: int, org_id: int, t_ns: int) -> list[dict[str, Any]]:
    return one_request_records(prefix, n, org_id, "cpu-model", t_ns, 1000)


def test_period_of_ns_is_the_utc_month() -> None:
    assert period_of_ns(NOV_LAST) == 202611
    assert period_of_ns(NOV_LAST + 999_999_999) == 202611
    assert period_of_ns(NOV_LAST + 1_000_000_000) == 202612
    assert period_of_ns(int(datetime(2026, 12, 31, 23, 59, 59, tzinfo=UTC).timestamp()) * 10**9) == 202612
    assert period_of_ns(int(datetime(2027, 1, 1, tzinfo=UTC).timestamp()) * 10**9) == 202701
    assert period_of_ns(NOV_LAST) == 202611  # after the cache moved on


def test_a_straggler_at_a_months_end_goes_to_the_later_period_and_the_period_never_decreases() -> None:
    org = OrganizationFactory()
    november = _request("nov", 1, org.pk, NOV_LAST)
    december = _request("dec", 1, org.pk, DEC_FIRST)
    # Received in November, chained after a December record: a straggler.
    straggler = _request("late", 1, org.pk, NOV_LAST + 900_000_000)
    append_records("months", november + december + straggler)

    placed = _periods("months")
    assert [(kind, period) for _seq, kind, period in placed] == [
        ("batch", 202611),
        ("req", 202611),
        ("batch_energy", 202611),  # no time of its own: the head's period
        ("batch", 202612),
        ("req", 202612),
        ("batch_energy", 202612),
        ("batch", 202612),  # November's, after December's
        ("req", 202612),
        ("batch_energy", 202612),
    ]
    assert LedgerChain.objects.get(chain_id="months").head_period == 202612
    assert LedgerRequest.objects.get(request_id="late.r1").received_ns < DEC_FIRST
    assert [r.broken for r in verify_all()] == [None]


def test_a_chain_starting_with_a_record_without_a_time_places_it_in_the_current_month() -> None:
    append_records("timeless", [batch_energy_record("t.b1", "t.i1", ["t.r1"], [5])])
    ((_, _, period),) = _periods("timeless")
    assert period == period_of_ns(time.time_ns())


def test_the_drainer_places_records_across_chunks_and_keeps_the_head_period(tmp_path: Path) -> None:
    org = OrganizationFactory()
    spool = Spool(tmp_path / "spool")
    for records in (
        _request("d", 1, org.pk, NOV_LAST),
        _request("d", 2, org.pk, DEC_FIRST),
        _request("d", 3, org.pk, NOV_LAST + 500_000_000),
    ):
        spool.append(b"".join(orjson.dumps(r) + b"\n" for r in records))
    # Small chunks: each chunk is chained ahead from the head the one before it reached (period included).
    writer = LedgerWriter(spool, max_chunk_bytes=200, preparer_min_backlog_bytes=0)
    writer.recover()
    writer.drain_all()

    periods = [period for _seq, _kind, period in _periods(spool.chain_id)]
    assert periods == [202611] * 3 + [202612] * 6
    assert LedgerChain.objects.get(chain_id=spool.chain_id).head_period == 202612
    # A writer started again (a restart) carries on from the head period in the database.
    spool.append(b"".join(orjson.dumps(r) + b"\n" for r in _request("d", 4, org.pk, NOV_LAST)))
    writer.stop()
    again = LedgerWriter(spool)
    again.recover()
    again.drain_all()
    assert [period for _seq, _kind, period in _periods(spool.chain_id)][-3:] == [202612] * 3
    assert [r.broken for r in verify_all()] == [None]
    again.stop()
    spool.close()


def _drain(path: Path, records: list[dict[str, Any]]) -> str:
    spool = Spool(path)
    spool.append(b"".join(orjson.dumps(r) + b"\n" for r in records))
    writer = LedgerWriter(spool, max_chunk_bytes=4096)
    writer.recover()
    writer.drain_all()
    writer.stop()
    spool.close()
    return spool.chain_id


def test_a_straggler_whose_first_copy_is_in_its_own_month_is_not_written_twice(tmp_path: Path) -> None:
    org = OrganizationFactory()
    old = _request("dup", 1, org.pk, NOV_LAST)
    _drain(tmp_path / "first", old)
    # The same lines replayed into another chain (a spool whose chain id file was lost), after a December
    # record: they would be placed in December, where no unique index sees November's copy.
    second = _drain(tmp_path / "second", _request("dup", 2, org.pk, DEC_FIRST) + old)

    assert LedgerRequest.objects.filter(request_id="dup.r1").count() == 1
    assert LedgerRequest.objects.get(request_id="dup.r1").period == 202611
    assert LedgerChain.objects.get(chain_id=second).head_seq == 3  # only December's records
    assert [r.broken for r in verify_all()] == [None, None]


def test_a_record_whose_first_copy_was_a_straggler_is_not_written_twice(tmp_path: Path) -> None:
    org = OrganizationFactory()
    late = _request("dup", 3, org.pk, NOV_LAST)
    _drain(tmp_path / "first", _request("dup", 4, org.pk, DEC_FIRST) + late)
    assert LedgerRequest.objects.get(request_id="dup.r3").period == 202612
    # Replayed alone into a new chain it would be placed in its own month, November.
    second = _drain(tmp_path / "second", late)

    assert LedgerRequest.objects.filter(request_id="dup.r3").count() == 1
    assert LedgerChain.objects.get(chain_id=second).head_seq == 0
    assert [r.broken for r in verify_all()] == [None, None]


def test_an_adjustment_is_placed_in_its_month_and_moves_its_chains_head_period() -> None:
    org = OrganizationFactory()
    append_records("adjusted", _request("adj", 1, org.pk, NOV_LAST))
    adjustment = ledger_adjust(
        target_kind="request", target_id="adj.r1", energy_delta_uj=-5, reason="meter fix", actor="ops"
    )
    now = period_of_ns(time.time_ns())
    assert LedgerAdjustment.objects.get(pk=adjustment.pk).period == now
    assert LedgerChain.objects.get(chain_id="adjustments").head_period == now
    assert [r.broken for r in verify_all()] == [None, None]


@pytest.mark.django_db(transaction=True)
def test_migration_0003_places_existing_records_as_the_writer_does() -> None:
    org = OrganizationFactory()
    append_records(
        "before",
        [
            *_request("m", 1, org.pk, NOV_LAST),
            batch_energy_record("m.b9", "m.i9", ["m.r1"], [1]),
            *_request("m", 2, org.pk, DEC_FIRST),
            *_request("m", 3, org.pk, NOV_LAST),
        ],
    )
    written = _periods("before")
    executor = MigrationExecutor(connection)
    latest = [key for key in executor.loader.graph.leaf_nodes() if key[0] == "ledger"]
    executor.migrate([("ledger", "0002_quarantine")])
    try:
        executor = MigrationExecutor(connection)
        executor.migrate(latest)
        assert _periods("before") == written
        assert LedgerChain.objects.get(chain_id="before").head_period == 202612
        assert [r.broken for r in verify_all()] == [None]
    finally:
        call_command("migrate", verbosity=0)
