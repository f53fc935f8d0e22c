"""The ledger's big tables partitioned by month on PostgreSQL (migration ledger 0004, ledger/partitions.py,
docs/ledger-partitioning.md): where the rows go, the partitions made ahead and on demand, the default partition
emptied, the unique keys per period, and the migration over a database holding rows."""

from __future__ import annotations

import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import orjson
import pytest
from django.conf import settings
from django.core.management import call_command
from django.db import IntegrityError, connection, transaction
from django.db.migrations.executor import MigrationExecutor

from inference.spool import Spool
from ledger import partitions as parts
from ledger.models import LedgerChain, LedgerRequest, period_of_ns
from ledger.selectors import LedgerFilter, _requests, ledger_page
from ledger.tasks import ledger_partitions
from ledger.verify import verify_all
from ledger.writer import LedgerWriter, append_records
from tests.factories import OrganizationFactory
from tests.support.ledger import lines_for_batch, one_request_records

pytestmark = [
    pytest.mark.django_db,
    pytest.mark.skipif(
        not settings.DATABASES["default"]["ENGINE"].endswith("postgresql"),
        reason="the ledger is partitioned on PostgreSQL only",
    ),
]


def _ns(year: int, month: int, day: int = 15) -> int:
    return int(datetime(year, month, day, 12, tzinfo=UTC).timestamp()) * 1_000_000_000


def _rows_in(name: str) -> int:
    with connection.cursor() as cur:
        cur.execute(f"SELECT count(*) FROM ONLY {name}")
        return int(cur.fetchone()[0])


def _request(prefix: str, n: int, org_id: int, t_ns: int) -> list[dict[str, Any]]:
    return one_request_records(prefix, n, org_id, "cpu-model", t_ns, 1000)


def _this_month() -> int:
    return period_of_ns(time.time_ns())


def test_the_big_tables_are_partitioned_with_this_month_and_the_months_ahead() -> None:
    assert parts.partitioned()
    now = _this_month()
    wanted = parts.periods_from(now, settings.LEDGER_PARTITION_MONTHS_AHEAD)
    for table in parts.PARTITIONED_TABLES:
        listed = parts.partitions(table)
        assert {p.period for p in listed} >= {*wanted, None}
        assert listed[-1].name == f"{table}_pdefault" and listed[-1].period is None
    # The id columns keep the byte-order collation (carbonledger 0010) and the id its sequence.
    with connection.cursor() as cur:
        cur.execute(
            "SELECT collation_name FROM information_schema.columns "
            "WHERE table_name = 'ledger_request' AND column_name = 'request_id'"
        )
        assert cur.fetchone()[0] == "C"
        cur.execute("SELECT pg_get_serial_sequence('ledger_request', 'id')")
        assert cur.fetchone()[0] == "public.ledger_request_id_seq"


def test_the_drainer_writes_each_record_into_its_months_partition(tmp_path: Path) -> None:
    org = OrganizationFactory()
    now = _this_month()
    ahead = parts.next_period(now)
    year, month = divmod(ahead, 100)
    spool = Spool(tmp_path / "spool")
    lines, _ids = lines_for_batch(org.pk, prefix="part")
    records = [orjson.loads(line) for line in lines]
    t_ahead = _ns(year, month)
    for rec in records:  # the batch moved into next month, whose partition was made ahead
        for field in ("start_ns", "received_ns", "t0_ns"):
            if field in rec:
                rec[field] = t_ahead
    spool.append(b"".join(orjson.dumps(r) + b"\n" for r in records))
    writer = LedgerWriter(spool, preparer_min_backlog_bytes=0)
    writer.recover()
    writer.drain_all()
    writer.stop()
    spool.close()

    assert _rows_in(f"ledger_request_p{ahead}") == 3
    assert _rows_in(f"ledger_batch_p{ahead}") == 1
    assert _rows_in(f"ledger_batch_energy_p{ahead}") == 1
    assert _rows_in("ledger_request_pdefault") == 0
    assert [r.broken for r in verify_all()] == [None]


