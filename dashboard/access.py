"""What every dashboard page shares: membership required, role checks, the organization, the page frame."""

from __future__ import annotations

from collections.abc import Callable
from functools import wraps
from typing import Any

from django.contrib.auth.decorators import login_required
from django.core.exceptions import PermissionDenied
from django.http import HttpRequest, HttpResponse
from django.shortcuts import render

from carbon.selectors import factor_attributions, synthetic_share
from dashboard.kpis import KPIS
from tenancy.access import ROLE_SCOPES
from tenancy.models import Membership

View = Callable[..., HttpResponse]


def member(view: View) -> View:
    """Signed in and member of an organization; the membership is passed on as ``request.membership``."""

    @login_required
    @wraps(view)
    def wrapper(request: HttpRequest, *args: Any, **kwargs: Any) -> HttpResponse:
        membership = Membership.objects.select_related("organization").filter(user=request.user).first()
        if membership is None:
            raise PermissionDenied("this account belongs to no organization")
        request.membership = membership  # type: ignore[attr-defined]
        return view(request, *args, **kwargs)

    return wrapper


def can(request: HttpRequest, scope: str) -> bool:
    """Whether the signed-in member's role allows ``scope`` (read, report, admin)."""
    return scope in ROLE_SCOPES[request.membership.role]  # type: ignore[attr-defined]


def render_page(request: HttpRequest, template: str, page: str, **context: Any) -> HttpResponse:
    """A dashboard page with what every page shows (organization, role, what the role may do, sources)."""
    membership: Membership = request.membership  # type: ignore[attr-defined]
    return render(
        request,
        template,
        {
            "page": page,
            "org": membership.organization,
            "role": membership.role,
            "can_admin": can(request, "admin"),
            "can_report": can(request, "report"),
            "attributions": factor_attributions(organization_id=membership.organization_id),
            "synthetic_share": synthetic_share(membership.organization_id),
            "kpi": KPIS,
            **context,
        },
    )


def organization_id(request: HttpRequest) -> int:
    """The pk of the signed-in member's organization (set by :func:`member`)."""
    return int(request.membership.organization_id)  # type: ignore[attr-defined]
