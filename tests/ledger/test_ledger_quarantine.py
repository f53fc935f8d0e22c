"""One spooled record the database refuses for its data must not jam the drainer (issue 22, finding 1).

A refused record goes to a quarantine, found by splitting the failing chunk, and its good neighbours are
written; the chain carries a marker in its place so that verification still proves nothing was dropped.
Runs on SQLite and, in the suite's second run, PostgreSQL (the thread path and the preparer-process path).
"""

from __future__ import annotations

import hashlib
import io
import logging
import os
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import orjson
import pytest
from django.core.management import call_command
from django.core.management.base import CommandError
from django.db import DataError, OperationalError, connection

import ledger.writer
from carbonledger.gateway_app import DrainerProcess, LedgerStatusService
from inference.errors import ThreadErrors
from inference.spool import Spool, SpoolPosition
from ledger.models import LedgerChain, LedgerQuarantine, LedgerQuarantineMarker, LedgerRequest
from ledger.records import RecordKind
from ledger.verify import verify_all
from ledger.writer import (
    LedgerWriter,
    append_marker,
    chain_and_insert,
    read_drainer_status,
    write_drainer_status,
)
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


# What the quarantine's error says, per refusal and backend.
REFUSAL_ERRORS = {
    ("integer-out-of-range", "sqlite"): "OverflowError",
    ("integer-out-of-range", "postgresql"): "OverflowError",
    ("too-long", "postgresql"): "value too long for type character varying(256)",
    ("nul", "postgresql"): "0x00",
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


def _quarantine_listing(*args: str) -> str:
    out = io.StringIO()
    call_command("ledger_quarantine", *args, stdout=out)
    return out.getvalue()


def _assert_quarantined(spool: Spool, bad: bytes, error: str) -> LedgerQuarantine:
    """The line is in the quarantine whole, with its error and the position it starts at, and its marker holds
    its hash in the chain."""
    row = LedgerQuarantine.objects.get()
    line = bad.rstrip(b"\n")
    assert bytes(row.line) == line
    assert row.line_sha256 == hashlib.sha256(line).hexdigest()
    assert (row.record_kind, row.record_id, row.state) == ("req", "q.bad2", LedgerQuarantine.QUARANTINED)
    assert error in row.error
    assert spool.read(SpoolPosition.decode(row.spool_position), 1)[0] == [line]
    marker = LedgerQuarantineMarker.objects.get(seq=row.marker_seq)
    assert marker.chain_id == row.chain_id == LedgerChain.objects.get(chain_id=spool.chain_id).pk
    assert (marker.action, marker.line_sha256, marker.spool_position, marker.detail) == (
        "quarantined",
        row.line_sha256,
        row.spool_position,
        row.error,
    )
    return row


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
    spool, good_ids, bad = _spool_with_a_refused_request(tmp_path / "spool", _refusal(refusal))
    writer = LedgerWriter(spool, max_chunk_bytes=SMALL_CHUNK, preparer_min_backlog_bytes=preparer)
    writer.recover()

    writer.drain_all(deadline_s=10)

    assert (writer._preparer is not None) == (preparer is not None and connection.vendor == "postgresql")
    assert sorted(LedgerRequest.objects.values_list("request_id", flat=True)) == sorted(good_ids)
    assert spool.backlog_bytes == 0
    assert [r.broken for r in verify_all()] == [None]
    row = _assert_quarantined(spool, bad, REFUSAL_ERRORS[refusal, connection.vendor])
    listing = _quarantine_listing()
    assert f"#{row.pk} quarantined: req 'q.bad2'" in listing and "1 quarantined record(s) waiting" in listing
    # Every good record and the marker are chained: 4 batches of (batch, 3 requests, interval, idle, energy).
    assert LedgerChain.objects.get(chain_id=spool.chain_id).head_seq == 4 * 7 + 1
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
    status = LedgerStatusService(interval_s=0.05)  # what the gateway's /metrics reads
    writer.start()
    status.start()
    try:
        written = _wait(lambda: spool.backlog_bytes == 0, timeout_s=5)
        counted = _wait(lambda: status.quarantined == 1, timeout_s=5)
    finally:
        writer.stop(timeout_s=5)
        status.stop()
    assert written, f"the spool still holds {spool.backlog_bytes} bytes: {writer.last_error}"
    assert writer.healthy and writer.thread_errors == 0
    assert LedgerRequest.objects.filter(request_id__in=good_ids).count() == len(good_ids)
    assert [r.broken for r in verify_all()] == [None]
    assert counted, status.quarantined
    assert status.prometheus_lines()[-1] == "carbonledger_ledger_quarantined_records 1"
    spool.close()


def test_a_line_that_is_not_json_is_quarantined_and_the_rest_written(tmp_path: Path) -> None:
    org = OrganizationFactory()
    first, first_ids = lines_for_batch(org.pk, requests=2, prefix="j")
    second, second_ids = lines_for_batch(org.pk, requests=2, prefix="j")
    spool = Spool(tmp_path / "spool")
    torn = b'{"k": "req", "request_id": "j.torn\x1b[2J"'  # and a terminal escape, which the listing must not print
    spool.append(b"".join(first) + torn + b"\n" + b"".join(second))
    writer = LedgerWriter(spool)
    writer.recover()

    writer.drain_all(deadline_s=10)

    ids = first_ids + second_ids
    assert LedgerRequest.objects.filter(request_id__in=ids).count() == len(ids)
    assert spool.backlog_bytes == 0
    assert [r.broken for r in verify_all()] == [None]
    listing = _quarantine_listing()
    assert "j.torn\\x1b[2J" in listing and "\x1b" not in listing
    row = LedgerQuarantine.objects.get()
    assert (row.record_kind, row.record_id) == ("", "")  # nothing could be read from it
    assert row.error.startswith("not a JSON record")
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
    assert LedgerQuarantine.objects.get().record_id == "n.bad"
    writer.stop()
    spool.close()


UNTAKEABLE: dict[str, tuple[bytes, str]] = {
    "unknown-kind": (b'{"k":"future","id":"f.1"}', "unknown kind 'future'"),
    "a-marker-from-the-spool": (b'{"k":"quarantine","line_sha256":"0"}', "unknown kind 'quarantine'"),
    "not-an-object": (b'["k","req"]', "not a JSON object"),
    "missing-field": (b'{"k":"idle","interval_id":"u.i"}', "idle record lacks"),
    "id-not-a-value": (b'{"k":"req","request_id":["u.r"]}', "must be plain values"),
}


@pytest.mark.parametrize("untakeable", list(UNTAKEABLE))
def test_a_line_the_writer_cannot_take_is_quarantined_not_skipped(tmp_path: Path, untakeable: str) -> None:
    line, error = UNTAKEABLE[untakeable]
    if untakeable == "id-not-a-value":  # otherwise a whole request record
        record = orjson.loads(lines_for_batch(None, requests=1, prefix="u")[0][2])
        line = orjson.dumps({**record, "request_id": ["u.r"]})
    lines, ids = lines_for_batch(None, requests=2, prefix="u")
    spool = Spool(tmp_path / "spool")
    spool.append(b"".join(lines[:2]) + line + b"\n" + b"".join(lines[2:]))
    writer = LedgerWriter(spool)
    writer.recover()

    writer.drain_all(deadline_s=10)

    assert LedgerRequest.objects.filter(request_id__in=ids).count() == len(ids)
    row = LedgerQuarantine.objects.get()
    assert bytes(row.line) == line and error in row.error
    assert [r.broken for r in verify_all()] == [None]
    writer.stop()
    spool.close()


def test_duplicates_and_a_refused_record_in_one_chunk_skip_the_one_and_quarantine_the_other(
    tmp_path: Path,
) -> None:
    org = OrganizationFactory()
    old, old_ids = lines_for_batch(org.pk, requests=2, prefix="dq")
    with Spool(tmp_path / "first") as first:
        first.append(b"".join(old))
        writer = LedgerWriter(first)
        writer.recover()
        writer.drain_all()
        writer.stop()
    new, new_ids = lines_for_batch(org.pk, requests=2, prefix="dq")
    bad = _req_line(new[2], request_id="dq.bad", work_units=1 << 63)
    second = Spool(tmp_path / "second")  # replays the old batch, then a new one holding a refused record
    second.append(b"".join(old) + b"".join(new[:3]) + bad + b"".join(new[3:]))
    writer = LedgerWriter(second)
    writer.recover()

    writer.drain_all(deadline_s=10)

    assert sorted(LedgerRequest.objects.values_list("request_id", flat=True)) == sorted(old_ids + new_ids)
    assert LedgerQuarantine.objects.get().record_id == "dq.bad"
    assert LedgerChain.objects.get(chain_id=second.chain_id).head_seq == (1 + 2 + 1 + 1 + 1) + 1
    assert [r.broken for r in verify_all()] == [None, None]
    writer.stop()
    second.close()


# The writer thread commits on its own connection, outside a test's transaction (which on SQLite would lock it out).
@pytest.mark.django_db(transaction=True)
def test_the_writer_thread_survives_an_unexpected_error_counts_it_and_goes_on(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    org = OrganizationFactory()
    lines, ids = lines_for_batch(org.pk, requests=2, prefix="t")
    spool = Spool(tmp_path / "spool")
    spool.append(b"".join(lines))
    errors = ThreadErrors()
    writer = LedgerWriter(spool, interval_s=0.02, max_backoff_s=0.05, thread_errors=errors)
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
    assert writer.thread_errors == 3 and errors.count("ledger-writer") == 3  # the tally /metrics shows
    assert writer.healthy
    # Logged once, with its traceback and where the writer stood, not once per retry.
    logged = [r for r in caplog.records if r.levelno >= logging.ERROR]
    assert len(logged) == 1
    assert logged[0].exc_info is not None
    assert spool.chain_id in logged[0].getMessage() and "spool position 0:0" in logged[0].getMessage()
    assert LedgerQuarantine.objects.count() == 0
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
    assert LedgerQuarantine.objects.count() == 0 and LedgerQuarantineMarker.objects.count() == 0
    assert writer.thread_errors == 0  # an outage is waited for, not counted as a failure
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
    assert LedgerQuarantine.objects.count() == 0 and LedgerQuarantineMarker.objects.count() == 0
    assert [r.broken for r in verify_all()] == [None, None]
    writer.stop()
    second.close()


# -- the marker keeps verification honest -----------------------------------------------------------------------


def _drained_with_one_quarantined(tmp_path: Path) -> tuple[Spool, list[str], LedgerQuarantine]:
    spool, good_ids, _bad = _spool_with_a_refused_request(
        tmp_path / "spool", REFUSALS_EVERYWHERE["integer-out-of-range"]
    )
    writer = LedgerWriter(spool, max_chunk_bytes=SMALL_CHUNK)
    writer.recover()
    writer.drain_all(deadline_s=10)
    writer.stop()
    assert [r.broken for r in verify_all()] == [None]
    return spool, good_ids, LedgerQuarantine.objects.get()


TAMPERING: dict[str, Callable[[LedgerQuarantine], object]] = {
    "marker-deleted": lambda row: LedgerQuarantineMarker.objects.filter(seq=row.marker_seq).delete(),
    "marker-altered": lambda row: LedgerQuarantineMarker.objects.filter(seq=row.marker_seq).update(
        spool_position="9:9"
    ),
    "line-deleted": lambda row: LedgerQuarantine.objects.filter(pk=row.pk).delete(),
    "line-altered": lambda row: LedgerQuarantine.objects.filter(pk=row.pk).update(line=b'{"k":"req"}'),
}


@pytest.mark.parametrize("tampering", list(TAMPERING))
def test_deleting_or_altering_a_marker_or_its_line_breaks_verification(
    tmp_path: Path, tampering: str
) -> None:
    spool, _ids, row = _drained_with_one_quarantined(tmp_path)

    TAMPERING[tampering](row)

    [report] = verify_all()
    assert report.broken is not None
    assert report.broken.seq == row.marker_seq
    with pytest.raises(CommandError, match=f"first broken link at seq {row.marker_seq}"):
        call_command("verify_ledger", stdout=io.StringIO())
    spool.close()


def test_a_quarantined_line_keeps_its_exact_position_in_a_chunk_that_spans_segments(tmp_path: Path) -> None:
    org = OrganizationFactory()
    first, first_ids = lines_for_batch(org.pk, requests=2, prefix="s")
    second, second_ids = lines_for_batch(org.pk, requests=2, prefix="s")
    bad = _req_line(second[2], request_id="s.bad", work_units=1 << 63)
    with Spool(tmp_path / "spool") as spool:
        spool.append(b"".join(first))
    spool = Spool(tmp_path / "spool")  # a new process writes a new segment
    spool.append(b"".join(second[:3]) + bad + b"".join(second[3:]))
    writer = LedgerWriter(spool)  # one chunk holds both segments
    writer.recover()

    writer.drain_all(deadline_s=10)

    row = LedgerQuarantine.objects.get()
    position = SpoolPosition.decode(row.spool_position)
    assert position.segment == 2 and position.offset == sum(len(line) for line in second[:3])
    assert spool.read(position, 1)[0] == [bad.rstrip(b"\n")]
    assert LedgerRequest.objects.filter(request_id__in=first_ids + second_ids).count() == 4
    assert [r.broken for r in verify_all()] == [None]
    writer.stop()
    spool.close()


# -- the operator's command: retry after a fix, dismiss ------------------------------------------------------------


def _simulated_refusal(real: Callable[..., None]) -> Callable[..., None]:
    """bulk_insert refusing request rows that hold "q.bad2", as a database refuses a value it cannot take."""

    def refusing(
        kind: RecordKind, rows: list[tuple[object, ...]] | None, payload: bytes | None = None
    ) -> None:
        if kind.kind == "req" and rows and any("q.bad2" in row for row in rows):
            raise DataError("value too long for type character varying(256) (simulated)")
        real(kind, rows, payload)

    return refusing


def test_retry_after_the_refusal_is_fixed_writes_the_record_behind_its_marker_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    spool, _ids, bad = _spool_with_a_refused_request(tmp_path / "spool", {})
    writer = LedgerWriter(spool, max_chunk_bytes=SMALL_CHUNK, preparer_min_backlog_bytes=None)
    writer.recover()
    with monkeypatch.context() as patched:
        patched.setattr(ledger.writer, "bulk_insert", _simulated_refusal(ledger.writer.bulk_insert))
        writer.drain_all(deadline_s=10)
        row = _assert_quarantined(spool, bad, "(simulated)")
        with pytest.raises(CommandError, match="1 quarantined record"):
            _quarantine_listing("--retry")  # still refused: it stays, its attempt counted
        row.refresh_from_db()
        assert (row.state, row.attempts) == (
            LedgerQuarantine.QUARANTINED,
            1,
        ) and "(simulated)" in row.last_error
    head = LedgerChain.objects.get(chain_id=spool.chain_id).head_seq

    out = _quarantine_listing("--retry")  # the fix is in

    assert "1 record(s) retried, 0 still quarantined" in out
    row.refresh_from_db()
    assert row.state == LedgerQuarantine.RETRIED and row.resolved_seq == head + 1
    retried = LedgerQuarantineMarker.objects.get(seq=head + 1)
    assert (retried.action, retried.marker_seq, retried.line_sha256) == (
        "retried",
        row.marker_seq,
        row.line_sha256,
    )
    assert LedgerRequest.objects.get(request_id="q.bad2").seq == head + 2
    assert [r.broken for r in verify_all()] == [None]
    assert "no quarantined records" in _quarantine_listing()
    assert f"retried at seq {head + 1}" in _quarantine_listing("--all")
    # Twice is harmless: nothing is quarantined any more, nothing is written.
    assert "0 record(s) retried, 0 still quarantined" in _quarantine_listing("--retry")
    assert LedgerChain.objects.get(chain_id=spool.chain_id).head_seq == head + 2
    # The writer goes on after the retry's records, chaining from the head the retry left.
    more, more_ids = lines_for_batch(None, requests=1, prefix="after")
    spool.append(b"".join(more))
    writer.drain_all(deadline_s=10)
    assert LedgerRequest.objects.filter(request_id__in=more_ids).count() == 1
    assert [r.broken for r in verify_all()] == [None]
    writer.stop()
    spool.close()


def test_retry_after_widening_the_column_writes_a_record_postgresql_refused(tmp_path: Path) -> None:
    if connection.vendor != "postgresql":
        pytest.skip("SQLite does not refuse a long value")
    spool, _ids, bad = _spool_with_a_refused_request(tmp_path / "spool", REFUSALS_POSTGRES["too-long"])
    writer = LedgerWriter(spool, max_chunk_bytes=SMALL_CHUNK, preparer_min_backlog_bytes=0)
    writer.recover()
    writer.drain_all(deadline_s=10)
    _assert_quarantined(spool, bad, "value too long")
    with connection.cursor() as cur:  # the fix (rolled back with the test's transaction)
        cur.execute("ALTER TABLE ledger_request ALTER COLUMN client_request_id TYPE varchar(512)")

    assert "1 record(s) retried" in _quarantine_listing("--retry")

    assert LedgerRequest.objects.get(request_id="q.bad2").client_request_id == "x" * 300
    assert [r.broken for r in verify_all()] == [None]
    writer.stop()
    spool.close()


def test_a_retried_marker_followed_by_another_record_than_its_line_breaks_verification(
    tmp_path: Path,
) -> None:
    spool, _ids, row = _drained_with_one_quarantined(tmp_path)
    chain = LedgerChain.objects.get(chain_id=spool.chain_id)
    head = chain.head_seq
    # What a faulty retry would write: a retried marker for the line, then a record that is not the line's.
    append_marker(
        chain,
        action="retried",
        line_sha256=row.line_sha256,
        spool_position=row.spool_position,
        record_kind="req",
        record_id="q.bad2",
        detail="",
        marker_seq=row.marker_seq,
        created_ns=1,
    )
    chain_and_insert(chain, [{**orjson.loads(bytes(row.line)), "work_units": 1}])
    chain.save(update_fields=["head_seq", "head_hash"])

    [report] = verify_all()

    assert report.broken is not None and report.broken.seq == head + 2
    assert "not the record of its quarantined line" in report.broken.problem
    spool.close()


def test_dismissing_a_line_that_can_never_be_written_resolves_it_in_the_chain(tmp_path: Path) -> None:
    spool, _ids, row = _drained_with_one_quarantined(tmp_path)
    head = LedgerChain.objects.get(chain_id=spool.chain_id).head_seq
    with pytest.raises(CommandError, match="reason"):
        _quarantine_listing("--dismiss", str(row.pk))

    out = _quarantine_listing(
        "--dismiss", str(row.pk), "--reason", "no meter counts that much", "--actor", "ops"
    )

    assert "1 record(s) dismissed" in out
    row.refresh_from_db()
    assert row.state == LedgerQuarantine.DISMISSED and row.resolved_seq == head + 1
    dismissed = LedgerQuarantineMarker.objects.get(seq=head + 1)
    assert (dismissed.action, dismissed.detail) == (
        "dismissed",
        "dismissed by ops: no meter counts that much",
    )
    assert [r.broken for r in verify_all()] == [None]
    assert "no quarantined records" in _quarantine_listing()
    assert "0 record(s) dismissed" in _quarantine_listing("--dismiss", str(row.pk), "--reason", "again")
    spool.close()


# -- /metrics -------------------------------------------------------------------------------------------------------


def test_the_status_service_counts_the_unresolved_quarantined_lines(tmp_path: Path) -> None:
    spool, _ids, row = _drained_with_one_quarantined(tmp_path)
    status = LedgerStatusService(interval_s=60)
    assert status.prometheus_lines() == []  # nothing said before the first count

    status.refresh()

    assert status.prometheus_lines()[1:] == [
        "# TYPE carbonledger_ledger_quarantined_records gauge",
        "carbonledger_ledger_quarantined_records 1",
    ]
    _quarantine_listing("--dismiss", str(row.pk), "--reason", "test")
    status.refresh()
    assert status.prometheus_lines()[-1] == "carbonledger_ledger_quarantined_records 0"
    spool.close()


def test_the_drainer_process_thread_errors_reach_the_gateways_tally(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    errors = ThreadErrors()
    monkeypatch.setattr("carbonledger.gateway_app.THREAD_ERRORS", errors)
    drainer = DrainerProcess(tmp_path)
    ours = os.getpid()  # stands for a drainer process this gateway started
    drainer._mirrored[ours] = {}
    write_drainer_status(tmp_path, {"ledger-writer": 2})
    assert read_drainer_status(tmp_path) == (ours, {"ledger-writer": 2})

    drainer.mirror_thread_errors()
    drainer.mirror_thread_errors()  # nothing new: nothing counted twice
    assert errors.count("ledger-writer") == 2
    write_drainer_status(tmp_path, {"ledger-writer": 3})
    drainer.mirror_thread_errors()
    assert errors.count("ledger-writer") == 3

    DrainerProcess(tmp_path).mirror_thread_errors()  # another gateway's: it did not start that process
    assert errors.count("ledger-writer") == 3


def test_the_drainer_watchdog_survives_a_failed_restart_and_restarts_it_later(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    errors = ThreadErrors()
    monkeypatch.setattr("carbonledger.gateway_app.THREAD_ERRORS", errors)
    drainer = DrainerProcess(tmp_path)
    spawns: list[subprocess.Popen[bytes]] = []

    def spawn() -> None:
        if len(spawns) == 1:
            spawns.append(spawns[0])  # counts the attempt
            raise OSError("injected: cannot start a process")
        # The first drainer exits at once (as if it crashed); the one after the failed restart stays up.
        code = "pass" if not spawns else "import time; time.sleep(60)"
        drainer.proc = subprocess.Popen([sys.executable, "-c", code])
        spawns.append(drainer.proc)

    monkeypatch.setattr(drainer, "_spawn", spawn)
    drainer.start()
    try:
        assert _wait(lambda: len(spawns) == 3, timeout_s=10), len(spawns)
        assert drainer._watchdog is not None and drainer._watchdog.is_alive()
    finally:
        drainer.stop()
    assert errors.count("ledger-writer-watchdog") == 1
    assert spawns[-1].poll() is not None  # stopped with the watchdog
