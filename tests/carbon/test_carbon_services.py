"""Factor imports (versions, all or nothing), shipped figures, residual mixes, instruments, sites."""

from __future__ import annotations

from datetime import UTC, datetime
from decimal import Decimal
from io import StringIO

import pytest
from django.core.management import CommandError, call_command

from carbon import services as carbon
from carbon.models import EmissionFactor, FactorImport, PueRecord
from carbon.selectors import factor_attributions, factor_set
from tenancy.services import ServiceError
from tests.factories import OrganizationFactory

pytestmark = pytest.mark.django_db

H10 = datetime(2025, 1, 15, 10, tzinfo=UTC)
EM_HEADER = (
    "Datetime (UTC),Country,Zone Name,Zone Id,Carbon Intensity gCO₂eq/kWh (direct),"
    "Carbon Intensity gCO₂eq/kWh (LCA),Low Carbon Percentage,Renewable Percentage,Data Source,"
    "Data Estimated,Data Estimation Method\n"
)


@pytest.fixture
def shipped() -> None:
    carbon.load_shipped_factors()


def test_shipped_figures_load_once_with_their_attribution() -> None:
    made = carbon.load_shipped_factors()
    assert [m.row_count for m in made] == [213, 213, 52]
    assert carbon.load_shipped_factors() == []  # a second run does nothing
    assert EmissionFactor.objects.count() == 478
    licences = {a["licence"] for a in factor_attributions()}
    assert "CC BY 4.0" in licences
    assert any("Public domain" in licence for licence in licences)
    sources = " ".join(a["source"] for a in factor_attributions())
    assert "Ember" in sources and "Our World in Data" in sources and "eGRID2023" in sources


def test_an_accepted_import_is_a_new_version_and_its_factors_name_it(shipped: None) -> None:
    record = carbon.factor_import_csv(
        data=b"zone,datetime,g_co2e_per_kwh\nFR,2025-01-15T10:00:00Z,30\nFR,2025-01-15T11:00:00Z,31.5\n",
        name="fr.csv",
        source="RTE eco2mix (test)",
    )
    assert (record.status, record.row_count, record.layout) == ("accepted", 2, "plain")
    factors = EmissionFactor.objects.filter(factor_import=record).order_by("period_start")
    assert [str(f.intensity_g_per_kwh) for f in factors] == ["30.000000", "31.500000"]
    assert {f.source for f in factors} == {"RTE eco2mix (test)"}
    assert len(record.checksum_sha256) == 64


def test_a_file_with_bad_rows_is_rejected_whole_with_each_line_and_reason(shipped: None) -> None:
    data = (
        b"zone,datetime,g_co2e_per_kwh\n"
        b"FR,2025-01-15T10:00:00Z,30\n"
        b"FR,not-a-date,30\n"
        b"FR,2025-01-15T12:00:00Z,-4\n"
        b"ZZ-NOWHERE,2025-01-15T13:00:00Z,20\n"
        b"FR,2025-01-15T10:00:00Z,31\n"
    )
    record = carbon.factor_import_csv(data=data, name="bad.csv")
    assert record.status == "rejected"
    assert not EmissionFactor.objects.filter(factor_import=record).exists()
    lines = {e["line"]: e["reason"] for e in record.errors}
    assert set(lines) == {3, 4, 5, 6}
    assert "not-a-date" in lines[3]
    assert "negative" in lines[4]
    assert "ZZ-NOWHERE" in lines[5] and "unknown zone" in lines[5]
    assert "line 2" in lines[6]  # the duplicate hour names the first line


def test_the_same_file_imported_twice_is_refused(shipped: None) -> None:
    data = b"zone,datetime,g_co2e_per_kwh\nFR,2025-01-15T10:00:00Z,30\n"
    first = carbon.factor_import_csv(data=data, name="a.csv")
    with pytest.raises(ServiceError, match=f"version {first.pk}"):
        carbon.factor_import_csv(data=data, name="b.csv")


def test_a_new_zone_is_refused_unless_allowed(shipped: None) -> None:
    data = b"zone,datetime,g_co2e_per_kwh\nUS-CAL-CISO,2025-01-15T10:00:00Z,210\n"
    assert carbon.factor_import_csv(data=data, name="x.csv").status == "rejected"
    assert carbon.factor_import_csv(data=data, name="x.csv", allow_new_zones=True).status == "accepted"


def test_the_newest_version_wins_for_the_same_zone_and_hour(shipped: None) -> None:
    carbon.factor_import_csv(data=b"zone,datetime,g_co2e_per_kwh\nFR,2025-01-15T10:00:00Z,30\n", name="v1")
    v2 = carbon.factor_import_csv(
        data=b"zone,datetime,g_co2e_per_kwh\nFR,2025-01-15T10:00:00Z,33\n", name="v2"
    )
    chosen = factor_set(["FR"], None).hourly[("FR", H10)]
    assert chosen.intensity_g_per_kwh == 33
    assert EmissionFactor.objects.get(pk=int(chosen.factor_id)).factor_import_id == v2.pk


