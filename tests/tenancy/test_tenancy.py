"""Tenant isolation: every URL pattern of the project walked with a second organization's credentials.

Organization A holds data of every kind (a synthetic ledger and its rollups, sites, devices, an instrument,
a residual mix and a private factor import of its own, a generated report with its files, an API key and a
dashboard user). Organization B holds its own ledger, an API key and an admin dashboard user. The walker
derives the routes from ``django.urls.get_resolver()`` (only Django's admin site is skipped), fills every
path parameter with one of A's identifiers, and sends GET and every write method the view accepts, as B's
API key, as B's signed-in admin and with no credentials. A route the walker cannot fill fails the test."""

from __future__ import annotations

import io
import itertools
import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from datetime import UTC, date, datetime, timedelta
from decimal import Decimal
from pathlib import Path
from typing import Any

import pypdf
import pytest
from django.core.files.uploadedfile import SimpleUploadedFile
from django.http import HttpResponseBase
from django.urls import URLPattern, URLResolver, get_resolver, reverse
from django.urls.resolvers import RoutePattern
from rest_framework.test import APIClient

from carbon import services as carbon
from carbon.models import ContractualInstrument, FactorImport, PueRecord, ResidualMix
from carbon.rollups import rollups_update
from demo.synthetic_ledger import generate_ledger
from jobs import services as jobs_services
from jobs.models import Job
from ledger.models import LedgerRequest
from reports.models import Report, ReportFile, ReportingProfile
from reports.services import report_generate, report_request
from tenancy.models import ApiKey, Device, Organization, Site
from tenancy.services import ServiceError, api_key_create, organization_create, user_create

# Not transactional: the on-commit hooks (Celery recomputes, report generation) never fire.
pytestmark = pytest.mark.django_db

PASSWORD = "a-long-test-password-42"
A_SLUG, B_SLUG = "alpha-tenant", "bravo-tenant"
# Django's admin site (staff only, no tenant data through the product) and the static assets.
SKIPPED_PREFIXES = ("admin/", "static/")
# Pages outside /api/v1/ and /dashboard/ that anyone may open: the home page, the account pages and the API's
# documentation (schema and Swagger UI page, which describe the API and hold no organization's data).
ACCOUNT_PAGES = frozenset(
    {
        "home",
        "login",
        "logout",
        "password_change",
        "password_change_done",
        "password_reset",
        "password_reset_done",
        "password_reset_confirm",
        "password_reset_complete",
    }
)
DOC_PAGES = frozenset({"api-schema", "api-docs"})
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


# -- the two organizations ---------------------------------------------------------------------------


@dataclass
class Tenant:
    org: Organization
    key: str  # raw API key, scopes read,admin
    key_prefix: str
    username: str
    chain_id: str
    ledger_prefix: str  # "s<hex>." starts every request, batch and interval id of its synthetic ledger
    request_ids: list[str]
    site_ids: list[int]
    device_ids: list[str]
    identifiers: list[str] = field(default_factory=list)  # strings no other organization may ever see


@dataclass
class World:
    a: Tenant
    b: Tenant
    start: datetime  # the synthetic ledgers' window
    end: datetime
    a_report_id: int
    a_import_id: int
    a_lab_site_id: int
    a_lab_device_id: str
    a_instrument_id: str
    a_private_source: str
    a_job_id: int


DEMO_REPOSITORY = Path(__file__).resolve().parents[2] / "inference" / "demo_repository"
JOB_LINE = (
    b'{"inputs": [{"name": "x", "shape": [1, 256], "datatype": "FP32", "data": ['
    + b",".join([b"0.5"] * 256)
    + b"]}]}\n"
)


def _tenant(slug: str, name: str, *, requests: int, end: datetime, seed: int) -> Tenant:
    org = organization_create(slug=slug, name=name)
    made = generate_ledger(organization=org, requests=requests, days=1, end=end, seed=seed)
    ledger_prefix = f"s{made.chain_id[-6:]}."
    ids = list(
        LedgerRequest.objects.filter(organization=org)
        .order_by("received_ns")
        .values_list("request_id", flat=True)
    )
    assert ids and all(i.startswith(ledger_prefix) for i in ids)
    key = api_key_create(organization=org, scopes="read,admin", name=f"{slug}-key-name")
    username = f"{slug}-admin-user"
    user_create(organization=org, username=username, password=PASSWORD, role="admin")
    sites = list(Site.objects.filter(organization=org).order_by("pk"))
    return Tenant(
        org=org,
        key=key.raw_key,
        key_prefix=key.api_key.prefix,
        username=username,
        chain_id=made.chain_id,
        ledger_prefix=ledger_prefix,
        request_ids=ids,
        site_ids=[s.pk for s in sites],
        device_ids=list(Device.objects.filter(site__in=sites).values_list("device_id", flat=True)),
    )


