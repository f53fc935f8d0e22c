"""Organizations, API keys, sites and devices, the ledger, emission factors, instruments and rollups."""

from __future__ import annotations

from django.db import models

SCOPES = ("infer", "read", "admin")


class Organization(models.Model):
    slug = models.SlugField(max_length=64, unique=True)
    name = models.CharField(max_length=200)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["slug"]

    def __str__(self) -> str:
        return self.slug


class Membership(models.Model):
    """A dashboard user's organization and role. One organization per user: every page and endpoint shows
    only that organization's data."""

    class Role(models.TextChoices):
        VIEWER = "viewer", "viewer (read only)"
        ANALYST = "analyst", "analyst (read, request reports)"
        ADMIN = "admin", "admin (settings, keys, imports)"

    user = models.OneToOneField("auth.User", on_delete=models.CASCADE, related_name="membership")
    organization = models.ForeignKey(Organization, on_delete=models.CASCADE, related_name="memberships")
    role = models.CharField(max_length=16, choices=Role.choices, default=Role.VIEWER)

    def __str__(self) -> str:
        return f"{self.user} in {self.organization.slug} ({self.role})"


class ApiKey(models.Model):
    """A bearer key. Only its SHA-256 is stored; the key itself is shown once, at creation.

    Keys are 256-bit random tokens, so a fast hash is enough (no password stretching): the
    prefix finds the row, the hash proves the key.
    """

    organization = models.ForeignKey(Organization, on_delete=models.CASCADE, related_name="api_keys")
    name = models.CharField(max_length=100, blank=True)
    prefix = models.CharField(max_length=16, unique=True)
    key_sha256 = models.CharField(max_length=64)
    scopes = models.CharField(max_length=100, help_text="comma-separated: infer, read, admin")
    created_at = models.DateTimeField(auto_now_add=True)
    revoked_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["-created_at"]

    def __str__(self) -> str:
        return f"{self.organization.slug}:{self.prefix}"

    @property
    def scope_set(self) -> frozenset[str]:
        return frozenset(s for s in self.scopes.split(",") if s)

    @property
    def is_active(self) -> bool:
        return self.revoked_at is None


# -- sites and devices -------------------------------------------------------------------------


class Site(models.Model):
    """Where devices draw electricity: a grid zone, how the electricity is held, and PUE records.

    ``organization`` is the operator who reports the site's idle energy (None: nobody yet). ``pue`` is the
    current figure; its history (what every calculation uses) is in :class:`PueRecord`.
    """

    class Electricity(models.TextChoices):
        OWNED = "owned", "owned (Scope 2, ISO 14064-1 Category 2)"
        COLOCATED = "colocated", "colocated (Scope 2, ISO 14064-1 Category 2)"
        CLOUD = "cloud", "cloud (Scope 3 category 1, ISO 14064-1 Category 4)"

    organization = models.ForeignKey(
        Organization, null=True, blank=True, on_delete=models.PROTECT, related_name="sites"
    )
    name = models.SlugField(max_length=64)
    zone = models.CharField(max_length=32, help_text="grid zone, e.g. FR or US-CA")
    pue = models.DecimalField(max_digits=5, decimal_places=3, default=1)
    pue_source = models.CharField(
        max_length=16, default="declared", choices=[("declared", "declared"), ("measured", "measured")]
    )
    electricity = models.CharField(max_length=16, choices=Electricity.choices, default=Electricity.OWNED)
    # Carbon-aware mode: above this intensity, or above this percentile of the zone's last 30 days of hourly
    # figures (CARBON_AWARE_PERCENTILE when neither is set), serving at the site leans to efficiency.
    carbon_threshold_g_per_kwh = models.DecimalField(max_digits=12, decimal_places=6, null=True, blank=True)
    carbon_threshold_percentile = models.PositiveSmallIntegerField(null=True, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)

    def __str__(self) -> str:
        return self.name

    class Meta:
        # Unique per operator, so that no organization learns another's site names by a refusal.
        constraints = [
            models.UniqueConstraint(fields=["organization", "name"], name="site_organization_name"),
            models.UniqueConstraint(
                fields=["name"], condition=models.Q(organization__isnull=True), name="site_unowned_name"
            ),
        ]

    @property
    def scope_category(self) -> str:
        return "scope3_cat1" if self.electricity == self.Electricity.CLOUD else "scope2"


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
        ordering = ["site", "valid_from", "id"]


