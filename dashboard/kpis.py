"""The dashboard's KPIs, one definition each: a label that says whether idle energy is in ("incl. idle",
"excl. idle") and the short explanation shown on hover. Every page names a KPI through this table, so one label
never means two things."""

from __future__ import annotations

from typing import NamedTuple


class Kpi(NamedTuple):
    label: str
    help: str


KPIS: dict[str, Kpi] = {
    "energy_per_inference_excl_idle": Kpi(
        "Energy per inference, excl. idle",
        "IT energy of the batches that served requests, divided by the requests; idle time between batches "
        "is left out.",
    ),
    "co2e_per_1000_incl_idle": Kpi(
        "CO2e per 1,000 inferences, incl. idle",
        "Location-based emissions of all energy (batches and idle time, at the facility with its PUE) for "
        "every thousand requests served: what the service costs as it runs.",
    ),
    "co2e_per_1000_excl_idle": Kpi(
        "CO2e per 1,000 inferences, excl. idle",
        "Location-based emissions of the batches that served this model's requests only, for every thousand "
        "of its requests; idle time belongs to no model and is left out.",
    ),
    "idle_share": Kpi(
        "of which idle",
        "Energy of the devices while no batch ran (counted, never attributed to a model).",
    ),
}