def _private_factors(start: datetime, hours: int) -> bytes:
    lines = ["zone,datetime,g_co2e_per_kwh"]
    for h in range(hours):
        lines.append(f"FR,{(start + timedelta(hours=h)).strftime('%Y-%m-%dT%H:%M:%SZ')},77.7")
    return ("\n".join(lines) + "\n").encode()


@pytest.fixture
def world(settings: Any) -> World:
    settings.MODEL_REPOSITORY = DEMO_REPOSITORY  # jobs name a model of the repository
    carbon.load_shipped_factors()
    end = datetime.now(UTC).replace(minute=0, second=0, microsecond=0)
    start = end - timedelta(days=1)
    a = _tenant(A_SLUG, "Alpha Tenant Holdings", requests=300, end=end, seed=7)
    b = _tenant(B_SLUG, "Bravo Tenant Limited", requests=150, end=end, seed=11)
    assert a.ledger_prefix != b.ledger_prefix
    org = a.org
    ReportingProfile.objects.create(
        organization=org, responsible_person="Alphonse Responsible", description="Alpha serves models."
    )
    lab = carbon.site_create(name=f"{A_SLUG}-lab", zone="DE", pue="1.25", organization=org)
    lab_device = Device.objects.create(
        device_id=f"{A_SLUG}-lab-gpu",
        kind="gpu",
        name="alpha lab accelerator",
        method="nvml-counter",
        measured=True,
        relative_uncertainty=0.05,
        site=lab,
        embodied_kg_co2e=Decimal("150"),
        lifetime_years=Decimal("4"),
    )
    a.site_ids.append(lab.pk)
    a.device_ids.append(lab_device.device_id)
    instrument = carbon.instrument_create(
        organization=org,
        instrument_id="GO-ALPHA-7781",
        kind="GO",
        zone="FR",
        vintage_start=start - timedelta(days=1),
        vintage_end=end + timedelta(days=1),
        mwh="1",
        certificate_ids="ALPHACERT-0001..0010",
        retirement_evidence="alpha registry statement 4242",
        quality_criteria=dict(ALL_CRITERIA),
        created_by="alpha setup",
    )
    carbon.residual_mix_create(
        zone="FR",
        year=start.year,
        intensity_g_per_kwh="55.5",
        source="Alpha Residual Publisher",
        organization=org,
    )
    private_source = "Alpha Private Meter Source 9917"
    imported = carbon.factor_import_csv(
        data=_private_factors(start - timedelta(hours=1), 27),
        name="alpha-private-factors.csv",
        organization=org,
        created_by="alpha importer",
        source=private_source,
        licence="alpha internal licence",
    )
    assert imported.status == FactorImport.Status.ACCEPTED, imported.errors
    rollups_update()
    report = report_request(
        organization=org,
        start=start.date() - timedelta(days=1),
        end=end.date() + timedelta(days=1),
        requested_by="alpha requester",
    )
    done = report_generate(report.pk)
    assert done is not None and done.status == Report.Status.DONE, done and done.failure_reason
    assert set(done.files.values_list("format", flat=True)) == set(ReportFile.FORMATS)
    hashes = list(LedgerRequest.objects.filter(organization=org).values_list("hash", flat=True)[:3])
    job = jobs_services.job_submit(
        organization=org,
        data=JOB_LINE,
        model="linear",
        deadline=datetime.now(UTC) + timedelta(hours=2),
        input_name="alpha-secret-job.jsonl",
        submitted_by="alpha job submitter",
    )
    a.identifiers = [
        A_SLUG,
        "Alpha Tenant Holdings",
        "Alphonse Responsible",
        a.chain_id,
        a.ledger_prefix,
        a.request_ids[0],
        a.request_ids[-1],
        *hashes,
        *Site.objects.filter(pk__in=a.site_ids).values_list("name", flat=True),
        *a.device_ids,
        instrument.instrument_id,
        "ALPHACERT-0001",
        "alpha registry statement",
        "Alpha Residual Publisher",
        "alpha-private-factors.csv",
        private_source,
        "alpha internal licence",
        a.key_prefix,
        f"{A_SLUG}-key-name",
        a.username,
        f"/api/v1/reports/{done.pk}/",
        done.inputs_sha256,
        "alpha-secret-job.jsonl",
        "alpha job submitter",
        f"/api/v1/jobs/{job.pk}/",
    ]
    return World(
        a=a,
        b=b,
        start=start,
        end=end,
        a_report_id=done.pk,
        a_import_id=imported.pk,
        a_lab_site_id=lab.pk,
        a_lab_device_id=lab_device.device_id,
        a_instrument_id=instrument.instrument_id,
        a_private_source=private_source,
        a_job_id=job.pk,
    )


