"""Verification of the ledger's hash chains (reads only).

For each chain, the records of every kind are merged in ``seq`` order (streamed, so millions
of rows fit in little memory) and each link is checked: consecutive seq numbers from 1,
``prev_hash`` equal to the previous record's hash, and the hash recomputed from the record's
own fields. The chain row's head must match the last record, so deleting the newest records
is caught too. The first broken link is named.
"""

from __future__ import annotations

import heapq
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from ledger.models import LedgerChain
from ledger.records import GENESIS, KINDS, RecordKind, link_hash


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


def verify_chain(chain: LedgerChain, after_seq: int = 0, after_hash: str = GENESIS) -> ChainReport:
    """Verify ``chain`` from genesis, or from an earlier verified point (``after_seq`` with its hash): each
    record after it is re-hashed and linked, up to the chain's head."""
    merged = heapq.merge(*(_rows(chain, kind, after_seq) for kind in KINDS.values()), key=lambda r: r[0])
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
