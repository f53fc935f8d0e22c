"""Verification in several processes (issue 24): chains and seq segments of one chain are checked side by side,
and the reports are exactly those of one pass, first broken link included, wherever the segments' bounds fall.

The tests that fork workers commit their rows (``transaction=True``): a worker's own connection sees only what
is committed. Runs on SQLite and, in the suite's second run, PostgreSQL.
"""

from __future__ import annotations

import hashlib
import threading
from collections.abc import Callable
from io import StringIO
from pathlib import Path

import orjson
import pytest
from django.core.management import call_command
from django.core.management.base import CommandError
from django.db import connection, transaction
from django.utils import timezone

from inference.spool import Spool
from ledger import verify as verify_module
from ledger.models import (
    LedgerAdjustment,
    LedgerBatchEnergy,
    LedgerChain,
    LedgerQuarantine,
    LedgerRequest,
    LedgerVerification,
)
from ledger.records import GENESIS
from ledger.services import ledger_verify
from ledger.verify import ChainReport, verify_all, verify_chain
from ledger.writer import LedgerWriter, append_marker, chain_and_insert
from tests.factories import OrganizationFactory
from tests.support.ledger import lines_for_batch

pytestmark = pytest.mark.django_db(transaction=True)

SEGMENT_SIZES = [1, 2, 3, 4, 5, 7, 20]


def _ledger(tmp_path: Path, batches: int = 3, chains: int = 1) -> list[str]:
    """``batches`` batches (7 records each) in each of ``chains`` chains; returns the chain ids."""
    org = OrganizationFactory()
    ids = []
    for n in range(chains):
        spool = Spool(tmp_path / f"spool{n}")
        for _ in range(batches):
            spool.append(b"".join(lines_for_batch(org.pk, prefix=f"c{n}")[0]))
        writer = LedgerWriter(spool)
        writer.recover()
        writer.drain_all()
        writer.stop()
        ids.append(spool.chain_id)
        spool.close()
    return ids


def _one_pass() -> list[ChainReport]:
    return verify_all(workers=1)


def _assert_same_in_segments(expected: list[ChainReport]) -> None:
    for size in SEGMENT_SIZES:
        assert verify_all(workers=4, segment_records=size) == expected, f"segments of {size} records"


def _seq_of(model: type, index: int) -> int:
    return int(model.objects.order_by("seq").values_list("seq", flat=True)[index])


def _execute(sql: str, params: list[object]) -> None:
    with connection.cursor() as cur:
        cur.execute(sql, params)


TAMPERING: dict[str, Callable[[], None]] = {
    "changed-field": lambda: _execute(
        "UPDATE ledger_request SET work_units = work_units + 1 WHERE seq = %s", [_seq_of(LedgerRequest, 4)]
    ),
    "deleted-record": lambda: _execute(
        "DELETE FROM ledger_request WHERE seq = %s", [_seq_of(LedgerRequest, 2)]
    ),
    "deleted-run-of-records": lambda: [
        _execute(f"DELETE FROM {table} WHERE seq BETWEEN 5 AND 11", [])
        for table in (
            "ledger_batch",
            "ledger_request",
            "ledger_interval",
            "ledger_idle",
            "ledger_batch_energy",
        )
    ],
    "prev-hash-replaced": lambda: _execute(
        "UPDATE ledger_request SET prev_hash = %s WHERE seq = %s", ["f" * 64, _seq_of(LedgerRequest, 3)]
    ),
    "two-swapped": lambda: _swap(*LedgerRequest.objects.order_by("seq")[3:5]),
    "newest-deleted": lambda: LedgerBatchEnergy.objects.filter(
        seq=LedgerChain.objects.get().head_seq
    ).delete(),
    "newest-run-deleted": lambda: [
        _execute(f"DELETE FROM {table} WHERE seq > 9", [])
        for table in (
            "ledger_batch",
            "ledger_request",
            "ledger_interval",
            "ledger_idle",
            "ledger_batch_energy",
        )
    ],
    "seq-twice": lambda: _copy_as_adjustment(_seq_of(LedgerRequest, 4)),
    "head-hash": lambda: LedgerChain.objects.update(head_hash="e" * 64),
}


def _swap(a: LedgerRequest, b: LedgerRequest) -> None:
    with transaction.atomic():
        _execute("UPDATE ledger_request SET seq = -1 WHERE id = %s", [a.pk])
        _execute("UPDATE ledger_request SET seq = %s WHERE id = %s", [a.seq, b.pk])
        _execute("UPDATE ledger_request SET seq = %s WHERE id = %s", [b.seq, a.pk])