def _key_client(tenant: Tenant) -> APIClient:
    client = APIClient(raise_request_exception=False)
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {tenant.key}")
    return client


def _session_client(tenant: Tenant) -> APIClient:
    client = APIClient(raise_request_exception=False)
    assert client.login(username=tenant.username, password=PASSWORD)
    return client


def _anonymous_client() -> APIClient:
    return APIClient(raise_request_exception=False)


# -- the routes ----------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Route:
    route: str
    name: str
    area: str  # api, dashboard, account, docs
    params: tuple[str, ...]
    methods: (
        frozenset[str] | None
    )  # what the view accepts (DRF and class-based views); None: a plain function

    @property
    def writes(self) -> list[str]:
        if self.area in ("account", "docs"):
            return []  # account pages act on the signed-in user only (and POST /accounts/logout/ would end
            # the walk); the documentation is read-only
        if self.methods is None:
            return ["POST"]
        return sorted(self.methods & {"POST", "PUT", "PATCH", "DELETE"})


def project_routes(
    patterns: Iterable[URLPattern | URLResolver] | None = None, prefix: str = ""
) -> list[Route]:
    """Every URL pattern of the project, depth first; fails on a pattern the walker cannot classify."""
    found: list[Route] = []
    for entry in get_resolver().url_patterns if patterns is None else patterns:
        route = prefix + str(entry.pattern)
        if route.startswith(SKIPPED_PREFIXES):
            continue
        assert isinstance(entry.pattern, RoutePattern), f"{route!r} is a regex pattern: teach the walker"
        if isinstance(entry, URLResolver):
            found += project_routes(entry.url_patterns, route)
            continue
        assert entry.name, f"the route {route!r} has no name: the walker maps parameters by route name"
        if route.startswith("api/v1/"):
            area = "api"
        elif entry.name in DOC_PAGES:
            area = "docs"
        elif route.startswith("dashboard/"):
            area = "dashboard"
        elif entry.name in ACCOUNT_PAGES:
            area = "account"
        else:
            raise AssertionError(
                f"new route {route!r} ({entry.name}) outside /api/v1/ and /dashboard/: classify it"
            )
        callback: Any = entry.callback
        methods: frozenset[str] | None = None
        if getattr(callback, "cls", None) is not None:  # a DRF view
            methods = frozenset(m.upper() for m in callback.cls.http_method_names) - {"OPTIONS"}
        elif getattr(callback, "view_class", None) is not None:  # a Django class-based view
            view_class = callback.view_class
            methods = frozenset(m.upper() for m in view_class.http_method_names if hasattr(view_class, m))
            methods -= {"OPTIONS"}
        found.append(Route(route, entry.name, area, tuple(entry.pattern.converters), methods))
    return found


def _a_params(world: World) -> dict[str, list[dict[str, Any]]]:
    """Path parameters of A's objects, per route name."""
    report = {"pk": world.a_report_id}
    return {
        "api-ledger-request": [
            {"request_id": rid} for rid in (world.a.request_ids[0], world.a.request_ids[-1])
        ],
        "api-key-revoke": [{"prefix": world.a.key_prefix}],
        "api-factor-import": [{"pk": world.a_import_id}],
        "api-site-pue": [{"pk": pk} for pk in world.a.site_ids],
        "api-site-carbon-aware": [{"pk": pk} for pk in world.a.site_ids],
        "api-device": [{"device_id": d} for d in world.a.device_ids],
        "api-report": [report],
        "api-report-retry": [report],
        "api-report-recalculate": [report],
        "api-report-file": [{**report, "fmt": fmt} for fmt in ReportFile.FORMATS],
        "api-job": [{"pk": world.a_job_id}],
        "api-job-outputs": [{"pk": world.a_job_id}],
        "api-job-retry": [{"pk": world.a_job_id}],
        "dashboard-job": [{"pk": world.a_job_id}],
        "dashboard-job-retry": [{"pk": world.a_job_id}],
        # A reset link's user and token; a wrong one answers the page saying the link no longer works.
        "password_reset_confirm": [{"uidb64": "MQ", "token": "not-a-token"}],
    }


