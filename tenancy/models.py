"""Organizations, memberships, API keys, sites and devices: what every other app points at.

The tables keep the names they had when these models lived in the ``carbonledger`` app (migration
carbonledger 0013 handed them over without touching the database)."""

from __future__ import annotations

from django.db import models

SCOPES = ("infer", "read", "admin")


class Organization(models.Model):
    slug = models.SlugField(max_length=64, unique=True)
    name = models.CharField(max_length=200)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        db_table = "carbonledger_organization"
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

    class Meta:
        db_table = "carbonledger_membership"

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
        db_table = "carbonledger_apikey"
        ordering = ["-created_at"]

    def __str__(self) -> str:
        return f"{self.organization.slug}:{self.prefix}"

    @property
    def scope_set(self) -> frozenset[str]:
        return frozenset(s for s in self.scopes.split(",") if s)

    @property
    def is_active(self) -> bool:
        return self.revoked_at is None


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
        db_table = "carbonledger_site"
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

    class Meta:
        db_table = "carbonledger_device"

    def __str__(self) -> str:
        return self.device_id


class Lease(models.Model):
    """A named, expiring claim by one live process: a ledger chain (``chain:<chain_id>``) or a metered device
    (``device:<identity>``). ``token`` is the fencing token: it goes up by one every time the lease changes
    owner, so a write checked against (owner, token) inside its own transaction cannot come from a process
    whose lease was taken over. The functions in :mod:`tenancy.leases` are the only writers."""

    name = models.CharField(max_length=200, unique=True)
    owner = models.CharField(max_length=200)
    token = models.BigIntegerField(default=1)
    expires_at = models.DateTimeField()
    heartbeat_at = models.DateTimeField()
    claimed_at = models.DateTimeField()

    class Meta:
        db_table = "tenancy_lease"
        ordering = ["name"]

    def __str__(self) -> str:
        return f"{self.name} held by {self.owner} (token {self.token})"
