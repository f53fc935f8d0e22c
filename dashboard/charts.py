"""Charts: inline SVG (no JavaScript, no external assets) for the reports' PDF, and the data of the
dashboard's charts, which the browser draws with uPlot; both from the same series and the one formatter."""

from __future__ import annotations

from collections.abc import Sequence
from decimal import Decimal
from html import escape
from typing import Any

from carbon import display
from carbon.display import Number

PALETTE = ("#2f6f4f", "#8fbc8f", "#c9a227", "#5b7fa6", "#a65b5b", "#7a5ba6")


def bar_chart(
    labels: Sequence[str],
    series: Sequence[tuple[str, Sequence[float]]],
    *,
    unit: str,
    width: int = 720,
    height: int = 220,
    stacked: bool = False,
) -> str:
    """Grouped (or stacked) bars: one group per label, one bar per series."""
    if not labels or not series:
        return f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="30"><text x="0" y="18" font-size="11">No data in this window.</text></svg>'
    totals = [sum(values[i] for _, values in series) for i in range(len(labels))]
    top = max(totals) if stacked else max(max(values) for _, values in series)
    top = top if top > 0 else 1.0
    left, bottom, plot_h = 84, height - 34, height - 60
    slot = (width - left - 10) / len(labels)
    bar = slot * 0.8 if stacked else slot * 0.8 / len(series)
    out = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" viewBox="0 0 {width} {height}" '
        'font-family="sans-serif" font-size="9" role="img">',
        f'<line x1="{left}" y1="{bottom}" x2="{width - 10}" y2="{bottom}" stroke="#333"/>',
        f'<text x="{left - 4}" y="{bottom - plot_h + 4}" text-anchor="end">{_fmt(top)}</text>',
        f'<text x="{left - 4}" y="{bottom}" text-anchor="end">0</text>',
        f'<text x="{left - 4}" y="{bottom - plot_h - 8}" text-anchor="end">{escape(unit)}</text>',
    ]
    every = max(1, len(labels) // 12)
    for i, label in enumerate(labels):
        x = left + i * slot + slot * 0.1
        base = float(bottom)
        for j, (name, values) in enumerate(series):
            h = values[i] / top * plot_h
            colour = PALETTE[j % len(PALETTE)]
            bx = x if stacked else x + j * bar
            by = base - h if stacked else bottom - h
            out.append(
                f'<rect x="{bx:.1f}" y="{by:.1f}" width="{max(bar, 0.5):.1f}" height="{h:.1f}" fill="{colour}">'
                f"<title>{escape(label)} {escape(name)}: {_fmt(values[i])} {escape(unit)}</title></rect>"
            )
            if stacked:
                base -= h
        if i % every == 0:
            out.append(
                f'<text x="{x + slot * 0.4:.1f}" y="{bottom + 12}" text-anchor="middle">{escape(label)}</text>'
            )
    legend_x = left
    for j, (name, _) in enumerate(series):
        out.append(
            f'<rect x="{legend_x}" y="{height - 12}" width="8" height="8" fill="{PALETTE[j % len(PALETTE)]}"/>'
            f'<text x="{legend_x + 11}" y="{height - 5}">{escape(name)}</text>'
        )
        legend_x += 14 + 6 * len(name)
    out.append("</svg>")
    return "".join(out)


def _fmt(value: float) -> str:
    # Through the one formatter: separators, never E-notation (a tiny daily figure is 0.0000123, not 1.23e-05).
    return display.number(value, 3)


def chart(
    key: str,
    title: str,
    labels: Sequence[str],
    series: Sequence[tuple[str, Sequence[Number]]],
    *,
    quantity: str,
    stacked: bool = False,
    x_title: str = "Day (UTC)",
) -> dict[str, Any]:
    """A chart for the browser (drawn by uPlot, ``static/carbonledger/charts.js``): every series already in the
    one unit the formatter picks for the largest value (``quantity``: ``mass_g`` with values in grams,
    ``energy_kwh`` in kWh, or a fixed unit such as ``g/kWh``), each value with its printed text for the
    tooltip and the table that screen readers read instead of the canvas. The browser only draws."""
    values = [v for _, vs in series for v in vs]
    if quantity in display.SERIES_UNITS:
        unit, scale = display.series_unit(values, quantity)
    else:
        unit, scale = quantity, Decimal(1)
    drawn = [
        {
            "name": name,
            "colour": PALETTE[i % len(PALETTE)],
            "values": [float(display.to_decimal(v) / scale) for v in vs],
            "texts": [display.in_unit(v, scale, unit) for v in vs],
        }
        for i, (name, vs) in enumerate(series)
    ]
    return {
        "id": f"chart-{key}",
        "title": title,
        "unit": unit,
        "x_title": x_title,
        "stacked": stacked,
        "labels": list(labels),
        "series": drawn,
        "rows": [{"label": label, "texts": [s["texts"][i] for s in drawn]} for i, label in enumerate(labels)],
    }