def test_a_month_without_a_partition_goes_to_the_default_one_until_the_daily_task_moves_it() -> None:
    org = OrganizationFactory()
    far = parts.next_period(parts.periods_from(_this_month(), settings.LEDGER_PARTITION_MONTHS_AHEAD)[-1])
    year, month = divmod(far, 100)
    append_records("far", _request("far", 1, org.pk, _ns(year, month)))
    assert _rows_in("ledger_request_pdefault") == 1
    assert LedgerRequest.objects.get(request_id="far.r1").period == far

    created = ledger_partitions()

    assert f"ledger_request_p{far}" in created and f"ledger_batch_energy_p{far}" in created
    assert _rows_in("ledger_request_pdefault") == 0
    assert _rows_in(f"ledger_request_p{far}") == 1
    assert _rows_in(f"ledger_batch_p{far}") == 1
    assert ledger_partitions() == []  # nothing left to make
    assert [r.broken for r in verify_all()] == [None]
    # The drainer goes on writing into the new partition.
    append_records("far", _request("far", 2, org.pk, _ns(year, month, 20)))
    assert _rows_in(f"ledger_request_p{far}") == 2


def test_a_past_partition_is_detached_and_dropped_but_not_this_months() -> None:
    org = OrganizationFactory()
    append_records("old", _request("old", 1, org.pk, _ns(2024, 3)))
    ledger_partitions()
    assert any(p.period == 202403 for p in parts.partitions("ledger_request"))

    with pytest.raises(ValueError, match="still written to"):
        parts.drop_partition("ledger_request", _this_month())
    with pytest.raises(ValueError, match="not a partitioned ledger table"):
        parts.drop_partition("carbonledger_ledgerchain", 202403)

    assert parts.drop_partition("ledger_request", 202403)
    assert not parts.drop_partition("ledger_request", 202403)
    assert not LedgerRequest.objects.filter(request_id="old.r1").exists()
    assert all(p.period != 202403 for p in parts.partitions("ledger_request"))
    assert _rows_in("ledger_batch_p202403") == 1  # the other tables keep theirs until retention drops them


def _insert_copy(pk: int, **changed: str) -> None:
    """Insert a copy of request row ``pk`` with some columns changed (SQL expressions)."""
    columns = [f.column for f in LedgerRequest._meta.concrete_fields if f.column != "id"]
    values = ", ".join(changed.get(column, column) for column in columns)
    with connection.cursor() as cur:
        cur.execute(
            f"INSERT INTO ledger_request ({', '.join(columns)}) SELECT {values} FROM ledger_request WHERE id = %s",
            [pk],
        )


def test_a_request_id_is_unique_within_a_period_only_so_the_writer_looks_outside_it() -> None:
    org = OrganizationFactory()
    append_records("unique", _request("u", 1, org.pk, _ns(2026, 11)))
    pk = LedgerRequest.objects.get(request_id="u.r1").pk
    # The same request id again in its period (at another seq): refused by the (request_id, period) key.
    with pytest.raises(IntegrityError, match=r"Key \(request_id, period\)"), transaction.atomic():
        _insert_copy(pk, seq="seq + 100")
    # The same seq of the chain again in its period: refused by the (chain, seq, period) key.
    with pytest.raises(IntegrityError, match=r"Key \(chain_id, seq, period\)"), transaction.atomic():
        _insert_copy(pk, request_id="'u.other'")
    # In another period the database takes the same id: what the writer's look-up of records placed outside
    # their month (tests/ledger/test_period.py) and verification (seq twice) are for.
    with transaction.atomic():
        _insert_copy(pk, seq="seq + 100", period="202612")
    assert LedgerRequest.objects.filter(request_id="u.r1").count() == 2


