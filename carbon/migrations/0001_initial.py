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
                    name="FactorImport",
                    fields=[
                        (
                            "id",
                            models.BigAutoField(
                                auto_created=True, primary_key=True, serialize=False, verbose_name="ID"
                            ),
                        ),
                        ("name", models.CharField(max_length=255)),
                        ("layout", models.CharField(max_length=32)),
                        ("checksum_sha256", models.CharField(max_length=64)),
                        (
                            "status",
                            models.CharField(
                                choices=[("accepted", "Accepted"), ("rejected", "Rejected")], max_length=16
                            ),
                        ),
                        ("row_count", models.IntegerField(default=0)),
                        ("errors", models.JSONField(blank=True, default=list)),
                        ("created_by", models.CharField(blank=True, max_length=200)),
                        ("created_at", models.DateTimeField(auto_now_add=True)),
                        (
                            "organization",
                            models.ForeignKey(
                                blank=True,
                                help_text="empty: shared by every organization (the shipped public figures)",
                                null=True,
                                on_delete=django.db.models.deletion.PROTECT,
                                related_name="factor_imports",
                                to="tenancy.organization",
                            ),
                        ),
                    ],
                    options={
                        "db_table": "carbonledger_factorimport",
                        "ordering": ["-id"],
                    },
                ),
                migrations.CreateModel(
                    name="EmissionFactor",
                    fields=[
                        (
                            "id",
                            models.BigAutoField(
                                auto_created=True, primary_key=True, serialize=False, verbose_name="ID"
                            ),
                        ),
                        ("zone", models.CharField(max_length=32)),
                        ("zone_name", models.CharField(blank=True, max_length=200)),
                        (
                            "granularity",
                            models.CharField(choices=[("hour", "hour"), ("year", "year")], max_length=8),
                        ),
                        ("period_start", models.DateTimeField()),
                        ("period_end", models.DateTimeField()),
                        ("intensity_g_per_kwh", models.DecimalField(decimal_places=6, max_digits=12)),
                        (
                            "basis",
                            models.CharField(
                                choices=[("direct", "direct"), ("lifecycle", "lifecycle")], max_length=16
                            ),
                        ),
                        ("gases", models.CharField(default="CO2e", max_length=64)),
                        ("source", models.TextField()),
                        ("licence", models.CharField(blank=True, max_length=200)),
                        ("url", models.URLField(blank=True, max_length=500)),
                        ("published", models.CharField(blank=True, max_length=32)),
                        ("estimated", models.BooleanField(default=False)),
                        ("relative_uncertainty", models.DecimalField(decimal_places=4, max_digits=6)),
                        (
                            "factor_import",
                            models.ForeignKey(
                                on_delete=django.db.models.deletion.PROTECT,
                                related_name="factors",
                                to="carbon.factorimport",
                            ),
                        ),
                    ],
                    options={
                        "db_table": "carbonledger_emissionfactor",
                    },
                ),
                migrations.CreateModel(
                    name="PueRecord",
                    fields=[
                        (
                            "id",
                            models.BigAutoField(
                                auto_created=True, primary_key=True, serialize=False, verbose_name="ID"
                            ),
                        ),
                        ("valid_from", models.DateTimeField()),
                        ("pue", models.DecimalField(decimal_places=3, max_digits=5)),
                        (
                            "source",
                            models.CharField(
                                choices=[("declared", "declared"), ("measured", "measured")], max_length=16
                            ),
                        ),
                        (
                            "relative_uncertainty",
                            models.DecimalField(decimal_places=4, default=0, max_digits=6),
                        ),
                        ("note", models.TextField(blank=True)),
                        ("created_at", models.DateTimeField(auto_now_add=True)),
                        (
                            "site",
                            models.ForeignKey(
                                on_delete=django.db.models.deletion.PROTECT,
                                related_name="pue_records",
                                to="tenancy.site",
                            ),
                        ),
                    ],
                    options={
                        "db_table": "carbonledger_puerecord",
                        "ordering": ["site", "valid_from", "id"],
                    },
                ),
                migrations.CreateModel(
                    name="HourlyRollup",
                    fields=[
                        (
                            "id",
                            models.BigAutoField(
                                auto_created=True, primary_key=True, serialize=False, verbose_name="ID"
                            ),
                        ),
                        ("device_id", models.CharField(default="", max_length=128)),
                        ("model", models.CharField(blank=True, max_length=128)),
                        ("kind", models.CharField(max_length=8)),
                        ("method", models.CharField(max_length=32)),
                        ("measured", models.BooleanField(default=False)),
                        ("hour", models.DateTimeField()),
                        ("requests", models.BigIntegerField(default=0)),
                        ("work_units", models.BigIntegerField(default=0)),
                        ("energy_uj", models.BigIntegerField(default=0)),
                        (
                            "meter_relative_uncertainty",
                            models.DecimalField(decimal_places=4, default=0, max_digits=6),
                        ),
                        ("pue", models.DecimalField(decimal_places=3, max_digits=5, null=True)),
                        ("factor_match", models.CharField(blank=True, max_length=16)),
                        ("location_co2e_g", models.DecimalField(decimal_places=9, max_digits=24, null=True)),
                        ("market_co2e_g", models.DecimalField(decimal_places=9, max_digits=24, null=True)),
                        ("carbon_error", models.TextField(blank=True)),
                        ("synthetic", models.BooleanField(default=False)),
                        (
                            "location_factor",
                            models.ForeignKey(
                                db_constraint=False,
                                null=True,
                                on_delete=django.db.models.deletion.PROTECT,
                                related_name="+",
                                to="carbon.emissionfactor",
                            ),
                        ),
                        (
                            "organization",
                            models.ForeignKey(
                                db_constraint=False,
                                null=True,
                                on_delete=django.db.models.deletion.PROTECT,
                                related_name="+",
                                to="tenancy.organization",
                            ),
                        ),
                        (
                            "site",
                            models.ForeignKey(
                                db_constraint=False,
                                null=True,
                                on_delete=django.db.models.deletion.PROTECT,
                                related_name="+",
                                to="tenancy.site",
                            ),
                        ),
                        (
                            "pue_record",
                            models.ForeignKey(
                                db_constraint=False,
                                null=True,
                                on_delete=django.db.models.deletion.PROTECT,
                                related_name="+",
                                to="carbon.puerecord",
                            ),
                        ),
                    ],
                    options={
                        "db_table": "rollup_hourly",
                    },
                ),
                migrations.CreateModel(
                    name="ResidualMix",
                    fields=[
                        (
                            "id",
                            models.BigAutoField(
                                auto_created=True, primary_key=True, serialize=False, verbose_name="ID"
                            ),
                        ),
                        ("zone", models.CharField(max_length=32)),
                        ("year", models.IntegerField()),
                        ("intensity_g_per_kwh", models.DecimalField(decimal_places=6, max_digits=12)),
                        ("source", models.TextField()),
                        ("licence", models.CharField(blank=True, max_length=200)),
                        ("url", models.URLField(blank=True, max_length=500)),
                        (
                            "relative_uncertainty",
                            models.DecimalField(decimal_places=4, default=0, max_digits=6),
                        ),
                        ("created_at", models.DateTimeField(auto_now_add=True)),
                        (
                            "organization",
                            models.ForeignKey(
                                blank=True,
                                null=True,
                                on_delete=django.db.models.deletion.PROTECT,
                                related_name="residual_mixes",
                                to="tenancy.organization",
                            ),
                        ),
                    ],
                    options={
                        "db_table": "carbonledger_residualmix",
                        "ordering": ["zone", "year", "-id"],
                    },
                ),
                migrations.CreateModel(
                    name="RollupCursor",
                    fields=[
                        (
                            "id",
                            models.BigAutoField(
                                auto_created=True, primary_key=True, serialize=False, verbose_name="ID"
                            ),
                        ),
                        ("table", models.CharField(max_length=32)),
                        ("chain_id", models.IntegerField()),
                        ("seq", models.BigIntegerField(default=0)),
                    ],
                    options={
                        "db_table": "carbonledger_rollupcursor",
                        "constraints": [
                            models.UniqueConstraint(
                                fields=("table", "chain_id"), name="rollup_cursor_table_chain"
                            )
                        ],
                    },
                ),
                migrations.CreateModel(
                    name="ContractualInstrument",
                    fields=[
                        (
                            "id",
                            models.BigAutoField(
                                auto_created=True, primary_key=True, serialize=False, verbose_name="ID"
                            ),
                        ),
                        ("instrument_id", models.CharField(max_length=100)),
                        (
                            "kind",
                            models.CharField(
                                choices=[
                                    ("REC", "REC"),
                                    ("GO", "GO"),
                                    ("I-REC", "I-REC"),
                                    ("PPA", "PPA"),
                                    ("supplier_rate", "supplier_rate"),
                                ],
                                max_length=16,
                            ),
                        ),
                        (
                            "zone",
                            models.CharField(help_text="the market the instrument belongs to", max_length=32),
                        ),
                        ("vintage_start", models.DateTimeField()),
                        ("vintage_end", models.DateTimeField()),
                        ("mwh", models.DecimalField(blank=True, decimal_places=6, max_digits=16, null=True)),
                        (
                            "intensity_g_per_kwh",
                            models.DecimalField(decimal_places=6, default=0, max_digits=12),
                        ),
                        ("certificate_ids", models.TextField(blank=True)),
                        ("retirement_evidence", models.TextField(blank=True)),
                        ("quality_criteria", models.JSONField(blank=True, default=dict)),
                        ("notes", models.TextField(blank=True)),
                        ("created_by", models.CharField(blank=True, max_length=200)),
                        ("created_at", models.DateTimeField(auto_now_add=True)),
                        (
                            "organization",
                            models.ForeignKey(
                                on_delete=django.db.models.deletion.PROTECT,
                                related_name="instruments",
                                to="tenancy.organization",
                            ),
                        ),
                    ],
                    options={
                        "db_table": "carbonledger_contractualinstrument",
                        "ordering": ["instrument_id"],
                        "constraints": [
                            models.UniqueConstraint(
                                fields=("organization", "instrument_id"), name="instrument_org_id"
                            )
                        ],
                    },
                ),
                migrations.AddIndex(
                    model_name="emissionfactor",
                    index=models.Index(
                        fields=["zone", "granularity", "period_start"], name="factor_zone_period"
                    ),
                ),
                migrations.AddIndex(
                    model_name="hourlyrollup",
                    index=models.Index(fields=["organization", "hour"], name="rollup_org_hour"),
                ),
                migrations.AddIndex(
                    model_name="hourlyrollup",
                    index=models.Index(fields=["site", "hour"], name="rollup_site_hour"),
                ),
            ],
            database_operations=[],
        ),
    ]
