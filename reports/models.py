"""GHG reports: the organization's reporting profile, report runs (frozen snapshots) and their files."""

from __future__ import annotations

from django.db import models

from inference import limits
from tenancy.models import Organization


class ReportingProfile(models.Model):
    """What an ISO 14064-1 report says about the organization that no ledger record holds."""

    class Consolidation(models.TextChoices):
        OPERATIONAL = "operational control", "operational control"
        FINANCIAL = "financial control", "financial control"
        EQUITY = "equity share", "equity share"

    organization = models.OneToOneField(
        Organization, on_delete=models.CASCADE, related_name="reporting_profile"
    )
    description = models.TextField(blank=True)
    responsible_person = models.CharField(max_length=limits.RESPONSIBLE_PERSON_MAX_LENGTH, blank=True)
    consolidation_approach = models.CharField(
        max_length=32, choices=Consolidation.choices, default=Consolidation.OPERATIONAL
    )
    reporting_boundary = models.TextField(
        default=(
            "Electricity consumed by the machine-learning inference services operated through CarbonLedger: "
            "accelerators and CPUs metered per device, with facility overhead through PUE."
        )
    )
    significance_threshold_percent = models.DecimalField(max_digits=5, decimal_places=2, default=5)
    base_year = models.IntegerField(null=True, blank=True)
    recalculation_policy = models.TextField(
        default=(
            "The base year is recalculated when structural changes, changes of method or of emission factors, "
            "or discovered errors change base-year emissions by 5 % or more."
        )
    )
    exclusions = models.JSONField(default=list, blank=True, help_text='[{"what": ..., "justification": ...}]')
    verification_status = models.CharField(
        max_length=300, default="not verified by a third party (self-declared)"
    )
    # ESRS E1 intensities per net revenue (E1-5 §40, E1-6 §53): the net revenue of one financial year as the
    # financial statements give it; none: the intensities are not reported.
    net_revenue = models.DecimalField(max_digits=20, decimal_places=2, null=True, blank=True)
    net_revenue_currency = models.CharField(max_length=3, default="EUR")
    net_revenue_year = models.IntegerField(null=True, blank=True)
    updated_at = models.DateTimeField(auto_now=True)


class Report(models.Model):
    """One run of a GHG report for an organization and period [period_start, period_end).

    The snapshot (everything the files are rendered from) is frozen at generation; a later change of
    factors never changes it. A recalculation is a new report that names the one it replaces and why.
    """

    class Status(models.TextChoices):
        QUEUED = "queued"
        RUNNING = "running"
        DONE = "done"
        FAILED = "failed"

    organization = models.ForeignKey(Organization, on_delete=models.PROTECT, related_name="reports")
    period_start = models.DateField()
    period_end = models.DateField(help_text="exclusive")
    kind = models.CharField(max_length=16, default="on_demand")  # on_demand, monthly
    status = models.CharField(max_length=16, choices=Status.choices, default=Status.QUEUED)
    progress = models.IntegerField(default=0)
    progress_message = models.CharField(max_length=200, blank=True)
    failure_reason = models.TextField(blank=True)
    accept_broken_chain = models.BooleanField(default=False)
    requested_by = models.CharField(max_length=200, blank=True)
    replaces = models.ForeignKey("self", null=True, blank=True, on_delete=models.PROTECT, related_name="+")
    replacement_reason = models.TextField(blank=True)
    snapshot = models.JSONField(null=True, blank=True)
    inputs_sha256 = models.CharField(max_length=64, blank=True)
    code_version = models.CharField(max_length=100, blank=True)
    attempts = models.IntegerField(default=0)
    created_at = models.DateTimeField(auto_now_add=True)
    started_at = models.DateTimeField(null=True, blank=True)
    heartbeat_at = models.DateTimeField(null=True, blank=True)  # the running worker's last sign of life
    finished_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["-created_at", "-id"]
        constraints = [
            # Asking twice for the same report while one is queued or running gives the same run.
            models.UniqueConstraint(
                fields=["organization", "period_start", "period_end"],
                condition=models.Q(status__in=["queued", "running"]),
                name="report_one_active_per_period",
            )
        ]

    def __str__(self) -> str:
        return f"report {self.pk} {self.organization_id} {self.period_start}..{self.period_end} {self.status}"


class ReportFile(models.Model):
    FORMATS = ("pdf", "csv", "json", "esrs-e1")
    CONTENT_TYPES = {
        "pdf": "application/pdf",
        "csv": "text/csv; charset=utf-8",
        "json": "application/json",
        "esrs-e1": "text/csv; charset=utf-8",
    }

    report = models.ForeignKey(Report, on_delete=models.CASCADE, related_name="files")
    format = models.CharField(max_length=8)
    filename = models.CharField(max_length=200)
    sha256 = models.CharField(max_length=64)
    size = models.BigIntegerField()
    content = models.BinaryField()
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        constraints = [models.UniqueConstraint(fields=["report", "format"], name="report_file_format")]
