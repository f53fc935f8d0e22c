from django.contrib import admin
from django.urls import path

from carbonledger import api, views

urlpatterns = [
    path("", views.home, name="home"),
    path("admin/", admin.site.urls),
    path("api/v1/whoami", views.whoami, name="api-whoami"),
    path("api/v1/requests/<str:request_id>", api.ledger_request_detail, name="api-ledger-request"),
]
