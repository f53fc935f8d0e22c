"""Organizations and API keys. (Ledger, sites, devices and factors come with their issues.)"""

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
