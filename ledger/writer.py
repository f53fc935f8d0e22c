"""Drains the gateway's spool into the database, in bulk, on one thread.

The chain head and the spool position reached move in the same transaction as the records,
so a crash at any point replays exactly what was not committed: replay is idempotent by
construction, and a natural-key conflict (the same request id twice) is filtered out, not
duplicated. While the database is down the writer backs off and the spool grows on disk
(bounded; the gateway answers 503 when it is full); everything drains when it returns.

A record refused for what it holds (a value too long for its column, a NUL in a string, an integer out of
range, a line the normaliser cannot take) must not stop every record behind it: the chunk that holds it is
split until the record is alone, its neighbours are written, and the line goes to a quarantine
(``LedgerQuarantine``, ``manage.py ledger_quarantine``) with a hash-chained marker in its place, so the chain
still accounts for every spool line. Only such data errors quarantine: an unreachable database is waited
for, a duplicate skipped, and a conflict in the chain itself stops the drain as before.
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import logging
import os
import threading
import time
from collections import defaultdict
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, TypeVar

import orjson
import psycopg
from django.conf import settings
from django.db import (
    DatabaseError,
    DataError,
    IntegrityError,
    InterfaceError,
    ProgrammingError,
    close_old_connections,
    connection,
    transaction,
)
from psycopg.copy import Copy, FileWriter

from inference.errors import THREAD_ERRORS, ThreadErrors
from inference.spool import Spool, SpoolPosition, SpoolReader
from ledger.models import (
    LedgerChain,
    LedgerQuarantine,
    LedgerQuarantineMarker,
    month_bounds,
    own_period,
    period_of_ns,
)
from ledger.ownership import ChainLost, ChainOwnership
from ledger.preparer import PreparerFailed, PreparerProcess
from ledger.records import (
    CHAIN_COLUMNS,
    KINDS,
    WRITER_KINDS,
    RecordKind,
    link_hash,
    normalize,
    normalizer,
)
from tenancy.models import Device, Site

log = logging.getLogger(__name__)

# The drainer process's GIL switch interval (Python's default is 5 ms). While the helper thread
# prepares a chunk, the thread feeding the database needs the GIL back after every socket wait;
# at 5 ms it waits and the database idles. Measured with bench/ledger_ingest.py on PostgreSQL:
# 36.7k request records/s at 5 ms, 42.7k at 0.5 ms.
DRAINER_SWITCH_INTERVAL_S = 0.0005

# A chain's head as the writer carries it: (chain pk, head seq, head hash, head period).
Head = tuple[int, int, str, int]

# Insert order inside one transaction: what others refer to goes first.
KIND_ORDER = ("batch", "req", "interval", "idle", "energy", "batch_energy", "adjustment", "quarantine")

# What parsing, normalising or formatting a record raises when the record itself is at fault (no database
# involved): a chunk that raises one is split to find the record (``_salvage``).
_SHAPE_ERRORS: tuple[type[Exception], ...] = (ValueError, TypeError, KeyError, OverflowError, AttributeError)
# And formatting COPY streams ahead, where psycopg's errors are about values too (the cursor never executes).
_FORMAT_ERRORS: tuple[type[Exception], ...] = (*_SHAPE_ERRORS, psycopg.Error)
# What writing a row raises when the database (or its driver) refuses a value: PostgreSQL's class 22
# (DataError: too long, out of range, a NUL in a string), a value the driver cannot convert (OverflowError for
# an integer out of range, TypeError for a type the column cannot take, UnicodeEncodeError for a lone surrogate).
_VALUE_ERRORS: tuple[type[Exception], ...] = (
    DataError,
    psycopg.DataError,
    ValueError,
    TypeError,
    OverflowError,
)
# PostgreSQL's integrity errors that are about one row's values (not null, check), not about other rows.
_VALUE_SQLSTATES = frozenset({"23502", "23514"})
# The longest error text kept with a quarantined line (a database's message may quote the whole row).
QUARANTINE_ERROR_CHARS = 2000
# Written next to the spool by a drainer in a process of its own: its threads' error counts, which the gateway
# shows in /metrics (carbonledger/gateway_app.py).
DRAINER_STATUS_FILE = "drainer-status.json"


_PG_TYPES: dict[str, str] = {
    "BigIntegerField": "int8",
    "ForeignKey": "int8",
    "IntegerField": "int4",
    "FloatField": "float8",
    "BooleanField": "bool",
    "CharField": "text",
    "TextField": "text",
}


_pg_types_cache: dict[str, list[str]] = {}


def _pg_types(kind: RecordKind) -> list[str]:
    types = _pg_types_cache.get(kind.kind)
    if types is None:
        types = ["int8", "int8", "text", "text", "int4"]  # chain_id, seq, prev_hash, hash, period
        for name in kind.fields:
            field = kind.model._meta.get_field(name)
            types.append(_PG_TYPES[field.get_internal_type()])
        _pg_types_cache[kind.kind] = types
    return types


def copy_payload(cursor: Any, kind: RecordKind, rows: list[tuple[Any, ...]]) -> bytes:
    """The whole binary COPY stream of ``rows`` (signature, rows, trailer), formatted without sending.

    psycopg's documented ``Copy`` with a ``FileWriter`` formats with the same C dumpers as a live COPY
    but writes to memory, so a helper thread can format one chunk while this connection sends another.
    ``cursor`` (a psycopg cursor that never executes) lends its connection's adapters.
    """
    out = io.BytesIO()
    with Copy(cursor, binary=True, writer=FileWriter(out)) as copy:
        copy.set_types(_pg_types(kind))
        for row in rows:
            copy.write_row(row)
    return out.getvalue()


def bulk_insert(kind: RecordKind, rows: list[tuple[Any, ...]] | None, payload: bytes | None = None) -> None:
    """Insert many rows fast: binary COPY on PostgreSQL (of ``payload`` when formatted ahead by
    ``copy_payload``), executemany on SQLite."""
    if not rows and payload is None:
        return
    columns = CHAIN_COLUMNS + kind.fields
    table = kind.table
    cols = ", ".join(columns)
    with connection.cursor() as cur:
        if connection.vendor == "postgresql":
            raw = cur.cursor  # the psycopg cursor under Django's wrapper
            # Binary COPY: psycopg's C dumpers format each value; measured about twice as fast
            # as text COPY here. Django's wrapper maps psycopg's errors to django.db's.
            sql = f"COPY {table} ({cols}) FROM STDIN (FORMAT BINARY)"
            if payload is None:
                payload = copy_payload(raw, kind, rows or [])
            with connection.wrap_database_errors, raw.copy(sql) as copy:
                copy.write(payload)
        else:
            marks = ", ".join(["%s"] * len(columns))
            cur.executemany(f"INSERT INTO {table} ({cols}) VALUES ({marks})", rows)


def default_site() -> Site:
    """The site new devices are placed in: the oldest named ``SITE_NAME`` (an operator may have been given
    it since), created unowned when there is none. Organizations cannot take that name (site_create)."""
    site = Site.objects.filter(name=settings.SITE_NAME).order_by("pk").first()
    if site is None:
        site, _ = Site.objects.get_or_create(
            name=settings.SITE_NAME,
            organization=None,
            defaults={
                "zone": settings.SITE_ZONE,
                "pue": settings.SITE_PUE,
                "electricity": settings.SITE_ELECTRICITY,
            },
        )
    return site


def upsert_devices(records: list[dict[str, Any]]) -> None:
    site = default_site() if records else None
    for rec in records:
        facts = {
            "kind": rec.get("kind", ""),
            "name": rec.get("name", ""),
            "method": rec.get("method", ""),
            "measured": bool(rec.get("measured", False)),
            "relative_uncertainty": float(rec.get("relative_uncertainty", 0.0)),
            "info": rec.get("info", {}),
        }
        # A device keeps the site it was placed in; only its metering facts are refreshed.
        Device.objects.update_or_create(
            device_id=rec["device_id"], defaults=facts, create_defaults={**facts, "site": site}
        )


@dataclass
class PreparedChunk:
    """One chunk of spool lines, parsed and chained from a given head, ready to insert.

    Preparing is pure Python (no database), so the writer prepares the next chunk on a helper
    thread while the database takes this one. ``rows`` hold for the head they were chained
    from; if the chain has moved on by the time the chunk is committed (duplicates dropped from
    the previous chunk), the commit chains the records again from the real head. A chunk holding
    a record that cannot be parsed, chained or formatted stays unchained, ``refused`` saying why:
    its commit then goes through it line by line.
    """

    start: SpoolPosition
    end: SpoolPosition
    lines: int
    devices: list[dict[str, Any]]
    # Devices included (chaining skips them). None for a chunk prepared in the preparer process, which
    # sends back only its COPY streams: ``parsed_records`` parses ``raw`` again if the chunk must be re-chained.
    records: list[dict[str, Any]] | None
    raw: list[bytes] | None = None  # the spool lines
    chain_pk: int | None = None
    head_seq: int = 0
    head_hash: str = ""
    head_period: int = 0
    rows: dict[str, list[tuple[Any, ...]]] | None = None
    end_seq: int = 0
    end_hash: str = ""
    end_period: int = 0
    # The natural keys, per kind, of the records placed outside their own month or before the current one: only
    # these can have a copy in another partition, which no unique index sees (``_held``).
    early: dict[str, set[tuple[Any, ...]]] | None = None
    payloads: dict[str, bytes] | None = None  # binary COPY streams of ``rows``, per kind
    refused: str = ""  # why a record of the chunk could not be prepared (the chunk then stays unchained)

    def parsed_records(self) -> list[dict[str, Any]]:
        if self.records is None:
            self.records = _parse(self.raw or [])
        return self.records

    def chain_from(self, head: Head, copy_cursor: Any = None) -> None:
        try:
            rows, end_seq, end_hash, end_period, devices, early = _chain(*head, self.parsed_records())
            payloads = (
                {k: copy_payload(copy_cursor, KINDS[k], kind_rows) for k, kind_rows in rows.items()}
                if copy_cursor is not None
                else None
            )
        except _FORMAT_ERRORS as exc:
            self.refused = describe_error(exc)
            return
        self.chain_pk, self.head_seq, self.head_hash, self.head_period = head
        self.rows, self.end_seq, self.end_hash, self.devices = rows, end_seq, end_hash, devices
        self.end_period, self.early = end_period, early
        self.payloads = payloads

    @property
    def chained(self) -> bool:
        return self.chain_pk is not None and (self.rows is not None or self.payloads is not None)

    @property
    def end_head(self) -> Head | None:
        """The chain head after this chunk, when it was chained ahead."""
        if not self.chained or self.chain_pk is None:
            return None
        return self.chain_pk, self.end_seq, self.end_hash, self.end_period


def _parse(lines: list[bytes]) -> list[dict[str, Any]]:
    try:
        # One call for the whole chunk: measured about 10 % cheaper than a call per line.
        records: list[dict[str, Any]] = orjson.loads(b"[" + b",".join(lines) + b"]")
    except orjson.JSONDecodeError:
        records = [orjson.loads(line) for line in lines]  # raises on the bad line itself
    return records


def prepare_chunk(
    lines: list[bytes],
    start: SpoolPosition,
    end: SpoolPosition,
    head: Head | tuple[int, int, str] | None = None,
    copy_cursor: Any = None,
) -> PreparedChunk:
    """Parse ``lines`` and, given ``head`` = (chain pk, head seq, head hash, head period; without a period: none
    yet), chain them from it (and format their COPY streams, given a psycopg ``copy_cursor``). A line that cannot
    be taken leaves the chunk unchained, with ``refused`` set."""
    if head is not None and len(head) == 3:
        head = (head[0], head[1], head[2], 0)
    chunk = PreparedChunk(start=start, end=end, lines=len(lines), devices=[], records=None, raw=lines)
    try:
        chunk.records = _parse(lines)
        if head is None:
            chunk.devices = [r for r in chunk.records if r.get("k") == "device"]
    except _SHAPE_ERRORS as exc:
        chunk.records = None
        chunk.refused = describe_error(exc)
        return chunk
    if head is not None:
        chunk.chain_from(head, copy_cursor)
    return chunk


def commit_chunk(
    chain_id: str,
    chunk: PreparedChunk,
    spool: Spool | SpoolReader | None = None,
    ownership: ChainOwnership | None = None,
) -> tuple[int, Head]:
    """Insert a chunk in one transaction with the chain head and the spool position it reaches.

    Returns how many chained records were written (quarantine markers included) and the chain's new head
    (pk, seq, hash, period). Raises ``PositionMoved`` when the database checkpoint is not at ``chunk.start``. When a
    record of the chunk is refused for its data, the chunk is written line by line and that record quarantined;
    ``spool`` (the one the chunk was read from) gives each quarantined line its exact position. ``ownership``:
    the fencing check, first thing in the transaction (the lease row stays locked until the commit), raises
    ``ChainLost`` when the chain's lease is no longer this process's, and nothing is written.
    """
    with transaction.atomic():
        if ownership is not None:
            ownership.check()
        chain = _lock_chain(chain_id)
        at = SpoolPosition.decode(chain.spool_position)
        if at != chunk.start:
            raise PositionMoved(at)
        written: int | None = None
        if not chunk.refused:
            try:
                written = _write_chunk(chain, chunk)
            except Exception as exc:
                if not (isinstance(exc, _SHAPE_ERRORS) or refused_by_database(exc)):
                    raise
                chunk.refused = describe_error(exc)
        if written is None:
            written = _salvage(chain, chunk, spool)
        with connection.cursor() as cur:
            cur.execute(
                f"UPDATE {LedgerChain._meta.db_table} SET head_seq = %s, head_hash = %s, head_period = %s, "
                "spool_position = %s WHERE id = %s",
                [chain.head_seq, chain.head_hash, chain.head_period, chunk.end.encode(), chain.pk],
            )
    return written, (chain.pk, chain.head_seq, chain.head_hash, chain.head_period)


def _write_chunk(chain: LedgerChain, chunk: PreparedChunk) -> int:
    """The whole chunk at once (the fast path); each attempt in a savepoint, so that a refusal leaves the
    transaction as it was for ``_salvage``."""
    if chunk.devices:
        with transaction.atomic():
            upsert_devices(chunk.devices)
    try:
        with transaction.atomic():
            if chunk.chained and (chunk.chain_pk, chunk.head_seq, chunk.head_hash, chunk.head_period) == (
                chain.pk,
                chain.head_seq,
                chain.head_hash,
                chain.head_period,
            ):
                if not _held(chunk.early):
                    _insert(chunk.rows, chunk.payloads)
                    written = chunk.end_seq - chain.head_seq
                    chain.head_seq, chain.head_hash = chunk.end_seq, chunk.end_hash
                    chain.head_period = chunk.end_period
                    return written
            else:
                rows, seq, prev, period, _devices, early = _chain(*_head_of(chain), chunk.parsed_records())
                if not _held(early):
                    _insert(rows)
                    written = seq - chain.head_seq
                    chain.head_seq, chain.head_hash, chain.head_period = seq, prev, period
                    return written
    except IntegrityError as exc:
        if refused_by_database(exc):
            raise
    # Only a record already in the ledger can collide (the same id spooled twice; in another partition, found by
    # ``_held`` before the insert): drop those and chain the rest, so the ledger holds each id exactly once.
    with transaction.atomic():
        return chain_and_insert(chain, without_existing(chunk.parsed_records()))


def refused_by_database(exc: BaseException) -> bool:
    """Whether writing a row raised ``exc`` for the row's own values (quarantine it), rather than for the
    database's state: unreachable, a duplicate key, a conflict in the chain (wait, skip or stop instead)."""
    if isinstance(exc, _VALUE_ERRORS):
        return True
    if isinstance(exc, IntegrityError):
        sqlstate = getattr(exc.__cause__, "sqlstate", None)
        if sqlstate is not None:
            return sqlstate in _VALUE_SQLSTATES
        return str(exc).startswith(("NOT NULL constraint failed", "CHECK constraint failed"))  # SQLite
    if isinstance(exc, ProgrammingError | InterfaceError):
        return str(exc).startswith("Error binding parameter")  # SQLite: a value of a type it cannot store
    return False


