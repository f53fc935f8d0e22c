"""Optional online sources of hourly grid carbon intensity, behind a small registry of dotted paths.

Nothing here is switched on by itself: the caller reads its own setting, picks the providers to enable
(:data:`PROVIDERS` short names or any ``package.module.ClassName``) and builds them with
:func:`load_provider`. The module imports nothing from Django and reads no settings, so it can be used, and
tested, on its own; HTTP goes through :mod:`urllib.request` of the standard library.

Only *average* intensities are ever returned (the emissions of the grid mix divided by the energy of that
mix), the figure that a location-based inventory needs. Marginal signals (WattTime's MOER) answer a
different question, the effect of one more kWh, and are refused outright: see :class:`WattTimeProvider`.

Every reading covers one whole UTC hour ``[period_start, period_end)``, in grams CO2e per kWh, as an exact
:class:`~decimal.Decimal`. Numbers are taken from the JSON *text* (``json.loads(parse_float=Decimal)``),
never through a binary float, so ``322.57`` in a response is ``Decimal("322.57")``.

``history()`` is for the inventory (hours that have happened); ``forecast()`` is for scheduling only, and
its readings carry ``forecast=True`` so that they can never be mistaken for inventory data.

Windows: both methods take timezone-aware ``start`` and ``end`` (naive datetimes are refused with
``ValueError``) and return one reading per whole UTC hour that overlaps ``[start, end)`` and for which the
provider has a value, sorted by hour. An hour the provider has no value for is simply absent; the caller
decides what to fall back to.

Failures of the remote side (HTTP status, time-out, connection, bad JSON, missing or invalid field) raise
:class:`ProviderError`, whose message names the provider, the zone and what went wrong. Secrets (token,
password) are sent in headers only, so the URLs in messages and in :attr:`ProviderReading.url` hold none.
"""

from __future__ import annotations

import base64
import http.client
import importlib
import json
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from decimal import (
    MAX_EMAX,
    MAX_PREC,
    MIN_EMIN,
    ROUND_HALF_EVEN,
    Context,
    Decimal,
    Inexact,
    InvalidOperation,
    Overflow,
    Rounded,
)
from email.message import Message
from typing import IO, TYPE_CHECKING, Any, Final, Literal, Protocol, runtime_checkable

__all__ = [
    "DEFAULT_TIMEOUT_S",
    "G_PER_KWH_PER_LB_PER_MWH",
    "PROVIDERS",
    "Basis",
    "ElectricityMapsProvider",
    "IntensityProvider",
    "ProviderError",
    "ProviderReading",
    "WattTimeProvider",
    "load_provider",
]

Basis = Literal["direct", "lifecycle"]

DEFAULT_TIMEOUT_S: Final = 10.0
# 1 lb = 0.45359237 kg exactly (international avoirdupois pound), so 1 lb/MWh = 453.59237 g / 1000 kWh.
G_PER_KWH_PER_LB_PER_MWH: Final = Decimal("0.45359237")

_HOUR: Final = timedelta(hours=1)
_BASES: Final[dict[str, Basis]] = {"direct": "direct", "lifecycle": "lifecycle"}
# Sums and the unit conversion are exact (an inexact step raises); only the mean's division rounds, to the
# same 50 significant digits, half-even, that carbon.co2e uses for its divisions.
_EXACT: Final = Context(
    prec=MAX_PREC, Emax=MAX_EMAX, Emin=MIN_EMIN, traps=[Inexact, Rounded, InvalidOperation, Overflow]
)
_DIVISION: Final = Context(prec=50, rounding=ROUND_HALF_EVEN, traps=[InvalidOperation, Overflow])
_ERROR_BODY_CHARS: Final = 200
_USER_AGENT: Final = "carbonledger-intensity-providers/1"


