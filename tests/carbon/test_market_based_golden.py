"""Golden file of carbon.co2e.market_based: fixed inputs, the whole result serialized, compared byte for byte.

The file pins every line, total, instrument use, exclusion, disclosure and error message of the market-based
method, so a refactoring that changes any of them (a digit, an order, a word) fails here. After a deliberate
change of results, regenerate and review the diff:

    UPDATE_GOLDEN=1 .venv/bin/python -m pytest tests/carbon/test_market_based_golden.py
"""

from __future__ import annotations

import dataclasses
import json
import os
from collections.abc import Callable, Iterable
from datetime import UTC, datetime
from decimal import Decimal
from pathlib import Path
from typing import Any

from carbon.co2e import (
    RELEVANT_CRITERIA,
    Consumption,
    Factor,
    Instrument,
    MarketResult,
    ResidualMix,
    ScopeCategory,
    market_based,
)

GOLDEN = Path(__file__).resolve().parents[1] / "golden" / "market_based.json"
KWH_J = Decimal(3_600_000)
LATEST = "Ember (2026), with major processing by Our World in Data"


def at(year: int, month: int, day: int, hour: int = 0, minute: int = 0) -> datetime:
    return datetime(year, month, day, hour, minute, tzinfo=UTC)


# ---------------------------------------------------------------------------------------------------------
# Inputs
# ---------------------------------------------------------------------------------------------------------


def consumptions() -> list[Consumption]:
    def use(
        site_id: str,
        zone: str,
        start: datetime,
        end: datetime,
        energy_j: Decimal,
        pue: str,
        *,
        pue_rel: str = "0.05",
        meter_rel: str = "0.02",
        category: ScopeCategory = "scope2",
    ) -> Consumption:
        return Consumption(
            site_id=site_id,
            zone=zone,
            start=start,
            end=end,
            energy_j=energy_j,
            pue=Decimal(pue),
            pue_relative_uncertainty=Decimal(pue_rel),
            meter_relative_uncertainty=Decimal(meter_rel),
            scope_category=category,
            tag=f"{site_id}@{start:%Y%m%dT%H%M}",
        )

    return [
        # Crosses the year and several hours on partial hours: the 2024 slices use instruments up before
        # count_from; the split leaves remainders of nanojoules.
        use("paris-1", "FR", at(2024, 12, 31, 22, 30), at(2025, 1, 1, 1, 15), 10 * KWH_J, "1.5"),
        use(
            "paris-2", "FR", at(2025, 1, 1, 0), at(2025, 1, 1, 3), Decimal("7777777.777"), "1.2", pue_rel="0"
        ),
        use(
            "berlin-1",
            "DE",
            at(2025, 1, 1, 0),
            at(2025, 1, 1, 3),
            Decimal("3") * KWH_J,
            "1.3",
            meter_rel="0.3",
        ),
        use("amsterdam-1", "NL", at(2025, 1, 1, 1), at(2025, 1, 1, 2), Decimal("1234567.891"), "1.1"),
        use(
            "cloud-va",
            "US-VA",
            at(2025, 1, 1, 1),
            at(2025, 1, 1, 2),
            Decimal("2") * KWH_J,
            "1.1",
            category="scope3_cat1",
        ),
        use("paris-1", "FR", at(2025, 1, 1, 5), at(2025, 1, 1, 6), Decimal(0), "1.5"),  # a zero-energy slice
    ]


def instrument(
    instrument_id: str,
    kind: str,
    zone: str,
    start: datetime,
    end: datetime,
    mwh: str | None,
    intensity: str = "0",
    **criteria: bool,
) -> Instrument:
    attested: dict[str, bool] = dict.fromkeys(RELEVANT_CRITERIA[kind], True)  # type: ignore[index]
    attested.update(criteria)
    return Instrument(
        instrument_id=instrument_id,
        kind=kind,  # type: ignore[arg-type]
        zone=zone,
        vintage_start=start,
        vintage_end=end,
        mwh=None if mwh is None else Decimal(mwh),
        intensity_g_per_kwh=Decimal(intensity),
        quality_criteria=attested,
    )