def safe_text(text: str, limit: int) -> str:
    """``text`` as any database stores it: no NUL, no lone surrogate (escaped instead), at most ``limit``
    characters. For what the writer writes about a refused record, which must never be refused itself."""
    text = text.encode("utf-8", "backslashreplace").decode("utf-8").replace("\x00", "\\x00")
    return text if len(text) <= limit else text[: limit - 1] + "\u2026"


def describe_error(exc: BaseException) -> str:
    return safe_text(f"{type(exc).__name__}: {exc}".strip(), QUARANTINE_ERROR_CHARS)


@dataclass
class _Line:
    """One spool line of a chunk being salvaged: where it starts, and its record once parsed."""

    raw: bytes
    position: SpoolPosition
    record: dict[str, Any] | None = None


def _chunk_lines(chunk: PreparedChunk, spool: Spool | SpoolReader | None) -> list[_Line]:
    """The chunk's lines, each with the spool position it starts at.

    Read again from ``spool`` one line at a time: a chunk may span segments (and skip a torn tail between
    them), which its start and its lines alone cannot place. Only for a refused chunk, so the extra reads do
    not matter. Without a spool, the positions are counted from the chunk's start (exact within one segment).
    """
    raw = chunk.raw if chunk.raw is not None else []
    lines: list[_Line] = []
    if spool is None:
        at = chunk.start
        for line in raw:
            lines.append(_Line(line, at))
            at = SpoolPosition(at.segment, at.offset + len(line) + 1)
        return lines
    at = chunk.start
    while at < chunk.end:
        got, after = spool.read(at, 1)  # one whole line (a read always returns at least one)
        if not got:
            break
        for line in got:
            # A line never spans segments, so it starts its own length before the position after it.
            lines.append(_Line(line, SpoolPosition(after.segment, after.offset - len(line) - 1)))
        at = after
    if chunk.raw is not None and [line.raw for line in lines] != chunk.raw:
        raise RuntimeError(f"the spool from {chunk.start.encode()} no longer holds the lines read from it")
    return lines


