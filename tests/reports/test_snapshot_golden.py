"""Golden file of reports.snapshot.build_snapshot: a fixed database state, the snapshot it freezes (with what
varies from run to run normalized), the progress it reports and the failures it raises, byte for byte.

The state covers an owned site whose PUE changes during the period, a colocated site under a supplier rate,
a cloud site (Category 4, no residual mix: grid average, disclosed), a device placed in no site (energy not
valued), a contractual instrument partly used up before the period and one failing a quality criterion, a
shared residual mix, an hourly factor import over the shipped annual figures, a base year, and another
organization's ledger chain that the report must not show.

Normalized, because they differ between runs or databases and say nothing about the computation: the
generation time, the code version, database ids (replaced by labels naming the row), the verification times
of the chains and ``inputs_sha256`` (checked against the inputs first, then replaced, since the inputs hold
the ids), and the key order of the instruments' quality criteria (PostgreSQL's jsonb has its own). The
organizations get fixed ids so that the ledger records, and hence the chain hashes, are the same
on every run.

After a deliberate change of the snapshot, regenerate and review the diff:

    UPDATE_GOLDEN=1 .venv/bin/python -m pytest tests/reports/test_snapshot_golden.py
    UPDATE_GOLDEN=1 DATABASE_URL=postgres://... .venv/bin/python -m pytest tests/reports/test_snapshot_golden.py

(the second run must leave the file unchanged: the golden holds on SQLite and on PostgreSQL alike).
"""

from __future__ import annotations

import copy
import itertools
import os
import re
from collections.abc import Iterator
from datetime import UTC, date, datetime
from decimal import Decimal
from pathlib import Path
from typing import Any

import orjson
import pytest
from django.db import connection

from carbon import services as carbon
from carbon.models import EmissionFactor, FactorImport, HourlyRollup, PueRecord, ResidualMix
from carbon.rollups import rollups_update
from ledger.models import LedgerRequest
from ledger.services import ledger_verify
from ledger.writer import append_records
from reports.models import Report, ReportingProfile
from reports.snapshot import ReportFailure, build_snapshot, sha256_json
from tenancy.models import Device, Organization, Site
from tests.support.ledger import one_request_records

pytestmark = pytest.mark.django_db

GOLDEN = Path(__file__).resolve().parents[1] / "golden" / "snapshot.json"
KWH_UJ = 3_600_000_000_000
JAN = (date(2025, 1, 1), date(2025, 2, 1))
ALL_CRITERIA = {
    "conveys_attributes": True,
    "unique_claim": True,
    "retired_for_reporter": True,
    "vintage_matches_period": True,
    "same_market": True,
    "residual_mix_adjusted": True,
}


def at(year: int, month: int, day: int, hour: int = 0) -> datetime:
    return datetime(year, month, day, hour, tzinfo=UTC)


# ---------------------------------------------------------------------------------------------------------
# The database state
# ---------------------------------------------------------------------------------------------------------


def _device(
    device_id: str, kind: str, method: str, uncertainty: float, site: Site | None, **extra: Any
) -> Device:
    return Device.objects.create(
        device_id=device_id,
        kind=kind,
        method=method,
        measured=method != "modelled",
        relative_uncertainty=uncertainty,
        site=site,
        **extra,
    )


def _requests(chain: str, org: Organization, served: list[tuple[Device, datetime, int, str]]) -> None:
    numbers = itertools.count(1)
    records: list[dict[str, object]] = []
    for device, hour, energy_uj, model in served:
        t_ns = int(hour.timestamp()) * 10**9 + 5 * 60 * 10**9  # five past the hour
        records += one_request_records(chain, next(numbers), org.pk, device.device_id, t_ns, energy_uj, model)
    append_records(chain, records)


