"""Online intensity providers (carbon.providers) against a local imitation of the
Electricity Maps v3 and WattTime v3 APIs: a real HTTP server on 127.0.0.1 that checks the auth headers and
query parameters the way the real APIs would. No internet, no Django settings, no database."""

from __future__ import annotations

import ast
import base64
import json
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta, timezone
from decimal import Decimal
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

import pytest

from carbon import providers as intensity_providers
from carbon.providers import (
    PROVIDERS,
    ElectricityMapsProvider,
    IntensityProvider,
    ProviderError,
    ProviderReading,
    WattTimeProvider,
    load_provider,
)

EM_TOKEN = "em-secret-token"
WT_USER = "wt-user"
WT_PASSWORD = "wt-pass:word"
WT_TOKEN = "wt-jwt-token"
ZONE = "DE"
REGION = "CAISO_NORTH"
T0 = datetime(2024, 3, 1, 10, tzinfo=UTC)


# --------------------------------------------------------------------------------------------------------
# The imitation server
# --------------------------------------------------------------------------------------------------------


@dataclass
class Seen:
    path: str
    query: dict[str, str]
    headers: dict[str, str]


@dataclass
class FakeApis:
    """Shared state between a test and the server thread: what to answer, and what was asked."""

    base_url: str = ""
    seen: list[Seen] = field(default_factory=list)
    # path -> JSON-able object or raw bytes to answer with after the checks have passed
    bodies: dict[str, Any] = field(default_factory=dict)
    # path -> (status, raw body) answered before any check, to imitate failures
    failures: dict[str, tuple[int, bytes]] = field(default_factory=dict)
    delay_s: float = 0.0
    logins: int = 0
    reject_bearer_once: bool = False

    def requests_to(self, path: str) -> list[Seen]:
        return [s for s in self.seen if s.path == path]


def _answer(status: int, body: object) -> tuple[int, bytes]:
    raw = body if isinstance(body, bytes) else json.dumps(body).encode()
    return status, raw


def _route(api: FakeApis, path: str, query: dict[str, str], headers: dict[str, str]) -> tuple[int, bytes]:
    if path in api.failures:
        return api.failures[path]
    if path.startswith("/v3/carbon-intensity/"):
        if headers.get("auth-token") != EM_TOKEN:
            return _answer(401, {"message": "Invalid auth-token"})
        if query.get("emissionFactorType") not in ("lifecycle", "direct") or not query.get("zone"):
            return _answer(400, {"message": "bad query"})
        if path.endswith("/past-range"):
            for name in ("start", "end"):
                datetime.fromisoformat(query[name])  # a KeyError/ValueError here is a 500: the test fails
    elif path == "/login":
        expected = "Basic " + base64.b64encode(f"{WT_USER}:{WT_PASSWORD}".encode()).decode()
        if headers.get("authorization") != expected:
            return _answer(401, {"error": "unauthorized"})
        api.logins += 1
        return _answer(200, {"token": WT_TOKEN})
    elif path in ("/v3/historical", "/v3/forecast"):
        if headers.get("authorization") != f"Bearer {WT_TOKEN}":
            return _answer(401, {"error": "invalid token"})
        if api.reject_bearer_once:
            api.reject_bearer_once = False
            return _answer(401, {"error": "token expired"})
        assert "moer" not in query.get("signal_type", "moer")
        if not query.get("region"):
            return _answer(400, {"error": "region required"})
        if path == "/v3/historical":
            for name in ("start", "end"):
                datetime.fromisoformat(query[name])
    else:
        return _answer(404, {"message": "no such endpoint"})
    if path not in api.bodies:
        return _answer(500, {"message": f"test did not set a body for {path}"})
    return _answer(200, api.bodies[path])