def screen_line(raw: bytes) -> tuple[dict[str, Any] | None, str]:
    """A line's record, and why the ledger cannot take it ("" when it can, as far as no database is asked)."""
    try:
        record = orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        return None, f"not a JSON record: {exc}"
    if not isinstance(record, dict):
        return None, f"not a JSON object but {type(record).__name__}"
    k = record.get("k")
    if k == "device":
        return record, ""
    if not isinstance(k, str) or k not in KINDS or k in WRITER_KINDS:
        return record, f"ValueError: spool record of unknown kind {k!r}"
    kind = KINDS[k]
    try:
        normalize(kind, record)
    except _SHAPE_ERRORS as exc:
        return record, describe_error(exc)
    key = [record.get(name) for name in kind.natural_key]
    if not all(isinstance(value, str | int | float) for value in key):
        return (
            record,
            f"ValueError: {k} record's {', '.join(kind.natural_key)} must be plain values, got {key!r}",
        )
    return record, ""


def _salvage(chain: LedgerChain, chunk: PreparedChunk, spool: Spool | SpoolReader | None) -> int:
    """Write a refused chunk line by line, in spool order: the lines the ledger takes go in (runs of them at
    once, split in halves while a run is refused: ``_write_run``), and each line it refuses goes to the
    quarantine with a marker in its place in the chain. Returns the chained records written, markers included.
    """
    log.warning(
        "ledger chain %s: the chunk %s..%s was refused (%s); writing it line by line",
        chain.chain_id,
        chunk.start.encode(),
        chunk.end.encode(),
        chunk.refused.splitlines()[0] if chunk.refused else "",
    )
    written = 0
    run: list[_Line] = []
    for line in _chunk_lines(chunk, spool):
        line.record, problem = screen_line(line.raw)
        if not problem and line.record is not None and line.record.get("k") == "device":
            try:
                with transaction.atomic():
                    upsert_devices([line.record])
                continue
            except Exception as exc:
                if not (isinstance(exc, _SHAPE_ERRORS) or refused_by_database(exc)):
                    raise
                problem = describe_error(exc)
        if problem:
            written += _write_run(chain, run)  # what came before it goes first: the chain keeps spool order
            run = []
            written += _quarantine(chain, line, problem)
        else:
            run.append(line)
    return written + _write_run(chain, run)