@dataclass(frozen=True)
class ProviderReading:
    """The average carbon intensity of one zone's grid over one whole UTC hour, as a provider gave it.

    ``signal`` is the provider's own name for the figure (``carbonIntensity``, ``co2_aoer``); ``source``,
    ``licence`` and ``url`` say where it came from and under which terms, for the inventory's provenance.
    ``estimated`` is true when the provider modelled or gap-filled the hour (and for every forecast).
    """

    zone: str
    period_start: datetime
    period_end: datetime
    intensity_g_per_kwh: Decimal
    basis: Basis
    signal: str
    source: str
    licence: str
    url: str
    estimated: bool
    forecast: bool

    def __post_init__(self) -> None:
        start = self.period_start
        if start.tzinfo is None or start.utcoffset() is None:
            raise ValueError(f"period_start must be timezone-aware, got {start!r}")
        start = start.astimezone(UTC)
        if start != _floor_hour(start):
            raise ValueError(f"period_start must be on a whole UTC hour, got {start.isoformat()}")
        if self.period_end.tzinfo is None or self.period_end != start + _HOUR:
            raise ValueError(f"period_end must be period_start + 1 h, got {self.period_end!r}")
        if not isinstance(self.intensity_g_per_kwh, Decimal) or not self.intensity_g_per_kwh.is_finite():
            raise ValueError(
                f"intensity_g_per_kwh must be a finite Decimal, got {self.intensity_g_per_kwh!r}"
            )
        if self.intensity_g_per_kwh < 0:
            raise ValueError(f"intensity_g_per_kwh must not be negative, got {self.intensity_g_per_kwh}")
        if self.basis not in _BASES:
            raise ValueError(f"basis must be 'direct' or 'lifecycle', got {self.basis!r}")
        if not self.zone:
            raise ValueError("zone must not be empty")
        # Normalise both ends to UTC so that equal hours compare and hash equal whatever offset came in.
        object.__setattr__(self, "period_start", start)
        object.__setattr__(self, "period_end", start + _HOUR)


@runtime_checkable
class IntensityProvider(Protocol):
    """What the caller needs from an online intensity source (see the module docstring for windows)."""

    name: str

    def history(self, zone: str, start: datetime, end: datetime) -> list[ProviderReading]:
        """Average intensity of past hours overlapping ``[start, end)``, for the inventory."""
        ...

    def forecast(self, zone: str, start: datetime, end: datetime) -> list[ProviderReading]:
        """Forecast intensity of future hours overlapping ``[start, end)``, for scheduling only."""
        ...


class ProviderError(Exception):
    """A provider could not deliver: HTTP status, time-out, unreachable host, bad JSON, bad or missing field.

    ``status`` is the HTTP status code when the failure was one, else ``None``.
    """

    def __init__(self, provider: str, zone: str, problem: str, *, status: int | None = None) -> None:
        self.provider = provider
        self.zone = zone
        self.problem = problem
        self.status = status
        super().__init__(f"{provider}: carbon intensity for zone {zone!r}: {problem}")


# --------------------------------------------------------------------------------------------------------
# Electricity Maps
# --------------------------------------------------------------------------------------------------------


