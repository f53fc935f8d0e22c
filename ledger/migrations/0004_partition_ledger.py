"""The big ledger tables partitioned by month on PostgreSQL (docs/ledger-partitioning.md).

PostgreSQL requires the partition key in every unique constraint, the primary key included, so the unique keys
become (chain, seq, period), (request_id, period), ... on both engines (the model's state), and on PostgreSQL
each table is rebuilt as one partitioned ``BY RANGE (period)``: a partitioned table with the same columns (and
the byte-order "C" collation of the id columns, carbonledger 0010 and 0011), a partition for each month the rows
hold and for this month and the months ahead, a DEFAULT partition; the rows copied; the old table dropped and the
new one renamed; its id drawn from a sequence that goes on where the old identity column stood, owned by the
column; the primary key (id, period), the unique constraints and the indexes created last (faster than row by
row). On SQLite the constraints change and nothing else. Reversible: backwards, each table is rebuilt plain.
"""

from __future__ import annotations

import time
from typing import Any

from django.conf import settings
from django.db import migrations, models

# table -> (unique constraints and plain indexes after partitioning, before), each (name, columns, unique)
Index = tuple[str, tuple[str, ...], bool]
TABLES: dict[str, tuple[list[Index], list[Index]]] = {
    "ledger_batch": (
        [
            ("ledger_batch_chain_seq_period", ("chain_id", "seq", "period"), True),
            ("ledger_batch_id_period", ("batch_id", "period"), True),
        ],
        [
            ("ledger_batch_chain_seq", ("chain_id", "seq"), True),
            ("ledger_batch_id", ("batch_id",), True),
        ],
    ),
    "ledger_request": (
        [
            ("ledger_request_chain_seq_period", ("chain_id", "seq", "period"), True),
            ("ledger_request_id_period", ("request_id", "period"), True),
            ("ledger_request_org_time", ("organization_id", "received_ns"), False),
        ],
        [
            ("ledger_request_chain_seq", ("chain_id", "seq"), True),
            ("ledger_request_id", ("request_id",), True),
            ("ledger_request_org_time", ("organization_id", "received_ns"), False),
        ],
    ),
    "ledger_interval": (
        [
            ("ledger_interval_chain_seq_period", ("chain_id", "seq", "period"), True),
            ("ledger_interval_id_period", ("interval_id", "period"), True),
        ],
        [
            ("ledger_interval_chain_seq", ("chain_id", "seq"), True),
            ("ledger_interval_id", ("interval_id",), True),
        ],
    ),
    "ledger_idle": (
        [
            ("ledger_idle_chain_seq_period", ("chain_id", "seq", "period"), True),
            ("ledger_idle_interval_id_period", ("interval_id", "period"), True),
        ],
        [
            ("ledger_idle_chain_seq", ("chain_id", "seq"), True),
            ("ledger_idle_interval_id", ("interval_id",), True),
        ],
    ),
    "ledger_request_energy": (
        [
            ("ledger_request_energy_chain_seq_period", ("chain_id", "seq", "period"), True),
            ("ledger_energy_request", ("request_id",), False),
        ],
        [
            ("ledger_request_energy_chain_seq", ("chain_id", "seq"), True),
            ("ledger_energy_request", ("request_id",), False),
        ],
    ),
    "ledger_batch_energy": (
        [
            ("ledger_batch_energy_chain_seq_period", ("chain_id", "seq", "period"), True),
            ("ledger_batch_energy_key_period", ("batch_id", "interval_id", "period"), True),
        ],
        [
            ("ledger_batch_energy_chain_seq", ("chain_id", "seq"), True),
            ("ledger_batch_energy_key", ("batch_id", "interval_id"), True),
        ],
    ),
}
MONTHS_AHEAD_DEFAULT = 3


def _next_period(period: int) -> int:
    year, month = divmod(period, 100)
    return (year + 1) * 100 + 1 if month >= 12 else year * 100 + month + 1


def _is_period(period: int) -> bool:
    return period >= 100 and 1 <= period % 100 <= 12


def _this_month() -> int:
    now = time.gmtime()
    return now.tm_year * 100 + now.tm_mon


def _next_id(cur: Any, table: str) -> int:
    """The id the table's next row gets: where its id sequence stands, and past every id it holds."""
    cur.execute("SELECT pg_get_serial_sequence(%s, 'id')", [table])
    (sequence,) = cur.fetchone()
    following = 1
    if sequence is not None:
        cur.execute(f"SELECT last_value, is_called FROM {sequence}")
        last, called = cur.fetchone()
        following = last + 1 if called else last
    cur.execute(f"SELECT COALESCE(MAX(id), 0) + 1 FROM {table}")
    return max(following, cur.fetchone()[0])


def _keys(cur: Any, table: str, indexes: list[Index], primary: tuple[str, ...]) -> None:
    cur.execute(f"ALTER TABLE {table} ADD CONSTRAINT {table}_pkey PRIMARY KEY ({', '.join(primary)})")
    for name, columns, unique in indexes:
        if unique:
            cur.execute(f"ALTER TABLE {table} ADD CONSTRAINT {name} UNIQUE ({', '.join(columns)})")
        else:
            cur.execute(f"CREATE INDEX {name} ON {table} ({', '.join(columns)})")