def _write_run(chain: LedgerChain, run: list[_Line]) -> int:
    """Chain and insert ``run`` (lines whose records normalise); when the database refuses it, split it in
    halves until the refused record is alone, and quarantine that one. Duplicates are dropped as in the fast
    path; any other conflict is raised."""
    if not run:
        return 0
    # Chained outside the try: every record was screened (it normalises), so only the database's or the
    # driver's refusal of a value below is the run's fault; anything raised here is a bug, and is raised.
    records = [line.record for line in run if line.record is not None]
    rows, seq, prev, period, _devices, early = _chain(*_head_of(chain), records)
    if _held(early):
        return _write_run(chain, _without_existing_items(run, lambda line: line.record or {}))
    try:
        with transaction.atomic():
            _insert(rows)
        written = seq - chain.head_seq
        chain.head_seq, chain.head_hash, chain.head_period = seq, prev, period
        return written
    except Exception as exc:
        if isinstance(exc, IntegrityError) and not refused_by_database(exc):
            kept = _without_existing_items(run, lambda line: line.record or {})
            if len(kept) == len(run):
                raise  # no duplicate explains it: a conflict in the chain itself
            return _write_run(chain, kept)
        if not refused_by_database(exc):
            raise
        error = exc
    if len(run) == 1:
        return _quarantine(chain, run[0], describe_error(error))
    half = len(run) // 2
    return _write_run(chain, run[:half]) + _write_run(chain, run[half:])


def _record_identity(record: dict[str, Any] | None) -> tuple[str, str]:
    """The kind and id of a refused record, for the operator (kept short and storable whatever they hold)."""
    if record is None:
        return "", ""
    k = record.get("k")
    if not isinstance(k, str):
        return "", ""
    kind = KINDS.get(k)
    key = "device_id" if k == "device" else kind.natural_key[0] if kind is not None else ""
    value = record.get(key, "") if key else ""
    return safe_text(k, 32), safe_text(value if isinstance(value, str) else str(value), 256)


def _quarantine(chain: LedgerChain, line: _Line, error: str) -> int:
    """Keep a refused line in the quarantine and chain a marker in its place; returns 1 (the marker)."""
    record_kind, record_id = _record_identity(line.record)
    digest = hashlib.sha256(line.raw).hexdigest()
    created_ns = time.time_ns()
    seq = append_marker(
        chain,
        action=LedgerQuarantineMarker.QUARANTINED,
        line_sha256=digest,
        spool_position=line.position.encode(),
        record_kind=record_kind,
        record_id=record_id,
        detail=error,
        marker_seq=0,
        created_ns=created_ns,
    )
    LedgerQuarantine.objects.create(
        chain_id=chain.pk,
        marker_seq=seq,
        spool_position=line.position.encode(),
        line=line.raw,
        line_sha256=digest,
        record_kind=record_kind,
        record_id=record_id,
        error=error,
        created_at=datetime.fromtimestamp(created_ns / 1e9, tz=UTC),
    )
    log.error(
        "ledger chain %s: quarantined the %s record %r at spool position %s (marker seq %d): %s. The records "
        "around it are written; `manage.py ledger_quarantine` lists it, `--retry` writes it after a fix",
        chain.chain_id,
        record_kind or "unreadable",
        record_id,
        line.position.encode(),
        seq,
        error.splitlines()[0] if error else "",
    )
    return 1


