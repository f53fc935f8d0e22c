from __future__ import annotations

from django.conf import settings
from django.http import HttpRequest, HttpResponse
from django.shortcuts import render
from rest_framework.decorators import api_view
from rest_framework.request import Request
from rest_framework.response import Response


def home(request: HttpRequest) -> HttpResponse:
    from carbonledger.carbon.selectors import factor_attributions

    return render(
        request,
        "home.html",
        {"model_repository": settings.MODEL_REPOSITORY, "attributions": factor_attributions()},
    )


@api_view(["GET"])
def whoami(request: Request) -> Response:
    org = request.user.organization if hasattr(request.user, "organization") else None
    key = getattr(request.user, "api_key", None)
    return Response(
        {
            "organization": org.slug if org is not None else None,
            "scopes": sorted(key.scope_set) if key is not None else [],
        }
    )
