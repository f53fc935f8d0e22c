from __future__ import annotations

from django.conf import settings
from django.http import HttpRequest, HttpResponse
from django.shortcuts import render
from rest_framework.decorators import api_view
from rest_framework.request import Request
from rest_framework.response import Response

from carbonledger.openapi import doc


def home(request: HttpRequest) -> HttpResponse:
    from carbonledger.carbon.selectors import factor_attributions

    return render(
        request,
        "home.html",
        {"model_repository": settings.MODEL_REPOSITORY, "attributions": factor_attributions()},
    )


@doc("The organization and scopes of the caller")
@api_view(["GET"])
def whoami(request: Request) -> Response:
    from carbonledger.api_auth import organization_of, scopes_of

    org = organization_of(request.user)
    return Response(
        {"organization": org.slug if org is not None else None, "scopes": sorted(scopes_of(request.user))}
    )