def _lay_down_a_ledger(tmp_path: Path) -> dict[str, int]:
    org = OrganizationFactory()
    records: list[dict[str, Any]] = []
    for n, (year, month) in enumerate([(2026, 10), (2026, 11), (2026, 11), (2026, 12), (2026, 10)], 1):
        records += _request("mig", n, org.pk, _ns(year, month))
    append_records("migrated", records)
    spool = Spool(tmp_path / "spool")
    for _ in range(3):
        spool.append(b"".join(lines_for_batch(org.pk, prefix="mig")[0]))
    writer = LedgerWriter(spool)
    writer.recover()
    writer.drain_all()
    writer.stop()
    spool.close()
    with connection.cursor() as cur:
        counts = {}
        for table in parts.PARTITIONED_TABLES:
            cur.execute(f"SELECT count(*), COALESCE(sum(id), 0), COALESCE(max(id), 0) FROM {table}")
            count, id_sum, _max = cur.fetchone()
            counts[table] = (count, id_sum)
    return counts


@pytest.mark.django_db(transaction=True)
def test_migration_0004_keeps_every_row_and_every_chain_verifies_both_ways(tmp_path: Path) -> None:
    executor = MigrationExecutor(connection)
    latest = [key for key in executor.loader.graph.leaf_nodes() if key[0] == "ledger"]
    executor.migrate([("ledger", "0003_period")])
    try:
        assert not parts.partitioned()
        before = _lay_down_a_ledger(tmp_path)
        periods = sorted(LedgerRequest.objects.values_list("request_id", "period"))
        executor = MigrationExecutor(connection)
        executor.migrate(latest)

        assert parts.partitioned()
        after = {}
        with connection.cursor() as cur:
            for table in parts.PARTITIONED_TABLES:
                cur.execute(f"SELECT count(*), COALESCE(sum(id), 0) FROM {table}")
                after[table] = tuple(cur.fetchone())
        assert after == before  # every row, with its id
        assert sorted(LedgerRequest.objects.values_list("request_id", "period")) == periods
        # October's second request was chained after December's: a straggler, in December's partition.
        assert [_rows_in(f"ledger_request_p{p}") for p in (202610, 202611, 202612)] == [1, 2, 2]
        assert [r.broken for r in verify_all()] == [None, None]
        # New rows take ids after the old ones, and go on verifying.
        top = LedgerRequest.objects.order_by("-id").values_list("id", flat=True).first()
        append_records("migrated", _request("mig", 99, None, _ns(2026, 12)))
        assert LedgerRequest.objects.get(request_id="mig.r99").pk > top
        assert [r.broken for r in verify_all()] == [None, None]

        # And back: plain tables with every row again (verified once forward again: the later migrations'
        # tables, which verification reads, are gone at 0003).
        executor = MigrationExecutor(connection)
        executor.migrate([("ledger", "0003_period")])
        assert not parts.partitioned()
        assert LedgerRequest.objects.count() == before["ledger_request"][0] + 1
    finally:
        call_command("migrate", verbosity=0)
    assert parts.partitioned()
    assert LedgerRequest.objects.count() == before["ledger_request"][0] + 1
    assert [r.broken for r in verify_all()] == [None, None]
    assert LedgerChain.objects.filter(chain_id="migrated").exists()


def test_a_read_from_a_month_on_skips_the_older_partitions_and_finds_the_stragglers() -> None:
    org = OrganizationFactory()
    append_records(
        "reads",
        [
            *_request("rd", 1, org.pk, _ns(2026, 9)),
            *_request("rd", 2, org.pk, _ns(2026, 11)),
            *_request("rd", 3, org.pk, _ns(2026, 12, 1)),
            # Received in November, chained after December's: stored in December's partition.
            *_request("rd", 4, org.pk, _ns(2026, 11, 30)),
        ],
    )
    ledger_partitions()
    flt = LedgerFilter(organization_id=org.pk, start_ns=_ns(2026, 11, 1))

    rows, _more = ledger_page("requests", flt)

    assert [r["request_id"] for r in rows] == ["rd.r2", "rd.r4", "rd.r3"]
    plan = _requests(flt).explain()
    assert "ledger_request_p202611" in plan and "ledger_request_p202612" in plan
    assert "ledger_request_p202609" not in plan
    # A page after a key: the same bound from the key's month.
    after = LedgerFilter(organization_id=org.pk, after=(_ns(2026, 11), 0))
    assert [r["request_id"] for r in ledger_page("requests", after)[0]] == ["rd.r2", "rd.r4", "rd.r3"]
    assert "ledger_request_p202609" not in _requests(after).explain()