def _copy_as_adjustment(seq: int) -> None:
    """A forged record at a seq the chain already has (another table, so no unique index stops it)."""
    record = LedgerRequest.objects.get(seq=seq)
    LedgerAdjustment.objects.create(
        chain_id=record.chain_id,
        seq=seq,
        prev_hash=record.prev_hash,
        hash=record.hash,
        target_kind="request",
        target_id=record.request_id,
        energy_delta_uj=1,
        reason="forged",
        actor="x",
        created_ns=1,
    )


def test_a_chain_split_across_four_workers_verifies_intact(tmp_path: Path) -> None:
    _ledger(tmp_path, batches=4)
    head = LedgerChain.objects.get().head_seq

    expected = [
        ChainReport(LedgerChain.objects.get().chain_id, head, head, LedgerChain.objects.get().head_hash, None)
    ]
    assert _one_pass() == expected
    _assert_same_in_segments(expected)


def test_several_chains_in_workers_give_each_chain_its_report(tmp_path: Path) -> None:
    ids = _ledger(tmp_path, batches=2, chains=3)
    LedgerRequest.objects.filter(request_id__startswith="c1.").order_by("seq").filter(
        pk=LedgerRequest.objects.filter(request_id__startswith="c1.").order_by("seq")[1].pk
    ).update(work_units=99)

    reports = _one_pass()

    assert [r.chain_id for r in reports] == [LedgerChain.objects.get(chain_id=i).chain_id for i in ids]
    assert [r.broken is None for r in reports] == [True, False, True]
    _assert_same_in_segments(reports)


@pytest.mark.parametrize("tampering", list(TAMPERING))
def test_workers_name_the_same_first_broken_link_as_one_pass(tmp_path: Path, tampering: str) -> None:
    _ledger(tmp_path)
    assert [r.broken for r in _one_pass()] == [None]

    TAMPERING[tampering]()

    expected = _one_pass()
    assert expected[0].broken is not None
    _assert_same_in_segments(expected)


@pytest.mark.parametrize("which", ["last-of-a-segment", "first-of-the-next"])
def test_a_break_exactly_at_a_segment_boundary_is_named_at_its_seq(tmp_path: Path, which: str) -> None:
    _ledger(tmp_path)
    size = 7  # segments 1..7, 8..14, 15..21: a batch record opens each
    target = size if which == "last-of-a-segment" else size + 1
    if which == "last-of-a-segment":  # seq 7 is a batch's energy row: its fields changed
        _execute("UPDATE ledger_batch_energy SET final = NOT final WHERE seq = %s", [target])
        problem = "do not match its hash"
    else:  # seq 8 is the next batch: its link to seq 7 replaced, which only the parent sees
        _execute("UPDATE ledger_batch SET prev_hash = %s WHERE seq = %s", ["f" * 64, target])
        problem = "prev_hash does not match"

    [report] = verify_all(workers=4, segment_records=size)

    assert report.broken is not None and report.broken.seq == target and problem in report.broken.problem
    assert report.records == target - 1
    assert [report] == _one_pass()


def _retried_marker_then(tmp_path: Path, record_change: dict[str, object]) -> int:
    """A quarantined line, a retried marker for it at the chain's head and then a record (the line's, changed by
    ``record_change``): returns the retried marker's seq."""
    _ledger(tmp_path, batches=2)
    chain = LedgerChain.objects.get()
    line = orjson.dumps({**orjson.loads(lines_for_batch(None, prefix="q")[0][2]), "request_id": "q.late"})
    sha = hashlib.sha256(line).hexdigest()
    with transaction.atomic():
        marker = append_marker(
            chain,
            action="quarantined",
            line_sha256=sha,
            spool_position="1:0",
            record_kind="req",
            record_id="q.late",
            detail="refused",
            marker_seq=0,
            created_ns=1,
        )
        LedgerQuarantine.objects.create(
            chain=chain,
            marker_seq=marker,
            spool_position="1:0",
            line=line,
            line_sha256=sha,
            record_kind="req",
            record_id="q.late",
            error="refused",
            created_at=timezone.now(),
            state=LedgerQuarantine.RETRIED,
        )
        for n in range(3):  # records between the marker and its retry
            chain_and_insert(chain, [{**orjson.loads(line), "request_id": f"q.between{n}"}])
        retried = append_marker(
            chain,
            action="retried",
            line_sha256=sha,
            spool_position="1:0",
            record_kind="req",
            record_id="q.late",
            marker_seq=marker,
            created_ns=2,
        )
        chain_and_insert(chain, [{**orjson.loads(line), **record_change}])
        chain_and_insert(chain, [{**orjson.loads(line), "request_id": "q.after"}])
        chain.save()
    return retried


def test_a_retried_marker_ending_a_segment_is_followed_by_its_line_in_the_next(tmp_path: Path) -> None:
    retried = _retried_marker_then(tmp_path, {})

    [report] = verify_all(workers=4, segment_records=retried)

    assert report.broken is None
    assert [report] == _one_pass()
    _assert_same_in_segments([report])


