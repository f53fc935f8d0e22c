"""Hourly rollups: equal to the raw ledger, incremental, exactly-once, rebuildable; CO2e both ways."""

from __future__ import annotations

import itertools
from datetime import UTC, datetime, timedelta
from decimal import Decimal

import pytest
from django.db.models import Sum

from carbon import services as carbon
from carbon.models import EmissionFactor, HourlyRollup
from carbon.rollups import recompute_carbon, rollups_rebuild, rollups_update
from carbon.selectors import carbon_summary
from demo.synthetic_ledger import generate_ledger
from ledger.models import ChainOrganization, LedgerBatchEnergy, LedgerIdle, LedgerRequest
from ledger.selectors import organization_chains
from ledger.services import ledger_adjust
from ledger.writer import append_records
from tenancy.models import Device, Site
from tests.factories import OrganizationFactory
from tests.support.ledger import batch_energy_record, one_request_records

pytestmark = pytest.mark.django_db(transaction=True)

JAN_2025 = datetime(2025, 1, 15, 10, tzinfo=UTC)
_ids = itertools.count(1)


@pytest.fixture
def factors() -> None:
    carbon.load_shipped_factors()


def _site(org, zone: str = "FR", pue: str = "1.2", electricity: str = "owned", name: str = "") -> Site:
    site = carbon.site_create(
        name=name or f"site-{next(_ids)}",
        zone=zone,
        pue=pue,
        electricity=electricity,
        organization=org,
        pue_relative_uncertainty="0.02",
    )
    return site


def _device(site: Site, device_id: str = "", uncertainty: float = 0.05) -> Device:
    return Device.objects.create(
        device_id=device_id or f"gpu-{next(_ids)}",
        kind="gpu",
        method="nvml-counter",
        measured=True,
        relative_uncertainty=uncertainty,
        site=site,
    )


def _request(org_id: int | None, device: Device, at: datetime, energy_uj: int, model: str = "digits") -> str:
    """Append one batch with one request and its whole energy part to the ledger."""
    n = next(_ids)
    t = int(at.timestamp() * 1e9)
    request_id = f"h.r{n}"
    append_records("hand", one_request_records("h", n, org_id, device.device_id, t, energy_uj, model))
    return request_id


def test_rollup_totals_equal_raw_totals_for_a_synthetic_ledger(factors: None) -> None:
    org = OrganizationFactory()
    generate_ledger(organization=org, requests=5000, days=2, seed=3)
    rollups_update()
    raw_requests = LedgerRequest.objects.count()
    raw_energy = LedgerBatchEnergy.objects.aggregate(s=Sum("energy_uj"))["s"]
    raw_idle = LedgerIdle.objects.aggregate(s=Sum("energy_uj"))["s"]
    rolled = HourlyRollup.objects.filter(organization=org)
    assert rolled.aggregate(s=Sum("requests"))["s"] == raw_requests == 5000
    assert rolled.filter(kind="request").aggregate(s=Sum("energy_uj"))["s"] == raw_energy
    assert rolled.filter(kind="idle").aggregate(s=Sum("energy_uj"))["s"] == raw_idle
    # Per model, too.
    for model in ("digits", "digits_int8", "linear"):
        assert rolled.filter(model=model).aggregate(s=Sum("requests"))["s"] == (
            LedgerRequest.objects.filter(model=model).count()
        )
    assert rolled.filter(synthetic=False).count() == 0  # synthetic data stays marked
    assert not rolled.exclude(carbon_error="").exists()
    assert not rolled.filter(location_co2e_g=None).exists()