class Device(models.Model):
    """A metered device (GPU, CPU package, or the modelled CPU of a gateway process)."""

    device_id = models.CharField(max_length=128, unique=True)
    kind = models.CharField(max_length=16)  # gpu, cpu
    name = models.CharField(max_length=200, blank=True)
    method = models.CharField(max_length=32)  # nvml-counter, nvml-power-integration, rapl, triton, modelled
    measured = models.BooleanField(default=False)
    relative_uncertainty = models.FloatField(default=0.0)
    info = models.JSONField(default=dict, blank=True)
    site = models.ForeignKey(Site, null=True, blank=True, on_delete=models.PROTECT, related_name="devices")
    idle_power_w = models.FloatField(null=True, blank=True, help_text="declared idle power; empty: measured")
    embodied_kg_co2e = models.DecimalField(
        max_digits=12, decimal_places=3, null=True, blank=True, help_text="embodied emissions, for SCI"
    )
    lifetime_years = models.DecimalField(
        max_digits=6, decimal_places=2, null=True, blank=True, help_text="expected lifetime, for SCI"
    )
    first_seen_at = models.DateTimeField(auto_now_add=True)

    def __str__(self) -> str:
        return self.device_id


# -- the ledger: append-only, hash-chained -------------------------------------------------------


class LedgerChain(models.Model):
    """One hash chain per writer (a gateway process's spool). The only mutable ledger row: its head
    and the spool position already written, updated in the same transaction as the records."""

    chain_id = models.CharField(max_length=64, unique=True)
    created_at = models.DateTimeField(auto_now_add=True)
    head_seq = models.BigIntegerField(default=0)
    head_hash = models.CharField(max_length=64, default="0" * 64)
    spool_position = models.CharField(max_length=40, default="0:0")

    def __str__(self) -> str:
        return self.chain_id


class ChainedRecord(models.Model):
    # Indexes cost ingest speed (tens of thousands of rows a second): the (chain, seq)
    # unique constraint of each table already serves lookups by chain, so no FK index.
    # No FK constraint either: PostgreSQL would check it row by row during COPY.
    chain = models.ForeignKey(
        LedgerChain, on_delete=models.PROTECT, related_name="+", db_index=False, db_constraint=False
    )
    seq = models.BigIntegerField()
    prev_hash = models.CharField(max_length=64)
    hash = models.CharField(max_length=64)

    class Meta:
        abstract = True


class LedgerBatch(ChainedRecord):
    batch_id = models.CharField(max_length=64)
    model = models.CharField(max_length=128)
    version = models.CharField(max_length=32)
    device_id = models.CharField(max_length=128)
    instance = models.IntegerField(default=0)
    start_ns = models.BigIntegerField()
    end_ns = models.BigIntegerField()
    requests = models.IntegerField()
    rows = models.IntegerField()
    status = models.CharField(max_length=16, default="ok")
    # The model variant that served the batch (e.g. fp32 or int8; empty for a model without variants).
    # Chained only when set, so records written before the column existed still verify.
    variant = models.CharField(max_length=64, default="", blank=True)

    class Meta:
        db_table = "ledger_batch"
        constraints = [
            models.UniqueConstraint(fields=["chain", "seq"], name="ledger_batch_chain_seq"),
            models.UniqueConstraint(fields=["batch_id"], name="ledger_batch_id"),
        ]