_serial = itertools.count(1)


def _instrument_body(instrument_id: str) -> dict[str, Any]:
    return {
        "instrument_id": instrument_id,
        "kind": "GO",
        "zone": "FR",
        "vintage_start": "2025-01-01T00:00:00Z",
        "vintage_end": "2026-01-01T00:00:00Z",
        "mwh": "5",
        "quality_criteria": dict(ALL_CRITERIA),
    }


def _write_bodies(world: World, caller: Tenant) -> dict[str, Callable[[], list[tuple[Any, str | None]]]]:
    """Plausible bodies (data, DRF format; None: a form post) per write route. Each call makes new ones
    (names and files must be new: an organization may create what it likes in its own space)."""
    own_site = caller.site_ids[0]
    a_site = world.a.site_ids[0]
    today = date.today()

    def factor_file() -> list[tuple[Any, str | None]]:
        n = next(_serial)
        data = f"zone,datetime,g_co2e_per_kwh\nFR,2024-06-{1 + n % 28:02d}T{n % 24:02d}:00:00Z,{40 + n}\n"
        return [({"file": SimpleUploadedFile(f"walk-{n}.csv", data.encode())}, "multipart")]

    return {
        "api-keys": lambda: [({"scopes": ["read"], "name": f"walk-{next(_serial)}"}, "json")],
        "api-key-revoke": lambda: [({}, "json")],
        "api-factor-imports": factor_file,
        "api-residual-mixes": lambda: [
            (
                {"zone": "FR", "year": 2024, "intensity_g_per_kwh": "60", "source": f"walk {next(_serial)}"},
                "json",
            )
        ],
        "api-instruments": lambda: [(_instrument_body(f"GO-WALK-{next(_serial)}"), "json")],
        "api-sites": lambda: [({"name": f"walk-site-{next(_serial)}", "zone": "FR", "pue": "1.2"}, "json")],
        "api-site-pue": lambda: [
            ({"pue": "1.9", "source": "declared", "valid_from": "2025-01-01T00:00:00Z"}, "json")
        ],
        "api-site-carbon-aware": lambda: [
            ({"threshold_g_per_kwh": "1"}, "json"),
            ({"percentile": 5}, "json"),
        ],
        "api-devices": lambda: [({}, "json")],
        "api-device": lambda: [
            ({"site": own_site, "embodied_kg_co2e": "999", "lifetime_years": "1"}, "json"),
            ({"site": a_site}, "json"),
        ],
        "api-reports": lambda: [
            ({"start": (today - timedelta(days=3)).isoformat(), "end": today.isoformat()}, "json")
        ],
        "api-report-retry": lambda: [({}, "json")],
        "api-report-recalculate": lambda: [({"reason": "walked by another organization"}, "json")],
        "api-jobs": lambda: [
            (
                {
                    "file": SimpleUploadedFile(f"walk-{next(_serial)}.jsonl", JOB_LINE),
                    "model": "linear",
                    "deadline": (datetime.now(UTC) + timedelta(hours=2)).isoformat(),
                },
                "multipart",
            )
        ],
        "api-job-retry": lambda: [({}, "json")],
        "dashboard-reports": lambda: [
            ({"start": (today - timedelta(days=5)).isoformat(), "end": today.isoformat()}, None)
        ],
        "dashboard-jobs": lambda: [
            (
                {
                    "file": SimpleUploadedFile(f"walk-{next(_serial)}.jsonl", JOB_LINE),
                    "model": "linear",
                    "deadline": (datetime.now(UTC) + timedelta(hours=2)).strftime("%Y-%m-%d %H:%M"),
                },
                None,
            )
        ],
        "dashboard-settings": lambda: [
            ({"action": "revoke", "prefix": world.a.key_prefix}, None),
            (
                {
                    "action": "device",
                    "device_id": world.a_lab_device_id,
                    "site": str(own_site),
                    "embodied_kg_co2e": "999",
                    "lifetime_years": "1",
                },
                None,
            ),
            ({"action": "device", "device_id": world.a.device_ids[0], "site": str(a_site)}, None),
        ],
    }


def _queries(world: World, route: Route) -> list[dict[str, str]]:
    """Query strings for a list or aggregate route: none, the ledgers' window (so B's own pages are full),
    and A's sites as filters."""
    if route.params or route.area in ("account", "docs"):
        return [{}]
    if route.area == "dashboard":
        return [{}, {"partial": "1"}]
    window = {"start": world.start.isoformat(), "end": (world.end + timedelta(hours=1)).isoformat()}
    return [
        {},
        {**window, "limit": "1000"},
        *({**window, "site": str(pk), "limit": "1000"} for pk in world.a.site_ids),
        {"model": "digits", "zone": "FR", "step": "hour", **window},
    ]