@pytest.fixture
def apis(monkeypatch: pytest.MonkeyPatch) -> Iterator[FakeApis]:
    # Loopback traffic must never be sent to a proxy configured in the environment.
    monkeypatch.setenv("NO_PROXY", "127.0.0.1,localhost")
    monkeypatch.setenv("no_proxy", "127.0.0.1,localhost")
    api = FakeApis()

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            parts = urlsplit(self.path)
            query = {k: v[-1] for k, v in parse_qs(parts.query).items()}
            headers = {
                name.lower(): value for name, value in self.headers.items()
            }  # names are case-insensitive
            api.seen.append(Seen(parts.path, query, headers))
            if api.delay_s:
                time.sleep(api.delay_s)
            try:
                status, body = _route(api, parts.path, query, headers)
            except (KeyError, ValueError) as exc:
                status, body = _answer(500, {"message": f"fake server: {exc!r}"})
            try:
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)
            except (BrokenPipeError, ConnectionResetError):
                pass  # the client gave up (time-out test)

        def log_message(self, format: str, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.daemon_threads = True
    # A short poll interval so that shutdown() at teardown returns at once rather than after 0.5 s.
    thread = threading.Thread(
        target=server.serve_forever, kwargs={"poll_interval": 0.02}, name="fake-intensity-apis", daemon=True
    )
    thread.start()
    api.base_url = f"http://127.0.0.1:{server.server_address[1]}"
    try:
        yield api
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=5)


def em(api: FakeApis, **kwargs: Any) -> ElectricityMapsProvider:
    return ElectricityMapsProvider(EM_TOKEN, base_url=api.base_url, **kwargs)


def wt(api: FakeApis, **kwargs: Any) -> WattTimeProvider:
    return WattTimeProvider(WT_USER, WT_PASSWORD, base_url=api.base_url, **kwargs)


def wt_points(start: datetime, values: list[object], step_s: int = 300) -> list[dict[str, object]]:
    return [
        {"point_time": (start + timedelta(seconds=i * step_s)).isoformat(), "value": v, "version": "1.0"}
        for i, v in enumerate(values)
    ]


def wt_body(data: list[dict[str, object]], **meta: object) -> dict[str, object]:
    base_meta: dict[str, object] = {
        "region": REGION,
        "signal_type": "co2_aoer",
        "units": "lbs_co2_per_mwh",
        "data_point_period_seconds": 300,
        "warnings": [],
    }
    base_meta.update(meta)
    return {"data": data, "meta": base_meta}


# --------------------------------------------------------------------------------------------------------
# Electricity Maps
# --------------------------------------------------------------------------------------------------------

# Raw JSON text: the long literal has more digits than a binary float can hold, so only parsing the text
# itself (not float -> str) keeps it exact.
EM_PAST_RANGE = b"""{
  "zone": "DE",
  "data": [
    {"zone": "DE", "carbonIntensity": 322.57, "datetime": "2024-03-01T10:00:00.000Z",
     "updatedAt": "2024-03-02T00:00:00.000Z", "createdAt": "2024-03-01T09:00:00.000Z",
     "emissionFactorType": "lifecycle", "isEstimated": false, "estimationMethod": null},
    {"zone": "DE", "carbonIntensity": 301.123456789012345678901, "datetime": "2024-03-01T11:00:00.000Z",
     "emissionFactorType": "lifecycle", "isEstimated": true, "estimationMethod": "TIME_SLICER_AVERAGE"},
    {"zone": "DE", "carbonIntensity": 290, "datetime": "2024-03-01T13:00:00+01:00",
     "emissionFactorType": "lifecycle", "isEstimated": false, "estimationMethod": null},
    {"zone": "DE", "carbonIntensity": null, "datetime": "2024-03-01T13:00:00.000Z",
     "emissionFactorType": "lifecycle", "isEstimated": false, "estimationMethod": null},
    {"zone": "DE", "carbonIntensity": 999, "datetime": "2024-03-01T09:00:00.000Z",
     "emissionFactorType": "lifecycle", "isEstimated": false, "estimationMethod": null}
  ]
}"""


def test_electricitymaps_history_parses_exact_decimals_on_utc_hours_with_basis_and_provenance(
    apis: FakeApis,
) -> None:
    apis.bodies["/v3/carbon-intensity/past-range"] = EM_PAST_RANGE

    readings = em(apis).history(ZONE, T0, T0 + timedelta(hours=4))

    assert [r.period_start for r in readings] == [T0, T0 + timedelta(hours=1), T0 + timedelta(hours=2)]
    first, second, third = readings
    assert first.intensity_g_per_kwh == Decimal("322.57")
    assert str(first.intensity_g_per_kwh) == "322.57"
    assert str(second.intensity_g_per_kwh) == "301.123456789012345678901"
    assert third.intensity_g_per_kwh == Decimal(290)  # "13:00+01:00" is 12:00 UTC
    for reading in readings:
        assert reading.period_start.tzinfo is UTC
        assert reading.period_end == reading.period_start + timedelta(hours=1)
        assert reading.basis == "lifecycle"
        assert (reading.zone, reading.signal, reading.source) == (ZONE, "carbonIntensity", "Electricity Maps")
        assert reading.licence
        assert reading.forecast is False
        assert reading.url.startswith(f"{apis.base_url}/v3/carbon-intensity/past-range?")
        assert EM_TOKEN not in reading.url
    assert [r.estimated for r in readings] == [False, True, False]

    (request,) = apis.requests_to("/v3/carbon-intensity/past-range")
    assert request.headers["auth-token"] == EM_TOKEN
    assert request.query == {
        "zone": ZONE,
        "start": "2024-03-01T10:00:00Z",
        "end": "2024-03-01T14:00:00Z",
        "emissionFactorType": "lifecycle",
        "shouldUseFallbackCallerLookup": "false",
    }