def test_a_batch_row_s_shares_reach_each_request_s_organization_and_older_per_request_parts_count(
    factors: None,
) -> None:
    a, b = OrganizationFactory(), OrganizationFactory()
    device = _device(_site(None))
    t = int(JAN_2025.timestamp() * 1e9)

    def req(request_id: str, batch_id: str, org_id: int) -> dict[str, object]:
        return {
            "k": "req",
            "request_id": request_id,
            "organization_id": org_id,
            "model": "digits",
            "version": "1",
            "batch_id": batch_id,
            "device_id": device.device_id,
            "received_ns": t,
            "started_ns": t,
            "finished_ns": t + 1000,
            "queue_ns": 0,
            "compute_ns": 1000,
            "work_units": 1,
        }

    ids = ["m.r1", "m.r2", "m.r3"]
    append_records(
        "mixed",
        [
            req("m.r1", "m.b1", a.pk),
            req("m.r2", "m.b1", b.pk),
            req("m.r3", "m.b1", a.pk),
            req("old.r1", "old.b1", b.pk),
            batch_energy_record("m.b1", "i1", ids, [100_000, 200_000, 300_000]),
            batch_energy_record("m.b1", "i2", ids, [1_000, 2_000, 3_000]),
            {
                "k": "energy",
                "request_id": "old.r1",
                "interval_id": "i1",
                "batch_id": "old.b1",
                "energy_uj": 50_000,
            },
        ],
    )
    rollups_update()
    energy = {
        org: HourlyRollup.objects.filter(organization=org, kind="request").aggregate(s=Sum("energy_uj"))["s"]
        for org in (a, b)
    }
    assert energy == {a: 404_000, b: 252_000}
    rollups_rebuild()
    rebuilt = {
        org: HourlyRollup.objects.filter(organization=org, kind="request").aggregate(s=Sum("energy_uj"))["s"]
        for org in (a, b)
    }
    assert rebuilt == energy


def test_incremental_updates_equal_a_rebuild_and_a_second_run_adds_nothing(factors: None) -> None:
    org = OrganizationFactory()
    end = datetime(2025, 6, 1, tzinfo=UTC)
    generate_ledger(organization=org, requests=2000, days=1, end=end, seed=1)
    rollups_update(max_records=1500)  # a partial run, then the rest
    rollups_update()
    generate_ledger(organization=org, requests=1500, days=1, end=end, seed=2)  # more in the same hours
    rollups_update()
    again = rollups_update()
    assert again.rows_created == again.rows_updated == 0

    def snapshot() -> dict[tuple, tuple]:
        return {
            (r.site_id, r.model, r.kind, r.hour): (
                r.requests,
                r.energy_uj,
                r.location_co2e_g,
                r.market_co2e_g,
            )
            for r in HourlyRollup.objects.all()
        }

    incremental = snapshot()
    rollups_rebuild()
    assert snapshot() == incremental
    assert sum(v[0] for v in incremental.values()) == 3500


def test_an_adjustment_moves_the_rollup_by_its_delta(factors: None) -> None:
    org = OrganizationFactory()
    device = _device(_site(org))
    request_id = _request(org.pk, device, JAN_2025, 1_000_000)
    rollups_update()
    ledger_adjust(
        target_kind="request",
        target_id=request_id,
        energy_delta_uj=-250_000,
        reason="meter drift",
        actor="tester",
    )
    rollups_update()
    assert HourlyRollup.objects.get(organization=org, kind="request").energy_uj == 750_000


def test_one_kwh_in_france_with_pue_1_2_is_priced_by_hand(factors: None) -> None:
    org = OrganizationFactory()
    device = _device(_site(org, "FR", "1.2"))
    _request(org.pk, device, JAN_2025, 3_600_000_000_000)  # 1 kWh of IT energy
    rollups_update()
    row = HourlyRollup.objects.get(organization=org)
    factor = EmissionFactor.objects.get(pk=row.location_factor_id)
    assert (factor.zone, factor.period_start.year, factor.basis) == ("FR", 2025, "lifecycle")
    # 1 kWh x 1.2 x 41.44 g/kWh (Ember 2025, France) = 49.728 g
    assert factor.intensity_g_per_kwh == Decimal("41.44")
    assert row.location_co2e_g == Decimal("49.728")
    assert row.market_co2e_g == Decimal("49.728")  # no instrument, no residual mix: the grid average
    assert row.factor_match == "year"


