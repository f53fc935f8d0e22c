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
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import orjson

from ledger.models import LedgerChain, LedgerQuarantine, LedgerQuarantineMarker
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


def _rows(
    chain: LedgerChain, kind: RecordKind, after_seq: int
) -> Iterator[tuple[int, str, int, str, str, tuple[Any, ...]]]:
    columns = ["seq", "pk", "prev_hash", "hash", *kind.fields]
    qs = (
        # Up to the head as read: a writer appending meanwhile is not a broken chain.
        kind.model._default_manager.filter(chain=chain, seq__gt=after_seq, seq__lte=chain.head_seq)
        .order_by("seq")
        .values_list(*columns)
    )
    for row in qs.iterator(chunk_size=20_000):
        seq, pk, prev, digest, *values = row
        yield seq, kind.kind, pk, prev, digest, tuple(values)


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


def verify_chain(chain: LedgerChain, after_seq: int = 0, after_hash: str = GENESIS) -> ChainReport:
    """Verify ``chain`` from genesis, or from an earlier verified point (``after_seq`` with its hash): each
    record after it is re-hashed and linked, up to the chain's head."""
    merged = heapq.merge(*(_rows(chain, kind, after_seq) for kind in KINDS.values()), key=lambda r: r[0])
    quarantine = _Quarantine(chain)
    expected_seq = after_seq + 1
    prev = after_hash
    count = 0
    for seq, kind_name, pk, prev_hash, digest, values in merged:
        kind = KINDS[kind_name]
        problem = ""
        at = seq
        if seq < expected_seq:
            problem = f"seq {seq} appears twice (an inserted or copied record)"
        elif seq > expected_seq:
            problem = f"seq {expected_seq} is missing before it (a deleted record)"
            at = expected_seq
        elif prev_hash != prev:
            problem = "its prev_hash does not match the hash of the record before it (records reordered or replaced)"
        elif link_hash(prev, kind.kind, seq, values) != digest:
            problem = "its fields do not match its hash (a changed record)"
        else:
            problem = quarantine.check(seq, kind.kind, digest, values)
        if problem:
            link = BrokenLink(chain.chain_id, at, kind.kind, kind.table, pk, problem)
            return ChainReport(chain.chain_id, count, chain.head_seq, chain.head_hash, link)
        prev = digest
        expected_seq += 1
        count += 1
    last_seq = expected_seq - 1
    if chain.head_seq != last_seq or chain.head_hash != prev:
        problem = (
            f"the chain head says seq {chain.head_seq} but the records end at seq {last_seq}"
            " (the newest records were deleted)"
            if chain.head_seq != last_seq
            else "the chain head's hash does not match the last record"
        )
        link = BrokenLink(chain.chain_id, last_seq + 1, "head", LedgerChain._meta.db_table, None, problem)
        return ChainReport(chain.chain_id, count, chain.head_seq, chain.head_hash, link)
    return ChainReport(chain.chain_id, count, chain.head_seq, chain.head_hash, None)


def verify_all() -> list[ChainReport]:
    return [verify_chain(chain) for chain in LedgerChain.objects.order_by("pk")]