def partition(apps: Any, schema_editor: Any) -> None:
    if schema_editor.connection.vendor != "postgresql":
        return
    months_ahead = getattr(settings, "LEDGER_PARTITION_MONTHS_AHEAD", MONTHS_AHEAD_DEFAULT)
    ahead = [_this_month()]
    for _ in range(months_ahead):
        ahead.append(_next_period(ahead[-1]))
    with schema_editor.connection.cursor() as cur:
        for table, (indexes, _before) in TABLES.items():
            new = f"{table}__partitioned"
            following = _next_id(cur, table)
            # LIKE copies the columns, their types, collations and NOT NULL; not the identity of id, which a
            # partitioned table (before PostgreSQL 17) cannot have: a sequence takes its place below.
            cur.execute(f"CREATE TABLE {new} (LIKE {table}) PARTITION BY RANGE (period)")
            cur.execute(f"SELECT DISTINCT period FROM {table}")
            held = {period for (period,) in cur.fetchall()}
            for period in sorted({p for p in held if _is_period(p)} | set(ahead)):
                cur.execute(
                    f"CREATE TABLE {table}_p{period} PARTITION OF {new} "
                    f"FOR VALUES FROM ({period}) TO ({_next_period(period)})"
                )
            cur.execute(f"CREATE TABLE {table}_pdefault PARTITION OF {new} DEFAULT")
            cur.execute(f"INSERT INTO {new} SELECT * FROM {table}")
            cur.execute(f"DROP TABLE {table}")
            cur.execute(f"ALTER TABLE {new} RENAME TO {table}")
            cur.execute(f"CREATE SEQUENCE {table}_id_seq OWNED BY {table}.id")
            cur.execute(f"SELECT setval('{table}_id_seq', %s, false)", [following])
            cur.execute(
                f"ALTER TABLE {table} ALTER COLUMN id SET DEFAULT nextval('{table}_id_seq'::regclass)"
            )
            _keys(cur, table, indexes, ("id", "period"))
            cur.execute(f"ANALYZE {table}")


def unpartition(apps: Any, schema_editor: Any) -> None:
    if schema_editor.connection.vendor != "postgresql":
        return
    with schema_editor.connection.cursor() as cur:
        for table, (_after, indexes) in TABLES.items():
            plain = f"{table}__plain"
            following = _next_id(cur, table)
            cur.execute(f"CREATE TABLE {plain} (LIKE {table})")
            cur.execute(f"INSERT INTO {plain} SELECT * FROM {table}")
            cur.execute(f"DROP TABLE {table}")  # its partitions and its id sequence with it
            cur.execute(f"ALTER TABLE {plain} RENAME TO {table}")
            cur.execute(
                f"ALTER TABLE {table} ALTER COLUMN id ADD GENERATED BY DEFAULT AS IDENTITY (START WITH {following})"
            )
            _keys(cur, table, indexes, ("id",))


class OnSQLite:
    """A constraint operation the database runs on SQLite only: on PostgreSQL the table rebuild makes the
    constraints (``partition``), and the operation changes the model's state alone."""

    def database_forwards(self, app_label: str, schema_editor: Any, from_state: Any, to_state: Any) -> None:
        if schema_editor.connection.vendor != "postgresql":
            super().database_forwards(app_label, schema_editor, from_state, to_state)  # type: ignore[misc]

    def database_backwards(self, app_label: str, schema_editor: Any, from_state: Any, to_state: Any) -> None:
        if schema_editor.connection.vendor != "postgresql":
            super().database_backwards(app_label, schema_editor, from_state, to_state)  # type: ignore[misc]


class AddConstraintOnSQLite(OnSQLite, migrations.AddConstraint):
    pass


class RemoveConstraintOnSQLite(OnSQLite, migrations.RemoveConstraint):
    pass


MODELS = {
    "ledger_batch": "ledgerbatch",
    "ledger_request": "ledgerrequest",
    "ledger_interval": "ledgerinterval",
    "ledger_idle": "ledgeridle",
    "ledger_request_energy": "ledgerrequestenergy",
    "ledger_batch_energy": "ledgerbatchenergy",
}


def _field_names(columns: tuple[str, ...]) -> list[str]:
    return [column.removesuffix("_id") if column == "chain_id" else column for column in columns]


class Migration(migrations.Migration):
    dependencies = [("ledger", "0003_period")]

    operations = [
        *(
            RemoveConstraintOnSQLite(model_name=MODELS[table], name=name)
            for table, (_after, before) in TABLES.items()
            for name, _columns, unique in before
            if unique
        ),
        *(
            AddConstraintOnSQLite(
                model_name=MODELS[table],
                constraint=models.UniqueConstraint(fields=_field_names(columns), name=name),
            )
            for table, (after, _before) in TABLES.items()
            for name, columns, unique in after
            if unique
        ),
        migrations.RunPython(partition, unpartition),
    ]
