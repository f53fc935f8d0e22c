"""The ledger's hash chain: which fields of each record kind are chained, and how they are hashed.

Each record carries the hash of the previous record of its chain (one chain per writer), so a
changed field, a deleted, inserted or reordered record all break a link that
``manage.py verify_ledger`` names. The canonical form is a compact JSON array
``[kind, seq, field values in the order below]``; the hash is ``sha256(prev_hash_hex + canonical)``.
"""

from __future__ import annotations

import hashlib
import operator
from dataclasses import dataclass
from typing import Any

import orjson
from django.db import models

from carbonledger.models import (
    LedgerAdjustment,
    LedgerBatch,
    LedgerIdle,
    LedgerInterval,
    LedgerRequest,
    LedgerRequestEnergy,
)

GENESIS = "0" * 64


@dataclass(frozen=True)
class RecordKind:
    kind: str  # as written in the spool's "k" field
    model: type[models.Model]
    fields: tuple[str, ...]  # chained fields, in canonical order (column names)
    natural_key: str
    # Trailing fields added after records were first written: left out of the canonical form while empty,
    # so that every record written before them hashes exactly as it did.
    optional_tail: tuple[str, ...] = ()

    @property
    def table(self) -> str:
        return str(self.model._meta.db_table)


KINDS: dict[str, RecordKind] = {
    k.kind: k
    for k in (
        RecordKind(
            "batch",
            LedgerBatch,
            (
                "batch_id",
                "model",
                "version",
                "device_id",
                "instance",
                "start_ns",
                "end_ns",
                "requests",
                "rows",
                "status",
                "variant",
            ),
            "batch_id",
            ("variant",),
        ),
        RecordKind(
            "req",
            LedgerRequest,
            (
                "request_id",
                "client_request_id",
                "organization_id",
                "api_key_id",
                "model",
                "version",
                "batch_id",
                "device_id",
                "received_ns",
                "started_ns",
                "finished_ns",
                "queue_ns",
                "compute_ns",
                "work_units",
                "status",
                "synthetic",
                "variant",
            ),
            "request_id",
            ("variant",),
        ),
        RecordKind(
            "interval",
            LedgerInterval,
            (
                "interval_id",
                "device_id",
                "method",
                "relative_uncertainty",
                "t0_ns",
                "t1_ns",
                "counter_start_j",
                "counter_end_j",
                "energy_uj",
                "idle_uj",
                "busy_ns",
                "idle_ns",
            ),
            "interval_id",
        ),
        RecordKind(
            "idle",
            LedgerIdle,
            ("interval_id", "device_id", "t0_ns", "t1_ns", "energy_uj", "idle_ns", "idle_power_w"),
            "interval_id",
        ),
        RecordKind(
            "energy",
            LedgerRequestEnergy,
            ("request_id", "interval_id", "batch_id", "energy_uj", "final"),
            "request_id",
        ),
        RecordKind(
            "adjustment",
            LedgerAdjustment,
            ("target_kind", "target_id", "energy_delta_uj", "reason", "actor", "created_ns"),
            "target_id",
        ),
    )
}
CHAIN_COLUMNS = ("chain_id", "seq", "prev_hash", "hash")


_OPTIONAL_TAIL = {k.kind: len(k.optional_tail) for k in KINDS.values() if k.optional_tail}


def canonical(kind: str, seq: int, values: tuple[Any, ...] | list[Any]) -> bytes:
    optional = _OPTIONAL_TAIL.get(kind, 0)
    if optional:
        values = list(values)
        while optional and values and values[-1] == "":
            values.pop()
            optional -= 1
    return orjson.dumps([kind, seq, *values])


def link_hash(prev_hash: str, kind: str, seq: int, values: tuple[Any, ...] | list[Any]) -> str:
    return hashlib.sha256(prev_hash.encode() + canonical(kind, seq, values)).hexdigest()


@dataclass(frozen=True)
class _Plan:
    getter: Any  # operator.itemgetter over the chained fields
    float_positions: tuple[int, ...]  # JSON may carry 2 for 2.0; the database gives back 2.0
    defaults: dict[str, Any]  # optional fields and their value when absent
    nullable: frozenset[str]
    fields: tuple[str, ...]
    tail: tuple[str, ...]  # the optional tail: read with .get(), so records without it keep the fast path


_plans: dict[str, _Plan] = {}


def _plan(kind: RecordKind) -> _Plan:
    plan = _plans.get(kind.kind)
    if plan is None:
        floats: list[int] = []
        defaults: dict[str, Any] = {}
        nullable: set[str] = set()
        for pos, name in enumerate(kind.fields):
            field = kind.model._meta.get_field(name)  # Django resolves attnames like organization_id
            if isinstance(field, models.ForeignKey):
                nullable.add(name)
            elif isinstance(field, models.BooleanField):
                defaults[name] = False
            elif isinstance(field, models.FloatField):
                floats.append(pos)
            elif isinstance(field, models.CharField | models.TextField) and isinstance(field.default, str):
                defaults[name] = field.default
        head = kind.fields[: len(kind.fields) - len(kind.optional_tail)]
        plan = _Plan(
            operator.itemgetter(*head),
            tuple(floats),
            defaults,
            frozenset(nullable),
            kind.fields,
            kind.optional_tail,
        )
        _plans[kind.kind] = plan
    return plan


def normalize(kind: RecordKind, record: dict[str, Any]) -> tuple[Any, ...]:
    """The chained values of a spool record, with defaults for optional fields and fixed types.

    The writer calls this for every record, tens of thousands a second: the common case (every
    field present) is one itemgetter call plus a float() per float field.
    """
    plan = _plan(kind)
    try:
        values = list(plan.getter(record))
        for name in plan.tail:
            values.append(record.get(name, plan.defaults[name]))
    except KeyError:
        values = []
        for name in plan.fields:
            if name in record:
                values.append(record[name])
            elif name in plan.defaults:
                values.append(plan.defaults[name])
            elif name in plan.nullable:
                values.append(None)
            else:
                raise ValueError(f"{kind.kind} record lacks '{name}': {record}") from None
    for pos in plan.float_positions:
        values[pos] = float(values[pos])
    return tuple(values)
