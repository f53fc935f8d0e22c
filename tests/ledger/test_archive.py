"""Retention (issue 24): a chain's old records go to an archive file with their hashes before they leave the
database; what stays (the rollups, the chain's head, the verifications) still verifies the chain, from the
archive's checkpoint, and the archive verifies offline. Runs on SQLite and, in the suite's second run, PostgreSQL.
"""

from __future__ import annotations

import gzip
import hashlib
import os
import subprocess
import sys
from datetime import UTC, datetime
from io import StringIO
from pathlib import Path
from typing import Any

import orjson
import pytest
from django.core.management import call_command
from django.core.management.base import CommandError
from django.db import connection

from carbon.rollups import RebuildRefused, rollups_rebuild, rollups_update
from ledger.archive import ArchiveError, ledger_archive, parse_period, period_before, verify_archive
from ledger.models import LedgerArchive, LedgerBatch, LedgerChain, LedgerRequest, LedgerVerification
from ledger.partitions import ensure_partitions, partitioned, partitions
from ledger.records import GENESIS
from ledger.services import ledger_verify
from ledger.tasks import ledger_archive as ledger_archive_task
from ledger.verify import verify_all, verify_chains
from ledger.writer import append_records
from tenancy.leases import claim_lease
from tests.factories import OrganizationFactory
from tests.support.ledger import one_request_records

pytestmark = pytest.mark.django_db

CHAIN = "archive-test"
JAN, MAR, MAY = (datetime(2025, m, 10, 9, tzinfo=UTC) for m in (1, 3, 5))


@pytest.fixture(autouse=True)
def archive_dir(settings: Any, tmp_path: Path) -> Path:
    settings.LEDGER_ARCHIVE_DIR = tmp_path / "archive"
    return tmp_path / "archive"


def _requests(at: datetime, count: int, prefix: str, org_id: int | None = None) -> None:
    org_id = org_id if org_id is not None else OrganizationFactory().pk
    for n in range(count):
        t = int(at.timestamp() * 1e9) + n * 1_000_000_000
        append_records(CHAIN, one_request_records(prefix, n, org_id, "cpu-model", t, 1_000_000 + n))


def _ledger() -> LedgerChain:
    """Three requests in January 2025 (9 records) and two in March (6), rolled up and verified."""
    _requests(JAN, 3, "jan")
    _requests(MAR, 2, "mar")
    rollups_update()
    ledger_verify()
    return LedgerChain.objects.get(chain_id=CHAIN)


def _archive(before: str, *args: str) -> str:
    out = StringIO()
    call_command("ledger_archive", "--before", before, *args, stdout=out)
    return out.getvalue()


def _lines(path: Path) -> list[dict[str, object]]:
    with gzip.open(path, "rb") as f:
        return [orjson.loads(line) for line in f]


def test_the_months_before_the_cutoff_go_to_a_file_with_their_hashes_and_leave_the_database(
    archive_dir: Path,
) -> None:
    chain = _ledger()
    jan_hashes = list(
        LedgerRequest.objects.filter(request_id__startswith="jan").values_list("hash", flat=True)
    )

    out = _archive("2025-02")

    archive = LedgerArchive.objects.get()
    assert (archive.from_seq, archive.to_seq, archive.records) == (0, 9, 9)
    assert archive.counts == {"batch": 3, "batch_energy": 3, "req": 3}
    assert f"chain {CHAIN}: archived seq 1..9 (9 records) to {archive.path}, 9 row(s) deleted" in out
    data, manifest_path = Path(archive.path), Path(archive.manifest_path)
    assert data.parent == archive_dir / CHAIN and data.name == f"{CHAIN}-000000000001-000000000009.jsonl.gz"
    assert archive.sha256 == hashlib.sha256(data.read_bytes()).hexdigest()
    manifest = orjson.loads(manifest_path.read_bytes())
    assert {
        k: manifest[k] for k in ("chain", "from_seq", "to_seq", "prev_hash", "last_hash", "sha256", "counts")
    } == {
        "chain": CHAIN,
        "from_seq": 0,
        "to_seq": 9,
        "prev_hash": "0" * 64,
        "last_hash": archive.last_hash,
        "sha256": archive.sha256,
        "counts": archive.counts,
    }
    lines = _lines(data)
    assert [line["row"]["seq"] for line in lines] == list(range(1, 10))  # every kind, in seq order
    assert [line["table"] for line in lines[:3]] == ["ledger_batch", "ledger_request", "ledger_batch_energy"]
    assert [line["row"]["hash"] for line in lines if line["kind"] == "req"] == jan_hashes
    assert lines[1]["row"]["request_id"] == "jan.r0" and lines[1]["row"]["period"] == 202501  # all columns
    # Gone from the database; March kept, the chain's head and verifications too.
    assert not LedgerRequest.objects.filter(request_id__startswith="jan").exists()
    assert LedgerRequest.objects.filter(request_id__startswith="mar").count() == 2
    assert LedgerBatch.objects.order_by("seq").first().seq == 10  # type: ignore[union-attr]
    assert LedgerChain.objects.get().head_seq == chain.head_seq == 15
    assert LedgerVerification.objects.exists()