class LedgerRequest(ChainedRecord):
    # Unique through Meta.constraints: unique=True would add a second (LIKE) index on PostgreSQL.
    # Collation "C" on PostgreSQL (migration 0010), like the other indexed ledger ids: an AlterField
    # of these columns would reset it, so such a migration must set it again.
    request_id = models.CharField(max_length=64)
    client_request_id = models.CharField(max_length=256, blank=True, default="")
    organization = models.ForeignKey(
        Organization,
        null=True,
        on_delete=models.PROTECT,
        related_name="+",
        db_constraint=False,
        db_index=False,
    )
    api_key = models.ForeignKey(
        ApiKey, null=True, on_delete=models.PROTECT, related_name="+", db_constraint=False, db_index=False
    )
    model = models.CharField(max_length=128)
    version = models.CharField(max_length=32)
    batch_id = models.CharField(max_length=64)
    device_id = models.CharField(max_length=128)
    received_ns = models.BigIntegerField()
    started_ns = models.BigIntegerField()
    finished_ns = models.BigIntegerField()
    queue_ns = models.BigIntegerField()
    compute_ns = models.BigIntegerField()
    work_units = models.BigIntegerField()
    status = models.CharField(max_length=16, default="ok")
    synthetic = models.BooleanField(default=False)
    # The model variant that served the batch (e.g. fp32 or int8; empty for a model without variants).
    # Chained only when set, so records written before the column existed still verify.
    variant = models.CharField(max_length=64, default="", blank=True)

    class Meta:
        db_table = "ledger_request"
        constraints = [
            models.UniqueConstraint(fields=["chain", "seq"], name="ledger_request_chain_seq"),
            models.UniqueConstraint(fields=["request_id"], name="ledger_request_id"),
        ]
        indexes = [models.Index(fields=["organization", "received_ns"], name="ledger_request_org_time")]


class LedgerInterval(ChainedRecord):
    """Raw counter readings at both ends of one metering interval of one device."""

    interval_id = models.CharField(max_length=64)
    device_id = models.CharField(max_length=128)
    method = models.CharField(max_length=32)
    relative_uncertainty = models.FloatField()
    t0_ns = models.BigIntegerField()
    t1_ns = models.BigIntegerField()
    counter_start_j = models.FloatField()
    counter_end_j = models.FloatField()
    energy_uj = models.BigIntegerField()
    idle_uj = models.BigIntegerField()
    busy_ns = models.BigIntegerField()
    idle_ns = models.BigIntegerField()

    class Meta:
        db_table = "ledger_interval"
        constraints = [
            models.UniqueConstraint(fields=["chain", "seq"], name="ledger_interval_chain_seq"),
            models.UniqueConstraint(fields=["interval_id"], name="ledger_interval_id"),
        ]


class LedgerIdle(ChainedRecord):
    """Idle energy of a device in one interval: a ledger line of its own, never dropped."""

    interval_id = models.CharField(max_length=64)
    device_id = models.CharField(max_length=128)
    t0_ns = models.BigIntegerField()
    t1_ns = models.BigIntegerField()
    energy_uj = models.BigIntegerField()
    idle_ns = models.BigIntegerField()
    idle_power_w = models.FloatField()
    owed_in_uj = models.BigIntegerField(
        default=0,
        help_text="idle balance carried in from the device's earlier intervals (negative: charged beyond their "
        "estimates); with batches in the interval, energy_uj = min(interval energy, max(0, "
        "round(idle_power_w x idle_ns / 1000) + owed_in_uj)) in µJ",
    )

    class Meta:
        db_table = "ledger_idle"
        constraints = [
            models.UniqueConstraint(fields=["chain", "seq"], name="ledger_idle_chain_seq"),
            models.UniqueConstraint(fields=["interval_id"], name="ledger_idle_interval_id"),
        ]


class LedgerRequestEnergy(ChainedRecord):
    """A request's share of one interval's energy (a request spanning intervals has several)."""

    request_id = models.CharField(max_length=64)
    interval_id = models.CharField(max_length=64)
    batch_id = models.CharField(max_length=64)
    energy_uj = models.BigIntegerField()
    final = models.BooleanField(default=False, help_text="the batch is fully allocated with this part")

    class Meta:
        db_table = "ledger_request_energy"
        indexes = [models.Index(fields=["request_id"], name="ledger_energy_request")]
        # No uniqueness on (request, interval, batch): parts reach the database only with the
        # chunk that holds their request's unique id, and that index slowed ingest by a quarter.
        constraints = [
            models.UniqueConstraint(fields=["chain", "seq"], name="ledger_request_energy_chain_seq")
        ]