def test_a_retried_marker_ending_a_segment_followed_by_another_record_breaks_at_the_next(
    tmp_path: Path,
) -> None:
    retried = _retried_marker_then(tmp_path, {"work_units": 1})

    [report] = verify_all(workers=4, segment_records=retried)

    assert report.broken is not None and report.broken.seq == retried + 1
    assert "not the record of its quarantined line" in report.broken.problem
    assert [report] == _one_pass()
    _assert_same_in_segments([report])


def test_verification_runs_record_each_chain_and_resume_from_the_last_in_workers(tmp_path: Path) -> None:
    _ledger(tmp_path, batches=2, chains=2)

    first = ledger_verify(workers=4)
    assert [(v.from_seq, v.intact) for v in first] == [(0, True), (0, True)]
    assert [v.seq for v in first] == list(
        LedgerChain.objects.order_by("pk").values_list("head_seq", flat=True)
    )
    again = ledger_verify(workers=4)
    assert [(v.from_seq, v.records, v.intact) for v in again] == [
        (first[0].seq, 0, True),
        (first[1].seq, 0, True),
    ]
    LedgerRequest.objects.filter(pk=LedgerRequest.objects.order_by("seq").first().pk).update(work_units=5)
    full = ledger_verify(full=True, workers=4)
    assert sum(not v.intact for v in full) == 1
    assert LedgerVerification.objects.count() == 6


def test_verify_ledger_takes_the_number_of_workers(tmp_path: Path) -> None:
    _ledger(tmp_path, batches=2, chains=2)
    out = StringIO()
    call_command("verify_ledger", "--workers", "3", stdout=out)
    assert "ledger intact: 2 chain(s), 28 records" in out.getvalue()
    with pytest.raises(CommandError, match="--workers"):
        call_command("verify_ledger", "--workers", "0", stdout=StringIO())


def test_a_chain_verified_from_a_point_checks_the_link_to_it(tmp_path: Path) -> None:
    _ledger(tmp_path)
    chain = LedgerChain.objects.get()
    at = LedgerRequest.objects.order_by("seq")[3]

    assert verify_chain(chain, at.seq, at.hash, workers=4, segment_records=2).broken is None
    broken = verify_chain(chain, at.seq, GENESIS, workers=4, segment_records=2).broken
    assert broken is not None and broken.seq == at.seq + 1 and "prev_hash" in broken.problem


def test_a_process_with_other_threads_never_forks_its_workers() -> None:
    # Forking a process that runs other threads (the Celery worker's thread pool) can leave a child waiting
    # forever on a lock a thread held at the fork: verification there deadlocked the worker.
    assert verify_module.start_method_for(threads=1, pooled=False, in_memory=False) == "fork"
    # A forked child sees a database in this process's memory.
    assert verify_module.start_method_for(threads=1, pooled=False, in_memory=True) == "fork"
    assert verify_module.start_method_for(threads=2, pooled=False, in_memory=False) == "spawn"
    assert verify_module.start_method_for(threads=2, pooled=False, in_memory=True) is None
    assert verify_module.start_method_for(threads=1, pooled=True, in_memory=False) == "spawn"
    # This process, with one more thread than it had (earlier tests may have left some, gRPC's poller say).
    release = threading.Event()
    other = threading.Thread(target=release.wait, daemon=True)
    other.start()
    try:
        method = verify_module.worker_start_method()
    finally:
        release.set()
        other.join()
    if connection.vendor == "sqlite" and connection.is_in_memory_db():
        assert (
            method is None
        )  # a fresh interpreter cannot see a database in this process's memory: no workers
    else:
        assert method == "spawn"


def test_workers_spawned_from_a_threaded_process_give_the_one_pass_reports(tmp_path: Path) -> None:
    _ledger(tmp_path, batches=3, chains=2)
    LedgerRequest.objects.filter(pk=LedgerRequest.objects.order_by("pk")[4].pk).update(work_units=7)
    expected = _one_pass()
    release = threading.Event()
    other = threading.Thread(target=release.wait, daemon=True)
    other.start()
    try:
        got = verify_all(workers=2, segment_records=5)
    finally:
        release.set()
        other.join()
    assert got == expected
    assert expected[0].broken is not None or expected[1].broken is not None


def test_a_pooled_database_never_forks_its_workers(monkeypatch: pytest.MonkeyPatch) -> None:
    # A forked child would take over the pool's open sockets while the parent still uses them (the fleet test saw
    # PostgreSQL answer EMPTY_QUERY to a worker's cursor).
    monkeypatch.setitem(connection.settings_dict, "OPTIONS", {"pool": {"min_size": 1, "max_size": 2}})
    in_memory = connection.vendor == "sqlite" and connection.is_in_memory_db()
    assert verify_module.worker_start_method() == (None if in_memory else "spawn")
