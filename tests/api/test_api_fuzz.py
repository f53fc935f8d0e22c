"""Fuzzing the management API's write endpoints: whatever a client sends (JSON of any shape, hostile numbers,
dates at the calendar's edges, NUL characters, random files), the answer is never a 5xx and the next good
request is served. A fixed, small example budget per endpoint keeps the run short."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta, timezone
from typing import Any

import pytest
from django.core.files.uploadedfile import SimpleUploadedFile
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from rest_framework.test import APIClient

from carbon import services as carbon
from tenancy.models import Organization, Site
from tenancy.services import api_key_create
from tests.factories import OrganizationFactory
from tests.support.models import DEMO

pytestmark = pytest.mark.django_db

API = "/api/v1"
BUDGET = settings(
    max_examples=40,
    deadline=None,
    derandomize=True,  # the same examples on every run: a failure here is a failure everywhere
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)

EDGE_TEXT = st.sampled_from(
    [
        "",
        " ",
        "\x00",
        "a\x00b",
        "x" * 5000,
        "\U0001d518\u202e",
        "0001-01-01T00:00:00+05:00",
        "9999-12-31T23:59:59-05:00",
        "0001-01-01",
        "9999-12-31",
        "1969-12-31T23:00:00Z",
        "2025-01-01T00:00:00Z",
        "2025-01-01T00:30:00Z",
        "1e999999999",
        "-1e-999999999",
        "1E+400",
        "NaN",
        "-Infinity",
        "1" * 400,
        "0.0000000000000000000001",
        "FR",
        "supplier_rate",
        "GO",
        "declared",
        "read",
    ]
)
SCALARS = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(2**70), max_value=2**70),
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=40),
    EDGE_TEXT,
)
VALUES = st.recursive(
    SCALARS,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner, max_size=3),
    max_leaves=8,
)


NUMBERS = st.one_of(
    st.decimals(allow_nan=False, allow_infinity=False).map(str),
    st.decimals(min_value=-10, max_value=10, places=3).map(str),
    st.decimals(min_value=0, max_value=10, places=2).map(str),
    st.decimals(min_value=0, max_value=1, places=4).map(str),  # fractions: uncertainties
    st.decimals(min_value=1, max_value=5, places=3).map(str),  # PUE's whole range
    st.floats(min_value=-1e6, max_value=1e6),
    st.integers(min_value=-100, max_value=10_000),
)
ZONES = st.sampled_from([UTC, timezone(timedelta(hours=5)), timezone(timedelta(hours=-5, minutes=-30))])
DATETIMES = st.one_of(
    st.datetimes(min_value=datetime(1, 1, 1), max_value=datetime(9999, 12, 31), timezones=ZONES),
    st.datetimes(min_value=datetime(1960, 1, 1), max_value=datetime(2110, 1, 1), timezones=ZONES),
).map(lambda d: d.isoformat())
DATES = st.dates().map(lambda d: d.isoformat())


def _typed(kind: str) -> st.SearchStrategy[Any]:
    """Values of the field's own type across its whole range, the edges included."""
    return {"number": NUMBERS, "datetime": DATETIMES, "date": DATES, "text": st.text(max_size=30)}.get(
        kind, st.nothing()
    )


def _bodies(valid: dict[str, Any], kinds: dict[str, str] | None = None) -> st.SearchStrategy[Any]:
    """A JSON body: the valid one with one to three fields changed (to a value of the field's type anywhere in
    its range, a hostile value of any type, or absent) and maybe a stray field; or no object at all. Most
    examples get past the serializer with something off, into the services."""
    kinds = kinds or {}

    @st.composite
    def objects(draw: st.DrawFn) -> dict[str, Any]:
        body = dict(valid)
        count = draw(st.sampled_from([1, 1, 1, 2, 3]))  # mostly one field off, so the others let it through
        for name in draw(st.permutations(sorted(valid)))[:count]:
            typed = _typed(kinds.get(name, ""))
            value = draw(st.one_of(typed, typed, typed, typed, VALUES, st.just(_ABSENT)))
            if value is _ABSENT:
                body.pop(name)
            else:
                body[name] = value
        body.update(draw(st.dictionaries(st.text(max_size=8), VALUES, max_size=1)))
        return body

    return st.one_of(objects(), objects(), objects(), VALUES)


