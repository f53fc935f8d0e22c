"""Dashboard pages through Django's test client: login, roles, logout, password change, forms."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest
from django.test import Client

from carbon.rollups import rollups_update
from carbon.services import load_shipped_factors
from demo.synthetic_ledger import generate_ledger
from reports.models import Report
from tenancy.models import ApiKey, Organization, Site
from tests.factories import OrganizationFactory
from tests.support.accounts import signed_in

pytestmark = pytest.mark.django_db
PASSWORD = "a-long-test-password-42"
PAGES = (
    "/dashboard/",
    "/dashboard/models",
    "/dashboard/energy",
    "/dashboard/carbon",
    "/dashboard/reports",
    "/dashboard/jobs",
    "/dashboard/settings",
)


@pytest.fixture
def org() -> Organization:
    load_shipped_factors()
    org = OrganizationFactory()
    generate_ledger(organization=org, requests=2000, days=3, end=datetime.now(UTC), seed=5)
    rollups_update()
    return org


def _login(org: Organization, role: str, username: str | None = None) -> Client:
    return signed_in(org, role, username=username)


def test_pages_need_a_login_and_redirect_to_it() -> None:
    for page in PAGES:
        response = Client().get(page)
        assert response.status_code == 302 and response["Location"].startswith("/accounts/login/")


def test_every_page_renders_the_organizations_data_for_a_viewer(org: Organization) -> None:
    client = _login(org, "viewer")
    for page in PAGES:
        response = client.get(page)
        assert response.status_code == 200, page
        assert org.name in response.content.decode()
    overview = client.get("/dashboard/").content.decode()
    assert "2000" in overview or "This month" in overview


def test_a_user_without_an_organization_is_refused() -> None:
    from django.contrib.auth.models import User

    User.objects.create_user("loner", password=PASSWORD)
    client = Client()
    client.login(username="loner", password=PASSWORD)
    assert client.get("/dashboard/").status_code == 403


def test_a_viewer_cannot_change_settings_or_request_reports(org: Organization) -> None:
    client = _login(org, "viewer")
    assert client.post("/dashboard/settings", {"action": "key", "key-scopes": ["read"]}).status_code == 403
    assert client.post("/dashboard/reports", {"start": "2025-01-01", "end": "2025-02-01"}).status_code == 403
    assert not ApiKey.objects.filter(organization=org).exists()


def test_an_analyst_requests_a_report_but_cannot_change_settings(org: Organization) -> None:
    client = _login(org, "analyst")
    response = client.post("/dashboard/reports", {"start": "2025-01-01", "end": "2025-02-01"})
    assert response.status_code == 302
    assert Report.objects.filter(organization=org).count() == 1
    assert client.post("/dashboard/settings", {"action": "site"}).status_code == 403


def test_an_admin_creates_a_key_shown_once_and_a_site_and_bad_input_is_refused_at_the_field(
    org: Organization,
) -> None:
    client = _login(org, "admin")
    page = client.post("/dashboard/settings", {"action": "key", "key-name": "ci", "key-scopes": ["read"]})
    assert page.status_code == 200
    assert 'id="new-key"' in page.content.decode()
    assert ApiKey.objects.filter(organization=org, name="ci").exists()
    bad = client.post(
        "/dashboard/settings",
        {
            "action": "site",
            "site-name": "x1",
            "site-zone": "ZZ",
            "site-pue": "1.2",
            "site-pue_source": "declared",
            "site-pue_relative_uncertainty": "0.05",
            "site-electricity": "owned",
        },
    )
    form = bad.context["site_form"]
    assert "unknown grid zone 'ZZ'" in form.errors["zone"][0]
    good = client.post(
        "/dashboard/settings",
        {
            "action": "site",
            "site-name": "x1",
            "site-zone": "DE",
            "site-pue": "1.2",
            "site-pue_source": "declared",
            "site-pue_relative_uncertainty": "0.05",
            "site-electricity": "owned",
        },
    )
    assert good.status_code == 302
    assert Site.objects.get(name="x1").organization_id == org.pk


def test_a_bad_factor_upload_lists_each_rejected_line(org: Organization) -> None:
    from django.core.files.uploadedfile import SimpleUploadedFile

    client = _login(org, "admin")
    upload = SimpleUploadedFile("bad.csv", b"zone,datetime,g_co2e_per_kwh\nFR,yesterday,30\n", "text/csv")
    page = client.post("/dashboard/settings", {"action": "upload", "upload-file": upload})
    html = page.content.decode()
    assert "line 2:" in html and "yesterday" in html
    assert "1 row(s) rejected" in html


def test_logout_and_password_change(org: Organization) -> None:
    client = _login(org, "viewer", "vera")
    changed = client.post(
        "/accounts/password_change/",
        {
            "old_password": PASSWORD,
            "new_password1": "another-long-pass-77",
            "new_password2": "another-long-pass-77",
        },
    )
    assert changed.status_code == 302
    client.post("/accounts/logout/")
    assert client.get("/dashboard/").status_code == 302
    assert Client().login(username="vera", password="another-long-pass-77")
    assert not Client().login(username="vera", password=PASSWORD)


def test_the_models_page_shows_which_variant_served_the_traffic(org: Organization) -> None:
    client = _login(org, "viewer")
    html = client.get("/dashboard/models").content.decode()
    assert "Served by variant" in html
    assert "<td>fp32</td>" in html and "<td>int8</td>" in html
