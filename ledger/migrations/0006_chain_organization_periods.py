"""The months of an organization's records in each chain (``first_period``, ``last_period``), kept by the rollups
from now on. Existing rows keep NULL (unknown): their chains are listed for every period, as before."""

from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [("ledger", "0005_archive")]

    operations = [
        migrations.AddField(
            model_name="chainorganization", name="first_period", field=models.IntegerField(null=True)
        ),
        migrations.AddField(
            model_name="chainorganization", name="last_period", field=models.IntegerField(null=True)
        ),
    ]