def test_electricitymaps_direct_basis_is_asked_for_and_reported(apis: FakeApis) -> None:
    apis.bodies["/v3/carbon-intensity/past-range"] = {
        "zone": ZONE,
        "data": [
            {"carbonIntensity": 250, "datetime": "2024-03-01T10:00:00.000Z", "emissionFactorType": "direct"}
        ],
    }

    (reading,) = em(apis, emission_factor_type="direct").history(ZONE, T0, T0 + timedelta(hours=1))

    assert reading.basis == "direct"
    assert reading.estimated is True  # the API did not say it was measured
    assert apis.requests_to("/v3/carbon-intensity/past-range")[0].query["emissionFactorType"] == "direct"


def test_electricitymaps_history_widens_to_whole_hours_and_splits_ranges_over_ten_days(
    apis: FakeApis,
) -> None:
    apis.bodies["/v3/carbon-intensity/past-range"] = {"zone": ZONE, "data": []}
    start = datetime(2024, 3, 1, 10, 30, tzinfo=timezone(timedelta(hours=2)))  # 08:30 UTC

    assert em(apis).history(ZONE, start, start + timedelta(days=12)) == []

    asked = [(s.query["start"], s.query["end"]) for s in apis.requests_to("/v3/carbon-intensity/past-range")]
    assert asked == [
        ("2024-03-01T08:00:00Z", "2024-03-11T08:00:00Z"),
        ("2024-03-11T08:00:00Z", "2024-03-13T09:00:00Z"),
    ]


def test_electricitymaps_forecast_readings_are_flagged_forecast_and_kept_to_the_window(
    apis: FakeApis,
) -> None:
    apis.bodies["/v3/carbon-intensity/forecast"] = {
        "zone": ZONE,
        "forecast": [
            {"carbonIntensity": 210.5, "datetime": "2024-03-01T10:00:00.000Z"},
            {"carbonIntensity": 199, "datetime": "2024-03-01T11:00:00.000Z"},
            {"carbonIntensity": 180, "datetime": "2024-03-01T12:00:00.000Z"},
        ],
        "updatedAt": "2024-03-01T09:41:00.000Z",
    }

    readings = em(apis).forecast(ZONE, T0, T0 + timedelta(hours=2))

    assert [(r.period_start, r.intensity_g_per_kwh) for r in readings] == [
        (T0, Decimal("210.5")),
        (T0 + timedelta(hours=1), Decimal(199)),
    ]
    assert all(r.forecast and r.estimated for r in readings)
    (request,) = apis.requests_to("/v3/carbon-intensity/forecast")
    assert request.headers["auth-token"] == EM_TOKEN
    assert request.query["zone"] == ZONE
    assert request.query["emissionFactorType"] == "lifecycle"


def test_electricitymaps_answer_for_another_zone_is_refused(apis: FakeApis) -> None:
    apis.bodies["/v3/carbon-intensity/past-range"] = {
        "zone": "FR",
        "data": [{"carbonIntensity": 50, "datetime": "2024-03-01T10:00:00.000Z"}],
    }

    with pytest.raises(ProviderError, match="'FR'"):
        em(apis).history(ZONE, T0, T0 + timedelta(hours=1))


def test_electricitymaps_item_without_carbon_intensity_is_a_provider_error(apis: FakeApis) -> None:
    apis.bodies["/v3/carbon-intensity/past-range"] = {
        "zone": ZONE,
        "data": [{"datetime": "2024-03-01T10:00Z"}],
    }

    with pytest.raises(ProviderError, match="carbonIntensity") as caught:
        em(apis).history(ZONE, T0, T0 + timedelta(hours=1))

    assert (caught.value.provider, caught.value.zone) == ("electricitymaps", ZONE)


