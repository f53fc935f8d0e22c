"""The demo shows the product: loaded at a smaller size than `make run` loads (two days instead of thirty, the
same traffic per day), its data has an hourly intensity series per zone (synthetic, marked, shaped from the
annual figure), a granular GO and an annual REC that make market-based and hourly matching differ from
location-based, idle energy at 20-40 % of the devices' energy, a carbon-aware threshold, synthetic records
carrying the `synthetic` method, and a banner on the dashboard."""

from __future__ import annotations

from collections import defaultdict
from datetime import UTC, datetime, timedelta
from decimal import Decimal

import pytest
from django.test import Client

from carbon import co2e
from carbon.models import ContractualInstrument, EmissionFactor, HourlyRollup, InstrumentCertificate
from carbon.selectors import carbon_summary, factor_set, grid_signal, rollup_totals
from carbon.services import load_shipped_factors
from demo.showcase import DemoData, load_demo
from ledger.writer import default_site
from reports.models import ReportingProfile
from tenancy.models import Device, Organization, Site
from tests.factories import OrganizationFactory
from tests.support.accounts import signed_in

pytestmark = pytest.mark.django_db

END = datetime(2026, 11, 20, tzinfo=UTC)
DAYS = 2


@pytest.fixture
def demo() -> tuple[Organization, DemoData]:
    load_shipped_factors()
    org = OrganizationFactory(slug="demo-test")
    site = default_site()
    site.organization = org
    site.save(update_fields=["organization"])
    return org, load_demo(organization=org, days=DAYS, end=END)


def test_idle_energy_is_20_to_40_percent_of_the_devices_energy(demo: tuple[Organization, DemoData]) -> None:
    org, data = demo

    totals = rollup_totals(org.pk, data.start, data.end)

    assert totals["requests"] == data.requests > 0
    share = Decimal(totals["idle_uj"]) / Decimal(totals["energy_uj"])
    assert Decimal("0.20") <= share <= Decimal("0.40"), share


def test_each_demo_zone_has_a_marked_hourly_series_shaped_from_its_annual_figure(
    demo: tuple[Organization, DemoData],
) -> None:
    org, data = demo
    zones = set(Site.objects.filter(organization=org).values_list("zone", flat=True))
    assert zones == {"FR", "US-VA"}

    for zone in zones:
        hourly = EmissionFactor.objects.filter(
            zone=zone, granularity="hour", factor_import__organization=org
        ).order_by("period_start")
        hours = [f.period_start for f in hourly]
        # Every hour of the traffic, and a day ahead for the live carbon-aware signal.
        expected = [data.start + timedelta(hours=h) for h in range(DAYS * 24 + 24)]
        assert hours == expected, zone
        assert all("synthetic" in f.source.lower() for f in hourly)
        annual = co2e.select_factor(zone, data.start, factor_set([zone], None).annual[zone]).factor
        by_day: dict[object, list[Decimal]] = defaultdict(list)
        for f in hourly:
            by_day[f.period_start.date()].append(f.intensity_g_per_kwh)
        for day, values in by_day.items():
            assert len(values) == 24
            # The day's mean is the annual figure; the curve moves through the day (evening peak above it).
            assert sum(values, Decimal(0)) / 24 == annual.intensity_g_per_kwh, (zone, day)
            assert max(values) >= annual.intensity_g_per_kwh * Decimal("1.1") > min(values) * Decimal("1.1")
        assert annual.source in hourly[0].source  # shaped from it, and says which


def test_a_granular_go_and_an_annual_rec_make_market_based_and_hourly_matching_differ(
    demo: tuple[Organization, DemoData],
) -> None:
    org, data = demo
    instruments = {i.kind: i for i in ContractualInstrument.objects.filter(organization=org)}
    assert set(instruments) == {"GO", "REC"}
    assert InstrumentCertificate.objects.filter(instrument=instruments["GO"]).exists()
    assert not InstrumentCertificate.objects.filter(instrument=instruments["REC"]).exists()

    summary = carbon_summary(org.pk, data.start, data.end)

    assert summary.market.by_category["scope2"].co2e_g < summary.location.by_category["scope2"].co2e_g
    covered = summary.market.covered_mwh
    assert covered[instruments["GO"].instrument_id] > 0 and covered[instruments["REC"].instrument_id] > 0
    share = summary.hourly_match.share
    own_mwh = summary.location.by_category["scope2"].energy_kwh / 1000
    annual_share = sum(covered.values(), Decimal(0)) / own_mwh
    assert share is not None and 0 < share < annual_share < 1


def test_the_carbon_aware_threshold_is_set_and_the_mode_is_known(demo: tuple[Organization, DemoData]) -> None:
    org, data = demo
    for site in Site.objects.filter(organization=org).exclude(electricity="cloud"):
        assert site.carbon_threshold_g_per_kwh is not None, site.name
        signal = grid_signal(site, data.end - timedelta(minutes=30), forecast=None)
        assert signal.mode in ("normal", "efficiency"), (site.name, signal)
        assert "hourly figure" in signal.intensity_source


def test_synthetic_records_carry_the_synthetic_method_and_are_not_counted_measured(
    demo: tuple[Organization, DemoData],
) -> None:
    org, data = demo
    devices = Device.objects.filter(info__synthetic=True)
    assert devices.exists() and set(devices.values_list("method", flat=True)) == {"synthetic"}
    assert not devices.filter(measured=True).exists()
    rows = HourlyRollup.objects.filter(organization=org, synthetic=True)
    assert rows.exists() and set(rows.values_list("method", flat=True)) == {"synthetic"}
    assert rollup_totals(org.pk, data.start, data.end)["measured_uj"] == 0


def test_net_revenue_is_configured_for_the_esrs_intensities(demo: tuple[Organization, DemoData]) -> None:
    org, data = demo
    profile = ReportingProfile.objects.get(organization=org)
    assert profile.net_revenue is not None and profile.net_revenue > 0
    assert profile.net_revenue_year == data.end.year


def test_the_dashboard_shows_a_banner_while_synthetic_data_is_included(
    demo: tuple[Organization, DemoData],
) -> None:
    org, _ = demo
    client = signed_in(org, "viewer")

    for page in ("/dashboard/", "/dashboard/carbon", "/dashboard/reports"):
        html = client.get(page).content.decode()
        assert 'class="synthetic-banner"' in html, page
        assert "synthetic" in html.lower()

    plain = signed_in(OrganizationFactory(), "viewer", client=Client())
    assert 'class="synthetic-banner"' not in plain.get("/dashboard/").content.decode()


def test_loading_the_demo_twice_is_refused_rather_than_doubled(demo: tuple[Organization, DemoData]) -> None:
    org, _ = demo
    from tenancy.services import ServiceError

    with pytest.raises(ServiceError, match="already"):
        load_demo(organization=org, days=DAYS, end=END)