_ABSENT = object()


def _raw_json(body: Any) -> bytes:
    return json.dumps(
        body, allow_nan=True
    ).encode()  # NaN and Infinity literals included, as a client may send


class Fixture:
    def __init__(self) -> None:
        carbon.load_shipped_factors()
        self.org: Organization = OrganizationFactory()
        self.client = APIClient(raise_request_exception=False)
        key = api_key_create(organization=self.org, scopes="infer,read,admin").raw_key
        self.client.credentials(HTTP_AUTHORIZATION=f"Bearer {key}")
        self.site: Site = carbon.site_create(name="fuzz-site", zone="FR", organization=self.org)

    def still_serving(self) -> None:
        good = self.client.post(f"{API}/api-keys", {"scopes": ["read"], "name": "after"}, format="json")
        assert good.status_code == 201, good.content[:300]


@pytest.fixture
def api(settings: Any) -> Fixture:
    settings.MODEL_REPOSITORY = DEMO
    return Fixture()


def _json_case(api: Fixture, method: str, path: str, body: Any) -> None:
    response = getattr(api.client, method)(path, _raw_json(body), content_type="application/json")
    assert response.status_code < 500, (path, body, response.content[:500])
    api.still_serving()


INSTRUMENT = {
    "instrument_id": "GO-FUZZ",
    "kind": "GO",
    "zone": "FR",
    "vintage_start": "2025-01-01T00:00:00Z",
    "vintage_end": "2026-01-01T00:00:00Z",
    "mwh": "10",
    "intensity_g_per_kwh": "0",
    "quality_criteria": {"conveys_attributes": True},
    "certificate_ids": "",
    "retirement_evidence": "",
    "notes": "",
}
SITE = {
    "name": "fuzzed",
    "zone": "FR",
    "pue": "1.3",
    "pue_source": "declared",
    "pue_relative_uncertainty": "0.05",
    "electricity": "owned",
}
PUE = {
    "pue": "1.2",
    "source": "measured",
    "valid_from": "2025-02-01T00:00:00Z",
    "relative_uncertainty": "0.05",
    "note": "",
}
REPORT = {"start": "2025-01-01", "end": "2025-02-01", "accept_broken_chain": False}
MIX = {
    "zone": "FR",
    "year": 2025,
    "intensity_g_per_kwh": "60",
    "source": "AIB",
    "licence": "",
    "url": "",
    "relative_uncertainty": "0.1",
}


@BUDGET
@given(body=_bodies({"scopes": ["read"], "name": "fuzz"}))
def test_api_keys_never_answer_5xx(api: Fixture, body: Any) -> None:
    _json_case(api, "post", f"{API}/api-keys", body)


@BUDGET
@given(body=_bodies(SITE, {"name": "text", "pue": "number", "pue_relative_uncertainty": "number"}))
def test_sites_never_answer_5xx(api: Fixture, body: Any) -> None:
    _json_case(api, "post", f"{API}/sites", body)


@BUDGET
@given(
    body=_bodies(
        PUE, {"pue": "number", "valid_from": "datetime", "relative_uncertainty": "number", "note": "text"}
    )
)
def test_pue_records_never_answer_5xx(api: Fixture, body: Any) -> None:
    _json_case(api, "post", f"{API}/sites/{api.site.pk}/pue", body)


@BUDGET
@given(
    body=_bodies(
        INSTRUMENT,
        {
            "instrument_id": "text",
            "vintage_start": "datetime",
            "vintage_end": "datetime",
            "mwh": "number",
            "intensity_g_per_kwh": "number",
        },
    )
)
def test_instruments_never_answer_5xx(api: Fixture, body: Any) -> None:
    _json_case(api, "post", f"{API}/instruments", body)


