"""The management API (/api/v1/...): the organization, its API keys (create once, revoke), models with the
ledger's last hour, the ledger's requests, batches, metering intervals and idle lines (filters, keyset
pagination, a streamed CSV export), and what each dashboard role may do."""

from __future__ import annotations

import base64
import csv
import io
from dataclasses import dataclass
from datetime import UTC, date, datetime, timedelta
from typing import Any
from urllib.parse import parse_qs, urlsplit

import pytest
from django.conf import settings
from rest_framework.test import APIClient

from carbon import services as carbon
from carbon.rollups import rollups_update
from demo.synthetic_ledger import generate_ledger
from ledger.models import LedgerBatch, LedgerIdle, LedgerInterval, LedgerRequest
from ledger.selectors import REQUEST_CSV_COLUMNS, LedgerFilter, requests_for_export
from reports.models import Report
from tenancy.models import ApiKey, Device, Organization, Site
from tenancy.services import api_key_create, organization_create
from tests.support.accounts import signed_in

# Not transactional: the on-commit hooks (Celery recomputes, report generation) never fire.
pytestmark = pytest.mark.django_db

API = "/api/v1"
END = datetime(2026, 11, 30, 12, tzinfo=UTC)  # the synthetic ledgers: 6 hours up to here
HOURS = 6
NS = 1_000_000_000
ON_SQLITE = settings.DATABASES["default"]["ENGINE"] == "django.db.backends.sqlite3"
LEDGER_PATHS = ("ledger/requests", "ledger/batches", "ledger/intervals", "ledger/idle", "ledger/requests.csv")


@dataclass
class Org:
    org: Organization
    key: str  # read,admin
    paris: Site  # the GPU's site (digits, digits_int8)
    cloud: Site  # the CPU's site (linear)


def _org(slug: str, requests: int, seed: int) -> Org:
    org = organization_create(slug=slug, name=f"{slug} inc")
    generate_ledger(organization=org, requests=requests, days=HOURS / 24, end=END, seed=seed)
    return Org(
        org=org,
        key=api_key_create(organization=org, scopes="read,admin").raw_key,
        paris=Site.objects.get(name=f"{slug}-paris"),
        cloud=Site.objects.get(name=f"{slug}-cloud-us"),
    )


@pytest.fixture
def orgs() -> tuple[Org, Org]:
    carbon.load_shipped_factors()
    a, b = _org("ledger-a", 240, 5), _org("ledger-b", 90, 6)
    rollups_update()
    return a, b


def _client(key: str | None = None, *, raise_errors: bool = True) -> APIClient:
    client = APIClient(raise_request_exception=raise_errors)
    if key is not None:
        client.credentials(HTTP_AUTHORIZATION=f"Bearer {key}")
    return client


def _session(org: Organization, role: str) -> APIClient:
    client = APIClient()
    signed_in(org, role, username=f"{org.slug}-{role}", client=client)
    return client


def _ns(at: datetime) -> int:
    return int(at.timestamp()) * NS


def _devices(org: Organization, site: Site | None = None) -> list[str]:
    qs = Device.objects.filter(site__organization=org)
    if site is not None:
        qs = qs.filter(site=site)
    return list(qs.values_list("device_id", flat=True))


def _db_ids(kind: str, org: Organization) -> set[str]:
    if kind == "requests":
        return set(LedgerRequest.objects.filter(organization=org).values_list("request_id", flat=True))
    if kind == "batches":
        mine = LedgerRequest.objects.filter(organization=org).values("batch_id")
        return set(LedgerBatch.objects.filter(batch_id__in=mine).values_list("batch_id", flat=True))
    model = LedgerInterval if kind == "intervals" else LedgerIdle
    return set(model.objects.filter(device_id__in=_devices(org)).values_list("interval_id", flat=True))


ID_FIELD = {
    "requests": "request_id",
    "batches": "batch_id",
    "intervals": "interval_id",
    "idle": "interval_id",
}
TIME_FIELD = {"requests": "received_at", "batches": "started_at", "intervals": "start", "idle": "start"}


