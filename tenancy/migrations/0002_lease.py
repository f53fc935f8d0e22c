from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("tenancy", "0001_initial"),
    ]

    operations = [
        migrations.CreateModel(
            name="Lease",
            fields=[
                (
                    "id",
                    models.BigAutoField(
                        auto_created=True, primary_key=True, serialize=False, verbose_name="ID"
                    ),
                ),
                ("name", models.CharField(max_length=200, unique=True)),
                ("owner", models.CharField(max_length=200)),
                ("token", models.BigIntegerField(default=1)),
                ("expires_at", models.DateTimeField()),
                ("heartbeat_at", models.DateTimeField()),
                ("claimed_at", models.DateTimeField()),
            ],
            options={
                "db_table": "tenancy_lease",
                "ordering": ["name"],
            },
        ),
    ]