class ElectricityMapsProvider:
    """Electricity Maps API v3: hourly consumption-based average carbon intensity, gCO2eq/kWh.

    History comes from ``GET /v3/carbon-intensity/past-range?zone=&start=&end=`` (a commercial endpoint;
    the API limits one call to 10 days of hourly data, so longer windows are fetched in 10-day pieces), the
    forecast from ``GET /v3/carbon-intensity/forecast?zone=``. The token goes in the ``auth-token`` header.
    Every call carries ``emissionFactorType`` (``lifecycle``, the API's default, or ``direct``), which
    becomes the readings' ``basis``, and ``shouldUseFallbackCallerLookup=false``: without it the API may
    answer an unknown zone with the zone of the caller's IP address, which would put another grid's figures
    into the inventory. For the same reason a response that names a different zone is refused.

    An hour whose ``carbonIntensity`` is ``null`` (the provider has no value) is left out. A reading is
    ``estimated`` when the API says ``isEstimated: true``, names an ``estimationMethod``, or does not say
    (we do not claim a measurement the provider did not claim).
    """

    name: str = "electricitymaps"
    source: Final = "Electricity Maps"
    licence: Final = "Electricity Maps data licence, see https://www.electricitymaps.com"
    signal: Final = "carbonIntensity"
    max_range: Final = timedelta(days=10)

    def __init__(
        self,
        token: str,
        base_url: str = "https://api.electricitymap.org",
        timeout_s: float = DEFAULT_TIMEOUT_S,
        emission_factor_type: Basis = "lifecycle",
    ) -> None:
        if not token:
            raise ValueError("Electricity Maps needs an API token")
        if emission_factor_type not in _BASES:
            raise ValueError(
                f"emission_factor_type must be 'lifecycle' or 'direct', got {emission_factor_type!r}"
            )
        self._token = token
        self.base_url = _check_base_url(base_url)
        self.timeout_s = _check_timeout(timeout_s)
        self.emission_factor_type: Basis = _BASES[emission_factor_type]

    def __repr__(self) -> str:  # never show the token
        return f"ElectricityMapsProvider(base_url={self.base_url!r}, basis={self.emission_factor_type!r})"

    def history(self, zone: str, start: datetime, end: datetime) -> list[ProviderReading]:
        zone = _check_zone(zone)
        low, high = _hour_window(start, end)
        found: dict[datetime, ProviderReading] = {}
        for piece_start, piece_end in _pieces(low, high, self.max_range):
            url = self._url(
                "/v3/carbon-intensity/past-range", zone, start=_iso(piece_start), end=_iso(piece_end)
            )
            payload = self._get(zone, url)
            # Whether the API's ``end`` is inclusive is not documented; keying by hour makes it not matter.
            for reading in self._readings(zone, url, payload, ("data", "history"), forecast=False):
                if low <= reading.period_start < high:
                    found[reading.period_start] = reading
        return [found[hour] for hour in sorted(found)]

    def forecast(self, zone: str, start: datetime, end: datetime) -> list[ProviderReading]:
        zone = _check_zone(zone)
        low, high = _hour_window(start, end)
        url = self._url("/v3/carbon-intensity/forecast", zone)
        payload = self._get(zone, url)
        found = {
            reading.period_start: reading
            for reading in self._readings(zone, url, payload, ("forecast", "data"), forecast=True)
            if low <= reading.period_start < high
        }
        return [found[hour] for hour in sorted(found)]

    def _url(self, path: str, zone: str, **extra: str) -> str:
        query = {
            "zone": zone,
            **extra,
            "emissionFactorType": self.emission_factor_type,
            "shouldUseFallbackCallerLookup": "false",
        }
        return f"{self.base_url}{path}?{urllib.parse.urlencode(query, safe=':')}"

    def _get(self, zone: str, url: str) -> Any:
        return _get_json(self.name, zone, url, {"auth-token": self._token}, self.timeout_s)

    def _readings(
        self, zone: str, url: str, payload: Any, list_keys: tuple[str, ...], *, forecast: bool
    ) -> Iterator[ProviderReading]:
        fail = _Fail(self.name, zone, url)
        if not isinstance(payload, Mapping):
            raise fail("response is not a JSON object")
        answered_zone = payload.get("zone")
        if answered_zone is not None and answered_zone != zone:
            raise fail(f"response is for zone {answered_zone!r}, not the zone asked for")
        key = next((k for k in list_keys if k in payload), None)
        if key is None:
            raise fail(f"response has no {' or '.join(repr(k) for k in list_keys)} list")
        items = payload[key]
        if not isinstance(items, list):
            raise fail(f"{key!r} is not a list")
        for index, item in enumerate(items):
            where = f"{key}[{index}]"
            if not isinstance(item, Mapping):
                raise fail(f"{where} is not an object")
            for field_name in ("datetime", "carbonIntensity"):
                if field_name not in item:
                    raise fail(f"{where} has no {field_name!r} field")
            if item.get("zone") is not None and item["zone"] != zone:
                raise fail(f"{where} is for zone {item['zone']!r}, not the zone asked for")
            factor_type = item.get("emissionFactorType")
            if factor_type is not None and factor_type != self.emission_factor_type:
                raise fail(
                    f"{where} has emissionFactorType {factor_type!r}, asked for {self.emission_factor_type!r}"
                )
            if item["carbonIntensity"] is None:
                continue
            value = _intensity(fail, f"{where}.carbonIntensity", item["carbonIntensity"])
            hour = _utc_instant(fail, f"{where}.datetime", item["datetime"])
            if hour != _floor_hour(hour):
                raise fail(f"{where}.datetime {item['datetime']!r} is not on a whole UTC hour")
            flagged = item.get("isEstimated")
            if flagged is not None and not isinstance(flagged, bool):
                raise fail(f"{where}.isEstimated is not true/false: {flagged!r}")
            estimated = forecast or flagged is not False or item.get("estimationMethod") is not None
            yield ProviderReading(
                zone=zone,
                period_start=hour,
                period_end=hour + _HOUR,
                intensity_g_per_kwh=value,
                basis=self.emission_factor_type,
                signal=self.signal,
                source=self.source,
                licence=self.licence,
                url=url,
                estimated=estimated,
                forecast=forecast,
            )