def test_the_direct_basis_is_preferred_where_an_import_has_both(shipped: None, settings) -> None:
    data = (EM_HEADER + "2025-01-15 10:00:00,France,France,FR,22.5,56.04,95,28,rte,false,\n").encode()
    record = carbon.factor_import_csv(data=data, name="em.csv")
    assert (record.status, record.layout, record.row_count) == ("accepted", "electricitymaps", 2)
    assert factor_set(["FR"], None).hourly[("FR", H10)].basis == "direct"
    settings.FACTOR_BASIS_PREFERENCE = "lifecycle"
    assert factor_set(["FR"], None).hourly[("FR", H10)].intensity_g_per_kwh == Decimal("56.04")


def test_an_organizations_import_is_not_used_for_another(shipped: None) -> None:
    a, b = OrganizationFactory(), OrganizationFactory()
    carbon.factor_import_csv(
        data=b"zone,datetime,g_co2e_per_kwh\nFR,2025-01-15T10:00:00Z,30\n", name="a.csv", organization=a
    )
    assert ("FR", H10) in factor_set(["FR"], a.pk).hourly
    assert ("FR", H10) not in factor_set(["FR"], b.pk).hourly


def test_import_intensity_command_prints_each_rejected_line(shipped: None, tmp_path) -> None:
    bad = tmp_path / "bad.csv"
    bad.write_text("zone,datetime,g_co2e_per_kwh\nFR,2025-01-15T10:00:00,30\nFR,2025-01-15T11:00:00Z,9999\n")
    err = StringIO()
    with pytest.raises(CommandError, match="2 bad row"):
        call_command("import_intensity", str(bad), stderr=err)
    assert "bad.csv:2:" in err.getvalue() and "bad.csv:3:" in err.getvalue()
    good = tmp_path / "good.csv"
    good.write_text("zone,datetime,g_co2e_per_kwh\nFR,2025-01-15T10:00:00Z,30\n")
    out = StringIO()
    call_command("import_intensity", str(good), stdout=out)
    assert "imported 1 factor(s)" in out.getvalue()
    with pytest.raises(CommandError, match="cannot read"):
        call_command("import_intensity", str(tmp_path / "missing.csv"))


def test_residual_mix_rejects_bad_values(shipped: None) -> None:
    with pytest.raises(ServiceError, match="intensity_g_per_kwh"):
        carbon.residual_mix_create(zone="FR", year=2025, intensity_g_per_kwh="-1", source="AIB")
    with pytest.raises(ServiceError, match="source"):
        carbon.residual_mix_create(zone="FR", year=2025, intensity_g_per_kwh="50", source=" ")
    with pytest.raises(ServiceError, match="year"):
        carbon.residual_mix_create(zone="FR", year=1800, intensity_g_per_kwh="50", source="AIB")


def test_instrument_rules_come_from_the_pure_core(shipped: None) -> None:
    org = OrganizationFactory()
    common = {
        "organization": org,
        "kind": "GO",
        "zone": "FR",
        "vintage_end": datetime(2026, 1, 1, tzinfo=UTC),
    }
    with pytest.raises(ServiceError, match="whole UTC hours"):
        carbon.instrument_create(
            instrument_id="a", vintage_start=datetime(2025, 1, 1, 0, 30, tzinfo=UTC), mwh="1", **common
        )
    with pytest.raises(ServiceError, match="only a supplier_rate"):
        carbon.instrument_create(
            instrument_id="b", vintage_start=datetime(2025, 1, 1, tzinfo=UTC), mwh=None, **common
        )
    with pytest.raises(ServiceError, match="time zone"):
        carbon.instrument_create(instrument_id="c", vintage_start=datetime(2025, 1, 1), mwh="1", **common)
    with pytest.raises(ServiceError, match="kind"):
        carbon.instrument_create(
            instrument_id="d",
            vintage_start=datetime(2025, 1, 1, tzinfo=UTC),
            mwh="1",
            **{**common, "kind": "X"},
        )
    carbon.instrument_create(
        instrument_id="e", vintage_start=datetime(2025, 1, 1, tzinfo=UTC), mwh="1", **common
    )
    with pytest.raises(ServiceError, match="already exists"):
        carbon.instrument_create(
            instrument_id="e", vintage_start=datetime(2025, 1, 1, tzinfo=UTC), mwh="1", **common
        )


def test_site_needs_a_known_zone_and_a_sane_pue(shipped: None) -> None:
    with pytest.raises(ServiceError, match="unknown grid zone 'XX'"):
        carbon.site_create(name="s1", zone="XX")
    with pytest.raises(ServiceError, match="pue must be between 1 and 5"):
        carbon.site_create(name="s1", zone="FR", pue="0.9")
    site = carbon.site_create(name="s1", zone="FR", pue="1.25", pue_source="measured")
    assert list(PueRecord.objects.filter(site=site).values_list("pue", flat=True)) == [site.pue]
    carbon.site_set_pue(site=site, pue="1.4", source="measured", valid_from=H10)
    site.refresh_from_db()
    assert str(site.pue) == "1.400"
    assert PueRecord.objects.filter(site=site).count() == 2


def test_rejected_imports_are_kept_with_their_errors(shipped: None) -> None:
    carbon.factor_import_csv(data=b"nonsense\n1\n", name="junk.csv")
    record = FactorImport.objects.get(name="junk.csv")
    assert record.status == "rejected" and record.errors


def test_the_home_page_shows_the_attribution_of_the_shipped_figures(shipped: None, client) -> None:
    page = client.get("/").content.decode()
    assert "Ember (2026), with major processing by Our World in Data" in page
    assert "CC BY 4.0" in page
    assert "US EPA eGRID2023" in page
