from django.db import migrations

MOVED = {
    "tenancy": ("organization", "membership", "apikey", "site", "device"),
    "ledger": (
        "ledgerchain",
        "ledgerbatch",
        "ledgerrequest",
        "ledgerinterval",
        "ledgeridle",
        "ledgerrequestenergy",
        "ledgerbatchenergy",
        "ledgeradjustment",
        "chainorganization",
        "ledgerverification",
    ),
    "carbon": (
        "puerecord",
        "factorimport",
        "emissionfactor",
        "residualmix",
        "contractualinstrument",
        "hourlyrollup",
        "rollupcursor",
    ),
}


def _relabel(apps, schema_editor, forward):
    content_types = apps.get_model("contenttypes", "ContentType").objects.using(
        schema_editor.connection.alias
    )
    for app_label, models in MOVED.items():
        old, new = ("carbonledger", app_label) if forward else (app_label, "carbonledger")
        for model in models:
            # A content type already made under the new label (a post_migrate of a partial migrate) wins;
            # the old one would otherwise clash with it on (app_label, model).
            if content_types.filter(app_label=new, model=model).exists():
                continue
            content_types.filter(app_label=old, model=model).update(app_label=new)


def relabel_forward(apps, schema_editor):
    _relabel(apps, schema_editor, forward=True)


def relabel_backward(apps, schema_editor):
    _relabel(apps, schema_editor, forward=False)


class Migration(migrations.Migration):
    """The models moved to the tenancy, ledger and carbon apps: this forgets them here (state only: no
    table or row of theirs changes) and renames their content types, so that permissions follow them."""

    dependencies = [
        ("ledger", "0001_initial"),
        ("carbon", "0001_initial"),
        ("contenttypes", "0002_remove_content_type_name"),
        ("carbonledger", "0012_ledger_idle_owed_in"),
        ("jobs", "0002_tenancy_models"),
        ("reports", "0003_tenancy_models"),
    ]

    operations = [
        migrations.SeparateDatabaseAndState(
            state_operations=[
                migrations.RemoveField(
                    model_name="apikey",
                    name="organization",
                ),
                migrations.RemoveField(
                    model_name="ledgerrequest",
                    name="api_key",
                ),
                migrations.RemoveField(
                    model_name="chainorganization",
                    name="chain",
                ),
                migrations.RemoveField(
                    model_name="chainorganization",
                    name="organization",
                ),
                migrations.RemoveField(
                    model_name="contractualinstrument",
                    name="organization",
                ),
                migrations.RemoveField(
                    model_name="device",
                    name="site",
                ),
                migrations.RemoveField(
                    model_name="emissionfactor",
                    name="factor_import",
                ),
                migrations.RemoveField(
                    model_name="hourlyrollup",
                    name="location_factor",
                ),
                migrations.RemoveField(
                    model_name="factorimport",
                    name="organization",
                ),
                migrations.RemoveField(
                    model_name="hourlyrollup",
                    name="organization",
                ),
                migrations.RemoveField(
                    model_name="hourlyrollup",
                    name="pue_record",
                ),
                migrations.RemoveField(
                    model_name="hourlyrollup",
                    name="site",
                ),
                migrations.RemoveField(
                    model_name="ledgeradjustment",
                    name="chain",
                ),
                migrations.RemoveField(
                    model_name="ledgerbatch",
                    name="chain",
                ),
                migrations.RemoveField(
                    model_name="ledgerbatchenergy",
                    name="chain",
                ),
                migrations.RemoveField(
                    model_name="ledgerrequest",
                    name="chain",
                ),
                migrations.RemoveField(
                    model_name="ledgerverification",
                    name="chain",
                ),
                migrations.RemoveField(
                    model_name="ledgeridle",
                    name="chain",
                ),
                migrations.RemoveField(
                    model_name="ledgerrequestenergy",
                    name="chain",
                ),
                migrations.RemoveField(
                    model_name="ledgerinterval",
                    name="chain",
                ),
                migrations.RemoveField(
                    model_name="ledgerrequest",
                    name="organization",
                ),
                migrations.RemoveField(
                    model_name="membership",
                    name="organization",
                ),
                migrations.RemoveField(
                    model_name="membership",
                    name="user",
                ),
                migrations.RemoveField(
                    model_name="site",
                    name="organization",
                ),
                migrations.RemoveField(
                    model_name="residualmix",
                    name="organization",
                ),
                migrations.RemoveField(
                    model_name="puerecord",
                    name="site",
                ),
                migrations.DeleteModel(
                    name="RollupCursor",
                ),
                migrations.DeleteModel(
                    name="ApiKey",
                ),
                migrations.DeleteModel(
                    name="ChainOrganization",
                ),
                migrations.DeleteModel(
                    name="ContractualInstrument",
                ),
                migrations.DeleteModel(
                    name="Device",
                ),
                migrations.DeleteModel(
                    name="EmissionFactor",
                ),
                migrations.DeleteModel(
                    name="FactorImport",
                ),
                migrations.DeleteModel(
                    name="HourlyRollup",
                ),
                migrations.DeleteModel(
                    name="LedgerAdjustment",
                ),
                migrations.DeleteModel(
                    name="LedgerBatch",
                ),
                migrations.DeleteModel(
                    name="LedgerBatchEnergy",
                ),
                migrations.DeleteModel(
                    name="LedgerVerification",
                ),
                migrations.DeleteModel(
                    name="LedgerIdle",
                ),
                migrations.DeleteModel(
                    name="LedgerRequestEnergy",
                ),
                migrations.DeleteModel(
                    name="LedgerChain",
                ),
                migrations.DeleteModel(
                    name="LedgerInterval",
                ),
                migrations.DeleteModel(
                    name="LedgerRequest",
                ),
                migrations.DeleteModel(
                    name="Membership",
                ),
                migrations.DeleteModel(
                    name="Organization",
                ),
                migrations.DeleteModel(
                    name="ResidualMix",
                ),
                migrations.DeleteModel(
                    name="PueRecord",
                ),
                migrations.DeleteModel(
                    name="Site",
                ),
            ],
            database_operations=[],
        ),
        migrations.RunPython(relabel_forward, relabel_backward),
    ]
