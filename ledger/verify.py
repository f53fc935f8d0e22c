"""Verification of the ledger's hash chains (reads only).

For each chain, the records of every kind are merged in ``seq`` order (streamed, so millions
of rows fit in little memory) and each link is checked: consecutive seq numbers from 1,
``prev_hash`` equal to the previous record's hash, and the hash recomputed from the record's
own fields. The chain row's head must match the last record, so deleting the newest records
is caught too. The first broken link is named.

Quarantine markers (records the database refused for their data) are links like any other, and more: a
``quarantined`` marker's line must still be in the quarantine, unchanged (its sha256); a ``retried`` or
``dismissed`` marker must name an earlier ``quarantined`` marker of the same line; and a ``retried`` marker
must be followed by the very record of that line.
"""

from __future__ import annotations

import hashlib
import heapq
import threading
from collections.abc import Iterator
from dataclasses import dataclass, replace
from multiprocessing import get_context
from typing import Any

import orjson
from django.conf import settings
from django.db import connections

from ledger import verify_worker
from ledger.models import LedgerArchive, LedgerChain, LedgerQuarantine, LedgerQuarantineMarker
from ledger.records import GENESIS, KINDS, RecordKind, link_hash, normalize


@dataclass(frozen=True)
class BrokenLink:
    chain_id: str
    seq: int
    kind: str
    table: str
    pk: int | None
    problem: str

    def __str__(self) -> str:
        where = f"{self.kind} record id {self.pk} ({self.table})" if self.pk is not None else "chain head"
        return f"chain {self.chain_id}: first broken link at seq {self.seq}, {where}: {self.problem}"


@dataclass(frozen=True)
class ChainReport:
    chain_id: str
    records: int
    head_seq: int
    head_hash: str
    broken: BrokenLink | None
    from_seq: int = (
        0  # where it started: 0 from genesis, else an earlier verified point or an archive checkpoint
    )


def _rows(
    chain: LedgerChain, kind: RecordKind, after_seq: int, to_seq: int
) -> Iterator[tuple[int, str, int, str, str, tuple[Any, ...]]]:
    columns = ["seq", "pk", "prev_hash", "hash", *kind.fields]
    qs = (
        # Up to the head as read (``to_seq`` at most): a writer appending meanwhile is not a broken chain.
        kind.model._default_manager.filter(chain=chain, seq__gt=after_seq, seq__lte=to_seq)
        .order_by("seq")
        .values_list(*columns)
    )
    for row in qs.iterator(chunk_size=20_000):
        seq, pk, prev, digest, *values = row
        yield seq, kind.kind, pk, prev, digest, tuple(values)


def _next_record(chain: LedgerChain, after_seq: int) -> tuple[int, str, int] | None:
    """The first record after ``after_seq`` up to the head (seq, kind, pk), in the order the merge reads them."""
    found = []
    for order, kind in enumerate(KINDS.values()):
        row = (
            kind.model._default_manager.filter(chain=chain, seq__gt=after_seq, seq__lte=chain.head_seq)
            .order_by("seq")
            .values_list("seq", "pk")
            .first()
        )
        if row is not None:
            found.append((row[0], order, kind.kind, row[1]))
    if not found:
        return None
    seq, _, kind_name, pk = min(found)
    return seq, kind_name, pk


class _Quarantine:
    """A chain's quarantine markers and quarantined lines, read once (there are few), to check the markers."""

    _ACTION, _SHA, _MARKER_SEQ = (
        KINDS["quarantine"].fields.index(n) for n in ("action", "line_sha256", "marker_seq")
    )

    def __init__(self, chain: LedgerChain) -> None:
        self.markers = {
            seq: (action, sha)
            for seq, action, sha in LedgerQuarantineMarker.objects.filter(chain=chain).values_list(
                "seq", "action", "line_sha256"
            )
        }
        self.lines: dict[int, bytes] = {}
        if self.markers:
            self.lines = {
                seq: bytes(line)
                for seq, line in LedgerQuarantine.objects.filter(chain=chain).values_list(
                    "marker_seq", "line"
                )
            }
        # (seq, kind, hash) the record after a retried marker must have: the line's own record, chained there.
        self.expected: tuple[int, str, str] | None = None

    def check(self, seq: int, kind: str, digest: str, values: tuple[Any, ...]) -> str:
        """What is wrong with this (otherwise well linked) record as far as the quarantine goes; "" if nothing."""
        expected, self.expected = self.expected, None
        if expected is not None and expected[0] == seq and (kind, digest) != expected[1:]:
            return "it follows a retried quarantine marker but is not the record of its quarantined line"
        if kind != "quarantine":
            return ""
        action, sha, marker_seq = values[self._ACTION], values[self._SHA], values[self._MARKER_SEQ]
        if action == LedgerQuarantineMarker.QUARANTINED:
            line = self.lines.get(seq)
            if line is None:
                return "its quarantined line is not in the quarantine (ledger_quarantine) any more"
            if hashlib.sha256(line).hexdigest() != sha:
                return "its quarantined line in the quarantine (ledger_quarantine) was changed"
            return ""
        if marker_seq >= seq or self.markers.get(marker_seq) != (LedgerQuarantineMarker.QUARANTINED, sha):
            return f"it names no earlier quarantine marker of its line (seq {marker_seq})"
        if action == LedgerQuarantineMarker.RETRIED:
            return self._expect_record(seq, digest, marker_seq)
        return "" if action == LedgerQuarantineMarker.DISMISSED else f"unknown quarantine action {action!r}"

    def _expect_record(self, seq: int, digest: str, marker_seq: int) -> str:
        line = self.lines.get(marker_seq)
        if line is None:
            return "the line it retried is not in the quarantine (ledger_quarantine) any more"
        if hashlib.sha256(line).hexdigest() != self.markers[marker_seq][1]:
            return "the line it retried was changed in the quarantine (ledger_quarantine)"
        try:
            record = orjson.loads(line)
            k = record.get("k")
            if k != "device":  # a device's facts are upserted, not chained
                self.expected = (seq + 1, k, link_hash(digest, k, seq + 1, normalize(KINDS[k], record)))
        except (ValueError, KeyError, TypeError, AttributeError):
            return "the line it retried is not a record the ledger takes"
        return ""


