"""One layout for every page the product serves, no dead ends, one meaning per KPI label (Django test client)."""

from __future__ import annotations

import re
from datetime import UTC, datetime
from unittest import mock

import pytest
from django.conf import settings
from django.contrib.auth.models import User
from django.core import mail
from django.core.management import call_command
from django.test import Client, RequestFactory

from carbon.rollups import rollups_update
from carbon.services import load_shipped_factors
from demo.synthetic_ledger import generate_ledger
from tenancy.models import Organization
from tests.factories import OrganizationFactory
from tests.support.accounts import PASSWORD, signed_in

pytestmark = pytest.mark.django_db
STYLESHEET = "/static/carbonledger/site.css"


@pytest.fixture
def org() -> Organization:
    load_shipped_factors()
    org = OrganizationFactory()
    generate_ledger(organization=org, requests=500, days=2, end=datetime.now(UTC), seed=3)
    rollups_update()
    return org


def test_home_shows_anonymous_visitors_the_way_in_and_no_server_path() -> None:
    page = Client().get("/")
    html = page.content.decode()
    assert page.status_code == 200
    assert 'href="/accounts/login/' in html and 'href="/api/docs/"' in html
    assert str(settings.MODEL_REPOSITORY) not in html
    assert STYLESHEET in html


def test_home_sends_a_signed_in_member_to_the_overview(org: Organization) -> None:
    response = signed_in(org, "viewer").get("/")
    assert response.status_code == 302 and response["Location"] == "/dashboard/"


def test_the_account_pages_share_the_dashboards_layout(org: Organization) -> None:
    anonymous = Client()
    for url in ("/accounts/login/", "/accounts/password_reset/"):
        page = anonymous.get(url)
        assert page.status_code == 200, url
        assert STYLESHEET in page.content.decode(), url
    member = signed_in(org, "viewer")
    for url in ("/dashboard/", "/accounts/password_change/"):
        html = member.get(url).content.decode()
        assert STYLESHEET in html and 'href="/dashboard/settings"' in html, url


def test_the_404_page_has_the_navigation_and_a_way_back(org: Organization) -> None:
    anonymous = Client().get("/no/such/page")
    assert anonymous.status_code == 404
    html = anonymous.content.decode()
    assert STYLESHEET in html and 'href="/"' in html and "/accounts/login/" in html
    member = signed_in(org, "viewer").get("/dashboard/nowhere")
    assert member.status_code == 404 and 'href="/dashboard/carbon"' in member.content.decode()


def test_the_500_page_has_a_way_back_and_needs_no_context() -> None:
    from django.views.defaults import server_error

    response = server_error(RequestFactory().get("/broken"))
    html = response.content.decode()
    assert response.status_code == 500
    assert STYLESHEET in html and 'href="/"' in html


def test_a_password_is_reset_by_email_through_the_link_sent(org: Organization) -> None:
    user = User.objects.create_user("eve", email="eve@example.org", password=PASSWORD)
    client = Client()
    sent = client.post("/accounts/password_reset/", {"email": "eve@example.org"})
    assert sent.status_code == 302
    assert len(mail.outbox) == 1 and mail.outbox[0].to == ["eve@example.org"]
    link = re.search(r"https?://[^/\s]+(/accounts/reset/\S+)", mail.outbox[0].body)
    assert link, mail.outbox[0].body
    form = client.get(link.group(1), follow=True)
    assert form.status_code == 200 and STYLESHEET in form.content.decode()
    done = client.post(
        form.redirect_chain[-1][0],
        {"new_password1": "fresh-long-password-91", "new_password2": "fresh-long-password-91"},
    )
    assert done.status_code == 302
    user.refresh_from_db()
    assert user.check_password("fresh-long-password-91")


def test_the_api_root_lists_the_api_and_links_its_docs(org: Organization) -> None:
    index = signed_in(org, "viewer").get("/api/v1/")
    assert index.status_code == 200
    body = index.json()
    assert body["docs"] == "/api/docs/" and body["schema"] == "/api/schema/"
    paths = {e["path"] for e in body["endpoints"]}
    assert {"/api/v1/rollups", "/api/v1/sites", "/api/v1/reports", "/api/v1/whoami"} <= paths
    assert all(e["summary"] for e in body["endpoints"])
    # Nothing under /api/v1/ is public, but a visitor without a key still learns where the docs are.
    anonymous = Client().get("/api/v1/")
    assert anonymous.status_code in (401, 403)
    assert anonymous.json()["docs"] == "/api/docs/"


def test_the_admin_is_linked_for_staff_only(org: Organization) -> None:
    admin_member = signed_in(org, "admin")
    assert 'href="/admin/"' not in admin_member.get("/dashboard/").content.decode()
    User.objects.filter(username=f"admin-{org.slug}").update(is_staff=True)
    html = admin_member.get("/dashboard/").content.decode()
    assert 'href="/admin/"' in html and "operator" in html
    assert 'href="/admin/"' not in Client().get("/").content.decode()


def test_each_kpi_label_has_one_meaning_and_an_explanation(org: Organization) -> None:
    client = signed_in(org, "viewer")
    overview = client.get("/dashboard/").content.decode()
    models = client.get("/dashboard/models").content.decode()
    for html in (overview, models):
        # Never the bare label that meant idle included on one page and excluded on the other.
        labels = re.findall(r"CO2e per 1,000 inferences[^<]*", html)
        assert labels and all("incl. idle" in label or "excl. idle" in label for label in labels), labels
    assert "CO2e per 1,000 inferences, incl. idle" in overview
    assert "CO2e per 1,000 inferences, excl. idle" in models
    explained = re.findall(r'<abbr title="([^"]+)">[^<]*(?:incl|excl)\. idle', overview + models)
    assert len(explained) >= 2 and all(len(text) > 20 for text in explained)


def test_a_users_password_is_reset_with_a_documented_command() -> None:
    User.objects.create_user("ops", password=PASSWORD)
    with mock.patch("getpass.getpass", return_value="new-long-password-55"):
        call_command("changepassword", "ops")
    assert Client().login(username="ops", password="new-long-password-55")
    docs = (settings.BASE_DIR / "docs" / "dashboard-and-api.md").read_text()
    assert "manage.py changepassword" in docs