def test_verification_after_archiving_starts_at_the_checkpoint_and_checks_the_link_to_it() -> None:
    _ledger()
    _archive("2025-02")
    archive = LedgerArchive.objects.get()

    [report] = verify_all(workers=1)
    assert (report.broken, report.from_seq, report.records) == (None, 9, 6)
    (full,) = ledger_verify(full=True)
    assert (full.from_seq, full.seq, full.records, full.intact) == (9, 15, 6, True)
    out = StringIO()
    call_command("verify_ledger", stdout=out)
    assert (
        f"chain {CHAIN}: 6 records from the archive checkpoint at seq 9, head seq 15: intact"
        in out.getvalue()
    )

    # The first record kept must link to the archive's last hash.
    with connection.cursor() as cur:
        cur.execute("UPDATE ledger_batch SET prev_hash = %s WHERE seq = 10", ["f" * 64])
    [report] = verify_all(workers=1)
    assert report.broken is not None and report.broken.seq == archive.to_seq + 1
    assert "prev_hash" in report.broken.problem


def test_an_archive_file_verifies_offline_and_a_changed_one_does_not(archive_dir: Path) -> None:
    _ledger()
    _archive("2025-02")
    archive = LedgerArchive.objects.get()
    data = Path(archive.path)

    out = StringIO()
    call_command("verify_ledger", "--archive", str(data), stdout=out)
    assert f"archive {data.name}: seq 1..9 of chain {CHAIN}, 9 records: intact" in out.getvalue()
    assert verify_archive(Path(archive.manifest_path)) == []

    # A record changed and the file's sha256 set to match in the manifest: the row and the hashes still say no.
    lines = _lines(data)
    lines[4]["row"]["work_units"] = 99
    data.write_bytes(gzip.compress(b"".join(orjson.dumps(line) + b"\n" for line in lines)))
    manifest = orjson.loads(Path(archive.manifest_path).read_bytes())
    manifest["sha256"] = hashlib.sha256(data.read_bytes()).hexdigest()
    Path(archive.manifest_path).write_bytes(orjson.dumps(manifest))
    problems = verify_archive(data)
    assert any("does not match its LedgerArchive row" in p for p in problems)
    assert any("seq 5 (ledger_request): its fields do not match its hash" in p for p in problems)
    with pytest.raises(CommandError, match="seq 5"):
        call_command("verify_ledger", "--archive", str(data), stdout=StringIO())


def test_a_second_archive_goes_on_from_the_first_and_each_links_to_its_neighbours() -> None:
    _ledger()
    _archive("2025-02")
    _requests(MAY, 1, "may")
    rollups_update()

    out = _archive("2025-04")

    first, second = LedgerArchive.objects.order_by("to_seq")
    assert (second.from_seq, second.to_seq, second.prev_hash) == (9, 15, first.last_hash)
    assert "archived seq 10..15 (6 records)" in out
    assert verify_archive(Path(first.path)) == []  # its end links to the next archive
    assert verify_archive(Path(second.path)) == []  # its end links to the first record kept (May)
    assert [r.broken for r in verify_all(workers=1)] == [None]
    assert LedgerRequest.objects.get().request_id == "may.r0"