# The checks made on one record, in order: at one seq, a problem an earlier check finds is the one named.
_SEQ, _PREV, _HASH, _QUARANTINE = range(4)
_PREV_PROBLEM = (
    "its prev_hash does not match the hash of the record before it (records reordered or replaced)"
)
_RETRIED_PROBLEM = "it follows a retried quarantine marker but is not the record of its quarantined line"
# Below this many records a chain is not split: a worker's start (a connection, the quarantine read) costs more.
MIN_SEGMENT_RECORDS = 100_000


@dataclass(frozen=True)
class _Segment:
    """Records ``after_seq + 1 .. to_seq`` of a chain (as the parent read its head), checked by one worker."""

    chain: LedgerChain
    after_seq: int
    to_seq: int


@dataclass(frozen=True)
class _SegmentResult:
    records: int  # linked before its first problem
    # The record at after_seq + 1 (seq, kind, pk, stored prev_hash, hash): its prev_hash is the parent's to check
    # against the previous segment's last hash, so every link is checked once. None: no record there.
    first: tuple[int, str, int, str, str] | None
    last_seq: int  # the last record linked
    last_hash: str  # its hash, recomputed
    broken: BrokenLink | None
    stage: int  # the check that found ``broken`` (_SEQ, _HASH, _QUARANTINE)
    ends_early: bool  # the records end before to_seq and none follow up to the head
    # What the record after to_seq must be (seq, kind, hash), when this segment ends with a retried marker.
    expects: tuple[int, str, str] | None


def _check_segment(segment: _Segment) -> _SegmentResult:
    """Link and re-hash one segment. Its first record's prev_hash is taken as stored (the parent checks it)."""
    chain, after_seq = segment.chain, segment.after_seq
    merged = heapq.merge(
        *(_rows(chain, kind, after_seq, segment.to_seq) for kind in KINDS.values()), key=lambda r: r[0]
    )
    quarantine = _Quarantine(chain)
    expected_seq = after_seq + 1
    prev = ""
    first = None
    count = 0
    for seq, kind_name, pk, prev_hash, digest, values in merged:
        kind = KINDS[kind_name]
        if count == 0 and first is None and seq == after_seq + 1:
            first = (seq, kind_name, pk, prev_hash, digest)
            prev = prev_hash
        problem, stage, at = "", _SEQ, seq
        if seq < expected_seq:
            problem = f"seq {seq} appears twice (an inserted or copied record)"
        elif seq > expected_seq:
            problem = f"seq {expected_seq} is missing before it (a deleted record)"
            at = expected_seq
        elif prev_hash != prev:
            problem, stage = _PREV_PROBLEM, _PREV
        elif link_hash(prev, kind.kind, seq, values) != digest:
            problem, stage = "its fields do not match its hash (a changed record)", _HASH
        else:
            problem, stage = quarantine.check(seq, kind.kind, digest, values), _QUARANTINE
        if problem:
            link = BrokenLink(chain.chain_id, at, kind.kind, kind.table, pk, problem)
            return _SegmentResult(count, first, expected_seq - 1, prev, link, stage, False, None)
        prev = digest
        expected_seq += 1
        count += 1
    last_seq = expected_seq - 1
    if (
        last_seq < segment.to_seq
    ):  # records missing at its end: named at the next record, or the head's problem
        following = _next_record(chain, last_seq)
        if following is None:
            return _SegmentResult(count, first, last_seq, prev, None, _SEQ, True, None)
        seq, kind_name, pk = following
        problem = f"seq {expected_seq} is missing before it (a deleted record)"
        link = BrokenLink(chain.chain_id, expected_seq, kind_name, KINDS[kind_name].table, pk, problem)
        return _SegmentResult(count, first, last_seq, prev, link, _SEQ, False, None)
    expects = quarantine.expected if quarantine.expected and quarantine.expected[0] == last_seq + 1 else None
    return _SegmentResult(count, first, last_seq, prev, None, _SEQ, False, expects)