def _all_pages(client: APIClient, path: str, **query: Any) -> tuple[list[dict[str, Any]], int]:
    """Every row by following ``next``; and how many pages it took."""
    rows: list[dict[str, Any]] = []
    response = client.get(f"{API}/{path}", query)
    pages = 0
    while True:
        assert response.status_code == 200, response.content
        pages += 1
        body = response.json()
        rows += body["results"]
        if body["next"] is None:
            return rows, pages
        assert pages < 1000, "pagination does not end"
        response = client.get(body["next"])


def _csv_rows(response: Any) -> list[list[str]]:
    assert response.streaming
    return list(csv.reader(io.StringIO(b"".join(response.streaming_content).decode())))


# -- the organization ------------------------------------------------------------------------------


def test_the_organization_is_the_caller_s_own(orgs: tuple[Org, Org]) -> None:
    a, b = orgs
    for who, client in (
        (a, _client(a.key)),
        (b, _client(b.key)),
        (a, _session(a.org, "viewer")),
    ):
        response = client.get(f"{API}/organization")
        assert response.status_code == 200
        body = response.json()
        assert body["slug"] == who.org.slug
        assert body["name"] == who.org.name
        assert datetime.fromisoformat(body["created_at"]) == who.org.created_at


def test_the_organization_needs_credentials_and_the_read_scope() -> None:
    org = organization_create(slug="scoped")
    assert _client().get(f"{API}/organization").status_code == 401
    assert _client("cl_nope_nope").get(f"{API}/organization").status_code == 401
    infer_only = api_key_create(organization=org, scopes="infer").raw_key
    assert _client(infer_only).get(f"{API}/organization").status_code == 403


# -- API keys --------------------------------------------------------------------------------------


def test_keys_are_listed_for_the_own_organization_without_secrets() -> None:
    org, other = organization_create(slug="keys-a"), organization_create(slug="keys-b")
    admin = api_key_create(organization=org, scopes="read,admin", name="ci admin")
    infer = api_key_create(organization=org, scopes="infer", name="gateway")
    foreign = api_key_create(organization=other, scopes="read")
    response = _client(admin.raw_key).get(f"{API}/api-keys")
    assert response.status_code == 200
    listed = {k["prefix"]: k for k in response.json()["results"]}
    assert set(listed) == {admin.api_key.prefix, infer.api_key.prefix}
    assert listed[infer.api_key.prefix]["scopes"] == ["infer"]
    assert listed[admin.api_key.prefix]["scopes"] == ["admin", "read"]
    assert listed[admin.api_key.prefix]["name"] == "ci admin"
    assert all("key" not in k and k["revoked_at"] is None for k in listed.values())
    for secret in (admin.raw_key, infer.raw_key, admin.api_key.key_sha256, foreign.api_key.prefix):
        assert secret.encode() not in response.content


def test_a_created_key_is_shown_once_and_works() -> None:
    org = organization_create(slug="keys-new")
    client = _client(api_key_create(organization=org, scopes="read,admin").raw_key)
    response = client.post(f"{API}/api-keys", {"scopes": ["read", "read"], "name": "ci"}, format="json")
    assert response.status_code == 201, response.json()
    created = response.json()
    raw = created["key"]
    assert raw.startswith(f"cl_{created['prefix']}_")
    assert created["scopes"] == ["read"]
    assert created["name"] == "ci"
    assert created["revoked_at"] is None
    stored = ApiKey.objects.get(prefix=created["prefix"])
    assert stored.organization == org and raw not in stored.key_sha256
    # Shown once: the list names it without the key.
    listed = client.get(f"{API}/api-keys")
    assert created["prefix"] in {k["prefix"] for k in listed.json()["results"]}
    assert raw.encode() not in listed.content
    # The new key works, with its own scopes.
    new = _client(raw)
    assert new.get(f"{API}/organization").json()["slug"] == "keys-new"
    assert new.get(f"{API}/whoami").json() == {"organization": "keys-new", "scopes": ["read"]}