# --------------------------------------------------------------------------------------------------------
# WattTime
# --------------------------------------------------------------------------------------------------------


class WattTimeProvider:
    """WattTime API v3, average operating emissions rate (``co2_aoer``) only, converted to gCO2/kWh.

    Log-in is ``GET /login`` with HTTP basic auth, which answers ``{"token": ...}``; the token (valid 30
    minutes) is sent as ``Authorization: Bearer`` and renewed after 25 minutes, or once when a data call
    answers 401. History comes from ``GET /v3/historical?region=&start=&end=&signal_type=`` (fetched in
    30-day pieces, the window the official client uses), the forecast from
    ``GET /v3/forecast?region=&signal_type=``, which returns the latest forecast whatever the window.

    WattTime reports CO2 in lb/MWh at 5-minute resolution. Points are grouped by the UTC hour they start
    in and averaged over the points present: mean(lb/MWh) x 0.45359237 = g/kWh, the sum and conversion
    exact and the one division to 50 significant digits. An hour with fewer points than the hour holds
    (12 at the usual 300 s, or ``3600 / meta.data_point_period_seconds``) is still averaged, and marked
    ``estimated``. ``basis`` is ``direct``: the AOER counts combustion emissions at the generator only.

    Marginal signals are refused: ``co2_moer`` (anything containing ``moer``) raises ``ValueError`` in the
    constructor, and a response whose ``meta.signal_type`` is not the one asked for raises
    :class:`ProviderError`, so a marginal figure can never enter the inventory through this class.
    """

    name: str = "watttime"
    source: Final = "WattTime"
    licence: Final = "WattTime data, subject to the WattTime API terms of service, see https://watttime.org"
    max_range: Final = timedelta(days=30)
    default_point_period_s: Final = 300
    token_lifetime_s: Final = 25 * 60
    supported_signals: Final = frozenset({"co2_aoer"})
    units: Final = "lbs_co2_per_mwh"

    def __init__(
        self,
        username: str,
        password: str,
        base_url: str = "https://api.watttime.org",
        timeout_s: float = DEFAULT_TIMEOUT_S,
        signal_type: str = "co2_aoer",
    ) -> None:
        if "moer" in signal_type.lower():
            raise ValueError(
                f"WattTime signal {signal_type!r} is a marginal emissions rate (MOER); marginal signals are "
                "never used in the inventory, which needs the average rate: use signal_type='co2_aoer'"
            )
        if signal_type not in self.supported_signals:
            raise ValueError(
                f"WattTime signal {signal_type!r} is not supported: only 'co2_aoer' (average CO2, lb/MWh) "
                "can be converted to g CO2/kWh"
            )
        if not username or not password:
            raise ValueError("WattTime needs a username and a password")
        self._basic = base64.b64encode(f"{username}:{password}".encode()).decode("ascii")
        self.base_url = _check_base_url(base_url)
        self.timeout_s = _check_timeout(timeout_s)
        self.signal_type = signal_type
        self._token: str | None = None
        self._token_at = 0.0

    def __repr__(self) -> str:  # never show the credentials or the token
        return f"WattTimeProvider(base_url={self.base_url!r}, signal_type={self.signal_type!r})"

    def history(self, zone: str, start: datetime, end: datetime) -> list[ProviderReading]:
        zone = _check_zone(zone)
        low, high = _hour_window(start, end)
        points: dict[datetime, tuple[Decimal, str]] = {}
        period_s = self.default_point_period_s
        for piece_start, piece_end in _pieces(low, high, self.max_range):
            url = self._url("/v3/historical", zone, start=_iso(piece_start), end=_iso(piece_end))
            period_s = self._collect(zone, url, self._get(zone, url), low, high, points)
        return self._hourly(zone, points, period_s, forecast=False)

    def forecast(self, zone: str, start: datetime, end: datetime) -> list[ProviderReading]:
        zone = _check_zone(zone)
        low, high = _hour_window(start, end)
        points: dict[datetime, tuple[Decimal, str]] = {}
        url = self._url("/v3/forecast", zone)
        period_s = self._collect(zone, url, self._get(zone, url), low, high, points)
        return self._hourly(zone, points, period_s, forecast=True)

    def _url(self, path: str, zone: str, **extra: str) -> str:
        query = {"region": zone, **extra, "signal_type": self.signal_type}
        return f"{self.base_url}{path}?{urllib.parse.urlencode(query, safe=':')}"

    def _login(self, zone: str) -> str:
        url = f"{self.base_url}/login"
        payload = _get_json(self.name, zone, url, {"Authorization": f"Basic {self._basic}"}, self.timeout_s)
        token = payload.get("token") if isinstance(payload, Mapping) else None
        if not isinstance(token, str) or not token:
            raise ProviderError(self.name, zone, f"log-in at {url} answered without a 'token'")
        self._token, self._token_at = token, time.monotonic()
        return token

    def _get(self, zone: str, url: str) -> Any:
        fresh = self._token is not None and time.monotonic() - self._token_at < self.token_lifetime_s
        token = self._token if fresh and self._token is not None else self._login(zone)
        try:
            return _get_json(self.name, zone, url, {"Authorization": f"Bearer {token}"}, self.timeout_s)
        except ProviderError as exc:
            if exc.status != 401:
                raise
        # The token may have been revoked or expired early: log in again, once.
        token = self._login(zone)
        return _get_json(self.name, zone, url, {"Authorization": f"Bearer {token}"}, self.timeout_s)

    def _collect(
        self,
        zone: str,
        url: str,
        payload: Any,
        low: datetime,
        high: datetime,
        points: dict[datetime, tuple[Decimal, str]],
    ) -> int:
        """Check one response and add its points in ``[low, high)`` to ``points``; return the point period."""
        fail = _Fail(self.name, zone, url)
        if not isinstance(payload, Mapping):
            raise fail("response is not a JSON object")
        meta = payload.get("meta", {})
        if not isinstance(meta, Mapping):
            raise fail("'meta' is not an object")
        if meta.get("signal_type") is not None and meta["signal_type"] != self.signal_type:
            raise fail(f"response is for signal {meta['signal_type']!r}, asked for {self.signal_type!r}")
        if meta.get("region") is not None and meta["region"] != zone:
            raise fail(f"response is for region {meta['region']!r}, not the region asked for")
        if meta.get("units") is not None and meta["units"] != self.units:
            raise fail(f"response is in {meta['units']!r}, expected {self.units!r}")
        period_s = meta.get("data_point_period_seconds", self.default_point_period_s)
        if isinstance(period_s, bool) or not isinstance(period_s, int) or not 0 < period_s <= 3600:
            raise fail(
                f"meta.data_point_period_seconds is not a whole number of seconds up to 3600: {period_s!r}"
            )
        if 3600 % period_s:
            raise fail(f"meta.data_point_period_seconds {period_s} does not divide an hour")
        if "data" not in payload:
            raise fail("response has no 'data' list")
        items = payload["data"]
        if not isinstance(items, list):
            raise fail("'data' is not a list")
        for index, item in enumerate(items):
            where = f"data[{index}]"
            if not isinstance(item, Mapping):
                raise fail(f"{where} is not an object")
            for field_name in ("point_time", "value"):
                if field_name not in item:
                    raise fail(f"{where} has no {field_name!r} field")
            if item["value"] is None:
                continue
            value = _intensity(fail, f"{where}.value", item["value"])
            moment = _utc_instant(fail, f"{where}.point_time", item["point_time"])
            if low <= moment < high:
                points[moment] = (value, url)
        return period_s

    def _hourly(
        self, zone: str, points: Mapping[datetime, tuple[Decimal, str]], period_s: int, *, forecast: bool
    ) -> list[ProviderReading]:
        per_hour = 3600 // period_s
        hours: dict[datetime, list[tuple[Decimal, str]]] = {}
        for moment in sorted(points):
            hours.setdefault(_floor_hour(moment), []).append(points[moment])
        readings = []
        for hour, values in sorted(hours.items()):
            total_lb = _EXACT.create_decimal(0)
            for value, _url in values:
                total_lb = _EXACT.add(total_lb, value)
            total_g = _EXACT.multiply(total_lb, G_PER_KWH_PER_LB_PER_MWH)
            mean = _DIVISION.divide(total_g, Decimal(len(values)))
            readings.append(
                ProviderReading(
                    zone=zone,
                    period_start=hour,
                    period_end=hour + _HOUR,
                    intensity_g_per_kwh=mean,
                    basis="direct",
                    signal=self.signal_type,
                    source=self.source,
                    licence=self.licence,
                    url=values[0][1],
                    estimated=forecast or len(values) < per_hour,
                    forecast=forecast,
                )
            )
        return readings


