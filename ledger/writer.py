"""Drains the gateway's spool into the database, in bulk, on one thread.

The chain head and the spool position reached move in the same transaction as the records,
so a crash at any point replays exactly what was not committed: replay is idempotent by
construction, and a natural-key conflict (the same request id twice) is filtered out, not
duplicated. While the database is down the writer backs off and the spool grows on disk
(bounded; the gateway answers 503 when it is full); everything drains when it returns.
"""

from __future__ import annotations

import io
import logging
import threading
import time
from collections import defaultdict
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import orjson
from django.conf import settings
from django.db import DatabaseError, IntegrityError, close_old_connections, connection, transaction
from psycopg.copy import Copy, FileWriter

from inference.spool import Spool, SpoolPosition, SpoolReader
from ledger.models import LedgerChain
from ledger.preparer import PreparerFailed, PreparerProcess
from ledger.records import CHAIN_COLUMNS, KINDS, RecordKind, link_hash, normalize, normalizer
from tenancy.models import Device, Site

log = logging.getLogger(__name__)

# The drainer process's GIL switch interval (Python's default is 5 ms). While the helper thread
# prepares a chunk, the thread feeding the database needs the GIL back after every socket wait;
# at 5 ms it waits and the database idles. Measured with bench/ledger_ingest.py on PostgreSQL:
# 36.7k request records/s at 5 ms, 42.7k at 0.5 ms.
DRAINER_SWITCH_INTERVAL_S = 0.0005

# Insert order inside one transaction: what others refer to goes first.
KIND_ORDER = ("batch", "req", "interval", "idle", "energy", "batch_energy", "adjustment")


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
        types = ["int8", "int8", "text", "text"]  # chain_id, seq, prev_hash, hash
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
    the previous chunk), the commit chains the records again from the real head.
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
    rows: dict[str, list[tuple[Any, ...]]] | None = None
    end_seq: int = 0
    end_hash: str = ""
    payloads: dict[str, bytes] | None = None  # binary COPY streams of ``rows``, per kind

    def parsed_records(self) -> list[dict[str, Any]]:
        if self.records is None:
            self.records = _parse(self.raw or [])
        return self.records

    def chain_from(self, head: tuple[int, int, str], copy_cursor: Any = None) -> None:
        self.chain_pk, self.head_seq, self.head_hash = head
        self.rows, self.end_seq, self.end_hash, self.devices = _chain(*head, self.parsed_records())
        if copy_cursor is not None:
            self.payloads = {k: copy_payload(copy_cursor, KINDS[k], rows) for k, rows in self.rows.items()}

    @property
    def chained(self) -> bool:
        return self.chain_pk is not None and (self.rows is not None or self.payloads is not None)

    @property
    def end_head(self) -> tuple[int, int, str] | None:
        """The chain head after this chunk, when it was chained ahead."""
        if not self.chained or self.chain_pk is None:
            return None
        return self.chain_pk, self.end_seq, self.end_hash


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
    head: tuple[int, int, str] | None = None,
    copy_cursor: Any = None,
) -> PreparedChunk:
    """Parse ``lines`` and, given ``head`` = (chain pk, head seq, head hash), chain them from it
    (and format their COPY streams, given a psycopg ``copy_cursor``)."""
    records = _parse(lines)
    chunk = PreparedChunk(start=start, end=end, lines=len(lines), devices=[], records=records)
    if head is not None:
        chunk.chain_from(head, copy_cursor)
    else:
        chunk.devices = [r for r in records if r.get("k") == "device"]
    return chunk


def commit_chunk(chain_id: str, chunk: PreparedChunk) -> tuple[int, tuple[int, int, str]]:
    """Insert a chunk in one transaction with the chain head and the spool position it reaches.

    Returns how many chained records were written and the chain's new head (pk, seq, hash).
    Raises ``PositionMoved`` when the database checkpoint is not at ``chunk.start``.
    """
    with transaction.atomic():
        chain = _lock_chain(chain_id)
        at = SpoolPosition.decode(chain.spool_position)
        if at != chunk.start:
            raise PositionMoved(at)
        if chunk.devices:
            upsert_devices(chunk.devices)
        try:
            with transaction.atomic():
                if chunk.chained and (chunk.chain_pk, chunk.head_seq, chunk.head_hash) == (
                    chain.pk,
                    chain.head_seq,
                    chain.head_hash,
                ):
                    _insert(chunk.rows, chunk.payloads)
                    written = chunk.end_seq - chain.head_seq
                    chain.head_seq, chain.head_hash = chunk.end_seq, chunk.end_hash
                else:
                    written = _chain_and_insert(chain, chunk.parsed_records())
        except IntegrityError:
            # Only a record already in the ledger can collide (the same id spooled twice):
            # drop those and chain the rest, so the ledger holds each id exactly once.
            written = _chain_and_insert(chain, _without_existing(chunk.parsed_records()))
        with connection.cursor() as cur:
            cur.execute(
                f"UPDATE {LedgerChain._meta.db_table} SET head_seq = %s, head_hash = %s, spool_position = %s "
                "WHERE id = %s",
                [chain.head_seq, chain.head_hash, chunk.end.encode(), chain.pk],
            )
    return written, (chain.pk, chain.head_seq, chain.head_hash)


