"""The ledger's hash chain: which fields of each record kind are chained, and how they are hashed.

Each record carries the hash of the previous record of its chain (one chain per writer), so a
changed field, a deleted, inserted or reordered record all break a link that
``manage.py verify_ledger`` names. The canonical form is a compact JSON array
``[kind, seq, field values in the order below]``; the hash is ``sha256(prev_hash_hex + canonical)``.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import orjson
from django.db import models

from ledger.models import (
    LedgerAdjustment,
    LedgerBatch,
    LedgerBatchEnergy,
    LedgerIdle,
    LedgerInterval,
    LedgerQuarantineMarker,
    LedgerRequest,
    LedgerRequestEnergy,
)

GENESIS = "0" * 64


@dataclass(frozen=True)
class RecordKind:
    kind: str  # as written in the spool's "k" field
    model: type[models.Model]
    fields: tuple[str, ...]  # chained fields, in canonical order (column names)
    # The fields that identify a record, the first of them indexed: a replayed duplicate is found by them.
    natural_key: tuple[str, ...]
    # Trailing fields added after records were first written: left out of the canonical form while empty
    # ("" for text, 0 for numbers: what records written before them mean), so that every record written
    # before them hashes exactly as it did.
    optional_tail: tuple[str, ...] = ()
    # Text columns that hold a compact JSON array: a spool record may carry the list itself.
    json_fields: tuple[str, ...] = ()
    # Raises ValueError, naming the problem, for a record whose fields disagree with each other.
    check: Callable[[dict[str, Any]], None] | None = None
    # Whether the natural key names one record (an adjustment's target does not: it may have several).
    unique_key: bool = True

    @property
    def table(self) -> str:
        return str(self.model._meta.db_table)

    @property
    def time_field(self) -> str | None:
        """The field holding the record's own time in ns, which places it in a period; None: it has none."""
        return self.model.time_field  # type: ignore[attr-defined, no-any-return]


def _as_list(value: Any) -> Any:
    return orjson.loads(value) if isinstance(value, str) else value


def check_split(record: dict[str, Any]) -> None:
    """A batch's energy row must split exactly its ``energy_uj`` over its requests, one share each, none negative:
    the ledger's readers rely on it."""
    if "request_ids" not in record or "shares_uj" not in record:
        return  # the normalizer names the missing field
    where = f"batch_energy record of batch {record.get('batch_id')!r}"
    try:
        ids, shares = _as_list(record["request_ids"]), _as_list(record["shares_uj"])
    except orjson.JSONDecodeError as exc:
        raise ValueError(f"{where}: not a JSON array ({exc})") from None
    if not isinstance(ids, list) or not all(isinstance(i, str) and i for i in ids):
        raise ValueError(f"{where}: request_ids must be a list of request ids, got {ids!r}")
    if not isinstance(shares, list) or not all(type(x) is int and x >= 0 for x in shares):
        raise ValueError(f"{where}: shares_uj must be a list of non-negative integers, got {shares!r}")
    if len(set(ids)) != len(ids):
        raise ValueError(f"{where}: a request id appears twice in request_ids")
    if len(ids) != len(shares):
        raise ValueError(f"{where}: {len(ids)} request ids but {len(shares)} shares")
    if sum(shares) != record.get("energy_uj"):
        raise ValueError(
            f"{where}: the shares add up to {sum(shares)} µJ, not its energy_uj {record.get('energy_uj')}"
        )


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
            ("batch_id",),
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
            ("request_id",),
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
            ("interval_id",),
        ),
        RecordKind(
            "idle",
            LedgerIdle,
            (
                "interval_id",
                "device_id",
                "t0_ns",
                "t1_ns",
                "energy_uj",
                "idle_ns",
                "idle_power_w",
                "owed_in_uj",
            ),
            ("interval_id",),
            ("owed_in_uj",),
        ),
        RecordKind(
            "energy",
            LedgerRequestEnergy,
            ("request_id", "interval_id", "batch_id", "energy_uj", "final"),
            ("request_id", "interval_id", "batch_id"),  # a request has one part per interval and batch
        ),
        RecordKind(
            "batch_energy",
            LedgerBatchEnergy,
            ("batch_id", "interval_id", "energy_uj", "request_ids", "shares_uj", "final"),
            ("batch_id", "interval_id"),  # a batch has one row per interval
            json_fields=("request_ids", "shares_uj"),
            check=check_split,
        ),
        RecordKind(
            "adjustment",
            LedgerAdjustment,
            ("target_kind", "target_id", "energy_delta_uj", "reason", "actor", "created_ns"),
            ("target_id",),
            unique_key=False,
        ),
        RecordKind(
            "quarantine",
            LedgerQuarantineMarker,
            (
                "action",
                "line_sha256",
                "spool_position",
                "record_kind",
                "record_id",
                "detail",
                "marker_seq",
                "created_ns",
            ),
            ("line_sha256",),
        ),
    )
}
# The columns every chained row starts with; ``period`` places the row (not hashed: docs/ledger-partitioning.md).
CHAIN_COLUMNS = ("chain_id", "seq", "prev_hash", "hash", "period")
# Kinds the ledger writes itself and never takes from a spool: a spool line claiming one is refused.
WRITER_KINDS = frozenset({"quarantine"})


