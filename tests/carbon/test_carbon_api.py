"""REST API of the carbon domain (/api/v1/...): factor imports, factors, residual mixes, instruments, sites,
devices, rollups and the carbon summary; authentication, scopes and tenant isolation."""

from __future__ import annotations

from datetime import UTC, datetime
from decimal import Decimal
from typing import Any

import pytest
from django.core.files.uploadedfile import SimpleUploadedFile
from rest_framework.test import APIClient

from carbon import services as carbon
from carbon import tasks
from carbon.models import EmissionFactor, FactorImport, PueRecord
from carbon.rollups import rollups_update
from demo.synthetic_ledger import generate_ledger
from tenancy.models import Organization, Site
from tenancy.services import api_key_create
from tests.factories import OrganizationFactory

# Not transactional: the on-commit hooks (which queue a Celery recompute on the broker) never fire unless a
# test captures them explicitly.
pytestmark = pytest.mark.django_db

API = "/api/v1"
LEDGER_END = datetime(2025, 3, 1, tzinfo=UTC)
PLAIN_FR = (
    b"zone,datetime,g_co2e_per_kwh\n"
    b"FR,2025-01-15T10:00:00Z,30\n"
    b"FR,2025-01-15T11:00:00Z,31.5\n"
    b"FR,2025-01-15T12:00:00Z,29\n"
)
BAD_ROWS = (
    b"zone,datetime,g_co2e_per_kwh\n"
    b"FR,2025-13-45T10:00:00Z,30\n"  # line 2: no such date
    b"FR,2025-01-15T11:00:00Z,-5\n"  # line 3: negative
    b"XX-NOWHERE,2025-01-15T12:00:00Z,29\n"  # line 4: unknown zone
)
ALL_CRITERIA = dict.fromkeys(
    (
        "conveys_attributes",
        "unique_claim",
        "retired_for_reporter",
        "vintage_matches_period",
        "same_market",
        "residual_mix_adjusted",
    ),
    True,
)


@pytest.fixture
def factors() -> None:
    carbon.load_shipped_factors()


def _client(org: Organization, scopes: str = "read,admin", *, raise_errors: bool = True) -> APIClient:
    client = APIClient(raise_request_exception=raise_errors)
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {api_key_create(organization=org, scopes=scopes).raw_key}")
    return client


def _dec(value: Any) -> Decimal:
    """A number from the JSON: DRF writes a Decimal held in a plain dict as a float, a serializer's as a string."""
    return Decimal(str(value))


def _upload(client: APIClient, data: bytes, name: str = "fr-hourly.csv", **fields: Any) -> Any:
    body = {"file": SimpleUploadedFile(name, data, content_type="text/csv"), **fields}
    return client.post(f"{API}/factor-imports", body, format="multipart")


def _instrument(**overrides: Any) -> dict[str, Any]:
    body: dict[str, Any] = {
        "instrument_id": "GO-2025-001",
        "kind": "GO",
        "zone": "FR",
        "vintage_start": "2025-01-01T00:00:00Z",
        "vintage_end": "2026-01-01T00:00:00Z",
        "mwh": "10",
        "certificate_ids": "FR-GO-0001..0010",
        "retirement_evidence": "registry statement 42",
        "quality_criteria": dict(ALL_CRITERIA),
    }
    body.update(overrides)
    return body


def _site_body(name: str, zone: str = "FR", pue: str = "1.3") -> dict[str, Any]:
    return {"name": name, "zone": zone, "pue": pue}


# -- factor imports and factors --------------------------------------------------------------------