def _lock_chain(chain_id: str) -> LedgerChain:
    """The chain's row, locked until the transaction ends (created when new).

    Plain SQL rather than the ORM: this runs once a chunk on the thread that shares the GIL with the
    chunk being prepared, where the ORM's Python cost about 25 ms a chunk (measured).
    """
    lock = " FOR UPDATE" if connection.features.has_select_for_update else ""
    sql = f"SELECT id, head_seq, head_hash, spool_position FROM {LedgerChain._meta.db_table} WHERE chain_id = %s{lock}"
    with connection.cursor() as cur:
        cur.execute(sql, [chain_id])
        row = cur.fetchone()
        if row is None:
            LedgerChain.objects.get_or_create(chain_id=chain_id)
            cur.execute(sql, [chain_id])
            row = cur.fetchone()
    pk, head_seq, head_hash, position = row
    return LedgerChain(
        pk=pk, chain_id=chain_id, head_seq=head_seq, head_hash=head_hash, spool_position=position
    )


def append_records(chain_id: str, records: list[dict[str, Any]]) -> int:
    """Chain and insert records (spool-shaped dicts) at the head of ``chain_id``, outside any spool:
    for writers that are not a gateway (the synthetic demo ledger). Returns how many were written."""
    with transaction.atomic():
        chain, _ = LedgerChain.objects.get_or_create(chain_id=chain_id)
        chain = LedgerChain.objects.select_for_update().get(pk=chain.pk)
        written = _chain_and_insert(chain, records)
        chain.save(update_fields=["head_seq", "head_hash"])
    return written


def _chain(
    chain_pk: int, seq: int, prev: str, records: list[dict[str, Any]]
) -> tuple[dict[str, list[tuple[Any, ...]]], int, str, list[dict[str, Any]]]:
    """Rows per kind for ``records`` chained after (seq, prev), the new head seq and hash, and the
    device records met on the way (not chained: a device's facts are upserted).

    The normalizers are looked up once: this loop runs for every record, and the writer's rate is
    bounded by it (bench/ledger_ingest.py).
    """
    rows: dict[str, list[tuple[Any, ...]]] = {}
    devices: list[dict[str, Any]] = []
    fns = {k: normalizer(kind) for k, kind in KINDS.items()}
    for rec in records:
        k = rec.get("k")
        fn = fns.get(k)
        if fn is None:
            if k == "device":
                devices.append(rec)
            else:
                log.error("spool record of unknown kind %r skipped: %s", k, rec)
            continue
        try:
            values = fn(rec)
        except KeyError:
            values = normalize(KINDS[k], rec)  # raises, naming the field
        seq += 1
        digest = link_hash(prev, k, seq, values)
        rows.setdefault(k, []).append((chain_pk, seq, prev, digest, *values))
        prev = digest
    return rows, seq, prev, devices


def _insert(rows: dict[str, list[tuple[Any, ...]]] | None, payloads: dict[str, bytes] | None = None) -> None:
    """Insert a chunk's rows per kind, or their COPY streams formatted ahead (PostgreSQL)."""
    for k in KIND_ORDER:
        payload = payloads.get(k) if payloads else None
        if (rows and rows.get(k)) or payload is not None:
            bulk_insert(KINDS[k], rows.get(k) if rows else None, payload)


def _chain_and_insert(chain: LedgerChain, records: list[dict[str, Any]]) -> int:
    rows, seq, prev, _devices = _chain(chain.pk, chain.head_seq, chain.head_hash, records)
    _insert(rows)
    written = seq - chain.head_seq
    chain.head_seq = seq
    chain.head_hash = prev
    return written


