import django.db.models.deletion
from django.db import migrations, models


class Migration(migrations.Migration):
    """State only: the foreign keys now name the tenancy app; the tables they point at are the same."""

    dependencies = [
        ("jobs", "0001_initial"),
        ("tenancy", "0001_initial"),
    ]

    operations = [
        migrations.SeparateDatabaseAndState(
            state_operations=[
                migrations.AlterField(
                    model_name="job",
                    name="api_key",
                    field=models.ForeignKey(
                        blank=True,
                        help_text="the infer-only key of the latest run (revoked when the run ends)",
                        null=True,
                        on_delete=django.db.models.deletion.SET_NULL,
                        related_name="+",
                        to="tenancy.apikey",
                    ),
                ),
                migrations.AlterField(
                    model_name="job",
                    name="organization",
                    field=models.ForeignKey(
                        on_delete=django.db.models.deletion.PROTECT,
                        related_name="jobs",
                        to="tenancy.organization",
                    ),
                ),
                migrations.AlterField(
                    model_name="job",
                    name="site",
                    field=models.ForeignKey(
                        help_text="the site whose grid the plan followed",
                        on_delete=django.db.models.deletion.PROTECT,
                        related_name="+",
                        to="tenancy.site",
                    ),
                ),
            ],
            database_operations=[],
        ),
    ]
