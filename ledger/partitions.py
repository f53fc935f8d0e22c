"""The ledger's monthly partitions on PostgreSQL (docs/ledger-partitioning.md).

The big ledger tables are partitioned ``BY RANGE (period)``, one partition a month (``ledger_request_p202611``
holds period 202611) and a ``DEFAULT`` partition (``ledger_request_pdefault``) for a record whose month has no
partition yet. ``ensure_partitions`` creates the months ahead (from migration 0004, ``setup`` and the daily beat
task) and moves what the default partition holds into proper partitions; ``partitions`` lists them;
``detach_partition`` and ``drop_partition`` are retention's, once a month is archived. On SQLite the tables are
not partitioned: every function here does nothing there (``partitions`` lists nothing).
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from typing import Any

from django.db import connection, transaction

from ledger.models import period_of_ns

log = logging.getLogger(__name__)

# The tables partitioned by period; the adjustments and quarantine markers (few rows) are plain tables.
PARTITIONED_TABLES = (
    "ledger_request",
    "ledger_batch",
    "ledger_interval",
    "ledger_idle",
    "ledger_request_energy",
    "ledger_batch_energy",
)
DEFAULT_SUFFIX = "_pdefault"


@dataclass(frozen=True)
class Partition:
    table: str  # the partitioned table
    name: str  # the partition's own table
    period: int | None  # None: the default partition
    rows_estimate: int  # PostgreSQL's estimate (pg_class.reltuples, after ANALYZE or autovacuum); -1: unknown


def next_period(period: int) -> int:
    year, month = divmod(period, 100)
    return (year + 1) * 100 + 1 if month >= 12 else year * 100 + month + 1


def periods_from(period: int, months: int) -> list[int]:
    """``period`` and the ``months`` after it."""
    out = [period]
    for _ in range(months):
        out.append(next_period(out[-1]))
    return out


def is_period(period: int) -> bool:
    return 1 <= period % 100 <= 12 and period >= 100


def partition_name(table: str, period: int) -> str:
    return f"{table}_p{period}"


def _check_table(table: str) -> None:
    if table not in PARTITIONED_TABLES:
        raise ValueError(f"{table!r} is not a partitioned ledger table ({', '.join(PARTITIONED_TABLES)})")


def partitioned() -> bool:
    """Whether this database partitions the ledger (PostgreSQL after migration ledger 0004)."""
    if connection.vendor != "postgresql":
        return False
    with connection.cursor() as cur:
        cur.execute("SELECT 1 FROM pg_partitioned_table WHERE partrelid = 'ledger_request'::regclass")
        return cur.fetchone() is not None


def partitions(table: str | None = None) -> list[Partition]:
    """The partitions of the ledger's tables (of ``table`` only, when given), oldest month first, each table's
    default partition last."""
    if connection.vendor != "postgresql":
        return []
    tables = [table] if table is not None else list(PARTITIONED_TABLES)
    for name in tables:
        _check_table(name)
    with connection.cursor() as cur:
        cur.execute(
            "SELECT parent.relname, child.relname, child.reltuples::bigint "
            "FROM pg_inherits JOIN pg_class parent ON parent.oid = pg_inherits.inhparent "
            "JOIN pg_class child ON child.oid = pg_inherits.inhrelid "
            "WHERE parent.relname = ANY(%s) AND child.relkind IN ('r', 'p')",
            [tables],
        )
        rows = cur.fetchall()
    found = []
    for parent, name, estimate in rows:
        suffix = name[len(parent) :]
        period = None if suffix == DEFAULT_SUFFIX else int(suffix[2:]) if suffix[2:].isdigit() else None
        found.append(Partition(parent, name, period, int(estimate)))
    return sorted(found, key=lambda p: (tables.index(p.table), p.period is None, p.period or 0))


def _existing(cur: Any, table: str) -> set[str]:
    cur.execute(
        "SELECT child.relname FROM pg_inherits JOIN pg_class child ON child.oid = pg_inherits.inhrelid "
        "WHERE pg_inherits.inhparent = %s::regclass",
        [table],
    )
    return {name for (name,) in cur.fetchall()}


def create_partition(table: str, period: int) -> bool:
    """Create the partition of ``period`` for ``table`` unless it exists; returns whether it created one.

    Rows of that month already in the default partition (written while the month had no partition) are moved
    into it: PostgreSQL refuses a new partition while the default one holds rows of its range, so the default
    partition is detached for the moment, its rows of the month moved, and attached again, in one transaction.
    """
    _check_table(table)
    if not is_period(period):
        raise ValueError(f"not a period (yyyymm): {period}")
    name = partition_name(table, period)
    default = table + DEFAULT_SUFFIX
    bounds = f"FOR VALUES FROM ({int(period)}) TO ({next_period(period)})"
    with transaction.atomic(), connection.cursor() as cur:
        # One maintenance run at a time per table (the daily task and `setup` may meet); the drainer's inserts
        # wait for the few statements below, no longer.
        cur.execute("SELECT pg_advisory_xact_lock(hashtext(%s))", [f"ledger-partitions:{table}"])
        existing = _existing(cur, table)
        if name in existing:
            return False
        waiting = 0
        if default in existing:
            cur.execute(
                f"SELECT count(*) FROM {default} WHERE period >= %s AND period < %s",
                [period, next_period(period)],
            )
            waiting = cur.fetchone()[0]
        if not waiting:
            cur.execute(f"CREATE TABLE {name} PARTITION OF {table} {bounds}")
            return True
        cur.execute(f"ALTER TABLE {table} DETACH PARTITION {default}")
        cur.execute(f"CREATE TABLE {name} PARTITION OF {table} {bounds}")
        cur.execute(
            f"WITH moved AS (DELETE FROM {default} WHERE period >= %s AND period < %s RETURNING *) "
            f"INSERT INTO {name} SELECT * FROM moved",
            [period, next_period(period)],
        )
        cur.execute(f"ALTER TABLE {table} ATTACH PARTITION {default} DEFAULT")
    log.warning(
        "ledger: %d rows of %s for period %d were in the default partition; moved into %s",
        waiting,
        table,
        period,
        name,
    )
    return True


def ensure_partitions(months_ahead: int) -> list[str]:
    """Create the partitions of this month and ``months_ahead`` months after it, and of every month the default
    partitions hold rows of (moving them there); returns the partitions created. Safe to run any time, and
    twice: it creates only what is missing. Does nothing where the ledger is not partitioned."""
    if not partitioned():
        return []
    wanted = periods_from(period_of_ns(time.time_ns()), max(0, months_ahead))
    created = []
    for table in PARTITIONED_TABLES:
        with connection.cursor() as cur:
            cur.execute(f"SELECT DISTINCT period FROM {table + DEFAULT_SUFFIX}")
            stranded = sorted(period for (period,) in cur.fetchall() if is_period(period))
        for period in sorted({*wanted, *stranded}):
            if create_partition(table, period):
                created.append(partition_name(table, period))
    if created:
        log.info("ledger: created the partitions %s", ", ".join(created))
    return created


def _refuse_current(period: int) -> None:
    if period >= period_of_ns(time.time_ns()):
        raise ValueError(f"period {period} is this month or later: its partition is still written to")


def detach_partition(table: str, period: int) -> str:
    """Detach the partition of ``period`` from ``table`` (a month before this one): its rows leave the ledger's
    table but stay in the partition's own table, whose name is returned (to archive, then drop). Detaching one
    already detached returns its name again."""
    _check_table(table)
    _refuse_current(period)
    name = partition_name(table, period)
    with transaction.atomic(), connection.cursor() as cur:
        cur.execute("SELECT pg_advisory_xact_lock(hashtext(%s))", [f"ledger-partitions:{table}"])
        if name in _existing(cur, table):
            cur.execute(f"ALTER TABLE {table} DETACH PARTITION {name}")
    return name


def drop_partition(table: str, period: int) -> bool:
    """Detach (when attached) and drop the partition of ``period`` (a month before this one), with its rows:
    retention's, after archiving them. Returns whether there was one to drop."""
    name = detach_partition(table, period)
    with connection.cursor() as cur:
        cur.execute("SELECT to_regclass(%s)", [name])
        if cur.fetchone()[0] is None:
            return False
        cur.execute(f"DROP TABLE {name}")
    log.info("ledger: dropped the partition %s", name)
    return True
