"""The statement a report makes when synthetic records (generated demo data, marked ``synthetic`` in the
ledger) are among the ones it counts: their share of the energy and of the requests. None when there are none,
so a report of real traffic says nothing of the kind."""

from __future__ import annotations

from decimal import ROUND_HALF_EVEN, Decimal
from typing import Any

from carbon import co2e
from carbon.selectors import CarbonSummary

_SHARE = Decimal("0.0001")


def synthetic_statement(summary: CarbonSummary) -> dict[str, Any] | None:
    rows = summary.rows.values()
    synthetic_uj = sum(r.energy_uj for r in rows if r.synthetic)
    synthetic_requests = sum(r.requests for r in rows if r.synthetic)
    if not synthetic_uj and not synthetic_requests:
        return None
    share = Decimal(synthetic_uj) / Decimal(summary.energy_uj) if summary.energy_uj else Decimal(0)
    share = share.quantize(_SHARE, rounding=ROUND_HALF_EVEN)
    kwh = co2e.report_kwh(Decimal(synthetic_uj).scaleb(-6) / co2e.J_PER_KWH)
    return {
        "energy_share": format(share, "f"),
        "energy_kwh": format(kwh, "f"),
        "requests": synthetic_requests,
        "statement": (
            f"This report includes synthetic records: generated demo traffic, marked synthetic in the ledger, "
            f"with {synthetic_requests} of the period's {summary.requests} requests and their share of the IT "
            "energy below. They are not measured and stand for no real device or emissions; their energy and "
            "emissions are in the totals as generated."
        ),
    }