# -- the walk ------------------------------------------------------------------------------------------


@dataclass
class Hit:
    route: Route
    method: str
    url: str
    status: int
    body: bytes
    location: str
    content_type: str

    def __str__(self) -> str:
        return f"{self.method} {self.url} ({self.route.name}) -> {self.status}"


def _body(response: HttpResponseBase) -> bytes:
    if response.streaming:
        return b"".join(response.streaming_content)  # type: ignore[attr-defined]
    return bytes(response.content)  # type: ignore[attr-defined]


def _hit(route: Route, method: str, url: str, response: HttpResponseBase) -> Hit:
    return Hit(
        route,
        method,
        url,
        response.status_code,
        _body(response),
        response.get("Location", ""),
        response.get("Content-Type", ""),
    )


def walk(
    client: APIClient, world: World, caller: Tenant | None, *, only: set[str] | None = None
) -> list[Hit]:
    """GET every route (and each write method a view accepts, with a plausible body) with A's identifiers
    in the path. Problems a walker cannot fill raise at once."""
    params = _a_params(world)
    bodies = _write_bodies(world, caller or world.b)
    hits: list[Hit] = []
    for route in project_routes():
        if only is not None and route.name not in only:
            continue
        if route.params:
            assert route.name in params, f"cannot fill {route.route!r} ({route.name}): teach the walker"
            fillings = params[route.name]
            for kwargs in fillings:
                assert set(kwargs) == set(route.params), f"{route.name}: parameters {route.params} changed"
        else:
            fillings = [{}]
        for kwargs in fillings:
            url = reverse(route.name, kwargs=kwargs)
            for query in _queries(world, route):
                hits.append(_hit(route, "GET", url, client.get(url, query)))
            for method in route.writes:
                if route.name in bodies:
                    made = bodies[route.name]()
                elif route.area == "dashboard":
                    made = [({}, None)]  # a page that takes no form
                else:
                    raise AssertionError(
                        f"no body for {method} {route.route!r} ({route.name}): teach the walker"
                    )
                for data, fmt in made:
                    send = getattr(client, method.lower())
                    response = send(url, data, format=fmt) if fmt else send(url, data)
                    hits.append(_hit(route, method, url, response))
                    if response.status_code in (301, 302) and hits[-1].location.startswith("/dashboard"):
                        follow = hits[-1].location
                        hits.append(_hit(route, "GET", follow, client.get(follow)))
    return hits


def _pdf_text(content: bytes) -> str:
    pages = pypdf.PdfReader(io.BytesIO(content)).pages
    return re.sub(r"\s+", "", "".join(page.extract_text() for page in pages))


def leaks(hit: Hit, identifiers: Iterable[str]) -> list[str]:
    """A's identifying strings found in a response body (PDFs by their extracted text)."""
    if hit.content_type.startswith("application/pdf"):
        text = _pdf_text(hit.body)
        return [s for s in identifiers if re.sub(r"\s+", "", s) in text]
    return [s for s in identifiers if s.encode() in hit.body]


def _fingerprint(world: World) -> dict[str, Any]:
    """What B's writes must leave unchanged in A."""
    org = world.a.org
    return {
        "keys": sorted(ApiKey.objects.filter(organization=org).values_list("prefix", "revoked_at")),
        "devices": sorted(
            Device.objects.filter(device_id__in=world.a.device_ids).values_list(
                "device_id", "site_id", "embodied_kg_co2e", "lifetime_years"
            )
        ),
        "sites": sorted(
            Site.objects.filter(organization=org).values_list(
                "pk", "name", "pue", "carbon_threshold_g_per_kwh", "carbon_threshold_percentile"
            )
        ),
        "pue_records": sorted(
            PueRecord.objects.filter(site_id__in=world.a.site_ids).values_list("pk", flat=True)
        ),
        "reports": sorted(Report.objects.filter(organization=org).values_list("pk", "status", "replaces_id")),
        "instruments": ContractualInstrument.objects.filter(organization=org).count(),
        "mixes": ResidualMix.objects.filter(organization=org).count(),
        "imports": FactorImport.objects.filter(organization=org).count(),
        "requests": LedgerRequest.objects.filter(organization=org).count(),
        "jobs": sorted(
            Job.objects.filter(organization=org).values_list("pk", "status", "planned_start", "attempts")
        ),
    }


