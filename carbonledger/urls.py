from django.contrib import admin
from django.urls import path

from carbonledger import views

urlpatterns = [
    path("", views.home, name="home"),
    path("admin/", admin.site.urls),
    path("api/v1/whoami", views.whoami, name="api-whoami"),
]
