"""The ledger's hash chain: which fields of each record kind are chained, and how they are hashed.

Each record carries the hash of the previous record of its chain (one chain per writer), so a
changed field, a deleted, inserted or reordered record all break a link that
``manage.py verify_ledger`` names. The canonical form is a compact JSON array
``[kind, seq, field values in the order below]``; the hash is ``sha256(prev_hash_hex + canonical)``.
"""

from __future__ import annotations

import hashlib
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
            ),
            "batch_id",
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
            ),
            "request_id",
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


def canonical(kind: str, seq: int, values: tuple[Any, ...] | list[Any]) -> bytes:
    return orjson.dumps([kind, seq, *values])


def link_hash(prev_hash: str, kind: str, seq: int, values: tuple[Any, ...] | list[Any]) -> str:
    return hashlib.sha256(prev_hash.encode() + canonical(kind, seq, values)).hexdigest()


_Plan = list[tuple[str, Any, Any, bool]]  # (name, converter, default, nullable)
_plans: dict[str, _Plan] = {}


def _plan(kind: RecordKind) -> _Plan:
    plan = _plans.get(kind.kind)
    if plan is None:
        plan = []
        for name in kind.fields:
            field = kind.model._meta.get_field(
                name[: -len("_id")] if name in ("organization_id", "api_key_id") else name
            )
            if isinstance(field, models.ForeignKey):
                plan.append((name, int, None, True))
            elif isinstance(field, models.BooleanField):
                plan.append((name, bool, False, False))
            elif isinstance(field, models.FloatField):
                plan.append((name, float, None, False))
            elif isinstance(field, models.BigIntegerField | models.IntegerField):
                plan.append((name, int, None, False))
            else:
                default = field.default if isinstance(field.default, str) else ""
                plan.append((name, str, default, False))
        _plans[kind.kind] = plan
    return plan


def normalize(kind: RecordKind, record: dict[str, Any]) -> tuple[Any, ...]:
    """The chained values of a spool record, with defaults for optional fields and fixed types."""
    out: list[Any] = []
    for name, conv, default, nullable in _plan(kind):
        value = record.get(name)
        if value is None:
            if nullable:
                out.append(None)
                continue
            if default is None:
                raise ValueError(f"{kind.kind} record lacks '{name}': {record}")
            value = default
        out.append(conv(value))
    return tuple(out)