def test_electricitymaps_reading_off_the_whole_hour_is_a_provider_error(apis: FakeApis) -> None:
    apis.bodies["/v3/carbon-intensity/past-range"] = {
        "zone": ZONE,
        "data": [{"carbonIntensity": 50, "datetime": "2024-03-01T10:15:00.000Z"}],
    }

    with pytest.raises(ProviderError, match="whole UTC hour"):
        em(apis).history(ZONE, T0, T0 + timedelta(hours=1))


# --------------------------------------------------------------------------------------------------------
# WattTime
# --------------------------------------------------------------------------------------------------------


def test_watttime_converts_lb_per_mwh_to_g_per_kwh_exactly(apis: FakeApis) -> None:
    # 800, 810, ..., 910 lb/MWh: mean 855 lb/MWh; 855 x 0.45359237 = 387.82147635 g/kWh by hand.
    apis.bodies["/v3/historical"] = wt_body(wt_points(T0, [800 + 10 * i for i in range(12)]))

    (reading,) = wt(apis).history(REGION, T0, T0 + timedelta(hours=1))

    assert reading.intensity_g_per_kwh == Decimal("387.82147635")
    assert str(reading.intensity_g_per_kwh) == "387.82147635"
    assert (reading.period_start, reading.period_end) == (T0, T0 + timedelta(hours=1))
    assert reading.estimated is False
    assert reading.forecast is False
    assert (reading.basis, reading.signal, reading.source) == ("direct", "co2_aoer", "WattTime")


def test_watttime_one_lb_per_mwh_is_0_45359237_g_per_kwh(apis: FakeApis) -> None:
    body = (
        b'{"meta": {"signal_type": "co2_aoer", "units": "lbs_co2_per_mwh", "data_point_period_seconds": 3600},'
        b' "data": [{"point_time": "2024-03-01T10:00:00+00:00", "value": 1.0}]}'
    )
    apis.bodies["/v3/historical"] = body

    (reading,) = wt(apis).history(REGION, T0, T0 + timedelta(hours=1))

    assert reading.intensity_g_per_kwh == Decimal("0.45359237")
    assert reading.estimated is False  # one point per hour is a whole hour at a 3600 s period


def test_watttime_partial_hour_is_averaged_over_points_present_and_marked_estimated(apis: FakeApis) -> None:
    full_hour = wt_points(T0, [1000] * 12)
    # 4 of 12 points in the second hour: mean 1050 lb/MWh -> 1050 x 0.45359237 = 476.2719885 g/kWh.
    partial = wt_points(T0 + timedelta(hours=1, minutes=20), [900, 1000, 1100, 1200])
    apis.bodies["/v3/historical"] = wt_body(full_hour + partial)

    first, second = wt(apis).history(REGION, T0, T0 + timedelta(hours=2))

    assert (first.intensity_g_per_kwh, first.estimated) == (Decimal("453.59237"), False)
    assert second.period_start == T0 + timedelta(hours=1)
    assert (second.intensity_g_per_kwh, second.estimated) == (Decimal("476.2719885"), True)


def test_watttime_logs_in_with_basic_auth_then_sends_the_bearer_token_and_reuses_it(apis: FakeApis) -> None:
    apis.bodies["/v3/historical"] = wt_body(wt_points(T0, [1000] * 12))
    provider = wt(apis)

    provider.history(REGION, T0, T0 + timedelta(hours=1))
    provider.history(REGION, T0, T0 + timedelta(hours=1))

    assert apis.logins == 1
    first = apis.requests_to("/v3/historical")[0]
    assert first.headers["authorization"] == f"Bearer {WT_TOKEN}"
    assert first.query == {
        "region": REGION,
        "start": "2024-03-01T10:00:00Z",
        "end": "2024-03-01T11:00:00Z",
        "signal_type": "co2_aoer",
    }
    assert WT_PASSWORD not in repr(provider) and WT_TOKEN not in first.path


def test_watttime_logs_in_again_once_when_the_token_is_rejected(apis: FakeApis) -> None:
    apis.bodies["/v3/historical"] = wt_body(wt_points(T0, [1000] * 12))
    apis.reject_bearer_once = True

    (reading,) = wt(apis).history(REGION, T0, T0 + timedelta(hours=1))

    assert reading.intensity_g_per_kwh == Decimal("453.59237")
    assert apis.logins == 2


