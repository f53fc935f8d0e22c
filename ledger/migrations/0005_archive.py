"""The ledger's archives (issue 24, retention): a chain's records moved to a file, recorded once written."""

import django.db.models.deletion
from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [("ledger", "0004_partition_ledger")]

    operations = [
        migrations.CreateModel(
            name="LedgerArchive",
            fields=[
                (
                    "id",
                    models.BigAutoField(
                        auto_created=True, primary_key=True, serialize=False, verbose_name="ID"
                    ),
                ),
                ("from_seq", models.BigIntegerField()),
                ("to_seq", models.BigIntegerField()),
                (
                    "prev_hash",
                    models.CharField(
                        help_text="the hash of record from_seq (genesis: 64 zeros)", max_length=64
                    ),
                ),
                ("last_hash", models.CharField(help_text="the hash of record to_seq", max_length=64)),
                ("records", models.BigIntegerField()),
                ("counts", models.JSONField(default=dict, help_text="records per kind")),
                (
                    "before_period",
                    models.IntegerField(
                        help_text="the cutoff (yyyymm): every record archived is of an earlier period"
                    ),
                ),
                ("path", models.CharField(help_text="the data file", max_length=1000)),
                ("manifest_path", models.CharField(max_length=1000)),
                ("sha256", models.CharField(help_text="of the data file", max_length=64)),
                ("created_at", models.DateTimeField()),
                ("rows_deleted_at", models.DateTimeField(blank=True, null=True)),
                (
                    "chain",
                    models.ForeignKey(
                        on_delete=django.db.models.deletion.PROTECT,
                        related_name="archives",
                        to="ledger.ledgerchain",
                    ),
                ),
            ],
            options={
                "db_table": "ledger_archive",
                "ordering": ["chain", "to_seq"],
                "constraints": [
                    models.UniqueConstraint(fields=("chain", "to_seq"), name="ledger_archive_chain_to_seq")
                ],
            },
        ),
    ]