@BUDGET
@given(body=_bodies(REPORT, {"start": "date", "end": "date"}))
def test_reports_never_answer_5xx(api: Fixture, body: Any) -> None:
    _json_case(api, "post", f"{API}/reports", body)


@BUDGET
@given(
    body=_bodies(MIX, {"year": "number", "intensity_g_per_kwh": "number", "relative_uncertainty": "number"})
)
def test_residual_mixes_never_answer_5xx(api: Fixture, body: Any) -> None:
    _json_case(api, "post", f"{API}/residual-mixes", body)


@BUDGET
@given(
    body=_bodies(
        {"threshold_g_per_kwh": "300", "percentile": 75},
        {"threshold_g_per_kwh": "number", "percentile": "number"},
    )
)
def test_carbon_aware_thresholds_never_answer_5xx(api: Fixture, body: Any) -> None:
    _json_case(api, "put", f"{API}/sites/{api.site.pk}/carbon-aware", body)


CSV_CELLS = st.one_of(
    EDGE_TEXT, st.text(max_size=12), st.just("FR"), st.just("2025-01-15T10:00:00Z"), st.just("30")
)
CSV_FILES = st.one_of(
    st.binary(max_size=400),
    st.lists(st.lists(CSV_CELLS, min_size=1, max_size=5), max_size=6).map(
        lambda rows: ("zone,datetime,g_co2e_per_kwh\n" + "\n".join(",".join(r) for r in rows)).encode(
            "utf-8", "surrogatepass"
        )
    ),
)
FORM_TEXT = st.one_of(
    st.just(""),
    EDGE_TEXT.filter(lambda t: "\x00" not in t),
    st.text(max_size=30).filter(lambda t: "\x00" not in t),
)


@BUDGET
@given(
    data=CSV_FILES, source=FORM_TEXT, url=FORM_TEXT, allow_new=st.sampled_from(["true", "false", "maybe", ""])
)
def test_factor_imports_never_answer_5xx(
    api: Fixture, data: bytes, source: str, url: str, allow_new: str
) -> None:
    body = {
        "file": SimpleUploadedFile("fuzz.csv", data, content_type="text/csv"),
        "source": source,
        "url": url,
        "allow_new_zones": allow_new,
    }
    response = api.client.post(f"{API}/factor-imports", body, format="multipart")
    assert response.status_code < 500, (data[:200], response.content[:500])
    api.still_serving()


def _job_line(doc: Any) -> bytes:
    return _raw_json(doc) + b"\n"


JOB_FILES = st.one_of(
    st.binary(max_size=400),
    st.lists(VALUES.map(_job_line), max_size=3).map(b"".join),
    st.lists(
        st.fixed_dictionaries(
            {
                "inputs": st.lists(
                    st.fixed_dictionaries(
                        {"name": st.just("x"), "shape": VALUES, "datatype": VALUES, "data": VALUES}
                    ),
                    max_size=2,
                )
            }
        ).map(_job_line),
        min_size=1,
        max_size=2,
    ).map(b"".join),
)


@BUDGET
@given(
    data=JOB_FILES,
    model=st.one_of(st.just("linear"), FORM_TEXT),
    version=st.one_of(st.just(""), FORM_TEXT),
    deadline=st.one_of(st.just((datetime.now(UTC) + timedelta(hours=2)).isoformat()), DATETIMES, FORM_TEXT),
)
def test_jobs_never_answer_5xx(api: Fixture, data: bytes, model: str, version: str, deadline: str) -> None:
    body = {
        "file": SimpleUploadedFile("job.jsonl", data),
        "model": model,
        "version": version,
        "deadline": deadline,
    }
    response = api.client.post(f"{API}/jobs", body, format="multipart")
    assert response.status_code < 500, (data[:200], model, deadline, response.content[:500])
    api.still_serving()