# --------------------------------------------------------------------------------------------------------
# Registry
# --------------------------------------------------------------------------------------------------------

PROVIDERS: dict[str, str] = {
    "electricitymaps": "carbon.providers.ElectricityMapsProvider",
    "watttime": "carbon.providers.WattTimeProvider",
}


def load_provider(path_or_name: str, **kwargs: Any) -> IntensityProvider:
    """Build the provider named by a :data:`PROVIDERS` short name or a dotted ``package.module.ClassName``.

    ``kwargs`` go to the class's constructor (a wrong keyword raises its ``TypeError``). A name that is
    neither, a module that cannot be imported, a missing attribute or an object that does not have
    ``name``, ``history()`` and ``forecast()`` raise ``ValueError`` naming the path.
    """
    path = PROVIDERS.get(path_or_name, path_or_name)
    module_name, _, attribute = path.rpartition(".")
    if not module_name or not attribute or not all(part.isidentifier() for part in path.split(".")):
        raise ValueError(
            f"intensity provider {path_or_name!r} is neither a known short name ({', '.join(sorted(PROVIDERS))}) "
            "nor a dotted path 'package.module.ClassName'"
        )
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise ValueError(f"intensity provider {path!r}: cannot import module {module_name!r}: {exc}") from exc
    try:
        factory = getattr(module, attribute)
    except AttributeError:
        raise ValueError(
            f"intensity provider {path!r}: module {module_name!r} has no {attribute!r}"
        ) from None
    if not callable(factory):
        raise ValueError(f"intensity provider {path!r} is not a class or factory")
    provider = factory(**kwargs)
    if not isinstance(provider, IntensityProvider):
        raise ValueError(
            f"intensity provider {path!r} does not implement IntensityProvider (name, history(), forecast())"
        )
    return provider


