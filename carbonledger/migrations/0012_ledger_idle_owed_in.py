"""The idle balance an interval carried in (inference/allocation.py), on its idle line, so that a verifier can
recompute each idle line from the rows. Records written before it mean 0 and hash as they did (optional tail)."""

from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("carbonledger", "0011_ledger_batch_energy"),
    ]

    operations = [
        migrations.AddField(
            model_name="ledgeridle",
            name="owed_in_uj",
            field=models.BigIntegerField(
                default=0,
                help_text="idle balance carried in from the device's earlier intervals (negative: charged beyond "
                "their estimates); with batches in the interval, energy_uj = min(interval energy, max(0, "
                "round(idle_power_w x idle_ns / 1000) + owed_in_uj)) in µJ",
            ),
        ),
    ]