def append_marker(chain: LedgerChain, **fields: Any) -> int:
    """Chain a quarantine marker (``LedgerQuarantineMarker``'s fields) at the head of ``chain``, which the caller
    holds locked; returns its seq. Every text is made storable first: a marker must never be refused."""
    kind = KINDS["quarantine"]
    record = {
        **fields,
        "record_kind": safe_text(fields.get("record_kind", ""), 32),
        "record_id": safe_text(fields.get("record_id", ""), 256),
        "detail": safe_text(fields.get("detail", ""), QUARANTINE_ERROR_CHARS),
    }
    values = normalize(kind, record)
    seq = chain.head_seq + 1
    digest = link_hash(chain.head_hash, kind.kind, seq, values)
    period = max(chain.head_period, own_period(record["created_ns"]) or 0) or period_of_ns(time.time_ns())
    bulk_insert(kind, [(chain.pk, seq, chain.head_hash, digest, period, *values)])
    chain.head_seq, chain.head_hash, chain.head_period = seq, digest, period
    return seq


def _lock_chain(chain_id: str) -> LedgerChain:
    """The chain's row, locked until the transaction ends (created when new).

    Plain SQL rather than the ORM: this runs once a chunk on the thread that shares the GIL with the
    chunk being prepared, where the ORM's Python cost about 25 ms a chunk (measured).
    """
    lock = " FOR UPDATE" if connection.features.has_select_for_update else ""
    sql = (
        f"SELECT id, head_seq, head_hash, head_period, spool_position FROM {LedgerChain._meta.db_table} "
        f"WHERE chain_id = %s{lock}"
    )
    with connection.cursor() as cur:
        cur.execute(sql, [chain_id])
        row = cur.fetchone()
        if row is None:
            LedgerChain.objects.get_or_create(chain_id=chain_id)
            cur.execute(sql, [chain_id])
            row = cur.fetchone()
    pk, head_seq, head_hash, head_period, position = row
    return LedgerChain(
        pk=pk,
        chain_id=chain_id,
        head_seq=head_seq,
        head_hash=head_hash,
        head_period=head_period,
        spool_position=position,
    )


def _head_of(chain: LedgerChain) -> Head:
    return chain.pk, chain.head_seq, chain.head_hash, chain.head_period


def append_records(chain_id: str, records: list[dict[str, Any]]) -> int:
    """Chain and insert records (spool-shaped dicts) at the head of ``chain_id``, outside any spool:
    for writers that are not a gateway (the synthetic demo ledger). Returns how many were written."""
    with transaction.atomic():
        chain, _ = LedgerChain.objects.get_or_create(chain_id=chain_id)
        chain = LedgerChain.objects.select_for_update().get(pk=chain.pk)
        written = chain_and_insert(chain, records)
        chain.save(update_fields=["head_seq", "head_hash", "head_period"])
    return written


def _chain(
    chain_pk: int, seq: int, prev: str, period: int, records: list[dict[str, Any]]
) -> tuple[
    dict[str, list[tuple[Any, ...]]], int, str, int, list[dict[str, Any]], dict[str, set[tuple[Any, ...]]]
]:
    """Rows per kind for ``records`` chained after (seq, prev) and placed from ``period`` on; the new head seq,
    hash and period; the device records met on the way (not chained: a device's facts are upserted); and the
    natural keys of the records placed early (``PreparedChunk.early``).

    A record's period is max(the period before it, the month of its own time): never less than the record
    before it (docs/ledger-partitioning.md). The normalizers are looked up once: this loop runs for every
    record, and the writer's rate is bounded by it (bench/ledger_ingest.py).
    """
    rows: dict[str, list[tuple[Any, ...]]] = {}
    devices: list[dict[str, Any]] = []
    early: dict[str, set[tuple[Any, ...]]] = {}
    # Per kind: the normalizer, the field of the record's own time, the natural key (looked up once).
    specs = {
        k: (normalizer(kind), kind.time_field, kind.natural_key)
        for k, kind in KINDS.items()
        if k not in WRITER_KINDS
    }
    now = period_of_ns(time.time_ns())
    # The month nearly every record is in, as [start, end) in ns: one comparison instead of a call per record.
    month_start, month_end, month = month_bounds(now)
    for rec in records:
        k = rec.get("k")
        spec = specs.get(k)
        if spec is None:
            if k == "device":
                devices.append(rec)
                continue
            # Quarantined rather than dropped: a newer gateway's kind can be retried after an upgrade.
            raise ValueError(f"spool record of unknown kind {k!r}")
        fn, time_field, natural_key = spec
        try:
            values = fn(rec)
        except KeyError:
            values = normalize(KINDS[k], rec)  # raises, naming the field
        if time_field is None:
            own = None
        else:
            t = rec.get(time_field)
            own = month if type(t) is int and month_start <= t < month_end else own_period(t)
        if own is not None and own > period:
            period = own
        elif period == 0:
            period = own or now  # the chain's first record, without a time of its own: this month
        if period < now or (own is not None and own != period):
            early.setdefault(k, set()).add(tuple(rec.get(name) for name in natural_key))
        seq += 1
        digest = link_hash(prev, k, seq, values)
        rows.setdefault(k, []).append((chain_pk, seq, prev, digest, period, *values))
        prev = digest
    return rows, seq, prev, period, devices, early


def _held(early: dict[str, set[tuple[Any, ...]]] | None) -> bool:
    """Whether the ledger holds any of these natural keys already, in any partition."""
    return bool(early) and any(
        _existing_keys(KINDS[k], keys) for k, keys in (early or {}).items() if KINDS[k].unique_key
    )


