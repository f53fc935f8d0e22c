"""Reads behind the dashboard pages. Sums come from the hourly rollups (the same selectors the reports use);
latency and batch sizes from the ledger's last hour of traffic (bounded by the (organization, time) index)."""

from __future__ import annotations

from collections import defaultdict
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from typing import Any

from django.db.models import Avg, Count, Max, Q, Sum

from carbonledger.carbon.selectors import grid_signal, rollup_series, rollup_totals
from carbonledger.models import ContractualInstrument, HourlyRollup, LedgerRequest, Site

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


def last_traffic_ns(organization_id: int) -> int | None:
    return LedgerRequest.objects.filter(organization_id=organization_id).aggregate(t=Max("received_ns"))["t"]


def model_stats(organization_id: int) -> dict[str, Any]:
    """Per model, version and the variant that served it (fp32, int8...) over the last hour of traffic:
    throughput, queue and compute latency, batch sizes; J per inference per model over the last 30 days of
    rollups."""
    latest = last_traffic_ns(organization_id)
    if latest is None:
        return {"window_end": None, "models": [], "batch_sizes": {}, "energy": []}
    since = latest - 3600 * 10**9
    recent = LedgerRequest.objects.filter(organization_id=organization_id, received_ns__gt=since)
    models = list(
        recent.values("model", "version", "variant")
        .annotate(
            requests=Count("id"),
            queue_ms=Avg("queue_ns") / 1e6,
            compute_ms=Avg("compute_ns") / 1e6,
            max_queue_ms=Max("queue_ns") / 1e6,
        )
        .order_by("model", "version", "variant")
    )
    for m in models:
        m["per_second"] = m["requests"] / 3600
    sizes: dict[str, dict[int, int]] = defaultdict(lambda: defaultdict(int))
    per_batch = recent.values("model", "batch_id").annotate(n=Count("id"))
    for row in per_batch:
        sizes[row["model"]][row["n"]] += 1
    end = datetime.fromtimestamp(latest / 1e9, UTC)
    energy = list(
        HourlyRollup.objects.filter(
            organization_id=organization_id, kind="request", hour__gte=end - timedelta(days=30)
        )
        .values("model")
        .annotate(requests=Sum("requests"), uj=Sum("energy_uj"), co2e=Sum("location_co2e_g"))
        .order_by("model")
    )
    for e in energy:
        e["j_per_inference"] = e["uj"] / 1e6 / e["requests"] if e["requests"] else None
        e["g_per_1000"] = float(e["co2e"] or 0) * 1000 / e["requests"] if e["requests"] else None
    return {
        "window_end": end,
        "models": models,
        "batch_sizes": {m: dict(sorted(s.items())) for m, s in sorted(sizes.items())},
        "energy": energy,
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
