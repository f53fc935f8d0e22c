"""The exact outputs of the accounting path on one fixed ledger, recorded once and compared whole: the rollups'
CO2e columns (location- and market-based) and :func:`carbon_summary` with every line, choice, instrument
use and record it lists. Refactors of that path must leave both equal, field for field.

The scenario holds what each branch needs: two zones and scope categories, a PUE change within the period,
an hourly factor next to the annual ones, a certificate partly used up before the period by a site the
period never uses, an excluded certificate, a residual mix, idle energy, embodied emissions, a device with
no site and a row made negative by an adjustment (both not valued), and another organization's rows.

Database ids differ between runs and engines: the dump names every record by what it is (a site by its
name, a factor by zone, period and figure, a rollup by hour, kind, model and device) instead.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from dataclasses import fields, is_dataclass
from datetime import UTC, datetime
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest

from carbon import services as carbon
from carbon.models import ContractualInstrument, EmissionFactor, FactorImport, HourlyRollup, PueRecord
from carbon.rollups import recompute_carbon, rollups_update
from carbon.selectors import CarbonSummary, carbon_summary
from ledger.services import ledger_adjust
from ledger.writer import append_records
from tenancy.models import Device, Organization, Site
from tests.factories import OrganizationFactory
from tests.support.ledger import one_request_records

pytestmark = pytest.mark.django_db

PINNED = Path(__file__).resolve().parents[1] / "golden" / "carbon_summary.json"
KWH_UJ = 3_600_000_000_000
JAN_START = datetime(2025, 1, 1, tzinfo=UTC)
FEB_START = datetime(2025, 2, 1, tzinfo=UTC)
ALL_CRITERIA = dict.fromkeys(
    (
        "conveys_attributes",
        "unique_claim",
        "retired_for_reporter",
        "vintage_matches_period",
        "same_market",
        "residual_mix_adjusted",
    ),
    True,
)


class _Ledger:
    """Appends one-request batches, numbered from 1 in the order written."""

    def __init__(self) -> None:
        self.n = 0

    def request(self, org: Organization, device: Device, at: datetime, energy_uj: int, model: str) -> str:
        self.n += 1
        t_ns = int(at.timestamp()) * 1_000_000_000
        append_records(
            "pin", one_request_records("pin", self.n, org.pk, device.device_id, t_ns, energy_uj, model)
        )
        return f"pin.r{self.n}"

    def idle(self, device: Device, at: datetime, energy_uj: int) -> None:
        self.n += 1
        t0 = int(at.timestamp()) * 1_000_000_000
        interval = {
            "k": "interval",
            "interval_id": f"pin.i{self.n}",
            "device_id": device.device_id,
            "method": device.method,
            "relative_uncertainty": device.relative_uncertainty,
            "t0_ns": t0,
            "t1_ns": t0 + 1_000_000_000,
            "counter_start_j": 0.0,
            "counter_end_j": energy_uj / 1e6,
            "energy_uj": energy_uj,
            "idle_uj": energy_uj,
            "busy_ns": 0,
            "idle_ns": 1_000_000_000,
        }
        idle = {
            "k": "idle",
            "interval_id": f"pin.i{self.n}",
            "device_id": device.device_id,
            "t0_ns": t0,
            "t1_ns": t0 + 1_000_000_000,
            "energy_uj": energy_uj,
            "idle_ns": 1_000_000_000,
            "idle_power_w": energy_uj / 1e6,
        }
        append_records("pin", [interval, idle])


def _device(device_id: str, site: Site | None, uncertainty: float) -> Device:
    return Device.objects.create(
        device_id=device_id,
        kind="gpu",
        method="nvml-counter",
        measured=site is not None,
        relative_uncertainty=uncertainty,
        site=site,
    )


def _scenario() -> Organization:
    carbon.load_shipped_factors()
    hourly = b"zone,datetime,g_co2e_per_kwh\nFR,2025-01-15T11:00:00Z,30\nFR,2025-01-15T12:00:00Z,80\n"
    assert carbon.factor_import_csv(data=hourly, name="fr-hourly.csv").status == "accepted"
    org, other = OrganizationFactory(), OrganizationFactory()
    alpha = carbon.site_create(
        name="alpha", zone="FR", pue="1.2", pue_relative_uncertainty="0.02", organization=org
    )
    beta = carbon.site_create(
        name="beta",
        zone="DE",
        pue="1.1",
        pue_relative_uncertainty="0.05",
        electricity="cloud",
        organization=org,
    )
    gamma = carbon.site_create(name="gamma", zone="FR", pue="1.4", organization=org)
    a1, a2 = _device("a1", alpha, 0.05), _device("a2", alpha, 0.1)
    b1, c1, loose = _device("b1", beta, 0.02), _device("c1", gamma, 0.0), _device("loose", None, 0.3)
    carbon.device_update(device=a1, embodied_kg_co2e="876", lifetime_years="1")
    carbon.device_update(device=b1, embodied_kg_co2e="1000", lifetime_years="4")
    carbon.device_update(device=a2, embodied_kg_co2e="500")  # no lifetime: no share
    carbon.instrument_create(
        organization=org,
        instrument_id="GO-1",
        kind="GO",
        zone="FR",
        vintage_start=datetime(2024, 12, 1, tzinfo=UTC),
        vintage_end=datetime(2025, 12, 1, tzinfo=UTC),
        mwh="0.0015",
        quality_criteria=ALL_CRITERIA,
    )
    carbon.instrument_create(
        organization=org,
        instrument_id="GO-bad",
        kind="GO",
        zone="FR",
        vintage_start=datetime(2025, 1, 1, tzinfo=UTC),
        vintage_end=datetime(2026, 1, 1, tzinfo=UTC),
        mwh="1",
        quality_criteria={**ALL_CRITERIA, "unique_claim": False},
    )
    carbon.residual_mix_create(
        zone="FR", year=2025, intensity_g_per_kwh="50", source="AIB 2025 (test figure)"
    )
    carbon.residual_mix_create(
        zone="FR", year=2024, intensity_g_per_kwh="55", source="AIB 2024 (test figure)"
    )

    ledger = _Ledger()
    ledger.request(org, c1, datetime(2024, 12, 15, 9, 30, tzinfo=UTC), KWH_UJ, "digits")  # before: uses GO-1
    ledger.request(org, a1, datetime(2025, 1, 15, 10, 5, tzinfo=UTC), KWH_UJ // 2, "digits")
    ledger.request(org, a1, datetime(2025, 1, 15, 10, 40, tzinfo=UTC), KWH_UJ // 4, "digits")
    ledger.request(org, a1, datetime(2025, 1, 15, 11, 0, tzinfo=UTC), 123_456_789, "linear")
    ledger.request(org, a2, datetime(2025, 1, 15, 12, 59, tzinfo=UTC), 987_654_321, "linear")
    ledger.request(org, b1, datetime(2025, 1, 16, 8, 0, tzinfo=UTC), KWH_UJ // 5, "digits")
    ledger.request(org, a1, datetime(2025, 1, 25, 3, 0, tzinfo=UTC), KWH_UJ // 3, "digits")  # PUE 1.5
    ledger.request(org, loose, datetime(2025, 1, 17, 0, 0, tzinfo=UTC), 5_000_000, "digits")  # no site
    negative = ledger.request(org, b1, datetime(2025, 1, 18, 0, 0, tzinfo=UTC), 1_000, "linear")
    ledger.request(other, a1, datetime(2025, 1, 15, 10, 0, tzinfo=UTC), KWH_UJ, "digits")
    ledger.request(org, a1, datetime(2025, 2, 3, 0, 0, tzinfo=UTC), KWH_UJ, "digits")  # after the period
    ledger.idle(a1, datetime(2025, 1, 15, 10, 30, tzinfo=UTC), 4_000_000)
    ledger.idle(b1, datetime(2025, 1, 16, 8, 30, tzinfo=UTC), 2_500_000)
    rollups_update()
    ledger_adjust(
        target_kind="request", target_id=negative, energy_delta_uj=-3_000, reason="drift", actor="pin"
    )
    rollups_update()
    carbon.site_set_pue(
        site=alpha,
        pue="1.5",
        source="measured",
        valid_from=datetime(2025, 1, 20, tzinfo=UTC),
        relative_uncertainty="0.01",
    )
    # What the PUE change queues on commit, which this (non-transactional) test never reaches.
    recompute_carbon(site_id=alpha.pk, start=datetime(2025, 1, 20, tzinfo=UTC))
    return org


class _Names:
    """Stable names of the records the outputs refer to by database id."""

    def __init__(self) -> None:
        self.sites = {s.pk: s.name for s in Site.objects.all()}
        self.orgs = {o.pk: f"org{i}" for i, o in enumerate(Organization.objects.order_by("pk"))}
        self.imports = {i.pk: i.name for i in FactorImport.objects.all()}
        self.pue = {
            r.pk: f"pue {self.sites[r.site_id]} from {r.valid_from.isoformat()}"
            for r in PueRecord.objects.all()
        }
        self.rows = {r.pk: self.row(r) for r in HourlyRollup.objects.all()}
        assert len(set(self.rows.values())) == len(self.rows), "two rollups with the same name"
        self.factors: dict[int, str] = {}

    def row(self, r: HourlyRollup) -> str:
        org = self.orgs.get(r.organization_id, "no org")
        return f"{org} {r.hour.astimezone(UTC).isoformat()} {r.kind} {r.model or '-'} {r.device_id}"

    def factor(self, factor_id: str | int | None) -> str | None:
        if factor_id is None:
            return None
        pk = int(factor_id)
        if pk not in self.factors:
            f = EmissionFactor.objects.get(pk=pk)
            self.factors[pk] = (
                f"{f.zone} {f.granularity} {f.period_start.astimezone(UTC).isoformat()} {f.intensity_g_per_kwh} "
                f"{f.basis} ({self.imports[f.factor_import_id]})"
            )
        return self.factors[pk]

    def text(self, value: str) -> str:
        value = re.sub(r"residual mix \d+:", "residual mix #:", value)
        # The market-based disclosure of a grid average names its factor by id.
        return re.sub(r"grid average \((\d+),", lambda m: f"grid average ({self.factor(m[1])},", value)


def _plain(value: Any, names: _Names, key: str = "") -> Any:
    """``value`` as JSON-able data, ids replaced by names (``key``: the field or dict key it is held under)."""
    by_key: dict[str, Callable[[Any], Any]] = {
        "site_id": lambda v: names.sites[int(v)] if v not in (None, "") else v,
        "tag": lambda v: names.rows[int(v)] if v else v,
        "factor_id": names.factor,
        "location_factor_id": names.factor,
        "organization_id": lambda v: names.orgs.get(v, v),
        "pue_record_id": lambda v: names.pue.get(v, v),
    }
    if key in by_key and not isinstance(value, dict | list | tuple) and not is_dataclass(value):
        return by_key[key](value)
    if isinstance(value, HourlyRollup):
        return {
            f: _plain(getattr(value, f), names, f)
            for f in (
                "organization_id",
                "site_id",
                "device_id",
                "model",
                "kind",
                "method",
                "measured",
                "hour",
                "synthetic",
                "requests",
                "work_units",
                "energy_uj",
                "meter_relative_uncertainty",
                "pue",
                "pue_record_id",
                "location_factor_id",
                "factor_match",
                "location_co2e_g",
                "market_co2e_g",
                "carbon_error",
            )
        }
    if isinstance(value, Site):
        return {"name": value.name, "zone": value.zone, "electricity": value.electricity}
    if isinstance(value, ContractualInstrument):
        return {"instrument_id": value.instrument_id, "kind": value.kind, "mwh": _plain(value.mwh, names)}
    if is_dataclass(value) and not isinstance(value, type):
        return {f.name: _plain(getattr(value, f.name), names, f.name) for f in fields(value)}
    if isinstance(value, dict):
        return {str(k): _plain(v, names, str(k)) for k, v in value.items()}
    if isinstance(value, list | tuple | set | frozenset):
        items = [_plain(v, names, key) for v in value]
        return sorted(items, key=json.dumps) if isinstance(value, set | frozenset) else items
    if isinstance(value, Decimal):
        return str(value)
    if isinstance(value, datetime):
        return value.astimezone(UTC).isoformat()
    if isinstance(value, str):
        return names.text(value)
    return value


def _summary_dump(summary: CarbonSummary, names: _Names) -> dict[str, Any]:
    dump = _plain(summary, names)
    # Dict keys that are ids: rows by tag, sites by pk, factor records by factor id (their own ids too).
    dump["rows"] = {names.rows[int(tag)]: row for tag, row in dump["rows"].items()}
    dump["sites"] = {names.sites[int(pk)]: site for pk, site in dump["sites"].items()}
    dump["factor_records"] = dict(
        sorted(
            (
                names.factor(fid),
                {
                    **record,
                    "id": names.factor(record["id"]),
                    "factor_import_id": names.imports[int(record["factor_import_id"])],
                },
            )
            for fid, record in dump["factor_records"].items()
        )
    )
    dump["pue_records"] = [{**r, "id": names.pue[int(r["id"])]} for r in dump["pue_records"]]
    for line in dump["market"]["lines"]:
        if line["source"] == "grid_average":  # else an instrument id or a residual mix's source
            line["source_id"] = names.factor(line["source_id"])
    return dump


def _dump() -> dict[str, Any]:
    org = _scenario()
    names = _Names()
    rows = {names.row(r): _plain(r, names) for r in HourlyRollup.objects.all()}
    return {
        "rollups": dict(sorted(rows.items())),
        "january": _summary_dump(carbon_summary(org.pk, JAN_START, FEB_START), names),
        "january_15": _summary_dump(
            carbon_summary(org.pk, datetime(2025, 1, 15, tzinfo=UTC), datetime(2025, 1, 16, tzinfo=UTC)),
            names,
        ),
        "empty": _summary_dump(
            carbon_summary(org.pk, datetime(2026, 1, 1, tzinfo=UTC), datetime(2026, 2, 1, tzinfo=UTC)), names
        ),
    }


def test_rollups_and_the_carbon_summary_equal_the_recorded_outputs() -> None:
    assert _dump() == json.loads(PINNED.read_text())