def _insert(rows: dict[str, list[tuple[Any, ...]]] | None, payloads: dict[str, bytes] | None = None) -> None:
    """Insert a chunk's rows per kind, or their COPY streams formatted ahead (PostgreSQL)."""
    for k in KIND_ORDER:
        payload = payloads.get(k) if payloads else None
        if (rows and rows.get(k)) or payload is not None:
            bulk_insert(KINDS[k], rows.get(k) if rows else None, payload)


def chain_and_insert(chain: LedgerChain, records: list[dict[str, Any]]) -> int:
    """Chain ``records`` (spool-shaped) at the head of ``chain``, which the caller holds locked, and insert them;
    moves the chain object's head (the caller saves it) only once they are in. Returns how many were chained."""
    rows, seq, prev, period, _devices, _early = _chain(*_head_of(chain), records)
    _insert(rows)
    written = seq - chain.head_seq
    chain.head_seq = seq
    chain.head_hash = prev
    chain.head_period = period
    return written


def _natural_key(kind: RecordKind, rec: dict[str, Any]) -> tuple[Any, ...]:
    return tuple(rec[name] for name in kind.natural_key)


def _existing_keys(kind: RecordKind, keys: set[tuple[Any, ...]]) -> set[tuple[Any, ...]]:
    """Which of ``keys`` the ledger already holds, found through the key's first (indexed) field."""
    first = kind.natural_key[0]
    rows = kind.model._default_manager.filter(**{f"{first}__in": {key[0] for key in keys}})
    return set(rows.values_list(*kind.natural_key))


