from django.contrib import admin
from django.urls import path

from carbonledger import api, views
from carbonledger.carbon import api as carbon_api
from reports import api as reports_api

urlpatterns = [
    path("", views.home, name="home"),
    path("admin/", admin.site.urls),
    path("api/v1/whoami", views.whoami, name="api-whoami"),
    path("api/v1/requests/<str:request_id>", api.ledger_request_detail, name="api-ledger-request"),
    path("api/v1/factor-imports", carbon_api.factor_imports, name="api-factor-imports"),
    path("api/v1/factor-imports/<int:pk>", carbon_api.factor_import_detail, name="api-factor-import"),
    path("api/v1/emission-factors", carbon_api.emission_factors, name="api-emission-factors"),
    path("api/v1/residual-mixes", carbon_api.residual_mixes, name="api-residual-mixes"),
    path("api/v1/instruments", carbon_api.instruments, name="api-instruments"),
    path("api/v1/sites", carbon_api.sites, name="api-sites"),
    path("api/v1/sites/<int:pk>/pue", carbon_api.site_pue, name="api-site-pue"),
    path("api/v1/devices", carbon_api.devices, name="api-devices"),
    path("api/v1/devices/<str:device_id>", carbon_api.devices, name="api-device"),
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
]