def test_a_valid_plain_csv_is_accepted_shown_and_its_factors_are_listed_with_attribution(
    factors: None,
) -> None:
    org = OrganizationFactory()
    client = _client(org)
    response = _upload(client, PLAIN_FR)
    assert response.status_code == 201, response.json()
    created = response.json()
    assert created["status"] == "accepted"
    assert created["row_count"] == 3
    assert created["layout"] == "plain"
    assert created["errors"] == []
    assert created["shared"] is False
    assert created["name"] == "fr-hourly.csv"
    assert created["created_by"].startswith("api-key:")

    detail = client.get(f"{API}/factor-imports/{created['id']}")
    assert detail.status_code == 200
    assert detail.json() == created
    assert created["id"] in [r["id"] for r in client.get(f"{API}/factor-imports").json()["results"]]

    listed = client.get(f"{API}/emission-factors", {"zone": "FR"})
    assert listed.status_code == 200
    body = listed.json()
    assert {r["zone"] for r in body["results"]} == {"FR"}
    mine = [r for r in body["results"] if r["factor_import_id"] == created["id"]]
    assert [(r["granularity"], r["period_start"], _dec(r["intensity_g_per_kwh"])) for r in mine] == [
        ("hour", "2025-01-15T10:00:00Z", Decimal("30")),
        ("hour", "2025-01-15T11:00:00Z", Decimal("31.5")),
        ("hour", "2025-01-15T12:00:00Z", Decimal("29")),
    ]
    assert any(r["granularity"] == "year" for r in body["results"])  # the shipped annual figures too
    assert body["attribution"]
    assert "CC BY 4.0" in {a["licence"] for a in body["attribution"]}


