"""The URL map: the dashboard, the management REST API, the Django admin and the static files."""

from django.contrib import admin
from django.contrib.auth import views as auth_views
from django.urls import path
from drf_spectacular.views import SpectacularAPIView, SpectacularSwaggerView

from api import carbon as carbon_api
from api import index as api_index
from api import jobs as jobs_api
from api import ledger as ledger_api
from api import manage as manage_api
from api import reports as reports_api
from carbonledger.static_files import static_file
from dashboard import jobs as jobs_views
from dashboard import views as dashboard

handler404 = "dashboard.views.not_found"

urlpatterns = [
    path("", dashboard.home, name="home"),
    path("admin/", admin.site.urls),
    path("accounts/login/", auth_views.LoginView.as_view(), name="login"),
    path("accounts/logout/", auth_views.LogoutView.as_view(next_page="/accounts/login/"), name="logout"),
    path("accounts/password_change/", auth_views.PasswordChangeView.as_view(), name="password_change"),
    path(
        "accounts/password_change/done/",
        auth_views.PasswordChangeDoneView.as_view(),
        name="password_change_done",
    ),
    path("accounts/password_reset/", auth_views.PasswordResetView.as_view(), name="password_reset"),
    path(
        "accounts/password_reset/done/",
        auth_views.PasswordResetDoneView.as_view(),
        name="password_reset_done",
    ),
    path(
        "accounts/reset/<uidb64>/<token>/",
        auth_views.PasswordResetConfirmView.as_view(),
        name="password_reset_confirm",
    ),
    path(
        "accounts/reset/done/", auth_views.PasswordResetCompleteView.as_view(), name="password_reset_complete"
    ),
    path("dashboard/", dashboard.overview, name="dashboard"),
    path("dashboard/models", dashboard.models_page, name="dashboard-models"),
    path("dashboard/energy", dashboard.energy_page, name="dashboard-energy"),
    path("dashboard/carbon", dashboard.carbon_page, name="dashboard-carbon"),
    path("dashboard/reports", dashboard.reports_page, name="dashboard-reports"),
    path("dashboard/settings", dashboard.settings_page, name="dashboard-settings"),
    path(
        "dashboard/settings/organization",
        dashboard.settings_page,
        {"section": "organization"},
        name="dashboard-settings-organization",
    ),
    path(
        "dashboard/settings/sites",
        dashboard.settings_page,
        {"section": "sites"},
        name="dashboard-settings-sites",
    ),
    path(
        "dashboard/settings/devices",
        dashboard.settings_page,
        {"section": "devices"},
        name="dashboard-settings-devices",
    ),
    path(
        "dashboard/settings/keys",
        dashboard.settings_page,
        {"section": "keys"},
        name="dashboard-settings-keys",
    ),
    path(
        "dashboard/settings/instruments",
        dashboard.settings_page,
        {"section": "instruments"},
        name="dashboard-settings-instruments",
    ),
    path(
        "dashboard/settings/imports",
        dashboard.settings_page,
        {"section": "imports"},
        name="dashboard-settings-imports",
    ),
    path("dashboard/jobs", jobs_views.jobs_page, name="dashboard-jobs"),
    path("dashboard/jobs/<int:pk>", jobs_views.job_page, name="dashboard-job"),
    path("dashboard/jobs/<int:pk>/retry", jobs_views.job_retry_page, name="dashboard-job-retry"),
    path("static/<path:path>", static_file, name="static"),
    path("api/schema/", SpectacularAPIView.as_view(), name="api-schema"),
    path("api/docs/", SpectacularSwaggerView.as_view(url_name="api-schema"), name="api-docs"),
    path("api/v1/", api_index.index, name="api-index"),
    path("api/v1/whoami", manage_api.whoami, name="api-whoami"),
    path("api/v1/requests/<str:request_id>", ledger_api.ledger_request_detail, name="api-ledger-request"),
    path("api/v1/organization", manage_api.organization, name="api-organization"),
    path("api/v1/api-keys", manage_api.api_keys, name="api-keys"),
    path("api/v1/api-keys/<str:prefix>/revoke", manage_api.api_key_revoke_view, name="api-key-revoke"),
    path("api/v1/models", manage_api.models, name="api-models"),
    path("api/v1/ledger/requests", manage_api.ledger_requests, name="api-ledger-requests"),
    path("api/v1/ledger/requests.csv", manage_api.ledger_requests_csv, name="api-ledger-requests-csv"),
    path("api/v1/ledger/batches", manage_api.ledger_batches, name="api-ledger-batches"),
    path("api/v1/ledger/intervals", manage_api.ledger_intervals, name="api-ledger-intervals"),
    path("api/v1/ledger/idle", manage_api.ledger_idle, name="api-ledger-idle"),
    path("api/v1/factor-imports", carbon_api.factor_imports, name="api-factor-imports"),
    path("api/v1/factor-imports/<int:pk>", carbon_api.factor_import_detail, name="api-factor-import"),
    path("api/v1/emission-factors", carbon_api.emission_factors, name="api-emission-factors"),
    path("api/v1/residual-mixes", carbon_api.residual_mixes, name="api-residual-mixes"),
    path("api/v1/instruments", carbon_api.instruments, name="api-instruments"),
    path("api/v1/sites", carbon_api.sites, name="api-sites"),
    path("api/v1/sites/<int:pk>/pue", carbon_api.site_pue, name="api-site-pue"),
    path("api/v1/sites/<int:pk>/carbon-aware", carbon_api.site_carbon_aware, name="api-site-carbon-aware"),
    path("api/v1/devices", carbon_api.devices, name="api-devices"),
    path("api/v1/devices/<str:device_id>", carbon_api.device_detail, name="api-device"),
    path("api/v1/rollups", carbon_api.rollups, name="api-rollups"),
    path("api/v1/carbon", carbon_api.carbon, name="api-carbon"),
    path("api/v1/reports", reports_api.reports, name="api-reports"),
    path("api/v1/reports/<int:pk>", reports_api.report_detail, name="api-report"),
    path("api/v1/reports/<int:pk>/retry", reports_api.report_retry_view, name="api-report-retry"),
    path(
        "api/v1/reports/<int:pk>/recalculate",
        reports_api.report_recalculate_view,
        name="api-report-recalculate",
    ),
    path("api/v1/reports/<int:pk>/files/<str:fmt>", reports_api.report_file, name="api-report-file"),
    path("api/v1/jobs", jobs_api.jobs, name="api-jobs"),
    path("api/v1/jobs/<int:pk>", jobs_api.job_detail, name="api-job"),
    path("api/v1/jobs/<int:pk>/outputs", jobs_api.job_outputs, name="api-job-outputs"),
    path("api/v1/jobs/<int:pk>/retry", jobs_api.job_retry_view, name="api-job-retry"),
]
