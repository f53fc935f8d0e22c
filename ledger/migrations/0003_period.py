"""Every ledger record placed in a month: ``period`` (yyyymm) on each chained table, ``head_period`` on the chain.

Existing rows are placed by the writer's rule (docs/ledger-partitioning.md): a record's period is the largest
UTC month of its own time among the records of its chain up to it (every kind, in seq order), so it never
decreases along a chain; records with no time of their own (energy parts) take that running maximum too, or the
chain's first month when nothing before them has a time. The placement is computed once in SQL (a window
function over the union of the chain's records, into a keyed temporary table), then one UPDATE per table: no
Python loop over rows, whatever their number. ``period`` is not hashed: every record verifies as before.
"""

from __future__ import annotations

from typing import Any

from django.db import migrations, models

# (table, the column holding the record's own time in ns, or None)
TABLES = (
    ("ledger_batch", "start_ns"),
    ("ledger_request", "received_ns"),
    ("ledger_interval", "t0_ns"),
    ("ledger_idle", "t0_ns"),
    ("ledger_request_energy", None),
    ("ledger_batch_energy", None),
    ("ledger_adjustment", "created_ns"),
    ("ledger_quarantine_marker", "created_ns"),
)
PLACEMENT = "ledger_period_placement"


def _month(vendor: str, column: str) -> str:
    """SQL for the UTC month (yyyymm, an integer) of a time in ns."""
    if vendor == "postgresql":
        return (
            f"CAST(to_char(to_timestamp(({column} / 1000000000)::double precision) AT TIME ZONE 'UTC', "
            "'YYYYMM') AS integer)"
        )
    return f"CAST(strftime('%Y%m', {column} / 1000000000, 'unixepoch') AS INTEGER)"


def place(apps: Any, schema_editor: Any) -> None:
    vendor = schema_editor.connection.vendor
    union = " UNION ALL ".join(
        f"SELECT chain_id, seq, {_month(vendor, time) if time else 'NULL'} AS own FROM {table}"
        for table, time in TABLES
    )
    # The running maximum of the months along each chain; where nothing before a record has a time, the chain's
    # first month (never more than the running maximum after it, so the order holds).
    schema_editor.execute(f"CREATE TEMPORARY TABLE {PLACEMENT} (chain_id bigint, seq bigint, period integer)")
    schema_editor.execute(
        f"INSERT INTO {PLACEMENT} (chain_id, seq, period) "
        "SELECT chain_id, seq, COALESCE("
        "  MAX(own) OVER (PARTITION BY chain_id ORDER BY seq ROWS BETWEEN UNBOUNDED PRECEDING AND CURRENT ROW),"
        "  MIN(own) OVER (PARTITION BY chain_id),"
        "  0"
        f") FROM ({union}) AS records"
    )
    schema_editor.execute(f"CREATE UNIQUE INDEX {PLACEMENT}_key ON {PLACEMENT} (chain_id, seq)")
    if vendor == "postgresql":
        schema_editor.execute(f"ANALYZE {PLACEMENT}")
    for table, _time in TABLES:
        schema_editor.execute(
            f"UPDATE {table} SET period = p.period FROM {PLACEMENT} AS p "
            f"WHERE p.chain_id = {table}.chain_id AND p.seq = {table}.seq"
        )
    schema_editor.execute(
        "UPDATE carbonledger_ledgerchain SET head_period = COALESCE("
        f"(SELECT MAX(p.period) FROM {PLACEMENT} AS p WHERE p.chain_id = carbonledger_ledgerchain.id), 0)"
    )
    schema_editor.execute(f"DROP TABLE {PLACEMENT}")


class Migration(migrations.Migration):
    dependencies = [("ledger", "0002_quarantine")]

    operations = [
        migrations.AddField(
            model_name="ledgerchain",
            name="head_period",
            field=models.IntegerField(default=0),
        ),
        *(
            migrations.AddField(
                model_name=model,
                name="period",
                field=models.IntegerField(default=0),
                preserve_default=False,
            )
            for model in (
                "ledgerbatch",
                "ledgerrequest",
                "ledgerinterval",
                "ledgeridle",
                "ledgerrequestenergy",
                "ledgerbatchenergy",
                "ledgeradjustment",
                "ledgerquarantinemarker",
            )
        ),
        migrations.RunPython(place, migrations.RunPython.noop),
    ]