def build_state() -> Organization:
    carbon.load_shipped_factors()
    # One hourly French figure: that hour matches it, the other French hours note the annual average.
    carbon.factor_import_csv(
        data=b"zone,datetime,g_co2e_per_kwh\nFR,2025-01-10T09:00:00Z,10\n", name="golden-fr-hourly.csv"
    )
    org = Organization.objects.create(pk=7301, slug="golden-inference", name="Golden Inference")
    other = Organization.objects.create(pk=7302, slug="golden-other", name="Golden Other")
    ReportingProfile.objects.create(
        organization=org,
        responsible_person="Ada Lovelace",
        base_year=2024,
        description="Golden Inference serves models.",
    )
    paris = carbon.site_create(
        name="paris-1", zone="FR", pue="1.2", pue_relative_uncertainty="0.05", organization=org
    )
    carbon.site_set_pue(
        site=paris, pue="1.3", source="measured", valid_from=at(2025, 1, 15), relative_uncertainty="0.02"
    )
    berlin = carbon.site_create(
        name="berlin-colo", zone="DE", pue="1.4", electricity="colocated", organization=org
    )
    virginia = carbon.site_create(
        name="cloud-va", zone="US-VA", pue="1.1", electricity="cloud", organization=org
    )
    gpu = _device(
        "gpu-paris", "gpu", "nvml-counter", 0.05, paris, embodied_kg_co2e=Decimal("150"), lifetime_years=4
    )
    cpu_de = _device("cpu-berlin", "cpu", "rapl", 0.1, berlin)
    cpu_va = _device("cpu-va", "cpu", "modelled", 0.3, virginia)
    loose = _device("cpu-loose", "cpu", "modelled", 0.3, None)
    outsider = _device("cpu-outsider", "cpu", "modelled", 0.3, None)
    carbon.instrument_create(
        organization=org,
        instrument_id="GO-FR-1",
        kind="GO",
        zone="FR",
        vintage_start=at(2024, 12, 1),
        vintage_end=at(2025, 2, 1),
        mwh="0.002",
        certificate_ids="GO-2024-000123",
        retirement_evidence="registry cancellation statement 42",
        quality_criteria=ALL_CRITERIA,
    )
    carbon.instrument_create(
        organization=org,
        instrument_id="REC-FR-stale",
        kind="REC",
        zone="FR",
        vintage_start=at(2025, 1, 1),
        vintage_end=at(2026, 1, 1),
        mwh="1",
        quality_criteria={**ALL_CRITERIA, "vintage_matches_period": False},
    )
    carbon.instrument_create(
        organization=org,
        instrument_id="SUP-DE-half-month",
        kind="supplier_rate",
        zone="DE",
        vintage_start=at(2025, 1, 1),
        vintage_end=at(2025, 1, 15),
        mwh=None,
        intensity_g_per_kwh="300.5",
        quality_criteria={
            **{k: v for k, v in ALL_CRITERIA.items() if k != "retired_for_reporter"},
            "supplier_rate_disclosed": True,
        },
    )
    carbon.residual_mix_create(
        zone="FR", year=2025, intensity_g_per_kwh="58.5", source="AIB 2025 (illustrative)"
    )
    _requests(
        "golden",
        org,
        [
            (cpu_va, at(2024, 3, 4, 10), KWH_UJ // 4, "linear"),  # base year and monthly trend only
            (gpu, at(2024, 12, 20, 10), KWH_UJ, "digits"),  # before the period: uses up most of GO-FR-1
            (cpu_de, at(2025, 1, 5, 8), 8 * KWH_UJ // 10, "linear"),
            (gpu, at(2025, 1, 10, 9), KWH_UJ, "digits"),
            (gpu, at(2025, 1, 10, 10), KWH_UJ // 4, "linear"),
            (gpu, at(2025, 1, 20, 15), KWH_UJ // 2, "digits"),
            (cpu_va, at(2025, 1, 20, 16), KWH_UJ // 2, "linear"),
            (loose, at(2025, 1, 21, 12), KWH_UJ // 10, "digits"),
            (cpu_de, at(2025, 1, 25, 8), 3 * KWH_UJ // 10, "linear"),
            (gpu, at(2025, 2, 3, 9), KWH_UJ, "digits"),  # after the period
        ],
    )
    _requests("golden-other", other, [(outsider, at(2025, 1, 12, 9), KWH_UJ, "linear")])
    rollups_update()
    return org


def _report(org: Organization, start: date, end: date, **fields: Any) -> Report:
    # "done": the reports are only handed to build_snapshot, and an active one per period would clash.
    return Report.objects.create(
        organization=org, period_start=start, period_end=end, status="done", requested_by="golden", **fields
    )


# ---------------------------------------------------------------------------------------------------------
# Normalization
# ---------------------------------------------------------------------------------------------------------


def _labels() -> dict[str, dict[int, str]]:
    """A label naming each row whose database id a snapshot may show."""
    sites = {s.pk: s.name for s in Site.objects.all()}
    imports = {i.pk: i.name for i in FactorImport.objects.all()}
    return {
        "site": {pk: f"<site {name}>" for pk, name in sites.items()},
        "import": {pk: f"<import {name}>" for pk, name in imports.items()},
        "factor": {
            f.pk: f"<factor {imports[f.factor_import_id]} {f.zone} {f.granularity} {f.period_start:%Y-%m-%dT%H}>"
            for f in EmissionFactor.objects.all()
        },
        "pue": {
            p.pk: f"<pue {sites[p.site_id]} from {p.valid_from.isoformat()}>" for p in PueRecord.objects.all()
        },
        "rollup": {
            r.pk: f"<rollup {sites.get(r.site_id, 'no site')} {r.device_id} {r.kind} {r.model} {r.hour.isoformat()}>"
            for r in HourlyRollup.objects.all()
        },
        "mix": {m.pk: f"<residual mix {m.zone} {m.year}>" for m in ResidualMix.objects.all()},
    }


def _text(value: str, labels: dict[str, dict[int, str]]) -> str:
    value = re.sub(r"record id \d+", "record id <id>", value)
    return re.sub(r"residual mix (\d+):", lambda m: f"{labels['mix'][int(m.group(1))]}:", value)


def normalized(snapshot: dict[str, Any]) -> dict[str, Any]:
    labels = _labels()
    assert snapshot["inputs_sha256"] == sha256_json(snapshot["inputs"])
    out = copy.deepcopy(snapshot)
    out["report"]["id"] = "<report id>"
    out["generated_at"] = "<generated at>"
    out["code_version"] = "<code version>"
    out["inputs_sha256"] = "<sha256 of the inputs>"
    inputs = out["inputs"]
    for row in inputs["rollups"]:
        row[0] = labels["rollup"][row[0]]
        row[1] = None if row[1] is None else labels["site"][row[1]]
        row[9] = None if row[9] is None else labels["pue"][row[9]]
        row[10] = None if row[10] is None else labels["factor"][row[10]]
    for factor in inputs["factors"]:
        factor["id"] = labels["factor"][factor["id"]]
        factor["version"] = labels["import"][factor["version"]]
    for pue in inputs["pue_records"]:
        pue["id"] = labels["pue"][pue["id"]]
    for instrument in inputs["instruments"]:
        # A JSON column: PostgreSQL's jsonb gives its keys back in an order of its own, SQLite as written.
        instrument["quality_criteria"] = dict(sorted(instrument["quality_criteria"].items()))
    for chain in out["ledger"]["chains"]:
        for when in ("verified_at", "last_full_verification_at"):
            if chain[when] is not None:
                chain[when] = "<verification time>"
        chain["problem"] = _text(chain["problem"], labels)
    market = out["results"]["market_based"]
    for key in ("disclosures", "disclosures_display"):
        disclosures = [_text(d, labels) for d in market[key]]
        for pk, label in labels["factor"].items():
            disclosures = [
                d.replace(f"grid average ({pk}, ", f"grid average ({label}, ") for d in disclosures
            ]
        market[key] = disclosures
    return out


# ---------------------------------------------------------------------------------------------------------
# The golden
# ---------------------------------------------------------------------------------------------------------


class Progress:
    def __init__(self) -> None:
        self.calls: list[list[Any]] = []

    def __call__(self, percent: int, message: str) -> None:
        self.calls.append([percent, message])


def _run(report: Report) -> dict[str, Any]:
    """What build_snapshot gives for ``report``: its progress and its snapshot, or its failure."""
    progress = Progress()
    try:
        snapshot = build_snapshot(report, progress)
    except ReportFailure as exc:
        return {"progress": progress.calls, "failure": _text(str(exc), _labels())}
    return {"progress": progress.calls, "snapshot": normalized(snapshot)}


@pytest.fixture
def state() -> Iterator[Organization]:
    yield build_state()


def golden(org: Organization) -> dict[str, Any]:
    out: dict[str, Any] = {}
    out["january_2025"] = _run(_report(org, *JAN))
    empty = Organization.objects.create(pk=7303, slug="golden-empty", name="Golden Empty")
    out["organization_without_data_or_profile"] = _run(_report(empty, *JAN))
    out["period_reversed"] = _run(_report(org, JAN[1], JAN[0]))

    factor = EmissionFactor.objects.get(
        zone="FR", granularity="year", period_start__year=2025, factor_import__name__startswith="shipped/"
    )
    table = EmissionFactor._meta.db_table
    with connection.cursor() as cursor:
        cursor.execute(f"UPDATE {table} SET relative_uncertainty = -1 WHERE id = %s", [factor.pk])
    out["unreadable_factor"] = _run(_report(org, *JAN))
    with connection.cursor() as cursor:
        cursor.execute(
            f"UPDATE {table} SET relative_uncertainty = %s WHERE id = %s",
            [factor.relative_uncertainty, factor.pk],
        )

    with connection.cursor() as cursor:
        cursor.execute(
            "UPDATE ledger_request SET work_units = 99 WHERE id = %s",
            [LedgerRequest.objects.filter(chain__chain_id="golden").earliest("seq").pk],
        )
    ledger_verify(full=True)  # the report's own pass is incremental; a full pass finds the change
    out["broken_chain"] = _run(_report(org, *JAN))
    out["broken_chain_accepted"] = _run(_report(org, *JAN, accept_broken_chain=True))
    return out


def golden_bytes(org: Organization) -> bytes:
    # Keys in the snapshot's own order: the order of a snapshot's sections and fields is pinned too.
    return orjson.dumps(golden(org), option=orjson.OPT_INDENT_2) + b"\n"


def test_build_snapshot_matches_its_golden_file(state: Organization) -> None:
    produced = golden_bytes(state)
    if os.environ.get("UPDATE_GOLDEN") == "1":
        GOLDEN.parent.mkdir(parents=True, exist_ok=True)
        GOLDEN.write_bytes(produced)
    assert produced == GOLDEN.read_bytes(), (
        f"build_snapshot no longer gives {GOLDEN.name}; if the change is meant, run with UPDATE_GOLDEN=1 "
        "(on SQLite and on PostgreSQL) and review the diff"
    )