def test_watttime_forecast_readings_are_flagged_forecast(apis: FakeApis) -> None:
    apis.bodies["/v3/forecast"] = wt_body(
        wt_points(T0, [1000] * 24), generated_at="2024-03-01T09:55:00+00:00", generated_at_period_seconds=300
    )

    readings = wt(apis).forecast(REGION, T0, T0 + timedelta(hours=2))

    assert [(r.period_start, r.intensity_g_per_kwh) for r in readings] == [
        (T0, Decimal("453.59237")),
        (T0 + timedelta(hours=1), Decimal("453.59237")),
    ]
    assert all(r.forecast and r.estimated for r in readings)
    (request,) = apis.requests_to("/v3/forecast")
    assert request.query == {"region": REGION, "signal_type": "co2_aoer"}


@pytest.mark.parametrize("signal", ["co2_moer", "CO2_MOER", "co2_moer_v2"])
def test_watttime_refuses_marginal_signals(signal: str) -> None:
    with pytest.raises(ValueError, match="marginal"):
        WattTimeProvider(WT_USER, WT_PASSWORD, signal_type=signal)


def test_watttime_refuses_signals_it_cannot_convert_to_g_per_kwh() -> None:
    with pytest.raises(ValueError, match="co2_aoer"):
        WattTimeProvider(WT_USER, WT_PASSWORD, signal_type="health_damage")


def test_watttime_refuses_an_answer_labelled_with_a_marginal_signal(apis: FakeApis) -> None:
    apis.bodies["/v3/historical"] = wt_body(wt_points(T0, [1000] * 12), signal_type="co2_moer")

    with pytest.raises(ProviderError, match="co2_moer"):
        wt(apis).history(REGION, T0, T0 + timedelta(hours=1))


def test_watttime_refuses_unexpected_units(apis: FakeApis) -> None:
    apis.bodies["/v3/historical"] = wt_body(wt_points(T0, [1000] * 12), units="kg_co2_per_mwh")

    with pytest.raises(ProviderError, match="kg_co2_per_mwh"):
        wt(apis).history(REGION, T0, T0 + timedelta(hours=1))


# --------------------------------------------------------------------------------------------------------
# Failures common to both providers
# --------------------------------------------------------------------------------------------------------

EM_HISTORY_PATH = "/v3/carbon-intensity/past-range"
WT_HISTORY_PATH = "/v3/historical"


def _history(kind: str, api: FakeApis, **kwargs: Any) -> Callable[[], list[ProviderReading]]:
    if kind == "electricitymaps":
        provider: IntensityProvider = em(api, **kwargs)
        zone = ZONE
    else:
        provider = wt(api, **kwargs)
        zone = REGION
    return lambda: provider.history(zone, T0, T0 + timedelta(hours=1))


def _zone(kind: str) -> str:
    return ZONE if kind == "electricitymaps" else REGION


@pytest.mark.parametrize("status", [401, 500])
@pytest.mark.parametrize(
    ("kind", "path"), [("electricitymaps", EM_HISTORY_PATH), ("watttime", WT_HISTORY_PATH)]
)
def test_http_error_status_is_a_provider_error_naming_provider_and_zone(
    apis: FakeApis, kind: str, path: str, status: int
) -> None:
    apis.failures[path] = (status, b'{"message": "nope"}')

    with pytest.raises(ProviderError) as caught:
        _history(kind, apis)()

    error = caught.value
    assert (error.provider, error.zone, error.status) == (kind, _zone(kind), status)
    assert kind in str(error) and _zone(kind) in str(error) and f"HTTP {status}" in str(error)
    assert "nope" in str(error)


def test_wrong_watttime_password_is_a_provider_error_at_log_in(apis: FakeApis) -> None:
    provider = WattTimeProvider(WT_USER, "wrong", base_url=apis.base_url)

    with pytest.raises(ProviderError, match="HTTP 401") as caught:
        provider.history(REGION, T0, T0 + timedelta(hours=1))

    assert "/login" in str(caught.value) and "wrong" not in str(caught.value)
    assert apis.requests_to(WT_HISTORY_PATH) == []