def test_a_revoked_key_gets_401_and_revoking_twice_changes_nothing() -> None:
    org = organization_create(slug="keys-revoke")
    client = _client(api_key_create(organization=org, scopes="read,admin").raw_key)
    created = client.post(f"{API}/api-keys", {"scopes": ["read"]}, format="json").json()
    victim = _client(created["key"], raise_errors=False)
    assert victim.get(f"{API}/organization").status_code == 200
    revoked = client.post(f"{API}/api-keys/{created['prefix']}/revoke")
    assert revoked.status_code == 200
    body = revoked.json()
    assert body["prefix"] == created["prefix"] and body["revoked_at"] is not None
    refused = victim.get(f"{API}/organization")
    assert refused.status_code == 401
    assert refused["WWW-Authenticate"] == "Bearer"
    again = client.post(f"{API}/api-keys/{created['prefix']}/revoke")
    assert again.status_code == 200 and again.json()["revoked_at"] == body["revoked_at"]
    listed = {k["prefix"]: k for k in client.get(f"{API}/api-keys").json()["results"]}
    assert listed[created["prefix"]]["revoked_at"] == body["revoked_at"]
    # The key that did the revoking still works.
    assert client.get(f"{API}/organization").status_code == 200


def test_another_organization_s_prefix_is_not_found_and_its_key_stays_active() -> None:
    org, other = organization_create(slug="keys-mine"), organization_create(slug="keys-theirs")
    client = _client(api_key_create(organization=org, scopes="read,admin").raw_key, raise_errors=False)
    theirs = api_key_create(organization=other, scopes="read")
    response = client.post(f"{API}/api-keys/{theirs.api_key.prefix}/revoke")
    assert response.status_code == 404
    assert client.post(f"{API}/api-keys/000000000000/revoke").status_code == 404
    theirs.api_key.refresh_from_db()
    assert theirs.api_key.revoked_at is None
    assert _client(theirs.raw_key).get(f"{API}/organization").json()["slug"] == "keys-theirs"


def test_a_read_only_key_can_list_but_not_create_or_revoke_keys() -> None:
    org = organization_create(slug="keys-readonly")
    admin = api_key_create(organization=org, scopes="read,admin")
    reader = _client(api_key_create(organization=org, scopes="read").raw_key, raise_errors=False)
    assert reader.get(f"{API}/api-keys").status_code == 200
    before = ApiKey.objects.count()
    created = reader.post(f"{API}/api-keys", {"scopes": ["read", "admin"]}, format="json")
    assert created.status_code == 403
    assert "admin" in created.json()["detail"]
    assert reader.post(f"{API}/api-keys/{admin.api_key.prefix}/revoke").status_code == 403
    assert ApiKey.objects.count() == before
    admin.api_key.refresh_from_db()
    assert admin.api_key.revoked_at is None


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"scopes": ["root"]}, "scopes"),
        ({"scopes": ["read", "fly"]}, "scopes"),
        ({"scopes": []}, "scopes"),
        ({}, "scopes"),
        ({"scopes": "read"}, "scopes"),
        ({"scopes": ["read"], "name": "x" * 101}, "name"),
    ],
)
def test_bad_scopes_and_names_are_refused_with_400(body: dict[str, Any], field: str) -> None:
    org = organization_create(slug="keys-bad")
    client = _client(api_key_create(organization=org, scopes="read,admin").raw_key, raise_errors=False)
    before = ApiKey.objects.count()
    response = client.post(f"{API}/api-keys", body, format="json")
    assert response.status_code == 400
    assert field in response.json()
    assert ApiKey.objects.count() == before


def test_keys_are_created_from_json_only() -> None:
    org = organization_create(slug="keys-form")
    client = _client(api_key_create(organization=org, scopes="read,admin").raw_key, raise_errors=False)
    assert client.post(f"{API}/api-keys", {"scopes": "read"}, format="multipart").status_code == 415


# -- models ----------------------------------------------------------------------------------------


