"""The inputs hash is a fingerprint of the data a report was computed from: two generations of the same period
on the same data give the same ``inputs_sha256``; the ledger verification each generation runs is reported
beside it, outside the hash (issue 25)."""

from __future__ import annotations

from datetime import UTC, datetime
from decimal import Decimal

import pytest

from carbon import selectors
from carbon import services as carbon
from carbon.models import InstrumentCertificate
from carbon.rollups import recompute_carbon
from reports.snapshot import sha256_json
from tests.reports.conftest import generate

pytestmark = pytest.mark.django_db


def test_two_generations_of_the_same_period_on_the_same_data_have_the_same_inputs_hash(two_sites) -> None:
    first = generate(two_sites)
    second = generate(two_sites)
    assert first.pk != second.pk
    assert first.inputs_sha256 == second.inputs_sha256
    assert second.snapshot["inputs_sha256"] == sha256_json(second.snapshot["inputs"])
    # Each generation verified the ledger: that bookkeeping is reported beside the hash, not inside it.
    verification = second.snapshot["ledger"]
    assert verification["intact"] is True
    assert [c["chain_id"] for c in verification["chains"]] == ["reports-conftest"]
    assert all(c["verified_at"] for c in verification["chains"])
    assert "ledger" not in second.snapshot["inputs"]


def test_changed_data_changes_the_inputs_hash(two_sites) -> None:
    first = generate(two_sites)
    carbon.factor_import_csv(
        data=b"zone,datetime,g_co2e_per_kwh\nFR,2025-01-10T09:00:00Z,10\n", name="fr.csv"
    )
    recompute_carbon(two_sites.pk)
    assert generate(two_sites).inputs_sha256 != first.inputs_sha256


def _granular_go(org, volumes_wh: dict[int, int]):  # type: ignore[no-untyped-def]
    """A GO in FR for January 2025 with one certificate per hour of 10 January (hour -> Wh)."""
    instrument = carbon.instrument_create(
        organization=org,
        instrument_id="GO-FR-HOURLY",
        kind="GO",
        zone="FR",
        vintage_start=datetime(2025, 1, 1, tzinfo=UTC),
        vintage_end=datetime(2025, 2, 1, tzinfo=UTC),
        mwh=Decimal(sum(volumes_wh.values())).scaleb(-6),
        certificate_ids="GC-FR-*",
        retirement_evidence="registry cancellation statement",
        quality_criteria=dict.fromkeys(
            (
                "conveys_attributes",
                "unique_claim",
                "retired_for_reporter",
                "vintage_matches_period",
                "same_market",
                "residual_mix_adjusted",
            ),
            True,
        ),
    )
    rows = ["certificate_id,production_start,production_end,energy_wh,energy_source"] + [
        f"GC-FR-{hour},2025-01-10T{hour:02d}:00:00Z,2025-01-10T{hour + 1:02d}:00:00Z,{wh},solar"
        for hour, wh in sorted(volumes_wh.items())
    ]
    carbon.instrument_certificates_import(instrument=instrument, data=("\n".join(rows) + "\n").encode())
    return instrument


def test_an_hourly_certificate_volume_is_covered_by_the_inputs_hash(two_sites) -> None:
    # The owned site consumes 1.2 kWh of facility energy at 09:00 on 10 January.
    instrument = _granular_go(two_sites, {9: 500, 10: 500})
    first = generate(two_sites)
    again = generate(two_sites)
    assert again.inputs_sha256 == first.inputs_sha256

    # The same total, another split over the hours: the instrument's MWh is unchanged, its cover of 09:00
    # (hence the market-based figure and the hourly-matched share) is not.
    InstrumentCertificate.objects.filter(instrument=instrument, certificate_id="GC-FR-9").update(
        energy_wh=800
    )
    InstrumentCertificate.objects.filter(instrument=instrument, certificate_id="GC-FR-10").update(
        energy_wh=200
    )
    moved = generate(two_sites)

    hourly = moved.snapshot["results"]["esrs_e1"]["hourly_matching"]  # type: ignore[index]
    assert hourly["matched_mwh"] != first.snapshot["results"]["esrs_e1"]["hourly_matching"]["matched_mwh"]  # type: ignore[index]
    (listed,) = moved.snapshot["inputs"]["instruments"]  # type: ignore[index]
    assert listed["mwh"] == "0.001000"
    assert moved.inputs_sha256 != first.inputs_sha256
    assert moved.snapshot["inputs_sha256"] == sha256_json(moved.snapshot["inputs"])  # type: ignore[index]


def test_the_generation_mix_used_by_the_esrs_block_is_in_the_inputs_hash(
    two_sites, tmp_path, monkeypatch
) -> None:
    first = generate(two_sites)
    inputs = first.snapshot["inputs"]  # type: ignore[index]
    esrs_mix = first.snapshot["results"]["esrs_e1"]["energy_mix"]  # type: ignore[index]
    assert inputs["generation_mix"]["file_sha256"] == esrs_mix["file_sha256"]
    (fr,) = [z for z in inputs["generation_mix"]["zones"] if z["zone"] == "FR"]
    assert (fr["year"], fr["fossil_share"], fr["nuclear_share"]) == (2023, "0.084223", "0.652876")

    # Another edition of the mix file: the same ledger and factors, other shares, another hash.
    shipped = selectors.MIX_FILE.read_text(encoding="utf-8")
    edited = tmp_path / "mix.csv"
    edited.write_text(
        shipped.replace(
            "FR,France,2023,43.3,335.65,135.16,514.11,0.084223,0.652876,0.262901",
            "FR,France,2023,53.3,325.65,135.16,514.11,0.103674,0.633425,0.262901",
        ),
        encoding="utf-8",
    )
    monkeypatch.setattr(selectors, "MIX_FILE", edited)
    selectors.generation_mixes.cache_clear()
    try:
        second = generate(two_sites)
    finally:
        selectors.generation_mixes.cache_clear()
    assert second.snapshot["results"]["esrs_e1"]["energy_mix"]["file_sha256"] != esrs_mix["file_sha256"]  # type: ignore[index]
    assert second.inputs_sha256 != first.inputs_sha256