def _check_foreign_walk(hits: list[Hit], world: World, principal: str) -> list[str]:
    """B's view of the project: no 5xx, no 2xx on A's objects, nothing of A's in any 2xx body."""
    problems: list[str] = []
    for hit in hits:
        route = hit.route
        if hit.status >= 500:
            problems.append(f"{hit}: server error")
            continue
        login_redirect = hit.status == 302 and hit.location.startswith("/accounts/login/")
        # An API key is no dashboard session: every dashboard URL sends it to the login page (checked below).
        keyed_dashboard = route.area == "dashboard" and principal == "api-key"
        # The parameters of an account page (a password reset link's user and token) name no organization's
        # object: a wrong link answers the page saying so; what the body must not hold is checked below.
        foreign_object = route.params and not keyed_dashboard and route.area != "account"
        if foreign_object and 200 <= hit.status < 300:
            problems.append(f"{hit}: another organization's object answered")
        if foreign_object and hit.status not in (403, 404, 405):
            problems.append(f"{hit}: expected 404 (or 403/405) for another organization's object")
        if route.area == "api" and not route.params:
            # A write either succeeds in B's own space or is not offered on the list (PATCH /devices).
            expected = {"GET": {200}}.get(hit.method, {200, 201, 202, 405})
            if hit.status not in expected:
                problems.append(f"{hit}: B's own list or write should succeed: {hit.body[:300]!r}")
        if route.area == "dashboard" and hit.url.startswith("/dashboard"):
            if principal == "session" and not route.params and hit.status not in (200, 302):
                problems.append(f"{hit}: B's admin should see its own dashboard")
            if principal == "api-key" and not login_redirect:
                problems.append(f"{hit}: an API key is no dashboard session; expected a redirect to login")
        if 200 <= hit.status < 300:
            found = leaks(hit, world.a.identifiers)
            if found:
                problems.append(f"{hit}: A's data in the body: {found}")
    return problems


# -- the tests -----------------------------------------------------------------------------------------


def test_the_walker_finds_and_can_fill_every_url_pattern_of_the_project() -> None:
    routes = project_routes()
    names = {r.name for r in routes}
    # A sample of what must be there (the list itself is derived, not written down).
    assert {
        "api-ledger-requests-csv",
        "api-report-file",
        "api-key-revoke",
        "dashboard-settings",
        "home",
    } <= names
    assert len(names) == len(routes), "two routes share a name"
    assert not any(r.route.startswith("admin/") for r in routes)
    fillable = {
        "api-ledger-request",
        "api-key-revoke",
        "api-factor-import",
        "api-site-pue",
        "api-site-carbon-aware",
        "api-device",
        "api-report",
        "api-report-retry",
        "api-report-recalculate",
        "api-report-file",
        "api-job",
        "api-job-outputs",
        "api-job-retry",
        "dashboard-job",
        "dashboard-job-retry",
        "password_reset_confirm",
    }
    unfillable = [r.route for r in routes if r.params and r.name not in fillable]
    assert unfillable == [], f"new parameterised routes the walker cannot fill: {unfillable}"
    with_bodies = {
        "api-keys",
        "api-key-revoke",
        "api-factor-imports",
        "api-residual-mixes",
        "api-instruments",
        "api-sites",
        "api-site-pue",
        "api-site-carbon-aware",
        "api-devices",
        "api-device",
        "api-reports",
        "api-report-retry",
        "api-report-recalculate",
        "api-jobs",
        "api-job-retry",
    }
    no_body = [
        f"{m} {r.route}" for r in routes if r.area == "api" for m in r.writes if r.name not in with_bodies
    ]
    assert no_body == [], f"write routes the walker has no body for: {no_body}"
    # A view's methods are read from the view: the device route takes PATCH, revoke only POST.
    by_name = {r.name: r for r in routes}
    assert by_name["api-device"].writes == ["PATCH"]
    assert by_name["api-key-revoke"].methods == frozenset({"POST"})
    assert by_name["api-ledger-requests-csv"].writes == []