_OPTIONAL_TAIL = {k.kind: len(k.optional_tail) for k in KINDS.values() if k.optional_tail}
_EMPTY = ("", 0)


def canonical(kind: str, seq: int, values: tuple[Any, ...] | list[Any]) -> bytes:
    end = len(values)
    optional = _OPTIONAL_TAIL.get(kind, 0)
    while optional and end and values[end - 1] in _EMPTY:
        end -= 1
        optional -= 1
    return orjson.dumps((kind, seq, *values[:end]))


def link_hash(prev_hash: str, kind: str, seq: int, values: tuple[Any, ...] | list[Any]) -> str:
    return hashlib.sha256(prev_hash.encode() + canonical(kind, seq, values)).hexdigest()


def json_text(value: Any) -> str:
    """A JSON-array column's text: as given when already text, else the compact JSON of the list."""
    return value if isinstance(value, str) else orjson.dumps(value).decode()


def _has_plain_default(field: Any, optional_tail: bool) -> bool:
    """Records may leave out a text field with a text default, and an integer field of the optional tail
    with an integer default (records written before it existed)."""
    if isinstance(field, models.CharField | models.TextField):
        return isinstance(field.default, str)
    return optional_tail and isinstance(field, models.IntegerField) and type(field.default) is int


def _compile(kind: RecordKind) -> Callable[[dict[str, Any]], tuple[Any, ...]]:
    """A function from a spool record to its chained values, generated once per kind.

    The writer calls it for every record, tens of thousands a second, so it is one expression
    (as ``collections.namedtuple`` builds its methods): ``r["x"]`` for a required field,
    ``r.get("x", default)`` for a field with a default (absent from older or simpler writers'
    records) or a nullable foreign key, and ``float(...)`` for float columns, because JSON may
    carry ``2`` for ``2.0`` and the database gives back ``2.0``.
    """
    env: dict[str, Any] = {"json_text": json_text}
    parts: list[str] = []
    for pos, name in enumerate(kind.fields):
        field = kind.model._meta.get_field(name)  # Django resolves attnames like organization_id
        if not name.isidentifier():
            raise ValueError(f"{kind.kind}: field name {name!r} is not an identifier")
        if name in kind.json_fields:
            expr = f"json_text(r[{name!r}])"
        elif isinstance(field, models.ForeignKey):
            expr = f"r.get({name!r})"
        elif isinstance(field, models.BooleanField):
            expr = f"r.get({name!r}, False)"
        elif isinstance(field, models.FloatField):
            expr = f"float(r[{name!r}])"
        elif _has_plain_default(field, name in kind.optional_tail):
            env[f"default_{pos}"] = field.default
            expr = f"r.get({name!r}, default_{pos})"
        else:
            expr = f"r[{name!r}]"
        parts.append(expr)
    source = f"def normalize_{kind.kind}(r):\n    return ({', '.join(parts)},)\n"
    exec(source, env)  # built from the model's own field names, checked above
    fn: Callable[[dict[str, Any]], tuple[Any, ...]] = env[f"normalize_{kind.kind}"]
    return fn


_normalizers: dict[str, Callable[[dict[str, Any]], tuple[Any, ...]]] = {}


def normalizer(kind: RecordKind) -> Callable[[dict[str, Any]], tuple[Any, ...]]:
    """``normalize`` for one kind without the error message: raises KeyError for a missing field."""
    fn = _normalizers.get(kind.kind)
    if fn is None:
        fn = _compile(kind)
        if kind.check is not None:
            fn = _checked(kind.check, fn)
        _normalizers[kind.kind] = fn
    return fn


def _checked(
    check: Callable[[dict[str, Any]], None], fn: Callable[[dict[str, Any]], tuple[Any, ...]]
) -> Callable[[dict[str, Any]], tuple[Any, ...]]:
    def checked(record: dict[str, Any]) -> tuple[Any, ...]:
        values = fn(record)  # first: a missing field is a KeyError, which ``normalize`` names
        check(record)
        return values

    return checked


def normalize(kind: RecordKind, record: dict[str, Any]) -> tuple[Any, ...]:
    """The chained values of a spool record, in canonical order, with defaults for optional fields
    and fixed types; ``ValueError`` names a missing required field."""
    try:
        return normalizer(kind)(record)
    except KeyError as missing:
        raise ValueError(f"{kind.kind} record lacks {missing.args[0]!r}: {record}") from None