if TYPE_CHECKING:
    # Let mypy prove that both classes satisfy the protocol, which load_provider can only check at run time.
    _ELECTRICITYMAPS: type[IntensityProvider] = ElectricityMapsProvider
    _WATTTIME: type[IntensityProvider] = WattTimeProvider


# --------------------------------------------------------------------------------------------------------
# Helpers
# --------------------------------------------------------------------------------------------------------


class _Fail:
    """Builds the ProviderError for a bad response, naming the URL it came from."""

    def __init__(self, provider: str, zone: str, url: str) -> None:
        self.provider, self.zone, self.url = provider, zone, url

    def __call__(self, problem: str) -> ProviderError:
        return ProviderError(self.provider, self.zone, f"{problem} (from {self.url})")


class _NoRedirect(urllib.request.HTTPRedirectHandler):
    # urllib would re-send our auth headers to wherever a redirect points; an API that redirects is an
    # error to report, not a hop to follow with the token.
    def redirect_request(
        self,
        req: urllib.request.Request,
        fp: IO[bytes],
        code: int,
        msg: str,
        headers: Message,
        newurl: str,
    ) -> urllib.request.Request | None:
        return None


def _get_json(provider: str, zone: str, url: str, headers: Mapping[str, str], timeout_s: float) -> Any:
    """GET ``url`` and decode its JSON body, numbers as Decimal/int; any failure is a ProviderError."""
    request = urllib.request.Request(
        url, headers={"Accept": "application/json", "User-Agent": _USER_AGENT, **headers}, method="GET"
    )
    # A fresh opener per call so that proxy environment variables are read when the call is made.
    opener = urllib.request.build_opener(_NoRedirect)
    try:
        with opener.open(request, timeout=timeout_s) as response:
            body: bytes = response.read()
    except urllib.error.HTTPError as exc:
        raise ProviderError(
            provider, zone, f"HTTP {exc.code} from {url}{_error_detail(exc)}", status=exc.code
        ) from exc
    except TimeoutError as exc:
        raise ProviderError(provider, zone, f"no answer within {timeout_s:g} s from {url}") from exc
    except urllib.error.URLError as exc:
        if isinstance(exc.reason, TimeoutError):
            raise ProviderError(provider, zone, f"no answer within {timeout_s:g} s from {url}") from exc
        raise ProviderError(provider, zone, f"cannot reach {url}: {exc.reason}") from exc
    except (OSError, http.client.HTTPException) as exc:
        raise ProviderError(provider, zone, f"connection to {url} failed: {exc!r}") from exc
    try:
        return json.loads(body, parse_float=Decimal, parse_constant=_refuse_constant)
    except ValueError as exc:  # JSONDecodeError, UnicodeDecodeError and NaN/Infinity all land here
        raise ProviderError(provider, zone, f"response from {url} is not valid JSON: {exc}") from exc