class LedgerBatchEnergy(ChainedRecord):
    """A batch's share of one interval's energy and its split over the batch's requests.

    One row per batch and interval rather than one per request (``LedgerRequestEnergy``, which older records
    still use): at the batch sizes the gateway runs under load this writes a sixteenth of the rows
    (bench/ledger_ingest.py). ``request_ids`` and ``shares_uj`` are compact JSON arrays in the batch's order;
    the shares add up to ``energy_uj``. A request's energy is the sum of its shares over the batch's rows.
    """

    batch_id = models.CharField(max_length=64)
    interval_id = models.CharField(max_length=64)
    energy_uj = models.BigIntegerField()
    request_ids = models.TextField()
    shares_uj = models.TextField()
    final = models.BooleanField(default=False, help_text="the batch is fully allocated with this part")

    class Meta:
        db_table = "ledger_batch_energy"
        constraints = [
            models.UniqueConstraint(fields=["chain", "seq"], name="ledger_batch_energy_chain_seq"),
            models.UniqueConstraint(fields=["batch_id", "interval_id"], name="ledger_batch_energy_key"),
        ]


class LedgerAdjustment(ChainedRecord):
    """A correction: records are never updated; an adjusting entry says what changes, why and who."""

    target_kind = models.CharField(max_length=32)  # request, interval, idle
    target_id = models.CharField(max_length=64)
    energy_delta_uj = models.BigIntegerField()
    reason = models.TextField()
    actor = models.CharField(max_length=200)
    created_ns = models.BigIntegerField()

    class Meta:
        db_table = "ledger_adjustment"
        constraints = [models.UniqueConstraint(fields=["chain", "seq"], name="ledger_adjustment_chain_seq")]


# -- carbon: emission factors, residual mixes, instruments, rollups --------------------------------


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
        ordering = ["instrument_id"]
        constraints = [
            models.UniqueConstraint(fields=["organization", "instrument_id"], name="instrument_org_id")
        ]


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


class ChainOrganization(models.Model):
    """Which organizations have records in which hash chain (requests they sent, idle lines of sites they
    operate), kept by the rollups as they read the ledger: a report lists and vouches for those chains only."""

    chain = models.ForeignKey(LedgerChain, on_delete=models.PROTECT, related_name="+")
    # No database constraint, like the ledger's own organization column: the rollups must never fail on it.
    organization = models.ForeignKey(
        Organization, on_delete=models.PROTECT, related_name="+", db_constraint=False
    )

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["organization", "chain"], name="chain_organization_unique")
        ]


class RollupCursor(models.Model):
    """How far the rollups have read each ledger table of each chain (the records' seq)."""

    table = models.CharField(max_length=32)
    chain_id = models.IntegerField()
    seq = models.BigIntegerField(default=0)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["table", "chain_id"], name="rollup_cursor_table_chain")
        ]


class LedgerVerification(models.Model):
    """A verification run of one chain: records ``from_seq + 1 .. seq`` re-hashed and linked, starting at the
    hash of an earlier verification (``from_seq`` 0: from genesis, a full verification). ``problem`` names the
    first broken link; empty when intact."""

    chain = models.ForeignKey(LedgerChain, on_delete=models.PROTECT, related_name="verifications")
    from_seq = models.BigIntegerField()
    seq = models.BigIntegerField()
    hash = models.CharField(max_length=64)
    records = models.BigIntegerField()
    problem = models.TextField(blank=True)
    started_at = models.DateTimeField()
    finished_at = models.DateTimeField()

    class Meta:
        ordering = ["chain", "-seq", "-id"]

    @property
    def full(self) -> bool:
        return self.from_seq == 0

    @property
    def intact(self) -> bool:
        return not self.problem
