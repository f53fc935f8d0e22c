from django.contrib import admin

from tenancy.models import ApiKey, Organization


@admin.register(Organization)
class OrganizationAdmin(admin.ModelAdmin):
    list_display = ("slug", "name", "created_at")


@admin.register(ApiKey)
class ApiKeyAdmin(admin.ModelAdmin):
    list_display = ("prefix", "organization", "name", "scopes", "created_at", "revoked_at")
    readonly_fields = ("prefix", "key_sha256", "created_at")
