"""Inline SVG charts (no JavaScript, no external assets), shared by the dashboard and the reports so a page
and a PDF draw the same series the same way."""

from __future__ import annotations

from collections.abc import Sequence
from html import escape

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
    if value == 0:
        return "0"
    if abs(value) >= 100:
        return f"{value:,.0f}"
    return f"{value:.3g}"