def test_an_upload_queues_one_recompute_of_the_uploading_organization_on_commit(
    factors: None, django_capture_on_commit_callbacks: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    org = OrganizationFactory()
    client = _client(org)
    queued: list[int | None] = []
    monkeypatch.setattr(tasks.recompute_carbon, "delay", queued.append)
    with django_capture_on_commit_callbacks(execute=True):
        assert _upload(client, BAD_ROWS).status_code == 422
    assert queued == []  # nothing imported, nothing to recompute
    with django_capture_on_commit_callbacks(execute=True):
        assert _upload(client, PLAIN_FR).status_code == 201
    assert queued == [org.pk]


def test_a_file_with_bad_rows_is_rejected_with_every_line_and_imports_nothing(factors: None) -> None:
    org = OrganizationFactory()
    client = _client(org)
    factors_before = EmissionFactor.objects.count()
    response = _upload(client, BAD_ROWS, name="bad.csv")
    assert response.status_code == 422
    body = response.json()
    assert "3 row(s) rejected" in body["error"]
    assert body["import"]["status"] == "rejected"
    assert body["import"]["row_count"] == 0
    errors = body["import"]["errors"]
    assert [e["line"] for e in errors] == [2, 3, 4]
    assert "bad date" in errors[0]["reason"]
    assert "negative" in errors[1]["reason"]
    assert "unknown zone" in errors[2]["reason"] and "XX-NOWHERE" in errors[2]["reason"]
    assert EmissionFactor.objects.count() == factors_before
    # The rejected version is kept, with its errors, and the server keeps serving.
    detail = client.get(f"{API}/factor-imports/{body['import']['id']}")
    assert detail.status_code == 200
    assert detail.json()["status"] == "rejected"
    assert client.get(f"{API}/emission-factors", {"zone": "FR"}).status_code == 200


def test_a_new_zone_is_accepted_only_when_allowed(factors: None) -> None:
    client = _client(OrganizationFactory())
    data = b"zone,datetime,g_co2e_per_kwh\nZZ-LAB,2025-01-15T10:00:00Z,100\n"
    refused = _upload(client, data)
    assert refused.status_code == 422
    assert "unknown zone" in refused.json()["import"]["errors"][0]["reason"]
    accepted = _upload(client, data, allow_new_zones="true", source="lab meter", licence="internal")
    assert accepted.status_code == 201, accepted.json()
    rows = client.get(f"{API}/emission-factors", {"zone": "ZZ-LAB"}).json()["results"]
    assert [(r["source"], r["licence"]) for r in rows] == [("lab meter", "internal")]


def test_the_same_accepted_file_uploaded_twice_is_refused_naming_the_earlier_version(factors: None) -> None:
    client = _client(OrganizationFactory())
    first = _upload(client, PLAIN_FR)
    assert first.status_code == 201
    again = _upload(client, PLAIN_FR, name="renamed.csv")
    assert again.status_code == 409
    assert f"version {first.json()['id']}" in again.json()["error"]
    assert FactorImport.objects.filter(checksum_sha256=first.json()["checksum_sha256"]).count() == 1


def test_a_rejected_file_may_be_uploaded_again(factors: None) -> None:
    client = _client(OrganizationFactory())
    assert _upload(client, BAD_ROWS).status_code == 422
    assert _upload(client, BAD_ROWS).status_code == 422  # not 409: nothing was imported the first time


def test_an_upload_without_a_file_is_refused_naming_the_field(factors: None) -> None:
    client = _client(OrganizationFactory())
    response = client.post(f"{API}/factor-imports", {"source": "nothing"}, format="multipart")
    assert response.status_code == 400
    assert "file" in response.json()


def test_the_factor_list_takes_a_limit(factors: None) -> None:
    client = _client(OrganizationFactory())
    assert len(client.get(f"{API}/emission-factors", {"limit": "5"}).json()["results"]) == 5
    assert client.get(f"{API}/emission-factors", {"limit": "0"}).json()["results"] == []
    bad = client.get(f"{API}/emission-factors", {"limit": "many"})
    assert bad.status_code == 400
    assert "limit" in bad.json()


def test_a_negative_factor_limit_is_refused_with_a_400(factors: None) -> None:
    client = _client(OrganizationFactory(), raise_errors=False)  # a crash shows as a 500
    response = client.get(f"{API}/emission-factors", {"limit": "-1"})
    assert response.status_code == 400
    assert "limit" in response.json()


# -- authentication and scopes ---------------------------------------------------------------------


def test_writes_need_the_admin_scope_and_reads_work_with_read_only(factors: None) -> None:
    org = OrganizationFactory()
    reader = _client(org, scopes="read")
    for path, body, fmt in (
        ("factor-imports", {"file": SimpleUploadedFile("f.csv", PLAIN_FR)}, "multipart"),
        (
            "residual-mixes",
            {"zone": "FR", "year": 2025, "intensity_g_per_kwh": "50", "source": "AIB"},
            "json",
        ),
        ("instruments", _instrument(), "json"),
        ("sites", _site_body("read-only-site"), "json"),
    ):
        response = reader.post(f"{API}/{path}", body, format=fmt)
        assert response.status_code == 403, path
        assert "admin" in response.json()["detail"]
    assert not FactorImport.objects.filter(organization=org).exists()
    assert not Site.objects.filter(name="read-only-site").exists()
    for path in ("factor-imports", "emission-factors", "residual-mixes", "instruments", "sites", "devices"):
        assert reader.get(f"{API}/{path}").status_code == 200, path
    assert reader.get(f"{API}/rollups").status_code == 200
    assert reader.get(f"{API}/carbon").status_code == 200


def test_a_key_without_the_read_scope_cannot_read(factors: None) -> None:
    client = _client(OrganizationFactory(), scopes="infer")
    assert client.get(f"{API}/emission-factors").status_code == 403
    assert client.get(f"{API}/sites").status_code == 403


def test_no_key_or_a_bad_key_gets_401(factors: None) -> None:
    anonymous = APIClient()
    for path in ("factor-imports", "emission-factors", "sites", "carbon"):
        response = anonymous.get(f"{API}/{path}")
        assert response.status_code == 401, path
        assert response["WWW-Authenticate"] == "Bearer"
    assert anonymous.post(f"{API}/sites", _site_body("anon-site"), format="json").status_code == 401
    forged = APIClient()
    forged.credentials(HTTP_AUTHORIZATION="Bearer cl_000000000000_not-a-real-key")
    assert forged.get(f"{API}/sites").status_code == 401
    assert not Site.objects.filter(name="anon-site").exists()


# -- tenant isolation ------------------------------------------------------------------------------


def test_an_organization_sees_its_own_and_shared_factor_imports_but_not_anothers(factors: None) -> None:
    a, b = _client(OrganizationFactory()), _client(OrganizationFactory())
    a_import = _upload(a, PLAIN_FR).json()
    a_rejected = _upload(a, BAD_ROWS).json()["import"]
    for record in (a_import, a_rejected):
        assert b.get(f"{API}/factor-imports/{record['id']}").status_code == 404
    b_ids = {r["id"] for r in b.get(f"{API}/factor-imports").json()["results"]}
    assert a_import["id"] not in b_ids and a_rejected["id"] not in b_ids
    b_fr = b.get(f"{API}/emission-factors", {"zone": "FR"}).json()["results"]
    assert a_import["id"] not in {r["factor_import_id"] for r in b_fr}
    assert not [r for r in b_fr if r["granularity"] == "hour"]
    # The shipped imports (organization None) are shared with both.
    shipped = set(FactorImport.objects.filter(organization=None).values_list("pk", flat=True))
    assert len(shipped) == 3
    for client in (a, b):
        listed = client.get(f"{API}/factor-imports").json()["results"]
        assert shipped <= {r["id"] for r in listed}
        assert all(r["shared"] for r in listed if r["id"] in shipped)
        for pk in shipped:
            assert client.get(f"{API}/factor-imports/{pk}").json()["shared"] is True
    # The duplicate check is per owner: B may import the same bytes as its own version.
    b_same = _upload(b, PLAIN_FR)
    assert b_same.status_code == 201
    assert b_same.json()["id"] != a_import["id"]


def test_the_attribution_list_does_not_leak_another_organizations_private_import(factors: None) -> None:
    a, b = _client(OrganizationFactory()), _client(OrganizationFactory())
    secret = "Acme private meter feed"
    response = _upload(a, PLAIN_FR, source=secret, licence="Acme internal", url="https://acme.invalid/feed")
    assert response.status_code == 201
    assert secret in {x["source"] for x in a.get(f"{API}/emission-factors").json()["attribution"]}
    attribution = b.get(f"{API}/emission-factors").json()["attribution"]
    assert secret not in {x["source"] for x in attribution}
    assert "https://acme.invalid/feed" not in {x["url"] for x in attribution}


def test_sites_instruments_residual_mixes_and_devices_are_private(factors: None) -> None:
    org_a = OrganizationFactory()
    a, b = _client(org_a), _client(OrganizationFactory())
    site = a.post(f"{API}/sites", _site_body("a-paris"), format="json").json()
    assert a.post(f"{API}/instruments", _instrument(), format="json").status_code == 201
    mix = {"zone": "FR", "year": 2025, "intensity_g_per_kwh": "55", "source": "AIB 2025"}
    assert a.post(f"{API}/residual-mixes", mix, format="json").status_code == 201
    generate_ledger(organization=org_a, requests=10, days=1, end=LEDGER_END, seed=5)
    a_devices = a.get(f"{API}/devices").json()["results"]
    assert len(a_devices) == 2
    gpu = next(d["device_id"] for d in a_devices if d["device_id"].endswith("gpu0"))
    assert a.get(f"{API}/devices/{gpu}").status_code == 200

    assert {s["name"] for s in a.get(f"{API}/sites").json()["results"]} == {
        "a-paris",
        f"{org_a.slug}-paris",
        f"{org_a.slug}-cloud-us",
    }
    assert b.get(f"{API}/sites").json()["results"] == []
    assert b.get(f"{API}/instruments").json()["results"] == []
    assert b.get(f"{API}/residual-mixes").json()["results"] == []
    assert b.get(f"{API}/devices").json()["results"] == []
    assert b.get(f"{API}/devices/{gpu}").status_code == 404
    assert b.patch(f"{API}/devices/{gpu}", {"embodied_kg_co2e": "1"}, format="json").status_code == 404
    pue = {"pue": "1.5", "source": "measured", "valid_from": "2025-02-01T00:00:00Z"}
    assert b.post(f"{API}/sites/{site['id']}/pue", pue, format="json").status_code == 404
    assert PueRecord.objects.filter(site_id=site["id"]).count() == 1
    # A cannot place its device in B's site.
    b_site = b.post(f"{API}/sites", _site_body("b-paris"), format="json").json()
    moved = a.patch(f"{API}/devices/{gpu}", {"site": b_site["id"]}, format="json")
    assert moved.status_code == 400
    assert "site" in moved.json()
    # The same instrument id is free in another organization.
    assert b.post(f"{API}/instruments", _instrument(), format="json").status_code == 201


def test_rollups_and_carbon_totals_are_per_organization(factors: None) -> None:
    org_a = OrganizationFactory()
    a, b = _client(org_a), _client(OrganizationFactory())
    generate_ledger(organization=org_a, requests=200, days=1, end=LEDGER_END, seed=11)
    rollups_update()
    period = {"start": "2025-02-28", "end": "2025-03-01"}
    a_points = a.get(f"{API}/rollups", {**period, "step": "day"}).json()["results"]
    assert sum(p["requests"] for p in a_points) == 200
    assert b.get(f"{API}/rollups", {**period, "step": "day"}).json()["results"] == []
    a_carbon, b_carbon = a.get(f"{API}/carbon", period).json(), b.get(f"{API}/carbon", period).json()
    assert a_carbon["requests"] == 200
    assert _dec(a_carbon["location_based"]["total"]["co2e_g"]) > 0
    assert b_carbon["requests"] == 0
    assert _dec(b_carbon["location_based"]["total"]["co2e_g"]) == 0
    assert _dec(b_carbon["market_based"]["total"]["co2e_g"]) == 0
    assert b_carbon["sci_g_per_1000_requests"] is None
    assert b_carbon["factors"] == []


# -- residual mixes and instruments ----------------------------------------------------------------


def test_a_valid_residual_mix_is_created_and_listed(factors: None) -> None:
    client = _client(OrganizationFactory())
    body = {
        "zone": "FR",
        "year": 2025,
        "intensity_g_per_kwh": "52.5",
        "source": "AIB European Residual Mixes 2025",
        "url": "https://www.aib-net.org/facts/european-residual-mix",
    }
    response = client.post(f"{API}/residual-mixes", body, format="json")
    assert response.status_code == 201, response.json()
    created = response.json()
    assert created["zone"] == "FR" and created["year"] == 2025
    assert _dec(created["intensity_g_per_kwh"]) == Decimal("52.5")
    listed = client.get(f"{API}/residual-mixes").json()["results"]
    assert [m["id"] for m in listed] == [created["id"]]


@pytest.mark.parametrize(
    ("field", "value"),
    [("intensity_g_per_kwh", "-1"), ("year", 1980), ("source", "")],
)
def test_an_invalid_residual_mix_is_refused(factors: None, field: str, value: Any) -> None:
    client = _client(OrganizationFactory())
    body = {"zone": "FR", "year": 2025, "intensity_g_per_kwh": "50", "source": "AIB", field: value}
    response = client.post(f"{API}/residual-mixes", body, format="json")
    assert response.status_code == 400
    assert field in response.json()


def test_a_residual_mix_above_the_service_limit_is_refused_with_an_error(factors: None) -> None:
    client = _client(OrganizationFactory())
    body = {"zone": "FR", "year": 2025, "intensity_g_per_kwh": "2500", "source": "AIB"}
    response = client.post(f"{API}/residual-mixes", body, format="json")
    assert response.status_code == 400
    assert "2000" in str(response.json()["error"])


def test_a_go_meeting_every_criterion_is_usable(factors: None) -> None:
    client = _client(OrganizationFactory())
    response = client.post(f"{API}/instruments", _instrument(), format="json")
    assert response.status_code == 201, response.json()
    body = response.json()
    assert body["usable"] is True
    assert body["problems"] == []
    assert set(body["required_criteria"]) == set(ALL_CRITERIA)
    assert body["vintage_start"] == "2025-01-01T00:00:00+00:00"
    assert [i["instrument_id"] for i in client.get(f"{API}/instruments").json()["results"]] == ["GO-2025-001"]


def test_a_go_not_retired_for_the_reporter_is_stored_but_not_usable(factors: None) -> None:
    client = _client(OrganizationFactory())
    body = _instrument(quality_criteria={**ALL_CRITERIA, "retired_for_reporter": False})
    response = client.post(f"{API}/instruments", body, format="json")
    assert response.status_code == 201, response.json()
    created = response.json()
    assert created["usable"] is False
    assert len(created["problems"]) == 1
    assert "retired_for_reporter" in created["problems"][0]


def test_an_instrument_with_a_vintage_off_the_hour_is_refused(factors: None) -> None:
    client = _client(OrganizationFactory())
    response = client.post(
        f"{API}/instruments", _instrument(vintage_start="2025-01-01T00:30:00Z"), format="json"
    )
    assert response.status_code == 400
    assert "whole UTC hours" in response.json()["error"]
    assert client.get(f"{API}/instruments").json()["results"] == []


def test_a_duplicate_instrument_id_is_refused(factors: None) -> None:
    client = _client(OrganizationFactory())
    assert client.post(f"{API}/instruments", _instrument(), format="json").status_code == 201
    again = client.post(f"{API}/instruments", _instrument(mwh="5"), format="json")
    assert again.status_code == 400
    assert "GO-2025-001" in again.json()["error"]
    assert len(client.get(f"{API}/instruments").json()["results"]) == 1


def test_a_certificate_without_mwh_is_refused_with_a_400(factors: None) -> None:
    client = _client(OrganizationFactory())
    response = client.post(f"{API}/instruments", _instrument(mwh=None), format="json")
    assert response.status_code == 400
    assert "mwh" in response.json()["error"]


def test_an_unlimited_supplier_rate_may_omit_mwh(factors: None) -> None:
    client = _client(OrganizationFactory(), raise_errors=False)  # a crash shows as a 500
    body = _instrument(
        instrument_id="SUPPLIER-2025",
        kind="supplier_rate",
        intensity_g_per_kwh="20",
        quality_criteria={
            "conveys_attributes": True,
            "unique_claim": True,
            "vintage_matches_period": True,
            "same_market": True,
            "supplier_rate_disclosed": True,
            "residual_mix_adjusted": True,
        },
    )
    del body["mwh"]
    response = client.post(f"{API}/instruments", body, format="json")
    assert response.status_code == 201
    assert response.json()["mwh"] is None
    assert response.json()["usable"] is True


# -- sites, PUE and devices ------------------------------------------------------------------------


def test_a_site_is_created_with_one_pue_record_and_a_later_record_is_appended(factors: None) -> None:
    client = _client(OrganizationFactory())
    response = client.post(f"{API}/sites", _site_body("paris-1"), format="json")
    assert response.status_code == 201, response.json()
    site = response.json()
    assert (site["zone"], _dec(site["pue"]), site["scope_category"]) == ("FR", Decimal("1.3"), "scope2")
    assert len(site["pue_records"]) == 1
    assert _dec(site["pue_records"][0]["pue"]) == Decimal("1.3")

    later = {"pue": "1.25", "source": "measured", "valid_from": "2025-02-01T00:00:00Z", "note": "new chiller"}
    updated = client.post(f"{API}/sites/{site['id']}/pue", later, format="json")
    assert updated.status_code == 201, updated.json()
    body = updated.json()
    assert len(body["pue_records"]) == 2
    assert (_dec(body["pue"]), body["pue_source"]) == (Decimal("1.25"), "measured")
    assert sorted(r["valid_from"] for r in body["pue_records"])[-1] == "2025-02-01T00:00:00+00:00"
    listed = client.get(f"{API}/sites").json()["results"]
    assert [len(s["pue_records"]) for s in listed] == [2]


def test_a_site_in_an_unknown_zone_is_refused_naming_the_zone(factors: None) -> None:
    client = _client(OrganizationFactory())
    response = client.post(f"{API}/sites", _site_body("nowhere", zone="XX-NOWHERE"), format="json")
    assert response.status_code == 400
    assert "XX-NOWHERE" in response.json()["error"]
    assert not Site.objects.filter(name="nowhere").exists()


@pytest.mark.parametrize("pue", ["0.9", "5.5"])
def test_a_site_with_a_pue_out_of_range_is_refused_naming_pue(factors: None, pue: str) -> None:
    client = _client(OrganizationFactory())
    response = client.post(f"{API}/sites", _site_body("bad-pue", pue=pue), format="json")
    assert response.status_code == 400
    assert "pue" in response.json()
    assert not Site.objects.filter(name="bad-pue").exists()


def test_a_pue_record_out_of_range_or_for_no_site_is_refused(factors: None) -> None:
    client = _client(OrganizationFactory())
    site = client.post(f"{API}/sites", _site_body("paris-2"), format="json").json()
    bad = {"pue": "0.5", "source": "measured", "valid_from": "2025-02-01T00:00:00Z"}
    response = client.post(f"{API}/sites/{site['id']}/pue", bad, format="json")
    assert response.status_code == 400
    assert "pue" in response.json()
    good = {**bad, "pue": "1.2"}
    assert client.post(f"{API}/sites/999999/pue", good, format="json").status_code == 404
    assert PueRecord.objects.filter(site_id=site["id"]).count() == 1


def test_a_device_can_be_placed_in_a_site_and_given_embodied_emissions(factors: None) -> None:
    org = OrganizationFactory()
    client = _client(org)
    generate_ledger(organization=org, requests=10, days=1, end=LEDGER_END, seed=2)
    site = client.post(f"{API}/sites", _site_body("paris-3"), format="json").json()
    gpu = f"synthetic-{org.slug}-gpu0"
    response = client.patch(
        f"{API}/devices/{gpu}",
        {"site": site["id"], "embodied_kg_co2e": "150", "lifetime_years": "4"},
        format="json",
    )
    assert response.status_code == 200, response.json()
    body = response.json()
    assert body["site"] == site["id"]
    assert (_dec(body["embodied_kg_co2e"]), _dec(body["lifetime_years"])) == (Decimal(150), Decimal(4))
    assert client.get(f"{API}/devices/{gpu}").json() == body
    assert client.get(f"{API}/devices/no-such-device").status_code == 404
    negative = client.patch(f"{API}/devices/{gpu}", {"lifetime_years": "0"}, format="json")
    assert negative.status_code == 400
    assert "lifetime_years" in negative.json()


# -- rollups and the carbon summary ----------------------------------------------------------------


@pytest.fixture
def ledger() -> APIClient:
    """Two days of synthetic traffic (2000 requests) for one organization, rolled up; its client."""
    carbon.load_shipped_factors()
    org = OrganizationFactory()
    generate_ledger(organization=org, requests=2000, days=2, end=LEDGER_END, seed=7)
    rollups_update()
    return _client(org)


PERIOD = {"start": "2025-02-27", "end": "2025-03-01"}


def test_daily_rollups_have_one_point_a_day_summing_to_every_request(ledger: APIClient) -> None:
    response = ledger.get(f"{API}/rollups", {**PERIOD, "step": "day"})
    assert response.status_code == 200, response.json()
    body = response.json()
    assert (body["start"], body["end"], body["step"]) == (
        "2025-02-27T00:00:00+00:00",
        "2025-03-01T00:00:00+00:00",
        "day",
    )
    points = body["results"]
    assert [p["t"] for p in points] == ["2025-02-27T00:00:00+00:00", "2025-02-28T00:00:00+00:00"]
    assert sum(p["requests"] for p in points) == 2000
    assert all(p["energy_kwh"] > p["idle_kwh"] > 0 for p in points)
    assert all(_dec(p["location_co2e_g"]) > 0 and _dec(p["market_co2e_g"]) > 0 for p in points)


def test_hourly_rollups_have_48_points_and_monthly_one(ledger: APIClient) -> None:
    hourly = ledger.get(f"{API}/rollups", {**PERIOD, "step": "hour"}).json()["results"]
    assert len(hourly) == 48
    assert hourly[0]["t"] == "2025-02-27T00:00:00+00:00"
    assert hourly[-1]["t"] == "2025-02-28T23:00:00+00:00"
    assert sum(p["requests"] for p in hourly) == 2000
    monthly = ledger.get(f"{API}/rollups", {**PERIOD, "step": "month"}).json()["results"]
    assert [(p["t"], p["requests"]) for p in monthly] == [("2025-02-01T00:00:00+00:00", 2000)]


def test_rollups_refuse_an_unknown_step_a_reversed_period_and_a_bad_date(ledger: APIClient) -> None:
    week = ledger.get(f"{API}/rollups", {**PERIOD, "step": "week"})
    assert week.status_code == 400
    assert "step" in week.json()
    reversed_period = ledger.get(f"{API}/rollups", {"start": "2025-03-01", "end": "2025-02-27"})
    assert reversed_period.status_code == 400
    assert "start" in reversed_period.json()
    empty = ledger.get(f"{API}/rollups", {"start": "2025-03-01", "end": "2025-03-01"})
    assert empty.status_code == 400
    bad = ledger.get(f"{API}/rollups", {"start": "yesterday", "end": "2025-03-01"})
    assert bad.status_code == 400
    assert "start" in bad.json()
    assert ledger.get(f"{API}/carbon", {"start": "2025-03-02", "end": "2025-03-01"}).status_code == 400


def test_the_carbon_summary_gives_both_methods_sci_and_the_factors_used(ledger: APIClient) -> None:
    response = ledger.get(f"{API}/carbon", PERIOD)
    assert response.status_code == 200, response.json()
    body = response.json()
    assert body["requests"] == 2000
    location, market = body["location_based"], body["market_based"]
    assert _dec(location["total"]["co2e_g"]) > 0
    assert _dec(market["total"]["co2e_g"]) > 0
    assert _dec(location["total"]["energy_kwh"]) > 0
    assert set(location["by_category"]) == {"scope2", "scope3_cat1"}  # the owned and the cloud site
    assert body["sci_g_per_1000_requests"] is not None
    assert _dec(body["sci_g_per_1000_requests"]) > 0
    assert _dec(body["it_energy_kwh"]) > _dec(body["idle_energy_kwh"]) > 0
    assert body["measured_share"] == 0  # synthetic records: no meter measured them (issue 25)
    assert body["not_valued"] == []
    assert body["factors"]
    assert {f["zone"] for f in body["factors"]} == {"FR", "US-VA"}
    for factor in body["factors"]:
        assert factor["source"] and factor["licence"]
    assert "CC BY 4.0" in {f["licence"] for f in body["factors"]}


def test_the_carbon_summary_of_a_period_with_no_traffic_is_zero(ledger: APIClient) -> None:
    body = ledger.get(f"{API}/carbon", {"start": "2024-01-01", "end": "2024-02-01"}).json()
    assert body["requests"] == 0
    assert _dec(body["location_based"]["total"]["co2e_g"]) == 0
    assert body["sci_g_per_1000_requests"] is None