def test_only_what_the_rollups_have_read_is_archived() -> None:
    _requests(JAN, 3, "jan")
    ledger_verify()

    out = _archive("2025-02")

    assert not LedgerArchive.objects.exists() and LedgerRequest.objects.count() == 3
    assert (
        "nothing to archive before 2025-02 (held back by carbon.rollups.rolled_up_seq (up to seq 0))" in out
    )
    rollups_update()
    assert "archived seq 1..9" in _archive("2025-02")


def test_a_chain_found_broken_is_not_archived() -> None:
    _ledger()
    with connection.cursor() as cur:
        cur.execute("UPDATE ledger_request SET work_units = 7 WHERE request_id = 'jan.r1'")
    ledger_verify(full=True)

    out = _archive("2025-02")

    assert not LedgerArchive.objects.exists() and LedgerRequest.objects.count() == 5
    assert "its verification found it broken" in out and "seq 5" in out


def test_a_dry_run_says_what_would_go_and_changes_nothing(archive_dir: Path) -> None:
    _ledger()

    out = _archive("2025-02", "--dry-run")

    assert f"chain {CHAIN}: would archive seq 1..9 (9 records) (dry run)" in out
    assert not LedgerArchive.objects.exists() and LedgerRequest.objects.count() == 5
    assert not archive_dir.exists()


def test_rows_a_crash_left_behind_an_archive_are_deleted_by_the_next_run() -> None:
    _ledger()
    _archive("2025-02")
    archive = LedgerArchive.objects.get()
    # As if the process died between recording the archive and deleting its rows: put one row back.
    lines = _lines(Path(archive.path))
    LedgerRequest.objects.create(**{k: v for k, v in lines[1]["row"].items() if k != "id"})
    LedgerArchive.objects.update(rows_deleted_at=None)

    out = _archive("2025-02")

    assert "its rows were left by an earlier run: deleted now" in out
    assert not LedgerRequest.objects.filter(request_id__startswith="jan").exists()
    assert LedgerArchive.objects.get().rows_deleted_at is not None


def test_rollups_refuse_to_rebuild_over_archived_records() -> None:
    _ledger()
    _archive("2025-02")

    with pytest.raises(RebuildRefused, match="archived"):
        rollups_rebuild()
    with pytest.raises(CommandError, match="a rebuild from the raw rows would drop their energy"):
        call_command("rollups", "--rebuild", stdout=StringIO())
    call_command("rollups", stdout=StringIO())  # an update still runs


def test_the_retention_setting_names_the_cutoff_and_the_daily_task_acts_on_it(
    settings: Any,
) -> None:
    assert period_before(3, datetime(2025, 5, 31, tzinfo=UTC)) == 202503
    assert period_before(1, datetime(2025, 1, 2, tzinfo=UTC)) == 202501
    assert period_before(14, datetime(2025, 1, 2, tzinfo=UTC)) == 202312
    assert parse_period("2025-02") == 202502
    with pytest.raises(ArchiveError):
        parse_period("2025-13")
    _ledger()
    settings.LEDGER_RETENTION_MONTHS = 0
    assert ledger_archive_task() == [] and not LedgerArchive.objects.exists()
    with pytest.raises(CommandError, match="--before"):
        call_command("ledger_archive", stdout=StringIO())

    settings.LEDGER_RETENTION_MONTHS = 1  # keep this month only: every record here is older

    assert ledger_archive_task() == [f"{CHAIN}: seq 1..15 archived"]
    assert LedgerArchive.objects.get().to_seq == 15 and not LedgerRequest.objects.exists()
    assert [r.broken for r in verify_all(workers=1)] == [None]
    assert ledger_archive(period_before(1)).outcomes[0].note == "nothing before the cutoff"


def _partition_names() -> set[str]:
    return {p.name for p in partitions()}