def without_existing(records: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """``records`` less those the ledger already holds (by natural key) or that repeat an earlier one."""
    return _without_existing_items(records, lambda rec: rec)


_Item = TypeVar("_Item")


def _without_existing_items(
    items: Sequence[_Item], record_of: Callable[[_Item], dict[str, Any]]
) -> list[_Item]:
    """``items`` less those whose record the ledger already holds, or that repeat an earlier one's key."""
    wanted: dict[str, set[tuple[Any, ...]]] = defaultdict(set)
    for item in items:
        rec = record_of(item)
        kind = KINDS.get(rec.get("k", ""))
        if kind is not None:
            wanted[kind.kind].add(_natural_key(kind, rec))
    existing = {k: _existing_keys(KINDS[k], keys) for k, keys in wanted.items()}
    kept: list[_Item] = []
    seen: dict[str, set[tuple[Any, ...]]] = defaultdict(set)
    for item in items:
        rec = record_of(item)
        kind = KINDS.get(rec.get("k", ""))
        if kind is None:
            continue
        key = _natural_key(kind, rec)
        if key in existing[kind.kind] or key in seen[kind.kind]:
            log.warning("ledger already holds %s %s; the duplicate is not written again", kind.kind, key)
            continue
        seen[kind.kind].add(key)
        kept.append(item)
    return kept


class PositionMoved(Exception):
    def __init__(self, position: SpoolPosition) -> None:
        super().__init__(f"the database checkpoint is at {position.encode()}")
        self.position = position


class LedgerWriter:
    """The spool drainer: a thread that moves spooled records into the database in bulk."""

    def __init__(
        self,
        spool: Spool | SpoolReader,
        *,
        interval_s: float = 0.2,
        max_chunk_bytes: int = 4 << 20,
        max_backoff_s: float = 5.0,
        preparer_min_backlog_bytes: int | None = 16 << 20,
        thread_errors: ThreadErrors = THREAD_ERRORS,
        ownership: ChainOwnership | None = None,
    ) -> None:
        """``preparer_min_backlog_bytes``: on PostgreSQL, from this backlog on the next chunks are prepared in a
        preparer process rather than on a helper thread (None: never). ``thread_errors``: where the drain loop
        counts (and logs) the failures it survives, shown in /metrics. ``ownership``: the chain's lease, claimed
        and kept by the caller (the gateway, ``drain_ledger``); without one, ``recover`` claims the chain for
        this process and the writer keeps and releases the lease itself. Every commit checks it (fencing)."""
        if ownership is not None and ownership.chain_id != spool.chain_id:
            raise ValueError(
                f"the lease is for chain {ownership.chain_id}, the spool's chain is {spool.chain_id}"
            )
        self.spool = spool
        self.ownership = ownership
        self._owns_lease = ownership is None
        # Set once a commit found the chain's lease taken over (or the keeper did): the writer then stops
        # writing for good; readiness and /metrics read it.
        self.fenced = False
        self.lease_lost_total = 0
        self.interval_s = interval_s
        self.max_chunk_bytes = max_chunk_bytes
        self.max_backoff_s = max_backoff_s
        self.preparer_min_backlog_bytes = preparer_min_backlog_bytes
        self._preparer: PreparerProcess | None = None
        self.position = SpoolPosition.start()
        self.records_written = 0
        self.last_error = ""
        self.healthy = True
        self.thread_errors = 0  # iterations of the drain loop that failed other than by a database outage
        self._thread_errors = thread_errors
        self._stop = threading.Event()
        self._wake = threading.Event()
        self._thread: threading.Thread | None = None
        self._helper: ThreadPoolExecutor | None = None
        # (chain pk, head seq, head hash) as last committed, to chain the next chunk before the
        # database has it; None when unknown (the commit then chains from the locked row).
        self._head: Head | None = None

    def recover(self) -> None:
        """Claim the chain (unless the caller did), read the checkpoint from the database and make the spool
        replay from there. Raises ``ChainHeld`` when another live process holds the chain."""
        if self.ownership is None:
            self.ownership = ChainOwnership(self.spool.chain_id)
        if self.ownership.grant is None:
            self.ownership.claim()
        chain, _ = LedgerChain.objects.get_or_create(chain_id=self.spool.chain_id)
        self.position = SpoolPosition.decode(chain.spool_position)
        self.spool.recover(self.position)
        self._head = _head_of(chain)
        log.info(
            "ledger chain %s: head seq %d, replaying the spool from %s (%d bytes)",
            chain.chain_id,
            chain.head_seq,
            self.position.encode(),
            self.spool.backlog_bytes,
        )

    def start(self) -> None:
        if self._owns_lease and self.ownership is not None and self.ownership.grant is not None:
            self.ownership.start_keeper()
        self._thread = threading.Thread(target=self._run, name="ledger-writer", daemon=True)
        self._thread.start()

    @property
    def alive(self) -> bool:
        """Whether the writer thread runs (it ends on ``stop``, or when the chain was taken from it)."""
        return self._thread is not None and self._thread.is_alive()

    def stop(self, timeout_s: float = 10.0) -> None:
        """Drain what is spooled (bounded by ``timeout_s``) and stop the thread; a lease the writer claimed
        itself is released (one it was given is the giver's)."""
        self._stop.set()
        self._wake.set()
        if self._thread is not None:
            self._thread.join(timeout_s)
        if self._helper is not None:
            self._helper.shutdown(wait=True, cancel_futures=True)
            self._helper = None
        self._stop_preparer()
        if self._owns_lease and self.ownership is not None:
            self.ownership.release()

    def _preparer_failed(self, exc: BaseException) -> None:
        """The preparer died (killed, out of memory): prepare here, and start a new one on the next drain."""
        log.warning("ledger writer: %s; preparing here", exc)
        self._stop_preparer()

    def _stop_preparer(self) -> None:
        if self._preparer is not None:
            self._preparer.close()
            self._preparer = None

    def _preparer_for_backlog(self) -> PreparerProcess | None:
        """The preparer process when the backlog is worth it (started on first need, kept until ``stop``).

        A helper thread shares this process's GIL with the thread that feeds PostgreSQL, which then waits for
        it after every socket wait; a process of its own does not (bench/ledger_ingest.py). Starting one takes
        about a second, so it is for catching up on a large backlog, not for the steady trickle.
        """
        if (
            connection.vendor != "postgresql"
            or self.preparer_min_backlog_bytes is None
            or not settings.LEDGER_PREPARE_PROCESS
        ):
            return None
        if self._preparer is None:
            if self.spool.backlog_bytes < self.preparer_min_backlog_bytes:
                return None
            info = connection.connection.info
            try:
                self._preparer = PreparerProcess(info.dsn, info.password)
            except (OSError, PreparerFailed) as exc:
                log.warning("ledger writer: no preparer process (%s); preparing on a thread", exc)
                return None
            log.info(
                "ledger writer: %d bytes wait; preparing chunks in process %d",
                self.spool.backlog_bytes,
                self._preparer.pid,
            )
        return self._preparer

    def drain_once(self) -> int:
        """Write one chunk; returns the number of spool lines consumed (0 when nothing is waiting)."""
        lines, position = self.spool.read(self.position, self.max_chunk_bytes)
        if position == self.position:
            return 0
        chunk = prepare_chunk(lines, self.position, position, self._head)
        return chunk.lines if self._commit(chunk) else 0

    def _commit(self, chunk: PreparedChunk) -> bool:
        """Commit a chunk read from ``self.position``; False when another writer moved the checkpoint."""
        try:
            written, self._head = commit_chunk(self.spool.chain_id, chunk, self.spool, self.ownership)
        except ChainLost:
            self._head = None
            self._fence()
            raise
        except PositionMoved as moved:
            log.warning("ledger chain %s: %s; re-reading from there", self.spool.chain_id, moved)
            self.position = moved.position
            self._head = None
            return False
        except BaseException:
            self._head = None  # the transaction rolled back: the next commit reads the real head
            raise
        self.records_written += written
        self.position = chunk.end
        self.spool.acknowledge(chunk.end)
        return True

    def drain_available(self, *, until: float | None = None, stop: threading.Event | None = None) -> int:
        """Drain chunk after chunk until the spool is empty (or ``until``, a ``time.monotonic()``
        deadline, passes, or ``stop`` is set); returns the spool lines consumed.

        While the database inserts one chunk, the next is read, parsed and chained on a helper
        thread: the two overlap because the database works in its own process and this thread
        waits on it with the GIL released. Measured with ``bench/ledger_ingest.py`` (PostgreSQL on the
        same two cores): 26.8k request records/s chunk after chunk, 35.2k pipelined, 44k with the
        drainer's short GIL switch interval (``DRAINER_SWITCH_INTERVAL_S``).
        """
        if self._helper is None:
            self._helper = ThreadPoolExecutor(1, thread_name_prefix="ledger-prepare")
        consumed = 0
        lines, end = self.spool.read(self.position, self.max_chunk_bytes)
        if end == self.position:
            return 0
        copy_cursor = None
        if connection.vendor == "postgresql":
            connection.ensure_connection()
            copy_cursor = connection.connection.cursor()  # lends adapters to the helper; never executes
        preparer = self._preparer_for_backlog()
        ahead: Future[PreparedChunk] | None = None
        sent = False  # the chunk ahead is in the preparer process
        chunk = prepare_chunk(lines, self.position, end, self._head)
        chunk.raw = lines
        try:
            while True:
                if not chunk.chained and not chunk.refused and self._head is not None:
                    chunk.chain_from(self._head)  # parsed ahead before the head was known
                following, after = self.spool.read(chunk.end, self.max_chunk_bytes)
                head = chunk.end_head
                more = after != chunk.end
                if more and preparer is not None and head is not None:
                    try:
                        preparer.send(following, chunk.end, after, head)
                        sent = True
                    except PreparerFailed as exc:
                        self._preparer_failed(exc)
                        preparer = None
                if more and not sent:
                    ahead = self._helper.submit(prepare_chunk, following, chunk.end, after, head, copy_cursor)
                if not self._commit(chunk):
                    return consumed
                consumed += chunk.lines
                if not more or (until is not None and time.monotonic() > until) or (stop and stop.is_set()):
                    return consumed
                if sent:
                    assert preparer is not None
                    sent = False
                    try:
                        chunk = preparer.receive()
                    except PreparerFailed as exc:
                        self._preparer_failed(exc)
                        preparer = None
                        chunk = prepare_chunk(following, chunk.end, after, head, copy_cursor)
                else:
                    assert ahead is not None
                    chunk, ahead = ahead.result(), None
                chunk.raw = following
        finally:
            if ahead is not None:
                ahead.cancel()
            if sent and preparer is not None:
                preparer.discard()

    def _fence(self) -> None:
        if not self.fenced:
            self.fenced = True
            self.lease_lost_total += 1

    def drain_all(self, deadline_s: float = 30.0) -> None:
        end = time.monotonic() + deadline_s
        while time.monotonic() < end and self.drain_available(until=end):
            pass

    def _run(self) -> None:
        try:
            self._drain_until_stopped()
        finally:
            # Django's connections are per thread: this closes the writer thread's own, which nobody else
            # could close (``stop`` runs in another thread, whose connection is its caller's business).
            connection.close()

    def _drain_until_stopped(self) -> None:
        backoff = self.interval_s
        while True:
            stopping = self._stop.is_set()
            try:
                close_old_connections()
                if self.ownership is not None and self.ownership.lost:
                    # The keeper saw the lease taken over before a commit did.
                    raise ChainLost(self.spool.chain_id, self.ownership.lost_reason)
                self.drain_available(stop=None if stopping else self._stop)
                if not self.healthy:
                    log.warning("ledger writer: writing again (after %s)", self.last_error.splitlines()[0])
                self.healthy = True
                self.last_error = ""
                backoff = self.interval_s
            except ChainLost as exc:
                # Another process holds the chain now (a copy of this spool, or a replica that took it over
                # while this one was stalled): writing on would fork the chain. Stop for good, loudly; the
                # spool keeps what is not in the database, and readiness turns 503 on ``fenced``.
                self._fence()
                self.healthy = False
                self.last_error = str(exc)
                log.error(
                    "ledger writer stopped: %s; %d bytes stay in the spool at %s",
                    exc,
                    self.spool.backlog_bytes,
                    self.spool.directory,
                )
                return
            except DatabaseError as exc:
                self.healthy = False
                self.last_error = f"{type(exc).__name__}: {exc}"
                log.warning(
                    "ledger writer: database write failed (%s); %d bytes wait in the spool; retrying in %.1f s",
                    self.last_error.splitlines()[0],
                    self.spool.backlog_bytes,
                    backoff,
                )
                connection.close()
                backoff = min(self.max_backoff_s, backoff * 2)
            except Exception as exc:
                # A record refused for its data is quarantined inside the commit, so this is anything else (a
                # bug, the spool unreadable): the loop goes on from the checkpoint, which still holds what
                # failed; the failure is logged once with where the writer stood, and counted for /metrics.
                self.healthy = False
                self.last_error = f"{type(exc).__name__}: {exc}"
                self.thread_errors += 1
                self._thread_errors.record(
                    exc,
                    f"the ledger writer of chain {self.spool.chain_id} failed at spool position "
                    f"{self.position.encode()} ({self.spool.backlog_bytes} bytes waiting); it retries from there",
                    thread="ledger-writer",
                )
                with contextlib.suppress(DatabaseError):
                    connection.close()
                backoff = min(self.max_backoff_s, backoff * 2)
            if stopping:
                return
            self._wake.wait(backoff if not self.healthy else self.interval_s)
            self._wake.clear()


def write_drainer_status(
    directory: Path,
    thread_errors: dict[str, int],
    *,
    records_written: int | None = None,
    healthy: bool | None = None,
) -> None:
    """Publish this drainer process's thread error counts next to its spool (atomically: a temporary file, then
    a rename), for the gateway that started it to show in /metrics; with the records its writer committed and
    whether its last attempt succeeded, when given (``read_drainer_state``)."""
    status: dict[str, object] = {"pid": os.getpid(), "thread_errors": thread_errors}
    if records_written is not None:
        status["records_written"] = records_written
    if healthy is not None:
        status["healthy"] = healthy
    tmp = directory / f"{DRAINER_STATUS_FILE}.{os.getpid()}.tmp"
    tmp.write_bytes(orjson.dumps(status))
    os.replace(tmp, directory / DRAINER_STATUS_FILE)


def read_drainer_status(directory: Path) -> tuple[int, dict[str, int]] | None:
    """(pid, thread error counts) as a drainer process last published them; None when there is none (yet)."""
    try:
        status = orjson.loads((directory / DRAINER_STATUS_FILE).read_bytes())
        pid, counts = int(status["pid"]), status["thread_errors"]
        return pid, {str(name): int(count) for name, count in counts.items()}
    except FileNotFoundError:
        return None
    except (orjson.JSONDecodeError, KeyError, TypeError, ValueError, AttributeError) as exc:
        log.warning("ignoring the drainer's status file in %s: %s", directory, exc)
        return None


@dataclass(frozen=True)
class DrainerState:
    """What a drainer process last published about its writer (``write_drainer_status``)."""

    pid: int
    records_written: int | None
    healthy: bool | None


def read_drainer_state(directory: Path) -> DrainerState | None:
    """The writer's state as a drainer process last published it; None when there is none (yet)."""
    try:
        status = orjson.loads((directory / DRAINER_STATUS_FILE).read_bytes())
        written = status.get("records_written")
        healthy = status.get("healthy")
        return DrainerState(
            int(status["pid"]),
            None if written is None else int(written),
            None if healthy is None else bool(healthy),
        )
    except FileNotFoundError:
        return None
    except (orjson.JSONDecodeError, KeyError, TypeError, ValueError, AttributeError) as exc:
        log.warning("ignoring the drainer's status file in %s: %s", directory, exc)
        return None
