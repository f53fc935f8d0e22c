"""Energy per batch and interval with its split over the batch's requests, one row instead of one per request.

Its id columns get the byte-order ("C") collation on PostgreSQL, like the other ledger ids (0010).
"""

from typing import Any

import django.db.models.deletion
from django.db import migrations, models


def _collate(collation: str) -> Any:
    def run(apps: Any, schema_editor: Any) -> None:
        if schema_editor.connection.vendor != "postgresql":
            return
        quote = schema_editor.quote_name
        for column in ("batch_id", "interval_id"):
            schema_editor.execute(
                f"ALTER TABLE {quote('ledger_batch_energy')} ALTER COLUMN {quote(column)} "
                f"TYPE varchar(64) COLLATE {quote(collation)}"
            )

    return run


class Migration(migrations.Migration):
    dependencies = [
        ("carbonledger", "0010_ledger_ids_c_collation"),
    ]

    operations = [
        migrations.CreateModel(
            name="LedgerBatchEnergy",
            fields=[
                (
                    "id",
                    models.BigAutoField(
                        auto_created=True, primary_key=True, serialize=False, verbose_name="ID"
                    ),
                ),
                ("seq", models.BigIntegerField()),
                ("prev_hash", models.CharField(max_length=64)),
                ("hash", models.CharField(max_length=64)),
                ("batch_id", models.CharField(max_length=64)),
                ("interval_id", models.CharField(max_length=64)),
                ("energy_uj", models.BigIntegerField()),
                ("request_ids", models.TextField()),
                ("shares_uj", models.TextField()),
                (
                    "final",
                    models.BooleanField(
                        default=False, help_text="the batch is fully allocated with this part"
                    ),
                ),
                (
                    "chain",
                    models.ForeignKey(
                        db_constraint=False,
                        db_index=False,
                        on_delete=django.db.models.deletion.PROTECT,
                        related_name="+",
                        to="carbonledger.ledgerchain",
                    ),
                ),
            ],
            options={
                "db_table": "ledger_batch_energy",
                "constraints": [
                    models.UniqueConstraint(fields=("chain", "seq"), name="ledger_batch_energy_chain_seq"),
                    models.UniqueConstraint(
                        fields=("batch_id", "interval_id"), name="ledger_batch_energy_key"
                    ),
                ],
            },
        ),
        migrations.RunPython(_collate("C"), _collate("default")),
    ]
