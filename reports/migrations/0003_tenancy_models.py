import django.db.models.deletion
from django.db import migrations, models


class Migration(migrations.Migration):
    """State only: the foreign keys now name the tenancy app; the tables they point at are the same."""

    dependencies = [
        ("reports", "0002_report_heartbeat"),
        ("tenancy", "0001_initial"),
    ]

    operations = [
        migrations.SeparateDatabaseAndState(
            state_operations=[
                migrations.AlterField(
                    model_name="report",
                    name="organization",
                    field=models.ForeignKey(
                        on_delete=django.db.models.deletion.PROTECT,
                        related_name="reports",
                        to="tenancy.organization",
                    ),
                ),
                migrations.AlterField(
                    model_name="reportingprofile",
                    name="organization",
                    field=models.OneToOneField(
                        on_delete=django.db.models.deletion.CASCADE,
                        related_name="reporting_profile",
                        to="tenancy.organization",
                    ),
                ),
            ],
            database_operations=[],
        ),
    ]