def _check_segment_in_worker(segment: _Segment) -> _SegmentResult:
    try:
        return _check_segment(segment)
    finally:
        connections.close_all()  # a worker process leaves no connection behind when the pool ends it


def _head_problem(chain: LedgerChain, count: int, last_seq: int, last_hash: str) -> ChainReport:
    if chain.head_seq == last_seq and chain.head_hash == last_hash:
        return ChainReport(chain.chain_id, count, chain.head_seq, chain.head_hash, None)
    problem = (
        f"the chain head says seq {chain.head_seq} but the records end at seq {last_seq}"
        " (the newest records were deleted)"
        if chain.head_seq != last_seq
        else "the chain head's hash does not match the last record"
    )
    link = BrokenLink(chain.chain_id, last_seq + 1, "head", LedgerChain._meta.db_table, None, problem)
    return ChainReport(chain.chain_id, count, chain.head_seq, chain.head_hash, link)


def _stitch(
    chain: LedgerChain, after_seq: int, after_hash: str, results: list[_SegmentResult]
) -> ChainReport:
    """A chain's report from its segments' results, in seq order: each segment's first prev_hash must be the
    previous segment's last hash, and the lowest problem is the first broken link, as one pass would name it."""
    prev, expects, count, last_seq = after_hash, None, 0, after_seq
    for result in results:
        broken, records = result.broken, result.records
        if result.first is not None:
            seq, kind_name, pk, stored_prev, digest = result.first
            at_first = broken is not None and broken.seq == seq
            problem = ""
            if at_first and result.stage == _SEQ:
                pass  # its seq is wrong: that is named first
            elif stored_prev != prev:
                problem = _PREV_PROBLEM
            elif at_first and result.stage == _HASH:
                pass
            elif expects is not None and expects[0] == seq and (kind_name, digest) != expects[1:]:
                problem = _RETRIED_PROBLEM
            if problem:
                broken, records = (
                    BrokenLink(chain.chain_id, seq, kind_name, KINDS[kind_name].table, pk, problem),
                    0,
                )
        if broken is not None:
            return ChainReport(chain.chain_id, count + records, chain.head_seq, chain.head_hash, broken)
        count += records
        if records:  # an empty segment (nothing after a verified head) leaves the last hash as it was
            prev, last_seq = result.last_hash, result.last_seq
        expects = result.expects
        if result.ends_early:
            break
    return _head_problem(chain, count, last_seq, prev)