def _error_detail(exc: urllib.error.HTTPError) -> str:
    try:
        text = exc.read(_ERROR_BODY_CHARS + 1).decode("utf-8", "replace")
    except (OSError, http.client.HTTPException):
        return ""
    text = " ".join(text.split())
    if len(text) > _ERROR_BODY_CHARS:
        text = text[:_ERROR_BODY_CHARS] + "..."
    hint = " (check the credentials and the plan's access to this endpoint)" if exc.code in (401, 403) else ""
    return (f": {text}" if text else "") + hint


def _refuse_constant(name: str) -> Any:
    raise ValueError(f"{name} is not a number")


def _intensity(fail: _Fail, where: str, raw: object) -> Decimal:
    """A non-negative finite intensity from a decoded JSON number (already Decimal or int, never float)."""
    if isinstance(raw, bool) or not isinstance(raw, Decimal | int):
        raise fail(f"{where} is not a number: {raw!r}")
    value = Decimal(raw)
    if not value.is_finite():
        raise fail(f"{where} is not a finite number: {raw!r}")
    if value < 0:
        raise fail(f"{where} is negative ({value}); a grid carbon intensity cannot be")
    return value


def _utc_instant(fail: _Fail, where: str, raw: object) -> datetime:
    if not isinstance(raw, str):
        raise fail(f"{where} is not a string: {raw!r}")
    try:
        moment = datetime.fromisoformat(raw)
    except ValueError:
        raise fail(f"{where} is not an ISO 8601 date-time: {raw!r}") from None
    if moment.tzinfo is None or moment.utcoffset() is None:
        raise fail(f"{where} has no timezone: {raw!r}")
    return moment.astimezone(UTC)


def _floor_hour(moment: datetime) -> datetime:
    return moment.replace(minute=0, second=0, microsecond=0)


def _hour_window(start: datetime, end: datetime) -> tuple[datetime, datetime]:
    """``[start, end)`` widened to whole UTC hours: the hours that overlap it."""
    for label, moment in (("start", start), ("end", end)):
        if moment.tzinfo is None or moment.utcoffset() is None:
            raise ValueError(f"{label} must be timezone-aware, got {moment!r}")
    start, end = start.astimezone(UTC), end.astimezone(UTC)
    if end < start:
        raise ValueError(f"end {end.isoformat()} is before start {start.isoformat()}")
    low, high = _floor_hour(start), _floor_hour(end)
    if high < end:
        high += _HOUR
    return low, high


def _pieces(low: datetime, high: datetime, size: timedelta) -> Iterator[tuple[datetime, datetime]]:
    while low < high:
        piece_end = min(low + size, high)
        yield low, piece_end
        low = piece_end


def _iso(moment: datetime) -> str:
    return moment.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _check_zone(zone: str) -> str:
    if not isinstance(zone, str) or not zone.strip():
        raise ValueError(f"zone must be a non-empty string, got {zone!r}")
    return zone


def _check_base_url(base_url: str) -> str:
    # The URL may come from a setting; only http(s) is a web API (urllib would also open file:// and ftp://).
    parts = urllib.parse.urlsplit(base_url)
    if parts.scheme not in ("http", "https") or not parts.netloc:
        raise ValueError(f"base_url must be an http:// or https:// URL, got {base_url!r}")
    return base_url.rstrip("/")


def _check_timeout(timeout_s: float) -> float:
    if isinstance(timeout_s, bool) or not isinstance(timeout_s, int | float) or not timeout_s > 0:
        raise ValueError(f"timeout_s must be a positive number of seconds, got {timeout_s!r}")
    return float(timeout_s)