def test_market_based_applies_a_valid_certificate_then_the_residual_mix(factors: None) -> None:
    org = OrganizationFactory()
    device = _device(_site(org, "FR", "1.2"))
    criteria = dict.fromkeys(
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
    carbon.instrument_create(
        organization=org,
        instrument_id="GO-1",
        kind="GO",
        zone="FR",
        vintage_start=datetime(2025, 1, 1, tzinfo=UTC),
        vintage_end=datetime(2026, 1, 1, tzinfo=UTC),
        mwh="0.0005",
        quality_criteria=criteria,
    )
    carbon.instrument_create(
        organization=org,
        instrument_id="GO-bad",
        kind="GO",
        zone="FR",
        vintage_start=datetime(2025, 1, 1, tzinfo=UTC),
        vintage_end=datetime(2026, 1, 1, tzinfo=UTC),
        mwh="1",
        quality_criteria={**criteria, "retired_for_reporter": False},
    )
    carbon.residual_mix_create(
        zone="FR", year=2025, intensity_g_per_kwh="50", source="AIB 2025 (test figure)"
    )
    _request(org.pk, device, JAN_2025, 3_600_000_000_000)
    rollups_update()
    row = HourlyRollup.objects.get(organization=org)
    # 1.2 kWh facility: 0.5 kWh covered by GO-1 at 0 g, 0.7 kWh at the residual mix 50 g/kWh = 35 g.
    assert row.market_co2e_g == Decimal("35")
    assert row.location_co2e_g == Decimal("49.728")
    summary = carbon_summary(org.pk, datetime(2025, 1, 1, tzinfo=UTC), datetime(2025, 2, 1, tzinfo=UTC))
    assert summary.market.total.co2e_g == Decimal(35)
    assert [e.instrument.instrument_id for e in summary.market.excluded] == ["GO-bad"]
    assert "retired_for_reporter" in summary.market.excluded[0].reasons[0]
    assert summary.location.total.co2e_g == Decimal("49.728")


def test_a_certificate_used_up_before_the_period_is_not_used_again(factors: None) -> None:
    org = OrganizationFactory()
    device = _device(_site(org, "FR", "1"))
    criteria = dict.fromkeys(
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
    carbon.instrument_create(
        organization=org,
        instrument_id="GO-1",
        kind="GO",
        zone="FR",
        vintage_start=datetime(2025, 1, 1, tzinfo=UTC),
        vintage_end=datetime(2026, 1, 1, tzinfo=UTC),
        mwh="0.001",
        quality_criteria=criteria,
    )
    _request(org.pk, device, JAN_2025, 3_600_000_000_000)  # uses the whole MWh... of 0.001 MWh = 1 kWh
    _request(org.pk, device, datetime(2025, 3, 1, tzinfo=UTC), 3_600_000_000_000)
    rollups_update()
    march = carbon_summary(org.pk, datetime(2025, 3, 1, tzinfo=UTC), datetime(2025, 4, 1, tzinfo=UTC))
    assert march.market.total.co2e_g == Decimal("41.44")  # the grid average: the certificate is spent
    assert HourlyRollup.objects.get(hour__month=1).market_co2e_g == 0
    assert HourlyRollup.objects.get(hour__month=3).market_co2e_g == Decimal("41.44")


def test_a_new_factor_version_changes_rollups_only_after_recompute_and_is_named(factors: None) -> None:
    org = OrganizationFactory()
    device = _device(_site(org, "FR", "1"))
    _request(org.pk, device, JAN_2025, 3_600_000_000_000)
    rollups_update()
    before = HourlyRollup.objects.get(organization=org)
    record = carbon.factor_import_csv(
        data=b"zone,datetime,g_co2e_per_kwh\nFR,2025-01-15T10:00:00Z,30\n", name="hourly.csv"
    )
    assert record.status == "accepted"
    recompute_carbon(org.pk)
    after = HourlyRollup.objects.get(organization=org)
    assert after.location_co2e_g == Decimal("30")
    assert after.factor_match == "hour"
    assert EmissionFactor.objects.get(pk=after.location_factor_id).factor_import_id == record.pk
    assert before.location_factor_id != after.location_factor_id


def test_a_device_with_no_site_is_rolled_up_but_not_valued_with_the_reason(factors: None) -> None:
    org = OrganizationFactory()
    device = Device.objects.create(device_id="loose", kind="gpu", method="nvml-counter")
    _request(org.pk, device, JAN_2025, 1_000_000)
    rollups_update()
    row = HourlyRollup.objects.get(organization=org)
    assert row.energy_uj == 1_000_000
    assert row.location_co2e_g is None
    assert "not placed in a site" in row.carbon_error


def test_a_later_pue_record_applies_from_its_date(factors: None) -> None:
    org = OrganizationFactory()
    site = _site(org, "FR", "1.0")
    device = _device(site)
    _request(org.pk, device, JAN_2025, 3_600_000_000_000)
    _request(org.pk, device, JAN_2025 + timedelta(days=40), 3_600_000_000_000)
    rollups_update()
    carbon.site_set_pue(site=site, pue="1.5", source="measured", valid_from=datetime(2025, 2, 1, tzinfo=UTC))
    recompute_carbon(org.pk)
    jan, feb = HourlyRollup.objects.filter(organization=org).order_by("hour")
    assert (jan.pue, feb.pue) == (Decimal("1.000"), Decimal("1.500"))
    assert feb.location_co2e_g == Decimal("62.16")  # 1.5 x 41.44


def test_sci_per_request_adds_embodied_emissions_and_ignores_instruments(factors: None) -> None:
    org = OrganizationFactory()
    device = _device(_site(org, "FR", "1"))
    carbon.device_update(device=device, embodied_kg_co2e="876", lifetime_years="1")
    for _ in range(4):
        _request(org.pk, device, JAN_2025, 900_000_000_000)  # 4 x 0.25 kWh in one hour
    rollups_update()
    summary = carbon_summary(org.pk, datetime(2025, 1, 1, tzinfo=UTC), datetime(2025, 2, 1, tzinfo=UTC))
    # M = 876 kg x 1 h / 8760 h = 100 g; E x I = 1 kWh x 41.44 = 41.44 g; SCI = 141.44 / 4
    assert summary.embodied_g == Decimal(100)
    assert summary.sci_g_per_request == Decimal("35.36")


def test_energy_for_requests_months_before_it_is_rolled_up_to_them(factors: None) -> None:
    # The energy join reads the requests of the energy's own months first; a request chained in an earlier
    # month (here by another chain) is still found, so every share is rolled up once.
    early, late = OrganizationFactory(), OrganizationFactory()
    device = _device(_site(None))
    june = datetime(2025, 6, 15, tzinfo=UTC)
    append_records(
        "early", one_request_records("e", 1, early.pk, device.device_id, int(JAN_2025.timestamp() * 1e9), 0)
    )
    late_records = one_request_records("l", 2, late.pk, device.device_id, int(june.timestamp() * 1e9), 7_000)
    append_records(
        "late",
        [*late_records, batch_energy_record("e.b1", "e.i9", ["e.r1"], [5_000])],
    )
    assert set(LedgerRequest.objects.values_list("request_id", "period")) == {
        ("e.r1", 202501),
        ("l.r2", 202506),
    }
    assert set(LedgerBatchEnergy.objects.filter(batch_id="e.b1").values_list("period", flat=True)) == {
        202501,
        202506,
    }
    rollups_update()
    energy = {
        org: HourlyRollup.objects.filter(organization=org, kind="request").aggregate(s=Sum("energy_uj"))["s"]
        for org in (early, late)
    }
    assert energy == {early: 5_000, late: 7_000}
    rollups_rebuild()
    assert {
        org: HourlyRollup.objects.filter(organization=org, kind="request").aggregate(s=Sum("energy_uj"))["s"]
        for org in (early, late)
    } == energy


def test_the_rollups_keep_the_months_each_organization_has_records_in_each_chain(factors: None) -> None:
    a, b = OrganizationFactory(), OrganizationFactory()
    device = _device(_site(a))

    def request(chain: str, org_id: int, at: datetime) -> None:
        n = next(_ids)
        append_records(
            chain, one_request_records("m", n, org_id, device.device_id, int(at.timestamp() * 1e9), 1)
        )

    request("early", a.pk, datetime(2025, 1, 31, 23, tzinfo=UTC))
    request("late", a.pk, datetime(2025, 3, 1, 0, tzinfo=UTC))
    request("late", b.pk, datetime(2025, 2, 10, tzinfo=UTC))
    rollups_update()

    def chains(org_id: int, start: datetime, end: datetime) -> list[str]:
        return [c.chain_id for c in organization_chains(org_id, start, end)]

    jan, feb, mar, apr = (datetime(2025, m, 1, tzinfo=UTC) for m in (1, 2, 3, 4))
    assert chains(a.pk, jan, feb) == ["early"]
    assert chains(a.pk, feb, mar) == []
    assert chains(a.pk, mar, apr) == ["late"]
    assert chains(a.pk, jan, apr) == ["early", "late"]
    assert chains(b.pk, feb, mar) == ["late"] and chains(b.pk, jan, feb) == []
    # A later run widens the months (the same chain, records of a later month); they never narrow.
    request("early", a.pk, datetime(2025, 2, 14, tzinfo=UTC))
    rollups_update()
    assert chains(a.pk, feb, mar) == ["early"] and chains(a.pk, jan, feb) == ["early"]
    # Rolled up before the months were kept: listed for every period.
    ChainOrganization.objects.filter(organization_id=b.pk).update(first_period=None, last_period=None)
    assert chains(b.pk, jan, feb) == ["late"]
    # A rebuild reads every chain from its start again: the months come back exact.
    rollups_rebuild()
    assert chains(b.pk, jan, feb) == [] and chains(b.pk, feb, mar) == ["late"]
    assert chains(a.pk, jan, feb) == ["early"] and chains(a.pk, mar, apr) == ["late"]
