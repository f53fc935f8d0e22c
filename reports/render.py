"""Rendering a frozen snapshot into the report's files. Pure functions of the snapshot: the same snapshot
gives byte-identical CSV and JSON, and the same HTML (hence the same numbers in the PDF)."""

from __future__ import annotations

import csv
import io
from decimal import Decimal
from html import escape
from typing import Any

from django.template.loader import render_to_string

from carbon import display
from reports.snapshot import canonical_json

CSV_COLUMNS = (
    ("site", "site"),
    ("zone", "zone"),
    ("iso_category", "iso_14064_category"),
    ("model", "model"),
    ("month", "month (UTC, YYYY-MM)"),
    ("scope2_method", "scope2_method (location|market)"),
    ("metering_method", "metering_method"),
    ("requests", "requests (count)"),
    ("it_energy_kwh", "it_energy (kWh)"),
    ("idle_energy_kwh", "idle_energy (kWh)"),
    ("facility_energy_kwh", "facility_energy (kWh)"),
    ("co2e_g", "co2e (g)"),
    ("co2e_t", "co2e (t)"),
)


def render_json(snapshot: dict[str, Any]) -> bytes:
    return canonical_json(snapshot) + b"\n"


def render_csv(snapshot: dict[str, Any]) -> bytes:
    """One line per site x model x month x Scope 2 method, units in the header."""
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    writer.writerow([header for _, header in CSV_COLUMNS])
    for row in snapshot["results"]["breakdown"]:
        for method in ("location", "market"):
            co2e_g = Decimal(row[f"{method}_co2e_g"])
            values = {
                **row,
                "scope2_method": method,
                "co2e_g": row[f"{method}_co2e_g"],
                "co2e_t": format(co2e_g.scaleb(-6), "f"),
            }
            writer.writerow([values[key] for key, _ in CSV_COLUMNS])
    return out.getvalue().encode("utf-8")


def trend_svg(trend: list[dict[str, Any]], width: int = 640, height: int = 220) -> str:
    """A bar chart of the monthly trend, location- and market-based CO2e side by side, as inline SVG; its
    labels through the one formatter (a unit chosen by the largest bar)."""
    if not trend:
        return (
            f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="40">'
            '<text x="0" y="20" font-size="11">No rolled-up data in the trend window.</text></svg>'
        )
    keys = (("location_co2e_t", "#2f6f4f", "location-based"), ("market_co2e_t", "#8fbc8f", "market-based"))
    top = max(max(Decimal(p[key]) for key, _, _ in keys) for p in trend)
    scale_top = top if top > 0 else Decimal(1)
    left, bottom, plot_h = 84, height - 30, height - 50
    slot = (width - left - 10) / len(trend)
    bar = max(slot * 0.35, 1.0)
    parts = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
        f'viewBox="0 0 {width} {height}" font-family="sans-serif" font-size="9">',
        f'<line x1="{left}" y1="{bottom}" x2="{width - 10}" y2="{bottom}" stroke="#333"/>',
        f'<text x="{left - 4}" y="{bottom - plot_h + 4}" text-anchor="end">{escape(display.mass_t(top))}</text>',
        f'<text x="{left - 4}" y="{bottom}" text-anchor="end">0</text>',
        f'<text x="4" y="{bottom - plot_h / 2}" transform="rotate(-90 10 {bottom - plot_h / 2})">CO2e</text>',
    ]
    for i, point in enumerate(trend):
        x = left + i * slot + slot * 0.1
        for j, (key, colour, label) in enumerate(keys):
            h = float(Decimal(point[key]) / scale_top) * plot_h
            parts.append(
                f'<rect x="{x + j * bar:.1f}" y="{bottom - h:.1f}" width="{bar:.1f}" height="{h:.1f}" '
                f'fill="{colour}"><title>{point["month"]} {label}: {escape(display.mass_t(point[key]))}</title></rect>'
            )
        parts.append(
            f'<text x="{x + bar:.1f}" y="{bottom + 12}" text-anchor="middle">{point["month"]}</text>'
        )
    parts.append(
        f'<rect x="{width - 190}" y="4" width="8" height="8" fill="#2f6f4f"/>'
        f'<text x="{width - 178}" y="12">location-based</text>'
        f'<rect x="{width - 100}" y="4" width="8" height="8" fill="#8fbc8f"/>'
        f'<text x="{width - 88}" y="12">market-based</text></svg>'
    )
    return "".join(parts)


def factor_table(factors: list[dict[str, Any]]) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """The factors as the PDF lists them: each annual factor on its own row, and each hourly series summarised
    on one row per zone, source and version (hours covered, first and last hour, lowest, mean and highest
    intensity, the version's file hash). A month of hourly factors is hundreds of rows that no reader goes
    through; the JSON keeps every one of them."""
    annual = [f for f in factors if f["granularity"] != "hour"]
    series: dict[tuple[str, str, int], list[dict[str, Any]]] = {}
    for factor in factors:
        if factor["granularity"] == "hour":
            series.setdefault((factor["zone"], factor["source"], factor["version"]), []).append(factor)
    rows: list[dict[str, Any]] = []
    for _, hours in sorted(series.items(), key=lambda item: item[0]):
        values = [Decimal(f["intensity_g_per_kwh"]) for f in hours]
        starts = sorted(f["period_start"] for f in hours)
        first = hours[0]
        rows.append(
            {
                **{key: first[key] for key in ("zone", "source", "url", "licence", "basis", "version")},
                "version_name": first.get("version_name", ""),
                "version_sha256": first.get("version_sha256", ""),
                "hours": len(hours),
                "first_hour": starts[0],
                "last_hour": starts[-1],
                "min": format(min(values), "f"),
                "mean": format(sum(values, Decimal(0)) / len(values), "f"),
                "max": format(max(values), "f"),
                "estimated": any(f.get("estimated") for f in hours),
            }
        )
    return annual, rows


def render_html(snapshot: dict[str, Any]) -> str:
    """The report as HTML (A4 print CSS), the PDF's source."""
    annual, series = factor_table(snapshot["inputs"]["factors"])
    return render_to_string(
        "reports/report.html",
        {
            "s": snapshot,
            "r": snapshot["results"],
            "trend_svg": trend_svg(snapshot["results"]["monthly_trend"]),
            "annual_factors": annual,
            "factor_series": series,
        },
    )