def test_models_show_the_ledger_s_last_hour_and_no_gateway_in_tests(orgs: tuple[Org, Org]) -> None:
    a, _ = orgs
    response = _client(a.key).get(f"{API}/models")
    assert response.status_code == 200
    body = response.json()
    assert body["gateway_running_here"] is False
    assert body["models"] == []
    mine = LedgerRequest.objects.filter(organization=a.org)
    latest = max(mine.values_list("received_ns", flat=True))
    last_hour = mine.filter(received_ns__gt=latest - 3600 * NS)
    rows = body["ledger_last_hour"]
    assert rows, "a synthetic ledger has traffic in its last hour"
    assert {(r["model"], r["version"]) for r in rows} == set(last_hour.values_list("model", "version"))
    for row in rows:
        assert row["requests"] == last_hour.filter(model=row["model"]).count()
        assert row["queue_ms"] > 0 and row["compute_ms"] > 0
        assert row["max_queue_ms"] >= row["queue_ms"]
    assert set(body["batch_sizes"]) == {r["model"] for r in rows}
    for sizes in body["batch_sizes"].values():
        assert all(int(size) >= 1 and n >= 1 for size, n in sizes.items())
    energy = {e["model"]: e for e in body["energy_last_30_days"]}
    assert set(energy) == set(mine.values_list("model", flat=True))
    assert sum(e["requests"] for e in energy.values()) == mine.count()
    assert all(e["j_per_inference"] > 0 for e in energy.values())


def test_models_of_an_organization_without_traffic_are_empty(orgs: tuple[Org, Org]) -> None:
    quiet = organization_create(slug="quiet")
    body = _client(api_key_create(organization=quiet, scopes="read").raw_key).get(f"{API}/models").json()
    assert body["ledger_last_hour"] == [] and body["batch_sizes"] == {} and body["energy_last_30_days"] == []


# -- the ledger: filters ---------------------------------------------------------------------------


def test_requests_are_the_organization_s_own_in_time_order_with_their_energy(orgs: tuple[Org, Org]) -> None:
    a, b = orgs
    body = _client(a.key).get(f"{API}/ledger/requests", {"limit": "1000"}).json()
    rows = body["results"]
    assert body["next"] is None
    assert {r["request_id"] for r in rows} == _db_ids("requests", a.org)
    assert len(rows) == LedgerRequest.objects.filter(organization=a.org).count() == 240
    assert not {r["request_id"] for r in rows} & _db_ids("requests", b.org)
    times = [datetime.fromisoformat(r["received_at"]) for r in rows]
    assert times == sorted(times)
    db = {r.request_id: r for r in LedgerRequest.objects.filter(organization=a.org)}
    for row in rows:
        record = db[row["request_id"]]
        assert row["hash"] == record.hash and row["chain_seq"] == record.seq
        assert row["device_id"] == record.device_id and row["model"] == record.model
        assert row["synthetic"] is True and row["energy_j"] > 0


def test_requests_filter_by_model(orgs: tuple[Org, Org]) -> None:
    a, _ = orgs
    rows, _ = _all_pages(_client(a.key), "ledger/requests", model="digits", limit="1000")
    expected = LedgerRequest.objects.filter(organization=a.org, model="digits")
    assert rows and {r["model"] for r in rows} == {"digits"}
    assert {r["request_id"] for r in rows} == set(expected.values_list("request_id", flat=True))
    assert _client(a.key).get(f"{API}/ledger/requests", {"model": "no-such-model"}).json()["results"] == []


@pytest.mark.parametrize("kind", ["requests", "batches", "intervals", "idle"])
def test_start_and_end_bound_the_time_half_open(orgs: tuple[Org, Org], kind: str) -> None:
    a, _ = orgs
    start, end = END - timedelta(hours=3), END - timedelta(hours=2)
    query = {"start": start.isoformat(), "end": end.replace(tzinfo=None).isoformat(), "limit": "1000"}
    rows, _ = _all_pages(_client(a.key), f"ledger/{kind}", **query)
    window = {"requests": "received_ns", "batches": "start_ns", "intervals": "t0_ns", "idle": "t0_ns"}[kind]
    model = {
        "requests": LedgerRequest,
        "batches": LedgerBatch,
        "intervals": LedgerInterval,
        "idle": LedgerIdle,
    }[kind]
    inside = model.objects.filter(**{f"{window}__gte": _ns(start), f"{window}__lt": _ns(end)})
    expected = set(inside.values_list(ID_FIELD[kind], flat=True)) & _db_ids(kind, a.org)
    assert rows and {r[ID_FIELD[kind]] for r in rows} == expected
    assert all(start <= datetime.fromisoformat(r[TIME_FIELD[kind]]) < end for r in rows)
    if kind in ("intervals", "idle"):
        assert len(rows) == 60 * 2  # one a minute for each of the two devices


