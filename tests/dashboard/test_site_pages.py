"""One layout for every page the product serves, no dead ends, one meaning per KPI label (Django test client)."""

from __future__ import annotations

import re
from datetime import UTC, datetime, timedelta
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


@pytest.fixture(autouse=True)
def _fresh_cache() -> None:
    # The filters' model list is cached per organization id, and a rolled-back test frees its ids for reuse.
    from django.core.cache import cache

    cache.clear()


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


SETTINGS = ("organization", "sites", "devices", "keys", "instruments", "imports")


def test_settings_are_sub_pages_with_human_labels_and_units(org: Organization) -> None:
    client = signed_in(org, "admin")
    pages = {name: client.get(f"/dashboard/settings/{name}").content.decode() for name in SETTINGS}
    for name, html in pages.items():
        assert all(f'href="/dashboard/settings/{other}"' in html for other in SETTINGS), name
    assert "PUE (facility energy / IT energy)" in pages["sites"] and 'id="site-form"' in pages["sites"]
    assert 'id="site-form"' not in pages["keys"]  # one subject per page
    assert "Energy covered (MWh)" in pages["instruments"]
    assert "Emission rate (g CO2e/kWh)" in pages["instruments"]
    assert "Embodied emissions (kg CO2e)" in pages["devices"]
    for raw in (">Pue<", ">Mwh<", "Intensity g per kwh", ">Pue source<"):
        assert all(raw not in html for html in pages.values()), raw


def test_every_device_input_has_its_own_label(org: Organization) -> None:
    html = signed_in(org, "admin").get("/dashboard/settings/devices").content.decode()
    fields = re.findall(r"<(?:input|select)\b[^>]*>", html)
    visible = [f for f in fields if 'type="hidden"' not in f]
    inputs = [m.group(1) for f in visible if (m := re.search(r'\bid="(id_device\d+_[a-z_]+)"', f))]
    assert len(inputs) >= 3
    for input_id in inputs:
        assert f'<label for="{input_id}"' in html, input_id


def test_a_refused_settings_form_comes_back_on_its_sub_page_with_the_error_at_the_field(
    org: Organization,
) -> None:
    client = signed_in(org, "admin")
    refused = client.post(
        "/dashboard/settings/sites",
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
    assert refused.context["section"] == "sites"
    html = refused.content.decode()
    error_at = html.index("unknown grid zone")
    assert error_at < html.index('id="id_site-zone"') < error_at + 600  # beside the field, not at the top


def test_per_job_keys_are_folded_out_of_the_key_list(org: Organization) -> None:
    from tenancy.services import api_key_create

    api_key_create(organization=org, scopes="read", name="ci")
    for run in range(3):
        api_key_create(organization=org, scopes="infer", name=f"job 7 run {run}")
    html = signed_in(org, "admin").get("/dashboard/settings/keys").content.decode()
    listed = html[html.index('id="keys"') : html.index("</table>", html.index('id="keys"'))]
    folded = html[html.index('id="job-keys"') :]
    assert ">ci<" in listed and "job 7 run" not in listed
    assert folded.count("job 7 run") == 3 and "3 key(s) made by the job runner" in folded


def test_the_api_docs_show_the_authorization_header_whole() -> None:
    schema = Client().get("/api/schema/", {"format": "json"}).json()
    assert "`Authorization: Bearer <API key>`" in schema["info"]["description"]


def test_the_job_forms_example_deadline_is_ahead(org: Organization) -> None:
    html = signed_in(org, "admin").get("/dashboard/jobs").content.decode()
    example = re.search(r"e\.g\. (\d{4}-\d{2}-\d{2}) 18:00", html)
    assert example and example.group(1) > datetime.now(UTC).strftime("%Y-%m-%d")


def test_the_range_and_filters_of_a_page_and_the_api_select_the_same_rollups(org: Organization) -> None:
    from decimal import Decimal

    from rest_framework.test import APIClient

    from carbon.models import HourlyRollup

    client = signed_in(org, "viewer")
    api = signed_in(org, "analyst", client=APIClient())
    row = HourlyRollup.objects.filter(organization=org, kind="request").exclude(site=None).first()
    assert row is not None
    day = row.hour.date()
    query = {"preset": "", "start": day.isoformat(), "end": day.isoformat(), "model": row.model}
    query["site"] = str(row.site_id)
    page = client.get("/dashboard/", query)
    assert page.status_code == 200
    shown = page.context["data"]["range"]
    api_end = (day + timedelta(days=1)).isoformat()  # the last day is included: the API's end is the next
    rows = api.get(
        "/api/v1/rollups",
        {"start": day.isoformat(), "end": api_end, "step": "day", "model": row.model, "site": row.site_id},
    ).json()["results"]
    assert len(rows) == 1
    assert shown["requests"] == rows[0]["requests"] > 0
    assert shown["location_g"] == Decimal(str(rows[0]["location_co2e_g"]))
    everything = api.get("/api/v1/rollups", {"start": day.isoformat(), "end": api_end}).json()["results"]
    assert everything[0]["requests"] >= rows[0]["requests"]
    # The page's links keep the range and the filters.
    link = re.search(r'href="(/dashboard/energy[^"]*)"', page.content.decode())
    assert link and f"start={day}" in link.group(1) and f"model={row.model}" in link.group(1), link
    assert api.get("/api/v1/rollups", {"site": "²"}).status_code == 400


def test_a_bad_range_is_refused_beside_its_field_and_the_default_range_shown(org: Organization) -> None:
    page = signed_in(org, "viewer").get(
        "/dashboard/carbon", {"preset": "", "start": "2026-02-10", "end": "2026-02-01"}
    )
    assert page.status_code == 200
    form = page.context["range_form"]
    assert "before the first" in form.errors["end"][0]
    assert page.context["range"]["end"] - page.context["range"]["first"] == timedelta(days=30)


def test_a_preset_range_shows_its_first_and_last_day(org: Organization) -> None:
    page = signed_in(org, "viewer").get("/dashboard/energy", {"preset": "last_7_days"})
    today = datetime.now(UTC).date()
    html = page.content.decode()
    assert f'value="{today - timedelta(days=6)}"' in html and f'value="{today}"' in html
    assert page.context["range"]["end"] - page.context["range"]["first"] == timedelta(days=7)