def test_wrong_electricitymaps_token_is_a_provider_error(apis: FakeApis) -> None:
    provider = ElectricityMapsProvider("not-the-token", base_url=apis.base_url)

    with pytest.raises(ProviderError, match="HTTP 401") as caught:
        provider.history(ZONE, T0, T0 + timedelta(hours=1))

    assert "not-the-token" not in str(caught.value)


@pytest.mark.parametrize("kind", ["electricitymaps", "watttime"])
def test_slow_answer_is_a_provider_error_after_the_timeout(apis: FakeApis, kind: str) -> None:
    apis.bodies[EM_HISTORY_PATH] = {"zone": ZONE, "data": []}
    apis.bodies[WT_HISTORY_PATH] = wt_body([])
    apis.delay_s = 0.8
    fetch = _history(kind, apis, timeout_s=0.2)

    began = time.monotonic()
    with pytest.raises(ProviderError, match=r"no answer within 0\.2 s") as caught:
        fetch()

    assert time.monotonic() - began < 0.7
    assert (caught.value.provider, caught.value.zone) == (kind, _zone(kind))


@pytest.mark.parametrize("body", [b"{not json", b"<html>Bad gateway</html>", b'{"data": [NaN]}', b"\xff\xfe"])
@pytest.mark.parametrize(
    ("kind", "path"), [("electricitymaps", EM_HISTORY_PATH), ("watttime", WT_HISTORY_PATH)]
)
def test_malformed_json_is_a_provider_error(apis: FakeApis, kind: str, path: str, body: bytes) -> None:
    apis.bodies[path] = body

    with pytest.raises(ProviderError, match="not valid JSON") as caught:
        _history(kind, apis)()

    assert (caught.value.provider, caught.value.zone) == (kind, _zone(kind))


@pytest.mark.parametrize(
    ("kind", "path", "body"),
    [
        (
            "electricitymaps",
            EM_HISTORY_PATH,
            {"zone": ZONE, "data": [{"carbonIntensity": -5, "datetime": "2024-03-01T10:00:00Z"}]},
        ),
        ("watttime", WT_HISTORY_PATH, wt_body(wt_points(T0, [1000, -0.5, 1000]))),
    ],
)
def test_negative_intensity_is_a_provider_error(apis: FakeApis, kind: str, path: str, body: object) -> None:
    apis.bodies[path] = body

    with pytest.raises(ProviderError, match="negative"):
        _history(kind, apis)()


@pytest.mark.parametrize(
    "body",
    [
        {"meta": {}, "data": [{"value": 1000}]},
        {"meta": {}, "data": [{"point_time": "2024-03-01T10:00:00+00:00"}]},
        {"meta": {}},
        {"meta": {}, "data": [{"point_time": "2024-03-01T10:00:00", "value": 1}]},
        {"meta": {}, "data": [{"point_time": "2024-03-01T10:00:00Z", "value": "1000"}]},
    ],
)
def test_watttime_missing_or_invalid_field_is_a_provider_error(apis: FakeApis, body: object) -> None:
    apis.bodies[WT_HISTORY_PATH] = body

    with pytest.raises(ProviderError):
        wt(apis).history(REGION, T0, T0 + timedelta(hours=1))


def test_naive_or_reversed_window_is_refused_before_any_request(apis: FakeApis) -> None:
    provider = em(apis)

    with pytest.raises(ValueError, match="timezone-aware"):
        provider.history(ZONE, datetime(2024, 3, 1, 10), T0)
    with pytest.raises(ValueError, match="before start"):
        provider.history(ZONE, T0, T0 - timedelta(hours=1))
    assert apis.seen == []


@pytest.mark.parametrize(
    "kwargs",
    [{"timeout_s": 0}, {"base_url": "file:///etc"}, {"emission_factor_type": "marginal"}, {"token": ""}],
)
def test_electricitymaps_constructor_rejects_bad_configuration(kwargs: dict[str, Any]) -> None:
    arguments: dict[str, Any] = {"token": EM_TOKEN, **kwargs}
    with pytest.raises(ValueError):
        ElectricityMapsProvider(**arguments)


# --------------------------------------------------------------------------------------------------------
# ProviderReading
# --------------------------------------------------------------------------------------------------------


