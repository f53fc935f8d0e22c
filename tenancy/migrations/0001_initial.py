import django.db.models.deletion
from django.conf import settings
from django.db import migrations, models


class Migration(migrations.Migration):
    """State only: these models moved here from the carbonledger app; their tables (names kept) and
    rows stay as they are."""

    initial = True

    dependencies = [
        ("carbonledger", "0012_ledger_idle_owed_in"),
        migrations.swappable_dependency(settings.AUTH_USER_MODEL),
    ]

    operations = [
        migrations.SeparateDatabaseAndState(
            state_operations=[
                migrations.CreateModel(
                    name="Organization",
                    fields=[
                        (
                            "id",
                            models.BigAutoField(
                                auto_created=True, primary_key=True, serialize=False, verbose_name="ID"
                            ),
                        ),
                        ("slug", models.SlugField(max_length=64, unique=True)),
                        ("name", models.CharField(max_length=200)),
                        ("created_at", models.DateTimeField(auto_now_add=True)),
                    ],
                    options={
                        "db_table": "carbonledger_organization",
                        "ordering": ["slug"],
                    },
                ),
                migrations.CreateModel(
                    name="Membership",
                    fields=[
                        (
                            "id",
                            models.BigAutoField(
                                auto_created=True, primary_key=True, serialize=False, verbose_name="ID"
                            ),
                        ),
                        (
                            "role",
                            models.CharField(
                                choices=[
                                    ("viewer", "viewer (read only)"),
                                    ("analyst", "analyst (read, request reports)"),
                                    ("admin", "admin (settings, keys, imports)"),
                                ],
                                default="viewer",
                                max_length=16,
                            ),
                        ),
                        (
                            "user",
                            models.OneToOneField(
                                on_delete=django.db.models.deletion.CASCADE,
                                related_name="membership",
                                to=settings.AUTH_USER_MODEL,
                            ),
                        ),
                        (
                            "organization",
                            models.ForeignKey(
                                on_delete=django.db.models.deletion.CASCADE,
                                related_name="memberships",
                                to="tenancy.organization",
                            ),
                        ),
                    ],
                    options={
                        "db_table": "carbonledger_membership",
                    },
                ),
                migrations.CreateModel(
                    name="ApiKey",
                    fields=[
                        (
                            "id",
                            models.BigAutoField(
                                auto_created=True, primary_key=True, serialize=False, verbose_name="ID"
                            ),
                        ),
                        ("name", models.CharField(blank=True, max_length=100)),
                        ("prefix", models.CharField(max_length=16, unique=True)),
                        ("key_sha256", models.CharField(max_length=64)),
                        (
                            "scopes",
                            models.CharField(help_text="comma-separated: infer, read, admin", max_length=100),
                        ),
                        ("created_at", models.DateTimeField(auto_now_add=True)),
                        ("revoked_at", models.DateTimeField(blank=True, null=True)),
                        (
                            "organization",
                            models.ForeignKey(
                                on_delete=django.db.models.deletion.CASCADE,
                                related_name="api_keys",
                                to="tenancy.organization",
                            ),
                        ),
                    ],
                    options={
                        "db_table": "carbonledger_apikey",
                        "ordering": ["-created_at"],
                    },
                ),
                migrations.CreateModel(
                    name="Site",
                    fields=[
                        (
                            "id",
                            models.BigAutoField(
                                auto_created=True, primary_key=True, serialize=False, verbose_name="ID"
                            ),
                        ),
                        ("name", models.SlugField(max_length=64)),
                        ("zone", models.CharField(help_text="grid zone, e.g. FR or US-CA", max_length=32)),
                        ("pue", models.DecimalField(decimal_places=3, default=1, max_digits=5)),
                        (
                            "pue_source",
                            models.CharField(
                                choices=[("declared", "declared"), ("measured", "measured")],
                                default="declared",
                                max_length=16,
                            ),
                        ),
                        (
                            "electricity",
                            models.CharField(
                                choices=[
                                    ("owned", "owned (Scope 2, ISO 14064-1 Category 2)"),
                                    ("colocated", "colocated (Scope 2, ISO 14064-1 Category 2)"),
                                    ("cloud", "cloud (Scope 3 category 1, ISO 14064-1 Category 4)"),
                                ],
                                default="owned",
                                max_length=16,
                            ),
                        ),
                        (
                            "carbon_threshold_g_per_kwh",
                            models.DecimalField(blank=True, decimal_places=6, max_digits=12, null=True),
                        ),
                        (
                            "carbon_threshold_percentile",
                            models.PositiveSmallIntegerField(blank=True, null=True),
                        ),
                        ("created_at", models.DateTimeField(auto_now_add=True)),
                        (
                            "organization",
                            models.ForeignKey(
                                blank=True,
                                null=True,
                                on_delete=django.db.models.deletion.PROTECT,
                                related_name="sites",
                                to="tenancy.organization",
                            ),
                        ),
                    ],
                    options={
                        "db_table": "carbonledger_site",
                    },
                ),
                migrations.CreateModel(
                    name="Device",
                    fields=[
                        (
                            "id",
                            models.BigAutoField(
                                auto_created=True, primary_key=True, serialize=False, verbose_name="ID"
                            ),
                        ),
                        ("device_id", models.CharField(max_length=128, unique=True)),
                        ("kind", models.CharField(max_length=16)),
                        ("name", models.CharField(blank=True, max_length=200)),
                        ("method", models.CharField(max_length=32)),
                        ("measured", models.BooleanField(default=False)),
                        ("relative_uncertainty", models.FloatField(default=0.0)),
                        ("info", models.JSONField(blank=True, default=dict)),
                        (
                            "idle_power_w",
                            models.FloatField(
                                blank=True, help_text="declared idle power; empty: measured", null=True
                            ),
                        ),
                        (
                            "embodied_kg_co2e",
                            models.DecimalField(
                                blank=True,
                                decimal_places=3,
                                help_text="embodied emissions, for SCI",
                                max_digits=12,
                                null=True,
                            ),
                        ),
                        (
                            "lifetime_years",
                            models.DecimalField(
                                blank=True,
                                decimal_places=2,
                                help_text="expected lifetime, for SCI",
                                max_digits=6,
                                null=True,
                            ),
                        ),
                        ("first_seen_at", models.DateTimeField(auto_now_add=True)),
                        (
                            "site",
                            models.ForeignKey(
                                blank=True,
                                null=True,
                                on_delete=django.db.models.deletion.PROTECT,
                                related_name="devices",
                                to="tenancy.site",
                            ),
                        ),
                    ],
                    options={
                        "db_table": "carbonledger_device",
                    },
                ),
                migrations.AddConstraint(
                    model_name="site",
                    constraint=models.UniqueConstraint(
                        fields=("organization", "name"), name="site_organization_name"
                    ),
                ),
                migrations.AddConstraint(
                    model_name="site",
                    constraint=models.UniqueConstraint(
                        condition=models.Q(("organization__isnull", True)),
                        fields=("name",),
                        name="site_unowned_name",
                    ),
                ),
            ],
            database_operations=[],
        ),
    ]