def instruments() -> list[Instrument]:
    y2025, y2026 = at(2025, 1, 1), at(2026, 1, 1)
    bare = Instrument(
        instrument_id="GO-FR-unattested",
        kind="GO",
        zone="FR",
        vintage_start=y2025,
        vintage_end=y2026,
        mwh=Decimal("1"),
        intensity_g_per_kwh=Decimal(0),
        quality_criteria={"conveys_attributes": True},
    )
    # Given out of application order on purpose: the method sorts them.
    return [
        instrument("REC-BE-other-zone", "REC", "BE", y2025, y2026, "0.5"),
        instrument("GO-FR-1", "GO", "FR", y2025, y2026, "0.002"),
        instrument(
            "SUP-FR-one-hour", "supplier_rate", "FR", at(2025, 1, 1, 1), at(2025, 1, 1, 2), None, "35.5"
        ),
        instrument("REC-FR-2024", "REC", "FR", at(2024, 1, 1), y2025, "0.001"),
        instrument("PPA-FR-1", "PPA", "FR", at(2024, 12, 1), at(2025, 2, 1), "0.005"),
        instrument("SUP-DE-1", "supplier_rate", "DE", y2025, y2026, "0.001", "250.125"),
        instrument("REC-DE-1", "REC", "DE", y2025, y2026, "0.0007"),
        instrument("I-REC-DE-custom-ok", "I-REC", "DE", y2025, y2026, "0.0001", audited=True),
        instrument("GO-FR-double", "GO", "FR", y2025, y2026, "1", unique_claim=False),
        bare,
        instrument(
            "SUP-DE-undisclosed",
            "supplier_rate",
            "DE",
            y2025,
            y2026,
            None,
            "10",
            supplier_rate_disclosed=False,
        ),
        instrument("REC-FR-unaudited", "REC", "FR", y2025, y2026, "1", audited=False),
        instrument("PPA-DE-old", "PPA", "DE", at(2023, 1, 1), at(2024, 1, 1), "3"),
    ]


def residual_mixes() -> list[ResidualMix]:
    return [
        ResidualMix(zone="FR", year=2025, intensity_g_per_kwh=Decimal("60.123"), source="illustrative FR"),
        ResidualMix(
            zone="NL",
            year=2025,
            intensity_g_per_kwh=Decimal("456.7"),
            source="illustrative NL",
            relative_uncertainty=Decimal("0.1"),
        ),
        ResidualMix(zone="FR", year=2023, intensity_g_per_kwh=Decimal("70"), source="illustrative FR 2023"),
    ]


def factors() -> list[Factor]:
    def annual(zone: str, year: int, intensity: str, basis: str, source: str, relative: str) -> Factor:
        return Factor.annual(
            factor_id=f"{zone}:{year}",
            zone=zone,
            year=year,
            intensity_g_per_kwh=Decimal(intensity),
            basis=basis,  # type: ignore[arg-type]
            source=source,
            licence="CC BY 4.0",
            relative_uncertainty=Decimal(relative),
        )

    return [
        annual("FR", 2025, "41.44", "lifecycle", LATEST, "0.1"),
        annual("DE", 2025, "329.65", "lifecycle", LATEST, "0.1"),
        annual("NL", 2025, "250", "lifecycle", LATEST, "0.1"),
        annual("US-VA", 2023, "244.758", "direct", "US EPA eGRID2023", "0.07"),
        Factor(
            factor_id="DE:2025-01-01T01",
            zone="DE",
            period_start=at(2025, 1, 1, 1),
            period_end=at(2025, 1, 1, 2),
            granularity="hour",
            intensity_g_per_kwh=Decimal("301.5"),
            basis="direct",
            source="hourly illustrative",
            licence="CC BY 4.0",
            relative_uncertainty=Decimal("0.15"),
        ),
    ]


# ---------------------------------------------------------------------------------------------------------
# Serialization
# ---------------------------------------------------------------------------------------------------------


