"""Carbon: PUE records, emission factors and their imports, residual mixes, contractual instruments, rollups.

The tables keep the names they had in the ``carbonledger`` app (see carbonledger migration 0013)."""

from __future__ import annotations

from django.db import models

from tenancy.models import Organization, Site


class PueRecord(models.Model):
    """A PUE figure of a site from ``valid_from`` on. Never edited: a new figure is a new record."""

    site = models.ForeignKey(Site, on_delete=models.PROTECT, related_name="pue_records")
    valid_from = models.DateTimeField()
    pue = models.DecimalField(max_digits=5, decimal_places=3)
    source = models.CharField(max_length=16, choices=[("declared", "declared"), ("measured", "measured")])
    relative_uncertainty = models.DecimalField(max_digits=6, decimal_places=4, default=0)
    note = models.TextField(blank=True)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        db_table = "carbonledger_puerecord"
        ordering = ["site", "valid_from", "id"]


class FactorImport(models.Model):
    """One import of emission factors: a version. Accepted imports own their factors, which are never
    edited; a rejected import keeps its errors (line and reason) and owns no factor."""

    class Status(models.TextChoices):
        ACCEPTED = "accepted"
        REJECTED = "rejected"

    organization = models.ForeignKey(
        Organization,
        null=True,
        blank=True,
        on_delete=models.PROTECT,
        related_name="factor_imports",
        help_text="empty: shared by every organization (the shipped public figures)",
    )
    name = models.CharField(max_length=255)
    layout = models.CharField(max_length=32)
    checksum_sha256 = models.CharField(max_length=64)
    status = models.CharField(max_length=16, choices=Status.choices)
    row_count = models.IntegerField(default=0)
    errors = models.JSONField(default=list, blank=True)
    created_by = models.CharField(max_length=200, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        db_table = "carbonledger_factorimport"
        ordering = ["-id"]

    def __str__(self) -> str:
        return f"import {self.pk} ({self.name}, {self.status})"


class EmissionFactor(models.Model):
    """A location-based grid-average factor for a zone and period (one UTC hour or one UTC year)."""

    factor_import = models.ForeignKey(FactorImport, on_delete=models.PROTECT, related_name="factors")
    zone = models.CharField(max_length=32)
    zone_name = models.CharField(max_length=200, blank=True)
    granularity = models.CharField(max_length=8, choices=[("hour", "hour"), ("year", "year")])
    period_start = models.DateTimeField()
    period_end = models.DateTimeField()
    intensity_g_per_kwh = models.DecimalField(max_digits=12, decimal_places=6)
    basis = models.CharField(max_length=16, choices=[("direct", "direct"), ("lifecycle", "lifecycle")])
    gases = models.CharField(max_length=64, default="CO2e")
    source = models.TextField()
    licence = models.CharField(max_length=200, blank=True)
    url = models.URLField(max_length=500, blank=True)
    published = models.CharField(max_length=32, blank=True)
    estimated = models.BooleanField(default=False)
    relative_uncertainty = models.DecimalField(max_digits=6, decimal_places=4)

    class Meta:
        db_table = "carbonledger_emissionfactor"
        indexes = [models.Index(fields=["zone", "granularity", "period_start"], name="factor_zone_period")]


class ResidualMix(models.Model):
    """A market's residual-mix factor for a calendar year (market-based Scope 2). Never edited."""

    organization = models.ForeignKey(
        Organization, null=True, blank=True, on_delete=models.PROTECT, related_name="residual_mixes"
    )
    zone = models.CharField(max_length=32)
    year = models.IntegerField()
    intensity_g_per_kwh = models.DecimalField(max_digits=12, decimal_places=6)
    source = models.TextField()
    licence = models.CharField(max_length=200, blank=True)
    url = models.URLField(max_length=500, blank=True)
    relative_uncertainty = models.DecimalField(max_digits=6, decimal_places=4, default=0)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        db_table = "carbonledger_residualmix"
        ordering = ["zone", "year", "-id"]


class ContractualInstrument(models.Model):
    """A certificate (REC, GO, I-REC), a PPA or a supplier-specific rate held by an organization."""

    KINDS = ("REC", "GO", "I-REC", "PPA", "supplier_rate")

    organization = models.ForeignKey(Organization, on_delete=models.PROTECT, related_name="instruments")
    instrument_id = models.CharField(max_length=100)
    kind = models.CharField(max_length=16, choices=[(k, k) for k in KINDS])
    zone = models.CharField(max_length=32, help_text="the market the instrument belongs to")
    vintage_start = models.DateTimeField()
    vintage_end = models.DateTimeField()
    mwh = models.DecimalField(max_digits=16, decimal_places=6, null=True, blank=True)
    intensity_g_per_kwh = models.DecimalField(max_digits=12, decimal_places=6, default=0)
    certificate_ids = models.TextField(blank=True)
    retirement_evidence = models.TextField(blank=True)
    quality_criteria = models.JSONField(default=dict, blank=True)
    notes = models.TextField(blank=True)
    created_by = models.CharField(max_length=200, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        db_table = "carbonledger_contractualinstrument"
        ordering = ["instrument_id"]
        constraints = [
            models.UniqueConstraint(fields=["organization", "instrument_id"], name="instrument_org_id")
        ]


class InstrumentCertificate(models.Model):
    """A granular (time-stamped) certificate of an instrument: energy produced in an interval of at most an
    hour inside one UTC hour, matched in that hour. An instrument with certificates is matched hour by hour;
    its ``mwh`` is their sum. Never edited; a certificate id appears once per instrument."""

    instrument = models.ForeignKey(
        ContractualInstrument, on_delete=models.PROTECT, related_name="certificates"
    )
    certificate_id = models.CharField(max_length=100)  # inference.limits.CERTIFICATE_ID_MAX_LENGTH
    production_start = models.DateTimeField()
    production_end = models.DateTimeField()
    hour = models.DateTimeField()
    energy_wh = models.BigIntegerField()
    energy_source = models.CharField(max_length=32, blank=True)  # inference.limits.ENERGY_SOURCE_MAX_LENGTH
    created_by = models.CharField(max_length=200, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["instrument", "hour", "certificate_id"]
        constraints = [
            models.UniqueConstraint(fields=["instrument", "certificate_id"], name="certificate_instrument_id")
        ]
        indexes = [models.Index(fields=["instrument", "hour"], name="certificate_instrument_hour")]


class HourlyRollup(models.Model):
    """Energy, requests and CO2e of one organization, site, device, model, metering method and UTC hour.

    Built from the raw ledger (which stays the source of truth) and rebuildable from it. ``kind`` is
    ``request`` (request energy of ``model``) or ``idle`` (a device's idle energy; ``model`` is empty and the
    organization is the site's operator). Energies are IT energy in µJ; CO2e includes the PUE.
    """

    organization = models.ForeignKey(
        Organization, null=True, on_delete=models.PROTECT, related_name="+", db_constraint=False
    )
    site = models.ForeignKey(Site, null=True, on_delete=models.PROTECT, related_name="+", db_constraint=False)
    device_id = models.CharField(max_length=128, default="")
    model = models.CharField(max_length=128, blank=True)
    kind = models.CharField(max_length=8)
    method = models.CharField(max_length=32)
    measured = models.BooleanField(default=False)
    hour = models.DateTimeField()
    requests = models.BigIntegerField(default=0)
    work_units = models.BigIntegerField(default=0)
    energy_uj = models.BigIntegerField(default=0)
    meter_relative_uncertainty = models.DecimalField(max_digits=6, decimal_places=4, default=0)
    pue = models.DecimalField(max_digits=5, decimal_places=3, null=True)
    pue_record = models.ForeignKey(
        PueRecord, null=True, on_delete=models.PROTECT, related_name="+", db_constraint=False
    )
    location_factor = models.ForeignKey(
        EmissionFactor, null=True, on_delete=models.PROTECT, related_name="+", db_constraint=False
    )
    factor_match = models.CharField(max_length=16, blank=True)
    location_co2e_g = models.DecimalField(max_digits=24, decimal_places=9, null=True)
    market_co2e_g = models.DecimalField(max_digits=24, decimal_places=9, null=True)
    carbon_error = models.TextField(blank=True)
    synthetic = models.BooleanField(default=False)

    class Meta:
        db_table = "rollup_hourly"
        indexes = [
            models.Index(fields=["organization", "hour"], name="rollup_org_hour"),
            models.Index(fields=["site", "hour"], name="rollup_site_hour"),
        ]


class RollupCursor(models.Model):
    """How far the rollups have read each ledger table of each chain (the records' seq)."""

    table = models.CharField(max_length=32)
    chain_id = models.IntegerField()
    seq = models.BigIntegerField(default=0)

    class Meta:
        db_table = "carbonledger_rollupcursor"
        constraints = [
            models.UniqueConstraint(fields=["table", "chain_id"], name="rollup_cursor_table_chain")
        ]
