"""Deferred inference jobs: a file of KServe v2 infer requests run in the lowest-intensity window before a
deadline, through the gateway's own endpoint, and the outputs it answered (each with its ledger id)."""

from __future__ import annotations

from django.db import models

from tenancy.models import ApiKey, Organization, Site


class Job(models.Model):
    """One submitted job. ``plan`` holds the chosen window and why (JSON, see ``jobs.planning``)."""

    class Status(models.TextChoices):
        QUEUED = "queued"  # its window is now: waits for a worker
        SCHEDULED = "scheduled"  # waits for a later window (planned_start)
        RUNNING = "running"
        DONE = "done"
        FAILED = "failed"

    organization = models.ForeignKey(Organization, on_delete=models.PROTECT, related_name="jobs")
    model = models.CharField(max_length=128)
    version = models.CharField(
        max_length=32, blank=True, help_text="empty: the gateway's latest ready version"
    )
    status = models.CharField(max_length=16, choices=Status.choices, default=Status.SCHEDULED)
    submitted_at = models.DateTimeField()
    submitted_by = models.CharField(max_length=200, blank=True)
    deadline = models.DateTimeField()
    planned_start = models.DateTimeField()
    site = models.ForeignKey(
        Site, on_delete=models.PROTECT, related_name="+", help_text="the site whose grid the plan followed"
    )
    plan = models.JSONField(default=dict)
    input_name = models.CharField(max_length=255, blank=True)
    input_bytes = models.BigIntegerField()
    input_sha256 = models.CharField(max_length=64)
    inputs = models.BinaryField(help_text="the submitted JSON Lines file")
    request_count = models.IntegerField()
    done_requests = models.IntegerField(default=0)
    attempts = models.IntegerField(default=0)
    api_key = models.ForeignKey(
        ApiKey,
        null=True,
        blank=True,
        on_delete=models.SET_NULL,
        related_name="+",
        help_text="the infer-only key of the latest run (revoked when the run ends)",
    )
    failure_reason = models.TextField(blank=True)
    started_at = models.DateTimeField(null=True, blank=True)
    heartbeat_at = models.DateTimeField(null=True, blank=True)
    finished_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["-submitted_at", "-id"]
        indexes = [
            models.Index(fields=["status", "planned_start"], name="job_status_start"),
            models.Index(fields=["organization", "submitted_at"], name="job_org_submitted"),
        ]

    def __str__(self) -> str:
        return f"job {self.pk} {self.organization_id} {self.model} {self.status}"


class JobOutput(models.Model):
    """The gateway's answer to one request of a job (``index``: its order among the file's requests)."""

    job = models.ForeignKey(Job, on_delete=models.CASCADE, related_name="outputs")
    index = models.IntegerField()
    line = models.IntegerField(help_text="line of the job file")
    ledger_id = models.CharField(max_length=64, blank=True)
    response = models.TextField(help_text="the gateway's JSON answer, as sent")
    answered_at = models.DateTimeField()

    class Meta:
        ordering = ["job", "index"]
        constraints = [models.UniqueConstraint(fields=["job", "index"], name="job_output_index")]
        indexes = [models.Index(fields=["ledger_id"], name="job_output_ledger")]