def _natural_key(kind: RecordKind, rec: dict[str, Any]) -> tuple[Any, ...]:
    return tuple(rec[name] for name in kind.natural_key)


def _existing_keys(kind: RecordKind, keys: set[tuple[Any, ...]]) -> set[tuple[Any, ...]]:
    """Which of ``keys`` the ledger already holds, found through the key's first (indexed) field."""
    first = kind.natural_key[0]
    rows = kind.model._default_manager.filter(**{f"{first}__in": {key[0] for key in keys}})
    return set(rows.values_list(*kind.natural_key))


def _without_existing(records: list[dict[str, Any]]) -> list[dict[str, Any]]:
    wanted: dict[str, set[tuple[Any, ...]]] = defaultdict(set)
    for rec in records:
        kind = KINDS.get(rec.get("k", ""))
        if kind is not None:
            wanted[kind.kind].add(_natural_key(kind, rec))
    existing = {k: _existing_keys(KINDS[k], keys) for k, keys in wanted.items()}
    kept: list[dict[str, Any]] = []
    seen: dict[str, set[tuple[Any, ...]]] = defaultdict(set)
    for rec in records:
        kind = KINDS.get(rec.get("k", ""))
        if kind is None:
            continue
        key = _natural_key(kind, rec)
        if key in existing[kind.kind] or key in seen[kind.kind]:
            log.warning("ledger already holds %s %s; the duplicate is not written again", kind.kind, key)
            continue
        seen[kind.kind].add(key)
        kept.append(rec)
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
    ) -> None:
        """``preparer_min_backlog_bytes``: on PostgreSQL, from this backlog on the next chunks are prepared in a
        preparer process rather than on a helper thread (None: never)."""
        self.spool = spool
        self.interval_s = interval_s
        self.max_chunk_bytes = max_chunk_bytes
        self.max_backoff_s = max_backoff_s
        self.preparer_min_backlog_bytes = preparer_min_backlog_bytes
        self._preparer: PreparerProcess | None = None
        self.position = SpoolPosition.start()
        self.records_written = 0
        self.last_error = ""
        self.healthy = True
        self._stop = threading.Event()
        self._wake = threading.Event()
        self._thread: threading.Thread | None = None
        self._helper: ThreadPoolExecutor | None = None
        # (chain pk, head seq, head hash) as last committed, to chain the next chunk before the
        # database has it; None when unknown (the commit then chains from the locked row).
        self._head: tuple[int, int, str] | None = None

    def recover(self) -> None:
        """Read the checkpoint from the database and make the spool replay from there."""
        chain, _ = LedgerChain.objects.get_or_create(chain_id=self.spool.chain_id)
        self.position = SpoolPosition.decode(chain.spool_position)
        self.spool.recover(self.position)
        self._head = (chain.pk, chain.head_seq, chain.head_hash)
        log.info(
            "ledger chain %s: head seq %d, replaying the spool from %s (%d bytes)",
            chain.chain_id,
            chain.head_seq,
            self.position.encode(),
            self.spool.backlog_bytes,
        )

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="ledger-writer", daemon=True)
        self._thread.start()

    def stop(self, timeout_s: float = 10.0) -> None:
        """Drain what is spooled (bounded by ``timeout_s``) and stop the thread."""
        self._stop.set()
        self._wake.set()
        if self._thread is not None:
            self._thread.join(timeout_s)
        if self._helper is not None:
            self._helper.shutdown(wait=True, cancel_futures=True)
            self._helper = None
        self._stop_preparer()

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
            written, self._head = commit_chunk(self.spool.chain_id, chunk)
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
                if not chunk.chained and self._head is not None:
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
                self.drain_available(stop=None if stopping else self._stop)
                if not self.healthy:
                    log.warning("ledger writer: database reachable again; spool drained")
                self.healthy = True
                self.last_error = ""
                backoff = self.interval_s
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
                # A record the ledger refuses (fields that contradict each other, a malformed line) stops the
                # drain at its chunk rather than leaving a hole in the chain: the spool keeps it, the gateway
                # goes on until the spool is full, and the error names the record for an operator.
                self.healthy = False
                self.last_error = f"{type(exc).__name__}: {exc}"
                log.exception("ledger writer: unexpected error; retrying")
                connection.close()
                backoff = min(self.max_backoff_s, backoff * 2)
            if stopping:
                return
            self._wake.wait(backoff if not self.healthy else self.interval_s)
            self._wake.clear()
