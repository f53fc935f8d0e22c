"""The models left the carbonledger app for tenancy, ledger and carbon without a data migration: a database
at the last migration of the old layout keeps every row, and its ledger still verifies, once migrated
forward."""

from __future__ import annotations

from pathlib import Path

import pytest
from django.contrib.auth.models import Permission
from django.contrib.contenttypes.models import ContentType
from django.core.management import call_command
from django.db import connection
from django.db.migrations.executor import MigrationExecutor

from inference.spool import Spool
from ledger.models import LedgerBatch, LedgerBatchEnergy, LedgerChain, LedgerIdle, LedgerRequest
from ledger.records import KINDS
from ledger.verify import verify_all
from ledger.writer import LedgerWriter
from tenancy.models import Lease, Organization
from tests.support.ledger import lines_for_batch

# The last migration of each app before the move: the database of a running installation of that layout.
BEFORE_THE_MOVE = [
    ("carbonledger", "0012_ledger_idle_owed_in"),
    ("jobs", "0001_initial"),
    ("reports", "0002_report_heartbeat"),
    ("tenancy", None),
    ("ledger", None),
    ("carbon", None),
]


KINDS_MODELS = [kind.model for kind in KINDS.values() if kind.kind != "quarantine"]  # its table is later


def _migrate(targets: list[tuple[str, str | None]]) -> None:
    executor = MigrationExecutor(connection)
    executor.loader.build_graph()
    executor.migrate(targets)


def _latest() -> list[tuple[str, str]]:
    executor = MigrationExecutor(connection)
    return [
        key
        for key in executor.loader.graph.leaf_nodes()
        if key[0] in {"carbonledger", "tenancy", "ledger", "carbon", "jobs", "reports"}
    ]


def _table_rows() -> dict[str, int]:
    with connection.cursor() as cursor:
        counts = {}
        for table in (
            "carbonledger_organization",
            "carbonledger_ledgerchain",
            "carbonledger_device",
            "ledger_request",
            "ledger_batch",
            "ledger_interval",
            "ledger_idle",
            "ledger_batch_energy",
        ):
            cursor.execute(f"SELECT COUNT(*) FROM {table}")
            counts[table] = cursor.fetchone()[0]
    return counts


@pytest.mark.django_db(transaction=True)
def test_a_ledger_written_before_the_move_keeps_every_row_and_verifies_after_migrating_forward(
    tmp_path: Path,
) -> None:
    latest = _latest()
    _migrate(BEFORE_THE_MOVE)
    try:
        applied = MigrationExecutor(connection).loader.applied_migrations
        assert ("carbonledger", "0013_models_to_apps") not in applied
        assert ("ledger", "0001_initial") not in applied
        # The tables are where the old layout had them: the writer's models name the same tables.
        org = Organization.objects.create(slug="before", name="Before the move")
        batches = [lines_for_batch(org.pk, requests=3, prefix="old") for _ in range(5)]
        spool = Spool(tmp_path / "spool")
        for lines, _ in batches:
            spool.append(b"".join(lines))
        # Today's writer leases its chain (tenancy.Lease, a later migration) and places its records in periods
        # (ledger 0003): the table and the columns are lent to the old layout for the write, and taken away before
        # migrating forward, which creates them (and places the rows again).
        # Plain SQL: the schema editor would rebuild a SQLite table from today's model, constraints included.
        lent = [(model._meta.db_table, "period") for model in KINDS_MODELS]
        lent.append((LedgerChain._meta.db_table, "head_period"))
        with connection.schema_editor() as editor:
            editor.create_model(Lease)
            for table, column in lent:
                editor.execute(f"ALTER TABLE {table} ADD COLUMN {column} integer NOT NULL DEFAULT 0")
        try:
            writer = LedgerWriter(spool)
            writer.recover()
            writer.drain_available()
            writer.stop()
        finally:
            with connection.schema_editor() as editor:
                editor.delete_model(Lease)
                for table, column in lent:
                    editor.execute(f"ALTER TABLE {table} DROP COLUMN {column}")
        before = _table_rows()
        assert before["ledger_request"] == 15
    finally:
        _migrate(latest)

    assert _table_rows() == before
    ids = sorted(rid for _, rids in batches for rid in rids)
    assert sorted(LedgerRequest.objects.values_list("request_id", flat=True)) == ids
    assert LedgerBatch.objects.count() == LedgerBatchEnergy.objects.count() == LedgerIdle.objects.count() == 5
    chain = LedgerChain.objects.get(chain_id=spool.chain_id)
    assert chain.head_seq == 5 * (1 + 3 + 1 + 1 + 1)
    assert [report.broken for report in verify_all()] == [None]
    call_command("verify_ledger")  # the operator's command says intact too (it raises otherwise)


@pytest.mark.django_db(transaction=True)
def test_the_moved_models_content_types_and_permissions_follow_them_there_and_back() -> None:
    latest = _latest()
    permissions = Permission.objects.count()
    moved = ContentType.objects.get(app_label="ledger", model="ledgerrequest")
    _migrate(BEFORE_THE_MOVE)
    try:
        back = ContentType.objects.get(pk=moved.pk)
        assert (back.app_label, back.model) == ("carbonledger", "ledgerrequest")
    finally:
        _migrate(latest)
    again = ContentType.objects.get(pk=moved.pk)
    assert (again.app_label, again.model) == ("ledger", "ledgerrequest")
    assert not ContentType.objects.filter(app_label="carbonledger").exists()
    assert Permission.objects.count() == permissions
    assert Permission.objects.filter(content_type=again, codename="view_ledgerrequest").exists()
