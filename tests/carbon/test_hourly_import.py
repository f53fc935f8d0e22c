"""Importing granular (hourly) certificates: checked at the edge, all or nothing, then matched hour by hour in
the market-based figure and the hourly-matched share of the carbon summary."""

from __future__ import annotations

import itertools
import re
from datetime import UTC, datetime
from decimal import Decimal
from io import StringIO

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError

from carbon import certificate_csv
from carbon import services as carbon
from carbon.models import InstrumentCertificate
from carbon.rollups import rollups_update
from carbon.selectors import carbon_summary, instrument_summary
from carbon.services import CertificateImportError, instrument_certificates_import
from inference.limits import CERTIFICATE_ID_MAX_LENGTH
from ledger.writer import append_records
from tenancy.models import Device, Organization
from tests.factories import OrganizationFactory
from tests.support.ledger import one_request_records

pytestmark = pytest.mark.django_db

_ids = itertools.count(1)
KWH_UJ = 3_600_000_000_000
H0 = datetime(2025, 6, 1, 10, tzinfo=UTC)
H1 = datetime(2025, 6, 1, 11, tzinfo=UTC)
CRITERIA = dict.fromkeys(
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
HEADER = "certificate_id,production_start,production_end,energy_wh,energy_source\n"
GOOD = (
    HEADER
    + "GC-1,2025-06-01T10:00:00Z,2025-06-01T10:30:00Z,250,solar\n"
    + "GC-2,2025-06-01T12:30:00+02:00,2025-06-01T13:00:00+02:00,250,solar\n"  # 10:30-11:00 UTC
    + "GC-3,2025-06-01T11:00:00Z,2025-06-01T12:00:00Z,2000,wind\n"
).encode()


@pytest.fixture
def org() -> Organization:
    carbon.load_shipped_factors()
    org = OrganizationFactory()
    site = carbon.site_create(name=f"fr-{org.slug}", zone="FR", pue="1", organization=org)
    gpu = Device.objects.create(
        device_id=f"gpu-{org.slug}", kind="gpu", method="nvml-counter", measured=True, site=site
    )
    for hour in (H0, H1):  # 1 kWh in each of two hours
        t = int(hour.timestamp() * 1e9) + 60 * 10**9
        records = one_request_records("c", next(_ids), org.pk, gpu.device_id, t, KWH_UJ, "digits")
        append_records("hourly-import-test", records)
    rollups_update()
    return org


def _go(org: Organization, instrument_id: str = "GO-1", mwh: str = "0.001"):  # type: ignore[no-untyped-def]
    return carbon.instrument_create(
        organization=org,
        instrument_id=instrument_id,
        kind="GO",
        zone="FR",
        vintage_start=datetime(2025, 1, 1, tzinfo=UTC),
        vintage_end=datetime(2026, 1, 1, tzinfo=UTC),
        mwh=mwh,
        quality_criteria=CRITERIA,
    )


def test_imported_certificates_are_matched_hour_by_hour_in_the_market_based_figure_and_the_share(
    org: Organization,
) -> None:
    go = _go(org)

    assert instrument_certificates_import(instrument=go, data=GOOD, created_by="test") == 3

    go.refresh_from_db()
    assert go.mwh == Decimal("0.0025")  # the certificates' sum
    assert list(InstrumentCertificate.objects.filter(instrument=go).values_list("hour", "energy_wh")) == [
        (H0, 250),
        (H0, 250),
        (H1, 2000),
    ]
    summary = carbon_summary(org.pk, datetime(2025, 6, 1, tzinfo=UTC), datetime(2025, 6, 2, tzinfo=UTC))
    # Hour 10: 0.5 of 1 kWh covered; hour 11: 1 of 1 kWh (the 1 kWh surplus expires, not moved to hour 10).
    assert summary.market.covered_mwh == {"GO-1": Decimal("0.0015")}
    assert summary.hourly_match.share == Decimal("0.75")
    fr_g_per_kwh = summary.location.total.co2e_g / 2  # the same annual factor in both hours, PUE 1
    assert summary.market.total.co2e_g == fr_g_per_kwh / 2  # half a kWh left, at the grid average
    shown = instrument_summary(go)
    assert shown["hourly_matched"] and shown["certificate_hours"] == 2 and shown["usable"]


def test_an_annual_instrument_of_the_same_volume_leaves_the_hourly_share_at_zero(org: Organization) -> None:
    _go(org, "REC-annual", mwh="0.0025")

    summary = carbon_summary(org.pk, datetime(2025, 6, 1, tzinfo=UTC), datetime(2025, 6, 2, tzinfo=UTC))

    assert summary.market.total.co2e_g == 0
    assert summary.hourly_match.share == 0


@pytest.mark.parametrize(
    ("row", "reason"),
    [
        ("GC-9,2025-06-01T10:30:00Z,2025-06-01T11:30:00Z,10,solar", "crosses the hour"),
        ("GC-9,2025-06-01T10:00:00Z,2025-06-01T12:00:00Z,10,solar", "longer than one hour"),
        ("GC-9,2025-06-01T10:30:00Z,2025-06-01T10:30:00Z,10,solar", "not after"),
        ("GC-9,2025-06-01T10:00:00,2025-06-01T10:30:00Z,10,solar", "no time zone"),
        ("GC-9,2025-06-01,2025-06-01T10:30:00Z,10,solar", "no time of day"),
        ("GC-9,2225-06-01T10:00:00Z,2225-06-01T10:30:00Z,10,solar", "year outside"),
        ("GC-9,2025-06-01T10:00:00Z,2025-06-01T10:30:00Z,-1,solar", "whole number"),
        ("GC-9,2025-06-01T10:00:00Z,2025-06-01T10:30:00Z,1.5,solar", "whole number"),
        ("GC-9,2025-06-01T10:00:00Z,2025-06-01T10:30:00Z,1e3,solar", "whole number"),
        ("GC-9,2025-06-01T10:00:00Z,2025-06-01T10:30:00Z,99999999999999,solar", "above"),
        (",2025-06-01T10:00:00Z,2025-06-01T10:30:00Z,10,solar", "certificate_id is empty"),
        ("GC\x07,2025-06-01T10:00:00Z,2025-06-01T10:30:00Z,10,solar", "control character"),
        ("GC-9,2025-06-01T10:00:00Z,2025-06-01T10:30:00Z,10," + "s" * 33, "energy_source is 33"),
        ("GC-1,2025-06-01T10:00:00Z,2025-06-01T10:30:00Z,10,solar", "already on line 2"),
        ("GC-9,2024-06-01T10:00:00Z,2024-06-01T10:30:00Z,10,solar", "outside the vintage"),
    ],
)
def test_a_bad_row_rejects_the_whole_file_naming_its_line_and_reason(
    org: Organization, row: str, reason: str
) -> None:
    go = _go(org)
    data = (HEADER + "GC-1,2025-06-01T10:00:00Z,2025-06-01T10:30:00Z,250,solar\n" + row + "\n").encode()

    with pytest.raises(CertificateImportError) as caught:
        instrument_certificates_import(instrument=go, data=data)

    errors = caught.value.errors
    assert {e.line for e in errors} == {3} and any(reason in e.reason for e in errors), errors
    assert not InstrumentCertificate.objects.exists()
    go.refresh_from_db()
    assert go.mwh == Decimal("0.001")


def test_a_certificate_id_as_wide_as_its_column_fits_and_one_character_more_is_refused(
    org: Organization,
) -> None:
    go = _go(org)
    widest = "G" * CERTIFICATE_ID_MAX_LENGTH
    row = ",2025-06-01T10:00:00Z,2025-06-01T10:30:00Z,10,solar\n"

    with pytest.raises(CertificateImportError, match=f"at most {CERTIFICATE_ID_MAX_LENGTH}"):
        instrument_certificates_import(instrument=go, data=(HEADER + widest + "G" + row).encode())
    assert instrument_certificates_import(instrument=go, data=(HEADER + widest + row).encode()) == 1
    assert InstrumentCertificate.objects.get().certificate_id == widest


def test_the_same_certificates_are_not_imported_twice(org: Organization) -> None:
    go = _go(org)
    instrument_certificates_import(instrument=go, data=GOOD)

    with pytest.raises(CertificateImportError, match="already imported"):
        instrument_certificates_import(instrument=go, data=GOOD)
    assert InstrumentCertificate.objects.count() == 3


def test_sizes_are_checked_before_the_rows(org: Organization, monkeypatch: pytest.MonkeyPatch) -> None:
    go = _go(org)
    monkeypatch.setattr(certificate_csv, "MAX_BYTES", 100)
    with pytest.raises(CertificateImportError, match="at most 100 bytes"):
        instrument_certificates_import(instrument=go, data=GOOD + b"\xff" * 100)  # not even decoded
    monkeypatch.setattr(certificate_csv, "MAX_BYTES", 10**6)
    monkeypatch.setattr(certificate_csv, "MAX_ROWS", 2)
    with pytest.raises(CertificateImportError, match="more than 2 certificates"):
        instrument_certificates_import(instrument=go, data=GOOD)


def test_many_bad_rows_are_counted_and_only_the_first_are_kept(org: Organization) -> None:
    go = _go(org)
    data = (HEADER + "x,bad,bad,bad\n" * 5000).encode()

    with pytest.raises(CertificateImportError) as caught:
        instrument_certificates_import(instrument=go, data=data)

    assert caught.value.count == 3 * 5000 and len(caught.value.errors) == 100


@pytest.mark.parametrize(
    ("data", "reason"),
    [
        (b"", "empty"),
        (b"certificate_id,energy_wh\n", "missing column(s) production_start, production_end"),
        (HEADER.encode() + b"GC\x00,2025-06-01T10:00:00Z,2025-06-01T10:30:00Z,10,x\n", "NUL"),
        (HEADER.encode("utf-16"), "not UTF-8"),
        (HEADER.encode(), "no certificate"),
    ],
)
def test_a_file_that_is_no_certificate_list_is_refused_in_one_line(
    org: Organization, data: bytes, reason: str
) -> None:
    with pytest.raises(carbon.ServiceError, match=re.escape(reason)):
        instrument_certificates_import(instrument=_go(org), data=data)


def test_the_command_imports_and_answers_a_bad_file_with_its_lines_and_one_error(
    org: Organization, tmp_path
) -> None:  # type: ignore[no-untyped-def]
    _go(org)
    good, bad = tmp_path / "good.csv", tmp_path / "bad.csv"
    good.write_bytes(GOOD)
    bad.write_bytes((HEADER + "GC-7,2025-06-01T10:30:00Z,2025-06-01T11:30:00Z,10,solar\n").encode())
    out, err = StringIO(), StringIO()

    call_command("import_certificates", str(good), "--org", org.slug, "--instrument", "GO-1", stdout=out)
    with pytest.raises(CommandError, match=r"bad\.csv rejected: 1 problem"):
        call_command("import_certificates", str(bad), "--org", org.slug, "--instrument", "GO-1", stderr=err)
    with pytest.raises(CommandError, match="no instrument 'GO-2'"):
        call_command("import_certificates", str(good), "--org", org.slug, "--instrument", "GO-2")

    assert "imported 3 certificate(s) into GO-1" in out.getvalue() and "0.0025" in out.getvalue()
    assert "bad.csv:2: the production interval crosses the hour" in err.getvalue()
