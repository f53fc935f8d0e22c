"""The inputs hash is a fingerprint of the data a report was computed from: two generations of the same period
on the same data give the same ``inputs_sha256``; the ledger verification each generation runs is reported
beside it, outside the hash (issue 25)."""

from __future__ import annotations

import pytest

from carbon import services as carbon
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