def _reading(**overrides: Any) -> ProviderReading:
    fields: dict[str, Any] = {
        "zone": ZONE,
        "period_start": T0,
        "period_end": T0 + timedelta(hours=1),
        "intensity_g_per_kwh": Decimal("100"),
        "basis": "lifecycle",
        "signal": "carbonIntensity",
        "source": "test",
        "licence": "test",
        "url": "http://example.invalid",
        "estimated": False,
        "forecast": False,
    }
    fields.update(overrides)
    return ProviderReading(**fields)


def test_provider_reading_is_normalised_to_utc() -> None:
    cet = timezone(timedelta(hours=1))
    reading = _reading(period_start=T0.astimezone(cet), period_end=(T0 + timedelta(hours=1)).astimezone(cet))

    assert reading.period_start.tzinfo is UTC and reading.period_start == T0
    assert reading == _reading()


@pytest.mark.parametrize(
    "overrides",
    [
        {"period_start": datetime(2024, 3, 1, 10), "period_end": datetime(2024, 3, 1, 11)},
        {"period_start": T0 + timedelta(minutes=30), "period_end": T0 + timedelta(minutes=90)},
        {"period_end": T0 + timedelta(hours=2)},
        {"intensity_g_per_kwh": Decimal("-1")},
        {"intensity_g_per_kwh": Decimal("NaN")},
        {"intensity_g_per_kwh": 100.0},
        {"basis": "marginal"},
    ],
)
def test_provider_reading_rejects_invalid_values(overrides: dict[str, Any]) -> None:
    with pytest.raises(ValueError):
        _reading(**overrides)


# --------------------------------------------------------------------------------------------------------
# Registry
# --------------------------------------------------------------------------------------------------------


class StaticProvider:
    """A provider defined outside the module, loadable by dotted path."""

    name = "static"

    def __init__(self, value: str = "42") -> None:
        self.value = Decimal(value)

    def history(self, zone: str, start: datetime, end: datetime) -> list[ProviderReading]:
        return [_reading(zone=zone, intensity_g_per_kwh=self.value)]

    def forecast(self, zone: str, start: datetime, end: datetime) -> list[ProviderReading]:
        return []


class NotAProvider:
    pass


def test_load_provider_by_short_name() -> None:
    electricitymaps = load_provider("electricitymaps", token=EM_TOKEN, timeout_s=3)
    watttime = load_provider("watttime", username=WT_USER, password=WT_PASSWORD)

    assert isinstance(electricitymaps, ElectricityMapsProvider) and electricitymaps.timeout_s == 3.0
    assert isinstance(watttime, WattTimeProvider)
    assert set(PROVIDERS) == {"electricitymaps", "watttime"}


def test_load_provider_by_dotted_path() -> None:
    builtin = load_provider(PROVIDERS["watttime"], username=WT_USER, password=WT_PASSWORD)
    custom = load_provider(f"{__name__}.StaticProvider", value="7.5")

    assert isinstance(builtin, WattTimeProvider)
    assert isinstance(custom, StaticProvider)
    assert custom.history(ZONE, T0, T0)[0].intensity_g_per_kwh == Decimal("7.5")


def test_load_provider_passes_constructor_refusals_through() -> None:
    with pytest.raises(ValueError, match="marginal"):
        load_provider("watttime", username=WT_USER, password=WT_PASSWORD, signal_type="co2_moer")


@pytest.mark.parametrize(
    ("path", "named"),
    [
        ("electricity_maps", "electricity_maps"),
        ("", "''"),
        ("carbonledger.no_such_module.Provider", "carbonledger.no_such_module"),
        ("carbon.providers.NoSuchProvider", "NoSuchProvider"),
        ("carbon.providers.PROVIDERS", "not a class"),
        (f"{__name__}.NotAProvider", "NotAProvider"),
        ("carbonledger..Provider", "carbonledger..Provider"),
    ],
)
def test_load_provider_bad_path_is_a_value_error_naming_it(path: str, named: str) -> None:
    with pytest.raises(ValueError) as caught:
        load_provider(path)

    assert named in str(caught.value)


def test_module_imports_nothing_from_django() -> None:
    source = Path(intensity_providers.__file__).read_text(encoding="utf-8")
    tree = ast.parse(source)
    imported = {
        alias.name.split(".")[0]
        for node in ast.walk(tree)
        if isinstance(node, ast.Import)
        for alias in node.names
    } | {
        (node.module or "").split(".")[0]
        for node in ast.walk(tree)
        if isinstance(node, ast.ImportFrom) and node.level == 0
    }
    assert "django" not in imported
