"""Reads behind the dashboard pages. Sums come from the hourly rollups (the same selectors the reports use);
latency and batch sizes from the ledger's last hour of traffic (bounded by the (organization, time) index)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from decimal import Decimal
from typing import Any

from django.core.cache import cache
from django.db.models import Q, Sum

from carbon.models import ContractualInstrument, HourlyRollup
from carbon.selectors import grid_signal, rollup_series, rollup_totals, rollups_of
from tenancy.models import Site

J_PER_KWH = 3.6e6


def _figures(totals: dict[str, Any]) -> dict[str, Any]:
    energy_j = totals["energy_uj"] / 1e6
    request_j = (totals["energy_uj"] - totals["idle_uj"]) / 1e6
    requests = totals["requests"]
    location = float(totals["location_co2e_g"])
    return {
        "requests": requests,
        "energy_kwh": energy_j / J_PER_KWH,
        "idle_kwh": totals["idle_uj"] / 1e6 / J_PER_KWH,
        "location_t": location / 1e6,
        "location_g": totals["location_co2e_g"],
        "market_g": totals["market_co2e_g"],
        "market_t": float(totals["market_co2e_g"]) / 1e6,
        "j_per_inference": request_j / requests if requests else None,
        "g_per_1000": location * 1000 / requests if requests else None,
        "measured_share": totals["measured_uj"] / totals["energy_uj"] if totals["energy_uj"] else None,
    }


def overview(
    organization_id: int,
    now: datetime,
    start: datetime,
    end: datetime,
    *,
    model: str | None = None,
    site_id: int | None = None,
) -> dict[str, Any]:
    """Today, this month, this year, and the range [start, end) with one point per UTC day (every day of the
    range, zero where nothing ran), of one model and one site when given: the reports' rollup selectors."""
    now = now.astimezone(UTC)
    today = now.replace(hour=0, minute=0, second=0, microsecond=0)
    month = today.replace(day=1)
    year = month.replace(month=1)
    window_end = now.replace(minute=0, second=0, microsecond=0) + timedelta(hours=1)
    windows = {"today": today, "this month": month, "this year": year}
    filters: dict[str, Any] = {"model": model, "site_id": site_id}
    by_day = {p["t"].astimezone(UTC): p for p in rollup_series(organization_id, start, end, "day", **filters)}
    days = []
    day = start
    while day < end:
        days.append(day)
        day += timedelta(days=1)
    empty = {"energy_uj": 0, "idle_uj": 0, "location_co2e_g": Decimal(0), "market_co2e_g": Decimal(0)}
    daily = [by_day.get(d, empty) for d in days]
    return {
        "windows": {
            name: _figures(rollup_totals(organization_id, since, window_end, **filters))
            for name, since in windows.items()
        },
        "range": _figures(rollup_totals(organization_id, start, end, **filters)),
        "daily_labels": [d.strftime("%d %b") for d in days],
        "daily_request_kwh": [(p["energy_uj"] - p["idle_uj"]) / 1e6 / J_PER_KWH for p in daily],
        "daily_idle_kwh": [p["idle_uj"] / 1e6 / J_PER_KWH for p in daily],
        "daily_location_g": [p["location_co2e_g"] for p in daily],
        "daily_market_g": [p["market_co2e_g"] for p in daily],
    }


MODEL_CHOICES_CACHE_S = 300


def filter_choices(organization_id: int) -> tuple[list[str], list[tuple[int, str]]]:
    """The models the organization's rollups hold and its sites, for the dashboard's filters. The models
    read all of the organization's rollups (its index, then the rows): kept a few minutes per process, as a
    new model appears in the rollups only once its traffic is rolled up anyway."""

    def models() -> list[str]:
        return list(
            HourlyRollup.objects.filter(organization_id=organization_id)
            .exclude(model="")
            .values_list("model", flat=True)
            .distinct()
            .order_by("model")
        )

    names = cache.get_or_set(f"dashboard:models:{organization_id}", models, MODEL_CHOICES_CACHE_S)
    sites = Site.objects.filter(organization_id=organization_id).order_by("name").values_list("pk", "name")
    return list(names), list(sites)


def buckets(start: datetime, end: datetime) -> tuple[timedelta, str]:
    """The step of a chart over [start, end): hours up to two weeks, else days; and its label format."""
    if end - start <= timedelta(days=14):
        return timedelta(hours=1), "%d %b %H:00"
    return timedelta(days=1), "%d %b"