@pytest.mark.parametrize("principal", ["api-key", "session"])
def test_a_second_organization_sees_and_changes_nothing_of_the_first_on_any_route(
    world: World, principal: str
) -> None:
    before = _fingerprint(world)
    client = _key_client(world.b) if principal == "api-key" else _session_client(world.b)
    hits = walk(client, world, world.b)
    problems = _check_foreign_walk(hits, world, principal)
    assert problems == [], "\n".join(problems)
    assert _fingerprint(world) == before
    # The walk reached every route, B's own data is in its pages, and the foreign objects were refused.
    assert {h.route.name for h in hits} == {r.name for r in project_routes()}
    requests = next(h for h in hits if h.route.name == "api-ledger-requests" and h.status == 200)
    assert world.b.ledger_prefix.encode() in requests.body
    refused = [
        h
        for h in hits
        if h.route.params
        and h.route.area != "account"  # a reset link names no organization's object
        and not (h.route.area == "dashboard" and principal == "api-key")
    ]
    assert refused and all(h.status in (403, 404, 405) for h in refused)
    assert any(h.status == 404 for h in refused if h.route.name == "api-report-file")
    if principal == "session":
        keys_page = next(h for h in hits if h.url == "/dashboard/settings/keys" and h.method == "GET")
        assert world.b.key_prefix.encode() in keys_page.body


def test_the_first_organization_sees_its_own_data_through_the_same_walker(world: World) -> None:
    """The walker and the leak check can fail: with A's own credentials the same URLs answer with A's data."""
    hits = walk(
        _key_client(world.a),
        world,
        world.a,
        only=(set(_a_params(world)) - {"api-key-revoke"}) | {"api-sites", "api-carbon"},
    )
    gets = [h for h in hits if h.method == "GET" and h.route.methods is not None and "GET" in h.route.methods]
    assert gets and all(h.status == 200 for h in gets), [str(h) for h in gets if h.status != 200]
    detail = next(h for h in gets if h.route.name == "api-ledger-request")
    assert world.a.request_ids[0].encode() in detail.body
    pdf = next(h for h in gets if h.route.name == "api-report-file" and h.url.endswith("/pdf"))
    assert pdf.body.startswith(b"%PDF") and A_SLUG in leaks(pdf, world.a.identifiers)
    sites = next(h for h in gets if h.route.name == "api-sites")
    assert f"{A_SLUG}-lab" in leaks(sites, world.a.identifiers)
    carbon_hits = [h for h in gets if h.route.name == "api-carbon"]
    assert any(world.a_instrument_id in leaks(h, world.a.identifiers) for h in carbon_hits)
    assert any(world.a_private_source in leaks(h, world.a.identifiers) for h in carbon_hits)
    # Its own writes are accepted: a PUE record on its site, a device moved to another of its sites.
    pue = next(h for h in hits if h.route.name == "api-site-pue" and h.method == "POST")
    assert pue.status == 201
    assert any(h.status == 200 for h in hits if h.route.name == "api-device" and h.method == "PATCH")
    recalculated = next(h for h in hits if h.route.name == "api-report-recalculate" and h.method == "POST")
    assert recalculated.status == 202
    # And the dashboard shows an admin of A its keys, instruments and private import.
    admin = _session_client(world.a)
    for section, text in (
        ("keys", world.a.key_prefix),
        ("instruments", world.a_instrument_id),
        ("imports", "alpha-private-factors.csv"),
    ):
        settings_page = admin.get(f"/dashboard/settings/{section}")
        assert settings_page.status_code == 200
        assert text.encode() in settings_page.content


def test_without_credentials_every_api_route_refuses_and_every_dashboard_page_redirects_to_login(
    world: World,
) -> None:
    before = _fingerprint(world)
    hits = walk(_anonymous_client(), world, None)
    problems = []
    for hit in hits:
        if hit.status >= 500:
            problems.append(f"{hit}: server error")
        elif hit.route.area == "api" and hit.status not in (401, 403):
            problems.append(f"{hit}: expected 401 or 403 without credentials")
        elif hit.route.area == "dashboard" and not (
            hit.status == 302 and hit.location.startswith("/accounts/login/?next=/dashboard")
        ):
            problems.append(f"{hit}: expected a redirect to the login page")
        if 200 <= hit.status < 300 and leaks(hit, world.a.identifiers):
            problems.append(f"{hit}: A's data in a public page: {leaks(hit, world.a.identifiers)}")
    assert problems == [], "\n".join(problems)
    assert _fingerprint(world) == before
    statuses = {h.route.name: h.status for h in hits if h.method == "GET"}
    assert statuses["api-whoami"] == 401  # nothing under /api/v1/ is public
    assert statuses["home"] == 200 and statuses["login"] == 200
    assert statuses["password_change"] == 302


