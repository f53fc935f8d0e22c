"""Rendering a frozen snapshot into the report's files. Pure functions of the snapshot: the same snapshot
gives byte-identical CSV and JSON, and the same HTML (hence the same numbers in the PDF)."""

from __future__ import annotations

import csv
import io
from decimal import Decimal
from typing import Any

from django.template.loader import render_to_string

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
    """A bar chart of the monthly trend, location- and market-based t CO2e side by side, as inline SVG."""
    if not trend:
        return (
            f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="40">'
            '<text x="0" y="20" font-size="11">No rolled-up data in the trend window.</text></svg>'
        )
    top = max(max(Decimal(p["location_co2e_t"]), Decimal(p["market_co2e_t"])) for p in trend)
    scale_top = top if top > 0 else Decimal(1)
    left, bottom, plot_h = 84, height - 30, height - 50
    slot = (width - left - 10) / len(trend)
    bar = max(slot * 0.35, 1.0)
    parts = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
        f'viewBox="0 0 {width} {height}" font-family="sans-serif" font-size="9">',
        f'<line x1="{left}" y1="{bottom}" x2="{width - 10}" y2="{bottom}" stroke="#333"/>',
        f'<text x="{left - 4}" y="{bottom - plot_h + 4}" text-anchor="end">{_short(top)}</text>',
        f'<text x="{left - 4}" y="{bottom}" text-anchor="end">0</text>',
        f'<text x="4" y="{bottom - plot_h / 2}" transform="rotate(-90 10 {bottom - plot_h / 2})">t CO2e</text>',
    ]
    for i, point in enumerate(trend):
        x = left + i * slot + slot * 0.1
        for j, (key, colour) in enumerate((("location_co2e_t", "#2f6f4f"), ("market_co2e_t", "#8fbc8f"))):
            h = float(Decimal(point[key]) / scale_top) * plot_h
            parts.append(
                f'<rect x="{x + j * bar:.1f}" y="{bottom - h:.1f}" width="{bar:.1f}" height="{h:.1f}" '
                f'fill="{colour}"><title>{point["month"]} {key.split("_")[0]}: {point[key]} t</title></rect>'
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


def _short(value: Decimal) -> str:
    return format(value.normalize(), "f") if value < 1000 else f"{value:,.0f}"


def render_html(snapshot: dict[str, Any]) -> str:
    """The report as HTML (A4 print CSS), the PDF's source."""
    return render_to_string(
        "reports/report.html",
        {
            "s": snapshot,
            "r": snapshot["results"],
            "trend_svg": trend_svg(snapshot["results"]["monthly_trend"]),
        },
    )