def device_timelines(
    organization_id: int,
    start: datetime,
    end: datetime,
    *,
    model: str | None = None,
    site_id: int | None = None,
) -> list[dict[str, Any]]:
    """Per device: batch (request) energy and idle energy, kWh, per hour (or per day over more than two
    weeks), of one model and one site when given."""
    step, label_format = buckets(start, end)
    rows = (
        rollups_of(organization_id, start, end, model=model, site_id=site_id)
        .values("device_id", "method", "hour")
        .annotate(
            busy=Sum("energy_uj", filter=Q(kind="request")),
            idle=Sum("energy_uj", filter=Q(kind="idle")),
        )
        .order_by("device_id", "hour")
    )
    devices: dict[str, dict[str, Any]] = {}
    hours = []
    h = start
    while h < end:
        hours.append(h)
        h += step
    index = {hour: i for i, hour in enumerate(hours)}
    for row in rows:
        d = devices.setdefault(
            row["device_id"],
            {
                "device_id": row["device_id"],
                "method": row["method"],
                "busy": [0.0] * len(hours),
                "idle": [0.0] * len(hours),
            },
        )
        hour = row["hour"].astimezone(UTC)
        i = index.get(hour if step == timedelta(hours=1) else hour.replace(hour=0))
        if i is not None:
            d["busy"][i] += (row["busy"] or 0) / 1e6 / J_PER_KWH
            d["idle"][i] += (row["idle"] or 0) / 1e6 / J_PER_KWH
    for d in devices.values():
        d["labels"] = [hr.strftime(label_format) for hr in hours]
        d["busy_kwh"] = sum(d["busy"])
        d["idle_kwh"] = sum(d["idle"])
    return list(devices.values())


def carbon_page(
    organization_id: int,
    start: datetime,
    end: datetime,
    *,
    model: str | None = None,
    site_id: int | None = None,
) -> dict[str, Any]:
    """Intensity by site and hour (CO2e / facility energy of the rollups), Scope 2 both ways by site, and the
    carbon-aware mode of each of the organization's sites now (the same selector the gateway reads)."""
    sites = {s.pk: s for s in Site.objects.filter(organization_id=organization_id)}
    step, label_format = buckets(start, end)
    rows = (
        rollups_of(organization_id, start, end, model=model, site_id=site_id)
        .values("site_id", "hour", "pue", "factor_match", "location_factor_id")
        .annotate(uj=Sum("energy_uj"), location=Sum("location_co2e_g"), market=Sum("market_co2e_g"))
        .order_by("site_id", "hour")
    )
    by_site: dict[int | None, dict[str, Any]] = {}
    for row in rows:
        site = sites.get(row["site_id"]) if row["site_id"] is not None else None
        entry = by_site.setdefault(
            row["site_id"],
            {
                "site": site,
                "hours": [],
                "intensity": [],
                "location_g": Decimal(0),
                "market_g": Decimal(0),
                "kwh": 0.0,
                "buckets": {},
            },
        )
        facility_kwh = row["uj"] / 1e6 / J_PER_KWH * float(row["pue"] or 1)
        entry["kwh"] += facility_kwh
        entry["location_g"] += row["location"] or 0
        entry["market_g"] += row["market"] or 0
        if facility_kwh > 0 and row["location"] is not None:
            hour = row["hour"].astimezone(UTC)
            bucket = (hour if step == timedelta(hours=1) else hour.replace(hour=0)).strftime(label_format)
            kwh, grams = entry["buckets"].get(bucket, (0.0, 0.0))
            entry["buckets"][bucket] = (kwh + facility_kwh, grams + float(row["location"]))
    for entry in by_site.values():
        # Intensity of a bucket: its CO2e over its facility energy (rows come in time order).
        entry["hours"] = list(entry["buckets"])
        entry["intensity"] = [grams / kwh for kwh, grams in entry["buckets"].values()]
    instruments = list(ContractualInstrument.objects.filter(organization_id=organization_id))
    now = datetime.now(UTC)
    signals = [(site, grid_signal(site, now)) for site in sorted(sites.values(), key=lambda s: s.name)]
    return {
        "signals": signals,
        "sites": list(by_site.values()),
        "scopes": _scopes(list(by_site.values())),
        "instruments": instruments,
        "totals": rollup_totals(organization_id, start, end, model=model, site_id=site_id),
    }


SCOPES = (
    ("scope2", "Scope 2: owned and colocated sites", "ISO 14064-1 Category 2"),
    ("scope3_cat1", "Scope 3 category 1: cloud inference", "ISO 14064-1 Category 4"),
)


def _scopes(entries: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The sites' figures by category, each with its own total: Scope 2 is the owned and colocated sites
    only; cloud inference is Scope 3 category 1. Energy at no site is in neither (it is not valued)."""
    scopes = []
    for key, label, iso in SCOPES:
        members = [e for e in entries if e["site"] is not None and e["site"].scope_category == key]
        scopes.append(
            {
                "key": key,
                "label": label,
                "iso_category": iso,
                "sites": members,
                "kwh": sum(e["kwh"] for e in members),
                "location_g": sum((e["location_g"] for e in members), Decimal(0)),
                "market_g": sum((e["market_g"] for e in members), Decimal(0)),
            }
        )
    return scopes