def test_a_report_names_no_ledger_chain_of_another_organization(world: World) -> None:
    report = report_request(
        organization=world.b.org, start=world.start.date(), end=world.end.date() + timedelta(days=1)
    )
    done = report_generate(report.pk)
    assert done is not None and done.status == Report.Status.DONE, done and done.failure_reason
    client = _key_client(world.b)
    found = {}
    for fmt in ReportFile.FORMATS:
        url = f"/api/v1/reports/{done.pk}/files/{fmt}"
        response = client.get(url)
        assert response.status_code == 200
        route = next(r for r in project_routes() if r.name == "api-report-file")
        found[fmt] = leaks(_hit(route, "GET", url, response), world.a.identifiers)
    assert found == {fmt: [] for fmt in ReportFile.FORMATS}


def test_a_zone_known_only_from_another_organization_s_private_import_is_unknown_to_others() -> None:
    carbon.load_shipped_factors()
    alpha = organization_create(slug=A_SLUG, name="Alpha")
    bravo = organization_create(slug=B_SLUG, name="Bravo")
    private = carbon.factor_import_csv(
        data=b"zone,datetime,g_co2e_per_kwh\nZZ-ALPHA-SECRET,2025-01-15T10:00:00Z,12\n",
        name="alpha-private-zone.csv",
        organization=alpha,
        allow_new_zones=True,
    )
    assert private.status == FactorImport.Status.ACCEPTED
    client = APIClient()
    client.credentials(
        HTTP_AUTHORIZATION=f"Bearer {api_key_create(organization=bravo, scopes='read,admin').raw_key}"
    )
    response = client.post(
        "/api/v1/sites", {"name": "bravo-probe", "zone": "ZZ-ALPHA-SECRET", "pue": "1.2"}, format="json"
    )
    assert response.status_code == 400, "B learnt that some organization imported factors for the zone"


def test_creating_a_site_does_not_reveal_another_organization_s_site_name() -> None:
    carbon.load_shipped_factors()
    alpha = organization_create(slug=A_SLUG, name="Alpha")
    bravo = organization_create(slug=B_SLUG, name="Bravo")
    carbon.site_create(name="alpha-secret-site", zone="FR", organization=alpha)
    client = APIClient()
    client.credentials(
        HTTP_AUTHORIZATION=f"Bearer {api_key_create(organization=bravo, scopes='read,admin').raw_key}"
    )
    clash = client.post(
        "/api/v1/sites", {"name": "alpha-secret-site", "zone": "FR", "pue": "1.2"}, format="json"
    )
    fresh = client.post(
        "/api/v1/sites", {"name": "bravo-fresh-site", "zone": "FR", "pue": "1.2"}, format="json"
    )
    assert fresh.status_code == 201
    # Either the name is B's to take (names per organization) or the refusal is the same as any refusal.
    assert clash.status_code == 201, clash.json()


def test_service_errors_reach_no_other_organization() -> None:
    """Creating the same thing in two organizations is allowed: per-organization checks, not global ones."""
    carbon.load_shipped_factors()
    alpha = organization_create(slug=A_SLUG, name="Alpha")
    bravo = organization_create(slug=B_SLUG, name="Bravo")
    data = b"zone,datetime,g_co2e_per_kwh\nFR,2025-01-15T10:00:00Z,30\n"
    first = carbon.factor_import_csv(data=data, name="alpha-same.csv", organization=alpha)
    assert first.status == FactorImport.Status.ACCEPTED
    client = APIClient()
    client.credentials(
        HTTP_AUTHORIZATION=f"Bearer {api_key_create(organization=bravo, scopes='read,admin').raw_key}"
    )
    upload = client.post(
        "/api/v1/factor-imports",
        {"file": SimpleUploadedFile("bravo-same.csv", data, content_type="text/csv")},
        format="multipart",
    )
    assert upload.status_code == 201, upload.json()  # not "already imported as version N (alpha-same.csv)"
    assert b"alpha" not in upload.content
    body = _instrument_body("GO-SAME-1")
    carbon.instrument_create(
        organization=alpha,
        created_by="alpha",
        **{
            **body,
            "vintage_start": datetime(2025, 1, 1, tzinfo=UTC),
            "vintage_end": datetime(2026, 1, 1, tzinfo=UTC),
        },
    )
    same = client.post("/api/v1/instruments", body, format="json")
    assert same.status_code == 201, same.json()
    with pytest.raises(ServiceError):  # but twice in one organization is refused
        carbon.instrument_create(
            organization=alpha,
            **{
                **body,
                "vintage_start": datetime(2025, 1, 1, tzinfo=UTC),
                "vintage_end": datetime(2026, 1, 1, tzinfo=UTC),
            },
        )