def test_requests_batches_intervals_and_idle_filter_by_site(orgs: tuple[Org, Org]) -> None:
    a, _ = orgs
    client = _client(a.key)
    for site, models in ((a.paris, {"digits", "digits_int8"}), (a.cloud, {"linear"})):
        devices = set(_devices(a.org, site))
        assert len(devices) == 1
        requests, _ = _all_pages(client, "ledger/requests", site=str(site.pk), limit="1000")
        assert requests and {r["device_id"] for r in requests} == devices
        assert {r["model"] for r in requests} == models
        expected = LedgerRequest.objects.filter(organization=a.org, device_id__in=devices).count()
        assert len(requests) == expected
        for kind in ("batches", "intervals", "idle"):
            rows, _ = _all_pages(client, f"ledger/{kind}", site=str(site.pk), limit="1000")
            assert rows and {r["device_id"] for r in rows} == devices
    # Filters combine: the CPU's site carries no digits.
    none = client.get(f"{API}/ledger/requests", {"site": str(a.cloud.pk), "model": "digits"}).json()
    assert none["results"] == []


def test_batches_intervals_and_idle_are_the_organization_s_own_devices(orgs: tuple[Org, Org]) -> None:
    a, b = orgs
    for org in (a, b):
        client = _client(org.key)
        devices = set(_devices(org.org))
        for kind in ("batches", "intervals", "idle"):
            rows, _ = _all_pages(client, f"ledger/{kind}", limit="1000")
            assert {r["device_id"] for r in rows} == devices
            assert {r[ID_FIELD[kind]] for r in rows} == _db_ids(kind, org.org)
    assert not _db_ids("batches", a.org) & _db_ids("batches", b.org)
    intervals = _client(a.key).get(f"{API}/ledger/intervals", {"limit": "2"}).json()["results"]
    assert set(intervals[0]) >= {"method", "counter_start_j", "counter_end_j", "idle_energy_j", "busy_s"}
    idle = _client(a.key).get(f"{API}/ledger/idle", {"limit": "2"}).json()["results"]
    assert {"idle_power_w", "owed_in_j"} <= set(idle[0]) and "method" not in idle[0]


# -- the ledger: keyset pagination ------------------------------------------------------------------


