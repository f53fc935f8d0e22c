import django.db.models.deletion
from django.db import migrations, models


class Migration(migrations.Migration):
    """State only: these models moved here from the carbonledger app; their tables (names kept) and
    rows stay as they are."""

    initial = True

    dependencies = [
        ("carbonledger", "0012_ledger_idle_owed_in"),
        ("tenancy", "0001_initial"),
    ]

    operations = [
        migrations.SeparateDatabaseAndState(
            state_operations=[
                migrations.CreateModel(
                    name="LedgerChain",
                    fields=[
                        (
                            "id",
                            models.BigAutoField(
                                auto_created=True, primary_key=True, serialize=False, verbose_name="ID"
                            ),
                        ),
                        ("chain_id", models.CharField(max_length=64, unique=True)),
                        ("created_at", models.DateTimeField(auto_now_add=True)),
                        ("head_seq", models.BigIntegerField(default=0)),
                        (
                            "head_hash",
                            models.CharField(
                                default="0000000000000000000000000000000000000000000000000000000000000000",
                                max_length=64,
                            ),
                        ),
                        ("spool_position", models.CharField(default="0:0", max_length=40)),
                    ],
                    options={
                        "db_table": "carbonledger_ledgerchain",
                    },
                ),
                migrations.CreateModel(
                    name="LedgerVerification",
                    fields=[
                        (
                            "id",
                            models.BigAutoField(
                                auto_created=True, primary_key=True, serialize=False, verbose_name="ID"
                            ),
                        ),
                        ("from_seq", models.BigIntegerField()),
                        ("seq", models.BigIntegerField()),
                        ("hash", models.CharField(max_length=64)),
                        ("records", models.BigIntegerField()),
                        ("problem", models.TextField(blank=True)),
                        ("started_at", models.DateTimeField()),
                        ("finished_at", models.DateTimeField()),
                        (
                            "chain",
                            models.ForeignKey(
                                on_delete=django.db.models.deletion.PROTECT,
                                related_name="verifications",
                                to="ledger.ledgerchain",
                            ),
                        ),
                    ],
                    options={
                        "db_table": "carbonledger_ledgerverification",
                        "ordering": ["chain", "-seq", "-id"],
                    },
                ),
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
                                to="ledger.ledgerchain",
                            ),
                        ),
                    ],
                    options={
                        "db_table": "ledger_batch_energy",
                        "constraints": [
                            models.UniqueConstraint(
                                fields=("chain", "seq"), name="ledger_batch_energy_chain_seq"
                            ),
                            models.UniqueConstraint(
                                fields=("batch_id", "interval_id"), name="ledger_batch_energy_key"
                            ),
                        ],
                    },
                ),
                migrations.CreateModel(
                    name="LedgerBatch",
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
                        ("model", models.CharField(max_length=128)),
                        ("version", models.CharField(max_length=32)),
                        ("device_id", models.CharField(max_length=128)),
                        ("instance", models.IntegerField(default=0)),
                        ("start_ns", models.BigIntegerField()),
                        ("end_ns", models.BigIntegerField()),
                        ("requests", models.IntegerField()),
                        ("rows", models.IntegerField()),
                        ("status", models.CharField(default="ok", max_length=16)),
                        ("variant", models.CharField(blank=True, default="", max_length=64)),
                        (
                            "chain",
                            models.ForeignKey(
                                db_constraint=False,
                                db_index=False,
                                on_delete=django.db.models.deletion.PROTECT,
                                related_name="+",
                                to="ledger.ledgerchain",
                            ),
                        ),
                    ],
                    options={
                        "db_table": "ledger_batch",
                        "constraints": [
                            models.UniqueConstraint(fields=("chain", "seq"), name="ledger_batch_chain_seq"),
                            models.UniqueConstraint(fields=("batch_id",), name="ledger_batch_id"),
                        ],
                    },
                ),
                migrations.CreateModel(
                    name="LedgerAdjustment",
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
                        ("target_kind", models.CharField(max_length=32)),
                        ("target_id", models.CharField(max_length=64)),
                        ("energy_delta_uj", models.BigIntegerField()),
                        ("reason", models.TextField()),
                        ("actor", models.CharField(max_length=200)),
                        ("created_ns", models.BigIntegerField()),
                        (
                            "chain",
                            models.ForeignKey(
                                db_constraint=False,
                                db_index=False,
                                on_delete=django.db.models.deletion.PROTECT,
                                related_name="+",
                                to="ledger.ledgerchain",
                            ),
                        ),
                    ],
                    options={
                        "db_table": "ledger_adjustment",
                        "constraints": [
                            models.UniqueConstraint(
                                fields=("chain", "seq"), name="ledger_adjustment_chain_seq"
                            )
                        ],
                    },
                ),
                migrations.CreateModel(
                    name="ChainOrganization",
                    fields=[
                        (
                            "id",
                            models.BigAutoField(
                                auto_created=True, primary_key=True, serialize=False, verbose_name="ID"
                            ),
                        ),
                        (
                            "organization",
                            models.ForeignKey(
                                db_constraint=False,
                                on_delete=django.db.models.deletion.PROTECT,
                                related_name="+",
                                to="tenancy.organization",
                            ),
                        ),
                        (
                            "chain",
                            models.ForeignKey(
                                on_delete=django.db.models.deletion.PROTECT,
                                related_name="+",
                                to="ledger.ledgerchain",
                            ),
                        ),
                    ],
                    options={
                        "db_table": "carbonledger_chainorganization",
                        "constraints": [
                            models.UniqueConstraint(
                                fields=("organization", "chain"), name="chain_organization_unique"
                            )
                        ],
                    },
                ),
                migrations.CreateModel(
                    name="LedgerIdle",
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
                        ("interval_id", models.CharField(max_length=64)),
                        ("device_id", models.CharField(max_length=128)),
                        ("t0_ns", models.BigIntegerField()),
                        ("t1_ns", models.BigIntegerField()),
                        ("energy_uj", models.BigIntegerField()),
                        ("idle_ns", models.BigIntegerField()),
                        ("idle_power_w", models.FloatField()),
                        (
                            "owed_in_uj",
                            models.BigIntegerField(
                                default=0,
                                help_text="idle balance carried in from the device's earlier intervals (negative: charged beyond their estimates); with batches in the interval, energy_uj = min(interval energy, max(0, round(idle_power_w x idle_ns / 1000) + owed_in_uj)) in µJ",
                            ),
                        ),
                        (
                            "chain",
                            models.ForeignKey(
                                db_constraint=False,
                                db_index=False,
                                on_delete=django.db.models.deletion.PROTECT,
                                related_name="+",
                                to="ledger.ledgerchain",
                            ),
                        ),
                    ],
                    options={
                        "db_table": "ledger_idle",
                        "constraints": [
                            models.UniqueConstraint(fields=("chain", "seq"), name="ledger_idle_chain_seq"),
                            models.UniqueConstraint(fields=("interval_id",), name="ledger_idle_interval_id"),
                        ],
                    },
                ),
                migrations.CreateModel(
                    name="LedgerInterval",
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
                        ("interval_id", models.CharField(max_length=64)),
                        ("device_id", models.CharField(max_length=128)),
                        ("method", models.CharField(max_length=32)),
                        ("relative_uncertainty", models.FloatField()),
                        ("t0_ns", models.BigIntegerField()),
                        ("t1_ns", models.BigIntegerField()),
                        ("counter_start_j", models.FloatField()),
                        ("counter_end_j", models.FloatField()),
                        ("energy_uj", models.BigIntegerField()),
                        ("idle_uj", models.BigIntegerField()),
                        ("busy_ns", models.BigIntegerField()),
                        ("idle_ns", models.BigIntegerField()),
                        (
                            "chain",
                            models.ForeignKey(
                                db_constraint=False,
                                db_index=False,
                                on_delete=django.db.models.deletion.PROTECT,
                                related_name="+",
                                to="ledger.ledgerchain",
                            ),
                        ),
                    ],
                    options={
                        "db_table": "ledger_interval",
                        "constraints": [
                            models.UniqueConstraint(
                                fields=("chain", "seq"), name="ledger_interval_chain_seq"
                            ),
                            models.UniqueConstraint(fields=("interval_id",), name="ledger_interval_id"),
                        ],
                    },
                ),
                migrations.CreateModel(
                    name="LedgerRequest",
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
                        ("request_id", models.CharField(max_length=64)),
                        ("client_request_id", models.CharField(blank=True, default="", max_length=256)),
                        ("model", models.CharField(max_length=128)),
                        ("version", models.CharField(max_length=32)),
                        ("batch_id", models.CharField(max_length=64)),
                        ("device_id", models.CharField(max_length=128)),
                        ("received_ns", models.BigIntegerField()),
                        ("started_ns", models.BigIntegerField()),
                        ("finished_ns", models.BigIntegerField()),
                        ("queue_ns", models.BigIntegerField()),
                        ("compute_ns", models.BigIntegerField()),
                        ("work_units", models.BigIntegerField()),
                        ("status", models.CharField(default="ok", max_length=16)),
                        ("synthetic", models.BooleanField(default=False)),
                        ("variant", models.CharField(blank=True, default="", max_length=64)),
                        (
                            "api_key",
                            models.ForeignKey(
                                db_constraint=False,
                                db_index=False,
                                null=True,
                                on_delete=django.db.models.deletion.PROTECT,
                                related_name="+",
                                to="tenancy.apikey",
                            ),
                        ),
                        (
                            "chain",
                            models.ForeignKey(
                                db_constraint=False,
                                db_index=False,
                                on_delete=django.db.models.deletion.PROTECT,
                                related_name="+",
                                to="ledger.ledgerchain",
                            ),
                        ),
                        (
                            "organization",
                            models.ForeignKey(
                                db_constraint=False,
                                db_index=False,
                                null=True,
                                on_delete=django.db.models.deletion.PROTECT,
                                related_name="+",
                                to="tenancy.organization",
                            ),
                        ),
                    ],
                    options={
                        "db_table": "ledger_request",
                        "indexes": [
                            models.Index(
                                fields=["organization", "received_ns"], name="ledger_request_org_time"
                            )
                        ],
                        "constraints": [
                            models.UniqueConstraint(fields=("chain", "seq"), name="ledger_request_chain_seq"),
                            models.UniqueConstraint(fields=("request_id",), name="ledger_request_id"),
                        ],
                    },
                ),
                migrations.CreateModel(
                    name="LedgerRequestEnergy",
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
                        ("request_id", models.CharField(max_length=64)),
                        ("interval_id", models.CharField(max_length=64)),
                        ("batch_id", models.CharField(max_length=64)),
                        ("energy_uj", models.BigIntegerField()),
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
                                to="ledger.ledgerchain",
                            ),
                        ),
                    ],
                    options={
                        "db_table": "ledger_request_energy",
                        "indexes": [models.Index(fields=["request_id"], name="ledger_energy_request")],
                        "constraints": [
                            models.UniqueConstraint(
                                fields=("chain", "seq"), name="ledger_request_energy_chain_seq"
                            )
                        ],
                    },
                ),
            ],
            database_operations=[],
        ),
    ]
