"""Reads behind the dashboard pages. Sums come from the hourly rollups (the same selectors the reports use);
latency and batch sizes from the ledger's last hour of traffic (bounded by the (organization, time) index)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from decimal import Decimal
from typing import Any

from django.db.models import Q, Sum

from carbon.models import ContractualInstrument, HourlyRollup
from carbon.selectors import grid_signal, rollup_series, rollup_totals
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
        "market_t": float(totals["market_co2e_g"]) / 1e6,
        "j_per_inference": request_j / requests if requests else None,
        "g_per_1000": location * 1000 / requests if requests else None,
        "measured_share": totals["measured_uj"] / totals["energy_uj"] if totals["energy_uj"] else None,
    }


def overview(organization_id: int, now: datetime) -> dict[str, Any]:
    now = now.astimezone(UTC)
    today = now.replace(hour=0, minute=0, second=0, microsecond=0)
    month = today.replace(day=1)
    year = month.replace(month=1)
    end = now.replace(minute=0, second=0, microsecond=0) + timedelta(hours=1)
    windows = {"today": today, "this month": month, "this year": year}
    daily = rollup_series(organization_id, end - timedelta(days=30), end, "day")
    return {
        "windows": {
            name: _figures(rollup_totals(organization_id, start, end)) for name, start in windows.items()
        },
        "daily": daily,
        "daily_labels": [p["t"].strftime("%m-%d") for p in daily],
        "daily_energy_kwh": [p["energy_uj"] / 1e6 / J_PER_KWH for p in daily],
        "daily_idle_kwh": [p["idle_uj"] / 1e6 / J_PER_KWH for p in daily],
        "daily_location_kg": [float(p["location_co2e_g"]) / 1000 for p in daily],
        "daily_market_kg": [float(p["market_co2e_g"]) / 1000 for p in daily],
    }


def device_timelines(organization_id: int, start: datetime, end: datetime) -> list[dict[str, Any]]:
    """Per device: hourly batch (request) energy and idle energy, kWh."""
    rows = (
        HourlyRollup.objects.filter(organization_id=organization_id, hour__gte=start, hour__lt=end)
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
        h += timedelta(hours=1)
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
        i = index.get(row["hour"].astimezone(UTC))
        if i is not None:
            d["busy"][i] += (row["busy"] or 0) / 1e6 / J_PER_KWH
            d["idle"][i] += (row["idle"] or 0) / 1e6 / J_PER_KWH
    for d in devices.values():
        d["labels"] = [hr.strftime("%d %Hh") for hr in hours]
        d["busy_kwh"] = sum(d["busy"])
        d["idle_kwh"] = sum(d["idle"])
    return list(devices.values())


def carbon_page(organization_id: int, start: datetime, end: datetime) -> dict[str, Any]:
    """Intensity by site and hour (CO2e / facility energy of the rollups), Scope 2 both ways by site, and the
    carbon-aware mode of each of the organization's sites now (the same selector the gateway reads)."""
    sites = {s.pk: s for s in Site.objects.filter(organization_id=organization_id)}
    rows = (
        HourlyRollup.objects.filter(organization_id=organization_id, hour__gte=start, hour__lt=end)
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
            },
        )
        facility_kwh = row["uj"] / 1e6 / J_PER_KWH * float(row["pue"] or 1)
        entry["kwh"] += facility_kwh
        entry["location_g"] += row["location"] or 0
        entry["market_g"] += row["market"] or 0
        if facility_kwh > 0 and row["location"] is not None:
            entry["hours"].append(row["hour"].astimezone(UTC).strftime("%d %Hh"))
            entry["intensity"].append(float(row["location"]) / facility_kwh)
    instruments = list(ContractualInstrument.objects.filter(organization_id=organization_id))
    now = datetime.now(UTC)
    signals = [(site, grid_signal(site, now)) for site in sorted(sites.values(), key=lambda s: s.name)]
    return {
        "signals": signals,
        "sites": list(by_site.values()),
        "instruments": instruments,
        "totals": rollup_totals(organization_id, start, end),
    }