def plain(value: Any) -> Any:
    """JSON-ready: Decimals as their exact strings (exponent kept), datetimes in ISO 8601, order kept."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: plain(getattr(value, f.name)) for f in dataclasses.fields(value)}
    if isinstance(value, dict):
        return {str(k): plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [plain(v) for v in value]
    if isinstance(value, Decimal):
        return str(value)
    if isinstance(value, datetime):
        return value.isoformat()
    return value


def result_of(result: MarketResult) -> dict[str, Any]:
    return {**plain(result), "covered_mwh": plain(result.covered_mwh)}


def error_of(call: Callable[[], object]) -> str:
    try:
        call()
    except Exception as exc:  # the golden records the type and message of whatever is raised
        return f"{type(exc).__name__}: {exc}"
    return "no error"


def cases() -> dict[str, Any]:
    def run(
        cons: Iterable[Consumption] | None = None,
        insts: Iterable[Instrument] | None = None,
        mixes: Iterable[ResidualMix] | None = None,
        facts: Iterable[Factor] | None = None,
        **kwargs: Any,
    ) -> MarketResult:
        return market_based(
            consumptions() if cons is None else cons,
            instruments() if insts is None else insts,
            residual_mixes() if mixes is None else mixes,
            factors() if facts is None else facts,
            **kwargs,
        )

    duplicate = [*instruments(), instruments()[0]]
    two_fr_2025 = [*residual_mixes(), residual_mixes()[0]]
    no_factor = [*consumptions(), dataclasses.replace(consumptions()[0], zone="XX")]
    return {
        "counted_from_2025": result_of(run(count_from=at(2025, 1, 1))),
        "whole_history": result_of(run()),
        "instruments_on_cloud_too": result_of(
            run(instrument_categories=("scope2", "scope3_cat1"), count_from=at(2025, 1, 1, 1))
        ),
        "no_instruments": result_of(run(insts=[])),
        "no_residual_mix": result_of(run(mixes=[], count_from=at(2025, 1, 1))),
        "nothing_consumed": result_of(run(cons=[])),
        "errors": {
            "duplicate_instrument": error_of(lambda: run(insts=duplicate)),
            "duplicate_residual_mix": error_of(lambda: run(mixes=two_fr_2025)),
            "duplicate_instrument_and_mix": error_of(lambda: run(insts=duplicate, mixes=two_fr_2025)),
            "unknown_category": error_of(lambda: run(instrument_categories=("scope9",))),  # type: ignore[arg-type]
            "not_an_instrument": error_of(lambda: run(insts=[object()])),  # type: ignore[list-item]
            "not_a_consumption": error_of(lambda: run(cons=[object()])),  # type: ignore[list-item]
            "naive_count_from": error_of(lambda: run(count_from=datetime(2025, 1, 1))),
            "naive_count_from_and_unknown_category": error_of(
                lambda: run(count_from=datetime(2025, 1, 1), instrument_categories=("scope9",))  # type: ignore[arg-type]
            ),
            "no_factor_without_residual_mix": error_of(lambda: run(cons=no_factor)),
            "duplicate_factor": error_of(lambda: run(facts=[*factors(), factors()[0]])),
            "duplicate_residual_mix_and_factor": error_of(
                lambda: run(mixes=two_fr_2025, facts=[*factors(), factors()[0]])
            ),
            "not_a_consumption_and_duplicate_factor": error_of(
                lambda: run(cons=[object()], facts=[*factors(), factors()[0]])  # type: ignore[list-item]
            ),
        },
    }


def golden_bytes() -> bytes:
    return (json.dumps(cases(), indent=2, ensure_ascii=False) + "\n").encode()


def test_one_shot_iterators_are_read_once_and_give_the_same_result() -> None:
    # The signature takes Iterables: a generator must be enough, so every input is read in a single pass.
    from_lists = market_based(
        consumptions(), instruments(), residual_mixes(), factors(), count_from=at(2025, 1, 1)
    )
    from_iterators = market_based(
        iter(consumptions()),
        iter(instruments()),
        iter(residual_mixes()),
        iter(factors()),
        instrument_categories=iter(("scope2",)),
        count_from=at(2025, 1, 1),
    )
    assert result_of(from_iterators) == result_of(from_lists)


def test_market_based_matches_its_golden_file() -> None:
    produced = golden_bytes()
    if os.environ.get("UPDATE_GOLDEN") == "1":
        GOLDEN.parent.mkdir(parents=True, exist_ok=True)
        GOLDEN.write_bytes(produced)
    expected = GOLDEN.read_bytes()
    assert produced == expected, (
        f"market_based no longer gives {GOLDEN.name}; if the change is meant, run with UPDATE_GOLDEN=1 "
        "and review the diff"
    )
