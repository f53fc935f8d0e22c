"""A job's emissions as :func:`jobs.selectors.job_emissions` computes them, and the one place they become the
dict that the API's job detail and the dashboard's job page show."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime
from decimal import Decimal
from typing import Any, Literal

from carbon import co2e

#: CO2e figures of a job are small (a few requests): shown to the microgram, half-even.
CO2E_QUANTUM_G = Decimal("0.000001")
COUNTERFACTUAL_LABEL = (
    "estimate outside the inventory: the same energy had the job run at submission, valued at the "
    "submission hour's factor and PUE; not a reported emission"
)
METHOD = (
    "location-based (GHG Protocol Scope 2): IT energy x PUE of the site at the hour x grid factor of the zone "
    "and hour"
)

EmissionsStatus = Literal["pending", "not available", "final"]


def _g(value: Decimal) -> str:
    return str(co2e.report_g(value, CO2E_QUANTUM_G))


@dataclass(frozen=True)
class JobFigures:
    """The figures of a job whose energy is final: the inventory's (``actual``) and the counterfactual
    estimate of the same energy at the submission hour, outside the inventory."""

    requests: int  # answered
    energy_uj: int  # IT energy, adjusting entries included
    actual: co2e.LocationResult
    counterfactual: co2e.LocationResult
    submission_hour: datetime
    site_names: Mapping[str, str]  # by the core's site id (the site's pk as text)
    notes: tuple[str, ...]

    @property
    def avoided_co2e_g(self) -> Decimal:
        """What the chosen window avoided (negative: the run emitted more than at submission)."""
        return self.counterfactual.total.co2e_g - self.actual.total.co2e_g

    def factors_used(self) -> list[co2e.Factor]:
        """Each factor either figure used, once, in the order first used."""
        uses = (*self.actual.factors_used, *self.counterfactual.factors_used)
        return list({u.factor.factor_id: u.factor for u in uses}.values())


@dataclass(frozen=True)
class JobEmissions:
    """A job's emissions: ``final`` with its figures, else ``pending`` or ``not available`` and why."""

    status: EmissionsStatus
    reason: str = ""  # why not final
    failed_note: str = ""  # the job failed part way: how many of its requests were answered
    figures: JobFigures | None = None

    @classmethod
    def pending(cls, reason: str, failed_note: str = "") -> JobEmissions:
        return cls("pending", reason, failed_note)

    @classmethod
    def not_available(cls, reason: str, failed_note: str = "") -> JobEmissions:
        return cls("not available", reason, failed_note)

    def as_dict(self) -> dict[str, Any]:
        """The emissions as the API and the dashboard show them, the counterfactual estimate included."""
        partial: dict[str, Any] = {"partial": True, "note": self.failed_note} if self.failed_note else {}
        if self.status == "pending":
            return {"status": "pending", "energy": "pending", "reason": self.reason, **partial}
        if self.figures is None:
            return {"status": self.status, "reason": self.reason, **partial}
        return {**_final(self.figures), **partial}

    def parts(self) -> tuple[dict[str, Any], dict[str, Any] | None]:
        """The emissions without the counterfactual estimate, and the estimate (None when not final): the API
        and the dashboard show them apart, the estimate being outside the inventory."""
        body = self.as_dict()
        counterfactual = body.pop("counterfactual", None)
        return body, counterfactual


def _final(figures: JobFigures) -> dict[str, Any]:
    actual, names = figures.actual, figures.site_names
    return {
        "status": "final",
        "energy": "final",
        "method": METHOD,
        "requests": figures.requests,
        "energy_j": str(Decimal(figures.energy_uj).scaleb(-6)),
        "facility_energy_kwh": str(actual.total.energy_kwh.quantize(Decimal("1E-12"))),
        "co2e_g": _g(actual.total.co2e_g),
        "uncertainty_g": _g(actual.total.uncertainty_g),
        "hours": [
            {
                "hour": line.consumption.start.isoformat(),
                "site": names[line.consumption.site_id],
                "zone": line.consumption.zone,
                "energy_j": str(line.consumption.energy_j),
                "pue": str(line.consumption.pue),
                "intensity_g_per_kwh": str(line.choice.factor.intensity_g_per_kwh),
                "factor_id": line.choice.factor.factor_id,
                "factor_match": line.choice.match,
                "factor_notes": list(line.choice.notes),
                "co2e_g": _g(line.co2e_g),
            }
            for line in actual.lines
        ],
        "factors": [
            {"factor_id": f.factor_id, "source": f.source, "licence": f.licence, "basis": f.basis}
            for f in figures.factors_used()
        ],
        "notes": list(figures.notes),
        "counterfactual": _counterfactual(figures),
    }


def _counterfactual(figures: JobFigures) -> dict[str, Any]:
    return {
        "label": COUNTERFACTUAL_LABEL,
        "estimate": True,
        "in_inventory": False,
        "hour": figures.submission_hour.isoformat(),
        "lines": [
            {
                "site": figures.site_names[line.consumption.site_id],
                "zone": line.consumption.zone,
                "energy_j": str(line.consumption.energy_j),
                "pue": str(line.consumption.pue),
                "intensity_g_per_kwh": str(line.choice.factor.intensity_g_per_kwh),
                "factor_id": line.choice.factor.factor_id,
                "factor_match": line.choice.match,
                "co2e_g": _g(line.co2e_g),
            }
            for line in figures.counterfactual.lines
        ],
        "co2e_g": _g(figures.counterfactual.total.co2e_g),
        "avoided_co2e_g": _g(figures.avoided_co2e_g),
    }