@pytest.mark.parametrize(("kind", "limit"), [("requests", 7), ("batches", 9), ("intervals", 7), ("idle", 13)])
def test_pagination_walks_every_row_once_in_order(orgs: tuple[Org, Org], kind: str, limit: int) -> None:
    """Intervals of the two devices share their start: pages that split a tie must neither repeat nor skip."""
    a, _ = orgs
    rows, pages = _all_pages(_client(a.key), f"ledger/{kind}", limit=str(limit))
    ids = [r[ID_FIELD[kind]] for r in rows]
    assert len(ids) == len(set(ids)), "a row was repeated"
    assert set(ids) == _db_ids(kind, a.org), "a row was skipped"
    assert pages in (len(ids) // limit + 1, -(-len(ids) // limit))
    times = [datetime.fromisoformat(r[TIME_FIELD[kind]]) for r in rows]
    assert times == sorted(times)


def test_the_next_link_keeps_the_filters(orgs: tuple[Org, Org]) -> None:
    a, _ = orgs
    client = _client(a.key)
    first = client.get(f"{API}/ledger/requests", {"model": "linear", "limit": "5"}).json()
    assert first["next"].startswith(f"{API}/ledger/requests?")
    assert "model=linear" in first["next"] and "limit=5" in first["next"] and "cursor=" in first["next"]
    rows, _ = _all_pages(client, "ledger/requests", model="linear", limit="5")
    assert {r["model"] for r in rows} == {"linear"}
    assert len(rows) == LedgerRequest.objects.filter(organization=a.org, model="linear").count()


def _b64(raw: bytes) -> str:
    return base64.urlsafe_b64encode(raw).decode()


@pytest.mark.parametrize("path", LEDGER_PATHS)
@pytest.mark.parametrize(
    ("query", "field"),
    [
        ({"cursor": "!!not-base64!!"}, "cursor"),
        ({"cursor": _b64(b"not json")}, "cursor"),
        ({"cursor": _b64(b"[1, 2, 3]")}, "cursor"),
        ({"cursor": _b64(b"null")}, "cursor"),
        ({"cursor": _b64(b'["a", 1]')}, "cursor"),
        ({"limit": "0"}, "limit"),
        ({"limit": "-3"}, "limit"),
        ({"limit": "1001"}, "limit"),
        ({"limit": "ten"}, "limit"),
        ({"start": "2026-11-30T12:00:00", "end": "2026-11-30T11:00:00"}, "start"),
        ({"start": "2026-11-30T11:00:00Z", "end": "2026-11-30T11:00:00Z"}, "start"),
        ({"start": "yesterday"}, "start"),
        ({"end": "2026-13-01"}, "end"),
        ({"site": "paris"}, "site"),
        ({"site": "-1"}, "site"),
    ],
)
def test_bad_ledger_queries_are_refused_with_400_naming_the_parameter(
    orgs: tuple[Org, Org], path: str, query: dict[str, str], field: str
) -> None:
    a, _ = orgs
    response = _client(a.key, raise_errors=False).get(f"{API}/{path}", query)
    assert response.status_code == 400, response.content
    assert field in response.json()


@pytest.mark.parametrize("path", LEDGER_PATHS)
def test_a_site_id_out_of_range_is_a_400_not_a_server_error(orgs: tuple[Org, Org], path: str) -> None:
    a, _ = orgs
    response = _client(a.key, raise_errors=False).get(f"{API}/{path}", {"site": "9" * 25})
    body = b"".join(response.streaming_content) if response.streaming else response.content
    assert response.status_code in (400, 200), body[:200]
    if response.status_code == 200:  # or: no such site, nothing in it
        assert response["Content-Type"].startswith("text/csv") or response.json()["results"] == []


# -- the ledger: CSV export ------------------------------------------------------------------------


def test_the_csv_export_streams_every_matching_request_with_a_header(orgs: tuple[Org, Org]) -> None:
    a, b = orgs
    start, end = END - timedelta(hours=4), END - timedelta(hours=1)
    query = {"model": "digits", "start": start.isoformat(), "end": end.isoformat()}
    response = _client(a.key).get(f"{API}/ledger/requests.csv", query)
    assert response.status_code == 200
    assert response["Content-Type"].startswith("text/csv")
    assert response["Content-Disposition"] == 'attachment; filename="ledger-requests.csv"'
    lines = _csv_rows(response)
    assert lines[0] == list(REQUEST_CSV_COLUMNS)
    rows = [dict(zip(lines[0], line, strict=True)) for line in lines[1:]]
    expected = LedgerRequest.objects.filter(
        organization=a.org, model="digits", received_ns__gte=_ns(start), received_ns__lt=_ns(end)
    )
    assert rows and len(rows) == expected.count()
    assert {r["request_id"] for r in rows} == set(expected.values_list("request_id", flat=True))
    assert {r["model"] for r in rows} == {"digits"}
    by_id = {r.request_id: r for r in expected}
    for row in rows:
        record = by_id[row["request_id"]]
        assert row["hash"] == record.hash and int(row["chain_seq"]) == record.seq
        assert float(row["queue_ms"]) == pytest.approx(record.queue_ns / 1e6)
    # The same rows as the paginated API, in the same order, with the same energy.
    api_rows, _ = _all_pages(_client(a.key), "ledger/requests", limit="1000", **query)
    assert [r["request_id"] for r in rows] == [r["request_id"] for r in api_rows]
    assert [float(r["energy_j"]) for r in rows] == [r["energy_j"] for r in api_rows]
    assert all(r["energy_final"] == "True" for r in rows)  # the synthetic ledger's intervals are closed
    # Only the caller's requests.
    theirs = _csv_rows(_client(b.key).get(f"{API}/ledger/requests.csv"))
    assert {line[0] for line in theirs[1:]} == _db_ids("requests", b.org)


def test_the_csv_export_has_no_page_limit_and_ignores_a_cursor(orgs: tuple[Org, Org]) -> None:
    a, _ = orgs
    client = _client(a.key)
    first = client.get(f"{API}/ledger/requests", {"limit": "3"}).json()
    cursor = parse_qs(urlsplit(first["next"]).query)["cursor"][0]
    lines = _csv_rows(client.get(f"{API}/ledger/requests.csv", {"limit": "3", "cursor": cursor}))
    assert len(lines) == 1 + LedgerRequest.objects.filter(organization=a.org).count()
    empty = _csv_rows(client.get(f"{API}/ledger/requests.csv", {"model": "no-such-model"}))
    assert empty == [list(REQUEST_CSV_COLUMNS)]


def test_the_csv_export_gives_the_same_energy_across_its_read_chunks(orgs: tuple[Org, Org]) -> None:
    a, _ = orgs
    flt = LedgerFilter(organization_id=a.org.pk)
    whole = list(requests_for_export(flt, chunk=100_000))
    assert len(whole) > 7 and all(row[11] != "" for row in whole)
    assert list(requests_for_export(flt, chunk=7)) == whole


# -- what each dashboard role may do ------------------------------------------------------------------


def _report_body() -> dict[str, str]:
    today = date.today()
    return {"start": (today - timedelta(days=30)).isoformat(), "end": today.isoformat()}


def _site_body(name: str) -> dict[str, str]:
    return {"name": name, "zone": "FR", "pue": "1.2"}


def test_a_viewer_reads_but_cannot_create_keys_reports_or_sites() -> None:
    carbon.load_shipped_factors()
    org = organization_create(slug="role-viewer")
    client = _session(org, "viewer")
    for path in ("api-keys", "sites", "reports", "ledger/requests", "models"):
        assert client.get(f"{API}/{path}").status_code == 200, path
    keys = ApiKey.objects.count()
    assert client.post(f"{API}/api-keys", {"scopes": ["read"]}, format="json").status_code == 403
    assert ApiKey.objects.count() == keys
    assert client.post(f"{API}/reports", _report_body(), format="json").status_code == 403
    assert client.post(f"{API}/sites", _site_body("viewer-site"), format="json").status_code == 403
    assert not Report.objects.filter(organization=org).exists()
    assert not Site.objects.filter(organization=org).exists()


def test_an_analyst_requests_reports_but_cannot_change_settings() -> None:
    carbon.load_shipped_factors()
    org = organization_create(slug="role-analyst")
    client = _session(org, "analyst")
    report = client.post(f"{API}/reports", _report_body(), format="json")
    assert report.status_code == 202, report.json()
    assert report.json()["requested_by"] == "role-analyst-analyst"
    assert Report.objects.filter(organization=org).count() == 1
    site = client.post(f"{API}/sites", _site_body("analyst-site"), format="json")
    assert site.status_code == 403
    assert "admin" in site.json()["detail"]
    assert client.post(f"{API}/api-keys", {"scopes": ["read"]}, format="json").status_code == 403
    assert not Site.objects.filter(organization=org).exists()


def test_an_admin_requests_reports_and_changes_settings() -> None:
    carbon.load_shipped_factors()
    org = organization_create(slug="role-admin")
    client = _session(org, "admin")
    assert client.post(f"{API}/reports", _report_body(), format="json").status_code == 202
    site = client.post(f"{API}/sites", _site_body("admin-site"), format="json")
    assert site.status_code == 201, site.json()
    assert Site.objects.get(name="admin-site").organization == org
    created = client.post(
        f"{API}/api-keys", {"scopes": ["infer"], "name": "from the dashboard"}, format="json"
    )
    assert created.status_code == 201
    assert ApiKey.objects.get(prefix=created.json()["prefix"]).organization == org
    prefix = created.json()["prefix"]
    assert client.post(f"{API}/api-keys/{prefix}/revoke").json()["revoked_at"] is not None
