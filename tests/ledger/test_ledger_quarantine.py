"""One spooled record the database refuses for its data must not jam the drainer (issue 22, finding 1).

A refused record goes to a quarantine, found by splitting the failing chunk, and its good neighbours are
written; the chain carries a marker in its place so that verification still proves nothing was dropped.
Runs on SQLite and, in the suite's second run, PostgreSQL (the thread path and the preparer-process path).
"""

from __future__ import annotations

import io
import time
from collections.abc import Callable
from pathlib import Path

import orjson
import pytest
from django.core.management import call_command
from django.db import OperationalError, connection

import ledger.writer
from inference.spool import Spool
from ledger.models import LedgerChain, LedgerRequest
from ledger.verify import verify_all
from ledger.writer import LedgerWriter
from tests.factories import OrganizationFactory
from tests.support.ledger import batch_energy_record, lines_for_batch

pytestmark = pytest.mark.django_db

SMALL_CHUNK = 1_000  # bytes: a batch of lines_for_batch spans several chunks
PREPARERS = [None, 0]  # on PostgreSQL, 0 prepares every chunk ahead in the preparer process


def _req_line(line: bytes, **change: object) -> bytes:
    """A request line of ``lines_for_batch`` with fields changed (a new request id, so it is no duplicate)."""
    record = orjson.loads(line)
    assert record["k"] == "req"
    record.update(change)
    return orjson.dumps(record) + b"\n"


# What the database refuses for its data, on both backends: a bigint out of range (SQLite: OverflowError).
REFUSALS_EVERYWHERE: dict[str, dict[str, object]] = {
    "integer-out-of-range": {"work_units": 1 << 63},
}
# What only PostgreSQL refuses (SQLite stores it): a value over its column's length, a NUL in a string.
REFUSALS_POSTGRES: dict[str, dict[str, object]] = {
    "too-long": {"client_request_id": "x" * 300},
    "nul": {"model": "lin\u0000ear"},
}


def _refusals() -> list[str]:
    return [*REFUSALS_EVERYWHERE, *REFUSALS_POSTGRES]


def _refusal(name: str) -> dict[str, object]:
    if name in REFUSALS_POSTGRES and connection.vendor != "postgresql":
        pytest.skip("SQLite stores this value")
    return {**REFUSALS_EVERYWHERE, **REFUSALS_POSTGRES}[name]


def _spool_with_a_refused_request(
    path: Path, change: dict[str, object], batches: int = 4
) -> tuple[Spool, list[str], bytes]:
    """A spool of good batches with one refused request line in the middle of the third batch."""
    org = OrganizationFactory()
    spool = Spool(path)
    good_ids: list[str] = []
    bad = b""
    for n in range(batches):
        lines, ids = lines_for_batch(org.pk, requests=3, prefix="q")
        if n == 2:
            bad = _req_line(lines[2], request_id=f"q.bad{n}", **change)
            lines = [*lines[:3], bad, *lines[3:]]
        good_ids.extend(ids)
        spool.append(b"".join(lines))
    return spool, good_ids, bad


def _quarantine_listing() -> str:
    out = io.StringIO()
    call_command("ledger_quarantine", stdout=out)
    return out.getvalue()


def _wait(predicate: Callable[[], bool], timeout_s: float) -> bool:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.02)
    return True


@pytest.mark.parametrize("preparer", PREPARERS)
@pytest.mark.parametrize("refusal", _refusals())
def test_a_record_the_database_refuses_is_quarantined_and_its_neighbours_are_written(
    tmp_path: Path, refusal: str, preparer: int | None
) -> None:
    spool, good_ids, _bad = _spool_with_a_refused_request(tmp_path / "spool", _refusal(refusal))
    writer = LedgerWriter(spool, max_chunk_bytes=SMALL_CHUNK, preparer_min_backlog_bytes=preparer)
    writer.recover()

    writer.drain_all(deadline_s=10)

    assert sorted(LedgerRequest.objects.values_list("request_id", flat=True)) == sorted(good_ids)
    assert spool.backlog_bytes == 0
    assert [r.broken for r in verify_all()] == [None]
    assert "q.bad2" in _quarantine_listing()
    writer.stop()
    spool.close()


# The writer thread commits on its own connection, outside a test's transaction (which on SQLite would lock it out).
@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("refusal", _refusals())
def test_the_writer_service_writes_the_good_records_within_seconds_despite_a_refused_one(
    tmp_path: Path, refusal: str
) -> None:
    spool, good_ids, _bad = _spool_with_a_refused_request(tmp_path / "spool", _refusal(refusal))
    writer = LedgerWriter(spool, interval_s=0.05, max_backoff_s=0.2, max_chunk_bytes=SMALL_CHUNK)
    writer.recover()
    writer.start()
    try:
        written = _wait(lambda: spool.backlog_bytes == 0, timeout_s=5)
    finally:
        writer.stop(timeout_s=5)
    assert written, f"the spool still holds {spool.backlog_bytes} bytes: {writer.last_error}"
    assert writer.healthy
    assert LedgerRequest.objects.filter(request_id__in=good_ids).count() == len(good_ids)
    assert [r.broken for r in verify_all()] == [None]
    spool.close()