def _plan(
    starts: list[tuple[LedgerChain, int, str]], workers: int, segment_records: int | None
) -> list[_Segment]:
    total = sum(max(0, chain.head_seq - after_seq) for chain, after_seq, _ in starts)
    size = segment_records
    if size is None and workers > 1:  # a few segments a worker, so that the chains' sizes even out
        size = max(MIN_SEGMENT_RECORDS, -(-total // (workers * 4)))
    segments = []
    for chain, after_seq, _ in starts:
        step = size if size is not None else max(1, chain.head_seq - after_seq)
        lo = after_seq
        while True:
            hi = min(chain.head_seq, lo + step)
            segments.append(_Segment(chain, lo, hi))
            lo = hi
            if lo >= chain.head_seq:
                break
    return segments


def _in_transaction() -> bool:
    return any(conn.in_atomic_block for conn in connections.all(initialized_only=True))


def worker_start_method() -> str | None:
    """How to start the worker processes here: ``fork`` in a process with this one thread; ``spawn`` (a fresh
    interpreter, Django set up on this process's databases) in one that runs other threads, since a child forked
    from it can wait forever on a lock another thread held at the fork (it deadlocked the Celery worker, whose
    pool is threads); None (no workers) when a database lives in this process's memory (SQLite in memory, the
    tests'), which only a forked child would see. A connection pool (``CARBONLEDGER_DB_POOL_MAX_SIZE``) also means
    spawn: a forked child would take the parent's pooled sockets and the two would talk over each other."""
    pooled = any("pool" in connections[alias].settings_dict.get("OPTIONS", {}) for alias in connections)
    in_memory = any(
        conn.vendor == "sqlite" and (name == ":memory:" or "mode=memory" in name)  # as Django tells it
        for conn in connections.all(initialized_only=True)
        for name in [str(conn.settings_dict["NAME"])]
    )
    return start_method_for(threads=threading.active_count(), pooled=pooled, in_memory=in_memory)


def start_method_for(*, threads: int, pooled: bool, in_memory: bool) -> str | None:
    """The rule of :func:`worker_start_method`, given what it found in this process."""
    if threads == 1 and not pooled:
        return "fork"
    return None if in_memory else "spawn"


def _run(segments: list[_Segment], workers: int) -> list[_SegmentResult]:
    # Inside a transaction the connections cannot be closed for the fork, and the workers' own connections would
    # not see its rows: the segments are then checked here, one after the other.
    method = worker_start_method()
    if workers <= 1 or len(segments) <= 1 or _in_transaction() or method is None:
        return [_check_segment(segment) for segment in segments]
    # Hashing is CPU-bound Python: processes, started after closing this process's connections (a forked child
    # must not share a socket with its parent); each worker opens its own.
    databases = {alias: dict(connections[alias].settings_dict) for alias in connections}
    connections.close_all()
    initializer = None if method == "fork" else verify_worker.start
    initargs = () if method == "fork" else (settings.SETTINGS_MODULE, databases)
    with get_context(method).Pool(min(workers, len(segments)), initializer, initargs) as pool:
        return pool.map(_check_segment_in_worker, segments, chunksize=1)


def default_workers() -> int:
    return int(getattr(settings, "LEDGER_VERIFY_WORKERS", 1))


def verify_chains(
    starts: list[tuple[LedgerChain, int, str]],
    *,
    workers: int | None = None,
    segment_records: int | None = None,
) -> list[ChainReport]:
    """Verify chains, each from a verified point (``(chain, after_seq, after_hash)``; ``(chain, 0, GENESIS)``:
    from genesis), in ``workers`` processes (default ``LEDGER_VERIFY_WORKERS``). A chain is split into seq
    segments (``segment_records`` long, by default a few per worker and at least ``MIN_SEGMENT_RECORDS``), so a
    one-gateway deployment's one long chain is shared out too; the reports are those one pass over each chain
    gives, first broken link included.

    A chain archived while it was verified (its checkpoint moved past the start: the retention deleted rows
    under the run) is verified again from its new checkpoint when the run found it broken, so an archive never
    passes for a deleted record; the report's ``from_seq`` says where it started."""
    workers = default_workers() if workers is None else max(1, workers)
    segments = _plan(starts, workers, segment_records)
    results = _run(segments, workers)
    reports = []
    for chain, after_seq, after_hash in starts:
        mine = [r for s, r in zip(segments, results, strict=True) if s.chain is chain]
        reports.append(replace(_stitch(chain, after_seq, after_hash, mine), from_seq=after_seq))
    moved = checkpoints()
    again = [
        n
        for n, ((chain, after_seq, _), report) in enumerate(zip(starts, reports, strict=True))
        if report.broken is not None and moved.get(chain.pk, (0, GENESIS))[0] > after_seq
    ]
    if again:
        redone = verify_chains(
            [(starts[n][0], *moved[starts[n][0].pk]) for n in again],
            workers=workers,
            segment_records=segment_records,
        )
        for n, report in zip(again, redone, strict=True):
            reports[n] = report
    return reports


def verify_chain(
    chain: LedgerChain,
    after_seq: int = 0,
    after_hash: str = GENESIS,
    *,
    workers: int | None = 1,
    segment_records: int | None = None,
) -> ChainReport:
    """Verify ``chain`` from genesis, or from an earlier verified point (``after_seq`` with its hash): each
    record after it is re-hashed and linked, up to the chain's head."""
    return verify_chains([(chain, after_seq, after_hash)], workers=workers, segment_records=segment_records)[
        0
    ]


def checkpoints() -> dict[int, tuple[int, str]]:
    """Each archived chain's checkpoint: the newest archive's (to_seq, last hash); its records up to there are in
    archive files (``ledger/archive.py``), and its verification starts there instead of at genesis."""
    found: dict[int, tuple[int, str]] = {}
    for chain_pk, to_seq, last_hash in LedgerArchive.objects.order_by("to_seq").values_list(
        "chain_id", "to_seq", "last_hash"
    ):
        found[chain_pk] = (to_seq, last_hash)
    return found


def verify_all(*, workers: int | None = None, segment_records: int | None = None) -> list[ChainReport]:
    """Every chain from genesis, or from its archive checkpoint (its first record kept must link to the archive's
    last hash)."""
    chains = LedgerChain.objects.order_by("pk")
    starts = checkpoints()
    return verify_chains(
        [(c, *starts.get(c.pk, (0, GENESIS))) for c in chains],
        workers=workers,
        segment_records=segment_records,
    )
