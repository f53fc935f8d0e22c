"""Scope 2 is ISO 14064-1 Category 2 (owned and colocated sites) only; cloud inference is Scope 3 category 1
(Category 4) on its own; a total of every category is labelled as such (issue 25). Checked in the PDF's text
and on the dashboard's Carbon page."""

from __future__ import annotations

import re
from datetime import UTC, datetime, timedelta
from decimal import Decimal

import pytest
from django.db.models import Sum

from carbon.models import HourlyRollup
from tests.reports.conftest import (
    CLOUD_G,
    OWNED_G,
    QUANTITY,
    generate,
    pdf_text,
    section,
    shows,
    two_site_organization,
)
from tests.support.accounts import signed_in

pytestmark = pytest.mark.django_db


def test_the_pdf_scope_2_section_prints_the_category_2_site_only_and_cloud_apart(two_sites) -> None:
    text = pdf_text(generate(two_sites))
    scope2 = section(text, "Scope 2: owned and colocated sites")
    assert "Category 2" in scope2
    assert shows(scope2, OWNED_G), scope2
    assert not shows(scope2, OWNED_G + CLOUD_G), (
        f"the Scope 2 section prints the total of every category: {scope2}"
    )
    assert not shows(scope2, CLOUD_G)
    scope3 = section(text, "Scope 3 category 1: cloud inference")
    assert "Category 4" in scope3
    assert shows(scope3, CLOUD_G), scope3
    assert not shows(scope3, OWNED_G)
    # Where the total of both categories is printed (the cover, the categories, the scope sections), a label
    # just before it says it is a total of every category.
    cover = text[: text.index("Contents")]
    printed = cover + section(text, "Emissions by category") + scope2 + scope3
    # (Within half a unit of the third significant figure: a value printed with its uncertainty has 3.)
    within = Decimal("0.005")
    unlabelled = [
        printed[max(0, m.start() - 150) : m.end()]
        for m in QUANTITY.finditer(printed)
        if shows(m.group(0), OWNED_G + CLOUD_G, within)
        and "all categories" not in printed[max(0, m.start() - 150) : m.start()]
    ]
    assert not unlabelled, unlabelled
    assert shows(cover, OWNED_G + CLOUD_G, within)
    assert shows(section(text, "Emissions by category"), OWNED_G + CLOUD_G)


def _page_section(html: str, heading: str) -> str:
    """The page's text from the <h2> that starts with ``heading`` to the next <h2>, tags removed."""
    start = html.index(f"<h2>{heading}")
    end = html.find("<h2>", start + 4)
    return re.sub(r"\s+", " ", re.sub(r"<[^>]+>", " ", html[start : end if end >= 0 else len(html)]))


def test_the_dashboard_carbon_page_shows_scope_2_for_category_2_sites_and_cloud_apart() -> None:
    now = datetime.now(UTC).replace(minute=0, second=0, microsecond=0)
    org = two_site_organization(when=(now - timedelta(days=1, hours=3), now - timedelta(days=2)))
    owned_g = HourlyRollup.objects.filter(organization=org, site__electricity="owned").aggregate(
        g=Sum("location_co2e_g")
    )["g"]
    cloud_g = HourlyRollup.objects.filter(organization=org, site__electricity="cloud").aggregate(
        g=Sum("location_co2e_g")
    )["g"]
    assert owned_g > 0 and cloud_g > 0
    html = signed_in(org, "viewer").get("/dashboard/carbon").content.decode()
    scope2 = _page_section(html, "Scope 2")
    assert "Category 2" in scope2
    assert f"paris-{org.slug}" in scope2 and f"cloud-va-{org.slug}" not in scope2
    assert shows(scope2, Decimal(owned_g)), scope2
    assert not shows(scope2, Decimal(owned_g + cloud_g)), scope2
    scope3 = _page_section(html, "Scope 3 category 1")
    assert "Category 4" in scope3 and f"cloud-va-{org.slug}" in scope3
    assert shows(scope3, Decimal(cloud_g)), scope3
    total = _page_section(html, "All categories")
    assert shows(total, Decimal(owned_g + cloud_g)), total