def test_a_line_that_is_not_json_is_quarantined_and_the_rest_written(tmp_path: Path) -> None:
    org = OrganizationFactory()
    first, first_ids = lines_for_batch(org.pk, requests=2, prefix="j")
    second, second_ids = lines_for_batch(org.pk, requests=2, prefix="j")
    spool = Spool(tmp_path / "spool")
    spool.append(b"".join(first) + b'{"k": "req", "request_id": "j.torn"\n' + b"".join(second))
    writer = LedgerWriter(spool)
    writer.recover()

    writer.drain_all(deadline_s=10)

    ids = first_ids + second_ids
    assert LedgerRequest.objects.filter(request_id__in=ids).count() == len(ids)
    assert spool.backlog_bytes == 0
    assert [r.broken for r in verify_all()] == [None]
    assert "j.torn" in _quarantine_listing()
    writer.stop()
    spool.close()


def test_a_record_the_normaliser_refuses_is_quarantined_and_the_rest_written(tmp_path: Path) -> None:
    org = OrganizationFactory()
    lines, ids = lines_for_batch(org.pk, requests=2, prefix="n")
    split = batch_energy_record("n.bad", "n.i-bad", ["n.x1", "n.x2"], [7, 3])
    refused = orjson.dumps({**split, "shares_uj": [7, 4]}) + b"\n"  # adds up to 11, not its energy_uj 10
    spool = Spool(tmp_path / "spool")
    spool.append(b"".join(lines[:3]) + refused + b"".join(lines[3:]))
    writer = LedgerWriter(spool)
    writer.recover()

    writer.drain_all(deadline_s=10)

    assert LedgerRequest.objects.filter(request_id__in=ids).count() == len(ids)
    assert spool.backlog_bytes == 0
    assert [r.broken for r in verify_all()] == [None]
    assert "add up to 11" in _quarantine_listing()
    writer.stop()
    spool.close()


# The writer thread commits on its own connection, outside a test's transaction (which on SQLite would lock it out).
@pytest.mark.django_db(transaction=True)
def test_the_writer_thread_survives_an_unexpected_error_counts_it_and_goes_on(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    org = OrganizationFactory()
    lines, ids = lines_for_batch(org.pk, requests=2, prefix="t")
    spool = Spool(tmp_path / "spool")
    spool.append(b"".join(lines))
    writer = LedgerWriter(spool, interval_s=0.02, max_backoff_s=0.05)
    writer.recover()
    real = writer.drain_available
    failures = [0]

    def failing_three_times(**kwargs: object) -> int:
        if failures[0] < 3:
            failures[0] += 1
            raise RuntimeError("injected failure")
        return real(**kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(writer, "drain_available", failing_three_times)
    writer.start()
    try:
        assert _wait(lambda: spool.backlog_bytes == 0, timeout_s=5)
    finally:
        writer.stop(timeout_s=5)

    assert LedgerRequest.objects.filter(request_id__in=ids).count() == len(ids)
    assert writer.thread_errors == 3
    assert writer.healthy
    # Logged once, with its traceback and where the writer stood, not once per retry.
    logged = [r for r in caplog.records if "injected failure" in r.getMessage() or r.exc_info]
    assert len(logged) == 1
    assert spool.chain_id in logged[0].getMessage()
    spool.close()


# The writer thread commits on its own connection, outside a test's transaction (which on SQLite would lock it out).
@pytest.mark.django_db(transaction=True)
def test_a_database_outage_is_retried_and_quarantines_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    org = OrganizationFactory()
    lines, ids = lines_for_batch(org.pk, requests=2, prefix="o")
    spool = Spool(tmp_path / "spool")
    spool.append(b"".join(lines))
    writer = LedgerWriter(spool, interval_s=0.02, max_backoff_s=0.05)
    writer.recover()
    real = ledger.writer.bulk_insert
    outages = [0]

    def unreachable(*args: object, **kwargs: object) -> None:
        if outages[0] < 3:
            outages[0] += 1
            raise OperationalError("connection to server at 127.0.0.1, port 5432 failed: Connection refused")
        real(*args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(ledger.writer, "bulk_insert", unreachable)
    writer.start()
    try:
        assert _wait(lambda: spool.backlog_bytes == 0, timeout_s=5)
    finally:
        writer.stop(timeout_s=5)

    assert outages[0] == 3
    assert LedgerRequest.objects.filter(request_id__in=ids).count() == len(ids)
    assert "no quarantined records" in _quarantine_listing()
    assert [r.broken for r in verify_all()] == [None]
    spool.close()


def test_a_duplicate_request_id_is_still_skipped_not_quarantined(tmp_path: Path) -> None:
    org = OrganizationFactory()
    old, old_ids = lines_for_batch(org.pk, requests=2, prefix="d")
    first = Spool(tmp_path / "first")
    first.append(b"".join(old))
    writer = LedgerWriter(first)
    writer.recover()
    writer.drain_all()
    writer.stop()
    first.close()
    new, new_ids = lines_for_batch(org.pk, requests=2, prefix="d")
    second = Spool(tmp_path / "second")
    second.append(b"".join(old) + b"".join(new))
    writer = LedgerWriter(second)
    writer.recover()

    writer.drain_all()

    assert LedgerRequest.objects.filter(request_id__in=old_ids + new_ids).count() == 4
    chain = LedgerChain.objects.get(chain_id=second.chain_id)
    assert chain.head_seq == 1 + 2 + 1 + 1 + 1  # only the new batch
    assert "no quarantined records" in _quarantine_listing()
    assert [r.broken for r in verify_all()] == [None, None]
    writer.stop()
    second.close()