def test_on_postgresql_the_partitions_of_a_wholly_archived_month_are_dropped() -> None:
    if not partitioned():
        pytest.skip("the ledger is partitioned by month on PostgreSQL only")
    _ledger()
    ensure_partitions(1)  # January's and March's rows leave the default partitions for their own
    assert {"ledger_request_p202501", "ledger_batch_p202501", "ledger_request_p202503"} <= _partition_names()

    out = _archive("2025-02")

    dropped = {"ledger_batch_p202501", "ledger_request_p202501", "ledger_batch_energy_p202501"}
    [line] = [line for line in out.splitlines() if line.startswith("dropped the partitions ")]
    assert (
        set(line.removeprefix("dropped the partitions ").removesuffix(" (wholly archived)").split(", "))
        == dropped
    )
    assert not dropped & _partition_names() and "ledger_request_p202503" in _partition_names()
    assert "9 row(s) deleted" not in out and "0 row(s) deleted" in out  # the DROP took them
    assert [r.broken for r in verify_all(workers=1)] == [None]
    assert verify_archive(Path(LedgerArchive.objects.get().path)) == []


def test_on_postgresql_a_month_another_chain_still_holds_keeps_its_partition_and_loses_the_archived_rows() -> (
    None
):
    if not partitioned():
        pytest.skip("the ledger is partitioned by month on PostgreSQL only")
    _ledger()
    org = OrganizationFactory().pk
    for n in range(2):  # another chain's January, not rolled up yet: held back
        t = int(JAN.timestamp() * 1e9) + n * 1_000_000_000
        append_records("other", one_request_records("other", n, org, "cpu-model", t, 5))
    ensure_partitions(1)

    out = _archive("2025-02")

    assert "chain other: nothing to archive before 2025-02 (held back by carbon.rollups.rolled_up_seq" in out
    assert f"chain {CHAIN}: archived seq 1..9 (9 records)" in out and "9 row(s) deleted" in out
    assert "ledger_request_p202501" in _partition_names()
    assert sorted(LedgerRequest.objects.filter(period=202501).values_list("request_id", flat=True)) == [
        "other.r0",
        "other.r1",
    ]
    assert [r.broken for r in verify_all(workers=1)] == [None, None]


def _beat_schedule(**env: str) -> dict[str, object]:
    """The beat schedule the settings build from ``env`` (a fresh process: the settings read it once)."""
    script = "import json; from carbonledger import settings; print(json.dumps(sorted(settings.CELERY_BEAT_SCHEDULE)))"
    root = Path(__file__).resolve().parents[2]
    out = subprocess.run(
        [sys.executable, "-c", script],
        cwd=root,
        env={**os.environ, **env},
        capture_output=True,
        text=True,
        check=True,
    )
    return {name: True for name in orjson.loads(out.stdout.strip().splitlines()[-1])}


def test_the_beat_archives_daily_only_when_a_retention_is_set() -> None:
    assert "ledger-archive" not in _beat_schedule(LEDGER_RETENTION_MONTHS="0")
    assert "ledger-archive" in _beat_schedule(LEDGER_RETENTION_MONTHS="13")


def test_a_verification_overtaken_by_an_archive_is_done_again_from_the_checkpoint() -> None:
    _ledger()
    chain = LedgerChain.objects.get()
    _archive("2025-02")

    # What a full run that started at genesis just before the archive meets: its first rows deleted under it.
    [report] = verify_chains([(chain, 0, GENESIS)], workers=1)
    assert (report.broken, report.from_seq, report.records) == (None, 9, 6)

    # A real problem after the checkpoint is still found.
    with connection.cursor() as cur:
        cur.execute("UPDATE ledger_request SET work_units = 9 WHERE seq = 11")
    [report] = verify_chains([(chain, 0, GENESIS)], workers=1)
    assert report.broken is not None and (report.broken.seq, report.from_seq) == (11, 9)


def test_one_archive_run_at_a_time() -> None:
    _ledger()
    claim_lease("ledger:archive", owner="elsewhere:1:abc", ttl_s=60)

    with pytest.raises(CommandError, match=r"another archive run is under way .*elsewhere:1:abc"):
        _archive("2025-02")

    assert not LedgerArchive.objects.exists() and LedgerRequest.objects.count() == 5
