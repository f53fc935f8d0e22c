"""Grid carbon-intensity CSV import (carbon.intensity_csv): the three layouts, every rejection
reason, all-or-nothing behaviour and the shipped public figures. No Django, no database."""

from __future__ import annotations

import ast
import dataclasses
import pickle
import sys
import time
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from pathlib import Path

import pytest

from carbon.intensity_csv import (
    ELECTRICITYMAPS_LICENCE,
    ELECTRICITYMAPS_SOURCE,
    ELECTRICITYMAPS_URL,
    PLAIN_SOURCE,
    IntensityImportError,
    IntensityRow,
    ParsedFile,
    RowError,
    parse_intensity_bytes,
    parse_intensity_csv,
)

ROOT = Path(__file__).resolve().parents[2]
GRID = ROOT / "carbon" / "data" / "grid-intensity"  # the project's copy of the shared figures
MODULE = ROOT / "carbon" / "intensity_csv.py"

PLAIN = "zone,datetime,g_co2e_per_kwh\n"
PLAIN_BASIS = "zone,datetime,g_co2e_per_kwh,basis\n"
ANNUAL = "zone,zone_name,year,gco2e_per_kwh,basis,gases,mix,source,license,url,published\n"
# The hourly export header as the Electricity Maps data portal writes it.
EM = (
    "Datetime (UTC),Country,Zone Name,Zone Id,Carbon Intensity gCO₂eq/kWh (direct),"
    "Carbon Intensity gCO₂eq/kWh (LCA),Low Carbon Percentage,Renewable Percentage,Data Source,"
    "Data Estimated,Data Estimation Method\n"
)
EM_ROW = "2023-01-01 00:00:00,France,France,FR,22.5,56.04,95.1,28.3,rte-france.com,false,\n"

H13 = datetime(2024, 3, 1, 13, tzinfo=UTC)


def errors_of(text: str, **kwargs: object) -> tuple[RowError, ...]:
    with pytest.raises(IntensityImportError) as caught:
        parse_intensity_csv(text, **kwargs)  # type: ignore[arg-type]
    return caught.value.errors


def only_error(text: str, **kwargs: object) -> RowError:
    errors = errors_of(text, **kwargs)
    assert len(errors) == 1, errors
    return errors[0]


def shipped(name: str) -> ParsedFile:
    return parse_intensity_bytes((GRID / name).read_bytes())


# ----------------------------------------------------------------------------------------------------------------
# plain layout
# ----------------------------------------------------------------------------------------------------------------


def test_plain_rows_are_hourly_factors_with_the_lifecycle_default_basis() -> None:
    parsed = parse_intensity_csv(PLAIN + "FR,2024-03-01T13:00:00Z,56.04\nDE,2024-03-01T14:00:00Z,380\n")

    assert parsed.layout == "plain"
    first, second = parsed.rows
    assert first == IntensityRow(
        line=2,
        zone="FR",
        period_start=H13,
        period_end=H13 + timedelta(hours=1),
        granularity="hour",
        intensity_g_per_kwh=Decimal("56.04"),
        basis="lifecycle",
        source=PLAIN_SOURCE,
        licence="",
        url="",
        published="",
    )
    assert first.gases == "CO2e" and first.zone_name == "" and first.estimated is False
    assert (second.line, second.zone, second.intensity_g_per_kwh) == (3, "DE", Decimal("380"))


def test_plain_datetime_with_offset_is_converted_to_utc() -> None:
    (row,) = parse_intensity_csv(PLAIN + "FR,2024-03-01T14:00:00+01:00,56\n").rows

    assert row.period_start == H13
    assert row.period_start.utcoffset() == timedelta(0)
    assert row.period_end == datetime(2024, 3, 1, 14, tzinfo=UTC)


def test_plain_offset_that_is_not_on_a_whole_utc_hour_is_rejected() -> None:
    error = only_error(PLAIN + "IN,2024-03-01T13:00:00+05:30,700\n")

    assert error.line == 2
    assert "whole UTC hour" in error.reason and "2024-03-01T07:30:00Z" in error.reason


def test_plain_default_basis_parameter_applies_when_there_is_no_basis_column() -> None:
    (row,) = parse_intensity_csv(PLAIN + "FR,2024-03-01T13:00:00Z,22\n", default_basis="direct").rows

    assert row.basis == "direct"


def test_plain_basis_column_is_used_and_an_empty_cell_takes_the_default() -> None:
    parsed = parse_intensity_csv(
        PLAIN_BASIS + "FR,2024-03-01T13:00:00Z,22,direct\nFR,2024-03-01T13:00:00Z,56,Lifecycle\n"
        "DE,2024-03-01T13:00:00Z,380,\n",
        default_basis="direct",
    )

    assert [r.basis for r in parsed.rows] == ["direct", "lifecycle", "direct"]


def test_plain_source_licence_and_url_come_from_the_caller() -> None:
    (row,) = parse_intensity_csv(
        PLAIN + "FR,2024-03-01T13:00:00Z,56\n",
        source="RTE eco2mix",
        licence="Etalab 2.0",
        url="https://www.rte-france.com",
    ).rows

    assert (row.source, row.licence, row.url) == ("RTE eco2mix", "Etalab 2.0", "https://www.rte-france.com")


def test_header_names_ignore_case_and_surrounding_spaces() -> None:
    parsed = parse_intensity_csv(" Zone , DateTime ,G_CO2E_PER_KWH \nFR,2024-03-01T13:00:00Z,56\n")

    assert parsed.layout == "plain" and len(parsed.rows) == 1


def test_columns_are_found_by_name_whatever_their_order() -> None:
    (row,) = parse_intensity_csv(
        "g_co2e_per_kwh,basis,datetime,zone\n56,direct,2024-03-01T13:00:00Z,FR\n"
    ).rows

    assert (row.zone, row.basis, row.period_start, row.intensity_g_per_kwh) == (
        "FR",
        "direct",
        H13,
        Decimal("56"),
    )


def test_cells_are_stripped_of_surrounding_spaces() -> None:
    (row,) = parse_intensity_csv(PLAIN + " FR , 2024-03-01T13:00:00Z , 56.04 \n").rows

    assert (row.zone, row.period_start, row.intensity_g_per_kwh) == ("FR", H13, Decimal("56.04"))


def test_intensity_is_the_exact_decimal_written_in_the_file() -> None:
    parsed = parse_intensity_csv(
        PLAIN + "FR,2024-03-01T13:00:00Z,56.04\nFR,2024-03-01T14:00:00Z,0.1\nFR,2024-03-01T15:00:00Z,1e2\n"
    )
    values = [r.intensity_g_per_kwh for r in parsed.rows]

    assert all(type(v) is Decimal for v in values)
    assert str(values[0]) == "56.04" and values[0] == Decimal("56.04")
    # 0.1 has no exact binary float; a float round-trip would give 0.1000000000000000055511151231257827...
    assert values[1].as_tuple() == Decimal("0.1").as_tuple()
    assert values[2] == Decimal("100")


def test_zero_intensity_is_accepted() -> None:
    (row,) = parse_intensity_csv(PLAIN + "IS,2024-03-01T13:00:00Z,0\n").rows

    assert row.intensity_g_per_kwh == 0


def test_rows_are_frozen() -> None:
    (row,) = parse_intensity_csv(PLAIN + "FR,2024-03-01T13:00:00Z,56\n").rows

    with pytest.raises(dataclasses.FrozenInstanceError):
        row.zone = "DE"  # type: ignore[misc]


def test_an_invalid_default_basis_is_a_caller_error() -> None:
    with pytest.raises(ValueError, match="default_basis"):
        parse_intensity_csv(PLAIN + "FR,2024-03-01T13:00:00Z,56\n", default_basis="market")  # type: ignore[arg-type]


# ----------------------------------------------------------------------------------------------------------------
# electricitymaps layout
# ----------------------------------------------------------------------------------------------------------------


def test_electricitymaps_row_gives_a_direct_and_a_lifecycle_factor_for_the_hour() -> None:
    parsed = parse_intensity_csv(EM + EM_ROW)

    assert parsed.layout == "electricitymaps"
    direct, lifecycle = parsed.rows
    assert (direct.basis, direct.intensity_g_per_kwh) == ("direct", Decimal("22.5"))
    assert (lifecycle.basis, lifecycle.intensity_g_per_kwh) == ("lifecycle", Decimal("56.04"))
    for row in parsed.rows:
        assert row.line == 2
        assert row.zone == "FR" and row.zone_name == "France"
        assert row.period_start == datetime(2023, 1, 1, tzinfo=UTC)
        assert row.period_end == datetime(2023, 1, 1, 1, tzinfo=UTC)
        assert row.granularity == "hour"
        assert row.estimated is False


def test_electricitymaps_naive_datetime_is_utc_and_iso_with_z_or_offset_is_accepted() -> None:
    parsed = parse_intensity_csv(
        EM
        + "2023-01-01 00:00:00,France,France,FR,22,56,,,,false,\n"
        + "2023-01-01T01:00:00Z,France,France,FR,23,57,,,,false,\n"
        + "2023-01-01T03:00:00+01:00,France,France,FR,24,58,,,,false,\n"
    )

    starts = sorted({r.period_start for r in parsed.rows})
    assert starts == [datetime(2023, 1, 1, h, tzinfo=UTC) for h in range(3)]


def test_electricitymaps_older_gco2eq_spelling_is_accepted() -> None:
    parsed = parse_intensity_csv(EM.replace("gCO₂eq", "gCO2eq") + EM_ROW)

    assert parsed.layout == "electricitymaps"
    assert [r.basis for r in parsed.rows] == ["direct", "lifecycle"]


def test_electricitymaps_newer_life_cycle_header_is_accepted() -> None:
    header = (
        "Datetime (UTC),Country,Zone name,Zone id,Carbon intensity gCO₂eq/kWh (direct),"
        "Carbon intensity gCO₂eq/kWh (Life cycle),Carbon-free energy percentage (CFE%),"
        "Renewable energy percentage (RE%),Data source,Data estimated,Data estimation method\n"
    )
    parsed = parse_intensity_csv(
        header + "2024-01-01 00:00:00,Sweden,Sweden,SE,2.54,30.02,99.42,60.13,svk.se,true,ESTIMATED\n"
    )

    assert [(r.zone, r.basis, r.intensity_g_per_kwh) for r in parsed.rows] == [
        ("SE", "direct", Decimal("2.54")),
        ("SE", "lifecycle", Decimal("30.02")),
    ]


def test_electricitymaps_empty_cell_means_that_basis_is_absent() -> None:
    parsed = parse_intensity_csv(
        EM
        + "2023-01-01 00:00:00,France,France,FR,,56.04,,,,false,\n"
        + "2023-01-01 01:00:00,France,France,FR,22.5,,,,,false,\n"
    )

    assert [(r.line, r.basis) for r in parsed.rows] == [(2, "lifecycle"), (3, "direct")]


def test_electricitymaps_source_names_the_data_source_and_licence_and_url_default() -> None:
    parsed = parse_intensity_csv(EM + EM_ROW + "2023-01-01 01:00:00,France,France,FR,22,56,,,,false,\n")

    with_source, without_source = parsed.rows[0], parsed.rows[2]
    assert (
        with_source.source
        == f"{ELECTRICITYMAPS_SOURCE} (rte-france.com)"
        == "Electricity Maps (rte-france.com)"
    )
    assert without_source.source == "Electricity Maps"
    assert with_source.licence == ELECTRICITYMAPS_LICENCE
    assert with_source.url == ELECTRICITYMAPS_URL == "https://www.electricitymaps.com"


def test_electricitymaps_source_licence_and_url_parameters_override_the_defaults() -> None:
    (row, _) = parse_intensity_csv(
        EM + EM_ROW, source="Electricity Maps 2023 hourly", licence="ODbL", url="https://example.org/fr.csv"
    ).rows

    assert (row.source, row.licence, row.url) == (
        "Electricity Maps 2023 hourly (rte-france.com)",
        "ODbL",
        "https://example.org/fr.csv",
    )


def test_electricitymaps_data_estimated_is_kept_as_a_boolean() -> None:
    parsed = parse_intensity_csv(
        EM
        + "2023-01-01 00:00:00,France,France,FR,22,56,,,,true,ESTIMATED_TIME_SLICER_AVERAGE\n"
        + "2023-01-01 01:00:00,France,France,FR,22,56,,,,False,\n"
        + "2023-01-01 02:00:00,France,France,FR,22,56,,,,,\n"
    )

    assert [r.estimated for r in parsed.rows] == [True, True, False, False, False, False]


def test_electricitymaps_zone_is_the_zone_id_not_the_country() -> None:
    parsed = parse_intensity_csv(EM + "2023-01-01 00:00:00,USA,CAISO,US-CAL-CISO,200,250,,,,false,\n")

    assert {(r.zone, r.zone_name) for r in parsed.rows} == {("US-CAL-CISO", "CAISO")}


def test_electricitymaps_row_with_both_intensities_empty_is_rejected() -> None:
    error = only_error(EM + "2023-01-01 00:00:00,France,France,FR,,,,,,false,\n")

    assert error.line == 2 and "both carbon intensity columns" in error.reason


def test_electricitymaps_data_estimated_that_is_not_a_boolean_is_rejected() -> None:
    error = only_error(EM + "2023-01-01 00:00:00,France,France,FR,22,56,,,,maybe,\n")

    assert error.line == 2 and "'maybe'" in error.reason and "true or false" in error.reason


def test_electricitymaps_bad_value_in_one_column_rejects_the_whole_row() -> None:
    error = only_error(EM + "2023-01-01 00:00:00,France,France,FR,22,n/a,,,,false,\n")

    assert error.line == 2 and "'n/a' is not a number" in error.reason


# ----------------------------------------------------------------------------------------------------------------
# annual layout and the shipped public figures
# ----------------------------------------------------------------------------------------------------------------


def test_annual_row_covers_the_utc_calendar_year_and_keeps_its_attribution() -> None:
    (row,) = parse_intensity_csv(
        ANNUAL
        + 'FR,France,2023,56.039,lifecycle,CO2e,production,"Ember; OWID",CC BY 4.0,https://x.org,2024\n',
        source="ignored when the cell is filled",
    ).rows

    assert row.granularity == "year"
    assert row.period_start == datetime(2023, 1, 1, tzinfo=UTC)
    assert row.period_end == datetime(2024, 1, 1, tzinfo=UTC)
    assert (row.zone, row.zone_name, row.basis, row.gases) == ("FR", "France", "lifecycle", "CO2e")
    assert (row.source, row.licence, row.url, row.published) == (
        "Ember; OWID",
        "CC BY 4.0",
        "https://x.org",
        "2024",
    )
    assert row.intensity_g_per_kwh == Decimal("56.039")


def test_annual_empty_gases_and_attribution_cells_take_defaults_and_parameters() -> None:
    (row,) = parse_intensity_csv(
        ANNUAL + "FR,France,2023,56,direct,,production,,,,\n",
        source="S",
        licence="L",
        url="https://u.example",
    ).rows

    assert (row.gases, row.source, row.licence, row.url, row.published) == (
        "CO2e",
        "S",
        "L",
        "https://u.example",
        "",
    )


def test_shipped_ember_owid_latest_file_parses_whole() -> None:
    parsed = shipped("ember_owid_countries_latest.csv")

    assert parsed.layout == "annual"
    assert len(parsed.rows) == 213
    (fr,) = [r for r in parsed.rows if r.zone == "FR"]
    assert fr.intensity_g_per_kwh == Decimal("41.44")
    assert fr.period_start == datetime(2025, 1, 1, tzinfo=UTC)
    assert (fr.basis, fr.zone_name, fr.licence) == ("lifecycle", "France", "CC BY 4.0")
    assert fr.source == "Ember (2026), with major processing by Our World in Data"
    (de,) = [r for r in parsed.rows if r.zone == "DE"]
    assert de.intensity_g_per_kwh == Decimal("329.65")


def test_shipped_owid_2021_2023_file_parses_whole() -> None:
    parsed = shipped("owid_countries_2021_2023.csv")

    assert parsed.layout == "annual"
    assert len(parsed.rows) == 213
    (fr,) = [r for r in parsed.rows if r.zone == "FR"]
    assert fr.intensity_g_per_kwh == Decimal("56.039")
    assert fr.period_start == datetime(2023, 1, 1, tzinfo=UTC)
    assert fr.published == "2024"


def test_shipped_egrid_us_states_file_parses_whole() -> None:
    parsed = shipped("egrid2023_us_states.csv")

    assert parsed.layout == "annual"
    assert len(parsed.rows) == 52
    assert {r.basis for r in parsed.rows} == {"direct"}
    (ca,) = [r for r in parsed.rows if r.zone == "US-CA"]
    assert (ca.intensity_g_per_kwh, ca.zone_name) == (Decimal("179.064"), "California")
    assert ca.period_start == datetime(2023, 1, 1, tzinfo=UTC)
    assert ca.licence == "Public domain (US federal government work)"


# ----------------------------------------------------------------------------------------------------------------
# File-level handling: encoding, BOM, line endings, blank lines
# ----------------------------------------------------------------------------------------------------------------


def test_utf8_bom_is_ignored_in_bytes_and_in_text() -> None:
    data = "\ufeff" + PLAIN + "FR,2024-03-01T13:00:00Z,56\n"

    assert parse_intensity_bytes(data.encode("utf-8")).layout == "plain"
    assert parse_intensity_csv(data).layout == "plain"
    assert parse_intensity_bytes(("\ufeff" + EM + EM_ROW).encode("utf-8")).layout == "electricitymaps"


def test_crlf_line_endings_are_accepted_and_lines_still_count_from_one() -> None:
    text = (PLAIN + "FR,2024-03-01T13:00:00Z,56\nFR,2024-03-01T14:00:00Z,57\n").replace("\n", "\r\n")

    parsed = parse_intensity_bytes(text.encode("utf-8"))

    assert [(r.line, r.intensity_g_per_kwh) for r in parsed.rows] == [(2, Decimal("56")), (3, Decimal("57"))]
    assert only_error(text + "FR,x,58\r\n").line == 4


def test_blank_lines_at_the_end_are_ignored() -> None:
    parsed = parse_intensity_csv(PLAIN + "FR,2024-03-01T13:00:00Z,56\n\n   \n,,\n\n")

    assert len(parsed.rows) == 1


def test_a_file_that_is_not_utf8_is_rejected_at_the_line_of_the_bad_byte() -> None:
    data = (PLAIN + "FR,2024-03-01T13:00:00Z,56\n").encode() + b"R\xe9union,2024-03-01T13:00:00Z,56\n"

    with pytest.raises(IntensityImportError) as caught:
        parse_intensity_bytes(data)

    (error,) = caught.value.errors
    assert error.line == 3 and "not UTF-8" in error.reason and "0xe9" in error.reason


def test_a_utf16_file_is_rejected_as_such() -> None:
    with pytest.raises(IntensityImportError) as caught:
        parse_intensity_bytes((PLAIN + "FR,2024-03-01T13:00:00Z,56\n").encode("utf-16"))

    (error,) = caught.value.errors
    assert error.line == 1 and "UTF-16" in error.reason


def test_a_quoted_cell_spanning_lines_keeps_later_line_numbers_physical() -> None:
    text = ANNUAL + 'FR,France,2023,56,lifecycle,CO2e,production,"two\nlines",CC BY 4.0,https://x.org,2024\n'
    text += "DE,Germany,2023,abc,lifecycle,CO2e,production,S,L,https://u.example,2024\n"

    assert only_error(text).line == 4


# ----------------------------------------------------------------------------------------------------------------
# Rejections, one reason each
# ----------------------------------------------------------------------------------------------------------------


def test_wrong_number_of_columns_is_rejected() -> None:
    errors = errors_of(PLAIN + "FR,2024-03-01T13:00:00Z\nFR,2024-03-01T14:00:00Z,56,direct\n")

    assert [e.line for e in errors] == [2, 3]
    assert "wrong number of columns: 2 instead of 3" in errors[0].reason
    assert "4 instead of 3" in errors[1].reason


def test_unparseable_date_is_rejected() -> None:
    error = only_error(PLAIN + "FR,01/03/2024 13:00,56\n")

    assert error.line == 2 and "bad date '01/03/2024 13:00'" in error.reason


def test_naive_date_is_rejected_in_the_plain_layout() -> None:
    error = only_error(PLAIN + "FR,2024-03-01T13:00:00,56\n")

    assert "bad date '2024-03-01T13:00:00'" in error.reason and "no timezone" in error.reason


def test_date_not_on_a_whole_hour_is_rejected() -> None:
    error = only_error(PLAIN + "FR,2024-03-01T13:15:00Z,56\n")

    assert "bad date '2024-03-01T13:15:00Z'" in error.reason and "not on a whole UTC hour" in error.reason


def test_date_without_a_time_of_day_is_rejected() -> None:
    error = only_error(EM + "2023-01-01,France,France,FR,22,56,,,,false,\n")

    assert "bad date '2023-01-01'" in error.reason and "no time of day" in error.reason


def test_date_with_an_implausible_year_is_rejected() -> None:
    error = only_error(PLAIN + "FR,0202-03-01T13:00:00Z,56\n")

    assert "bad date '0202-03-01T13:00:00Z'" in error.reason and "year outside" in error.reason


def test_bad_year_is_rejected() -> None:
    rest = ",lifecycle,CO2e,production,S,L,https://u.example,2024\n"
    errors = errors_of(
        ANNUAL
        + f"FR,France,23,56{rest}DE,Germany,2O23,380{rest}PL,Poland,3023,600{rest}IT,Italy,+202,300{rest}"
    )

    assert [e.line for e in errors] == [2, 3, 4, 5]
    assert all(e.reason.startswith("bad year") for e in errors)
    assert "'2O23'" in errors[1].reason


def test_value_that_is_not_a_number_is_rejected() -> None:
    errors = errors_of(
        PLAIN + "FR,2024-03-01T13:00:00Z,abc\nFR,2024-03-01T14:00:00Z,NaN\nFR,2024-03-01T15:00:00Z,1_000\n"
        "FR,2024-03-01T16:00:00Z,\n"
    )

    assert [e.line for e in errors] == [2, 3, 4, 5]
    assert "g_co2e_per_kwh 'abc' is not a number" in errors[0].reason
    assert "'NaN' is not a number" in errors[1].reason
    assert "'1_000' is not a number" in errors[2].reason
    assert "g_co2e_per_kwh is empty" in errors[3].reason


def test_negative_value_is_rejected() -> None:
    error = only_error(PLAIN + "FR,2024-03-01T13:00:00Z,-5\n")

    assert "'-5' is negative" in error.reason


def test_absurd_value_above_the_limit_is_rejected() -> None:
    error = only_error(PLAIN + "FR,2024-03-01T13:00:00Z,56040\n")

    assert "'56040' is above 2000" in error.reason


def test_the_absurdity_limit_is_inclusive_and_configurable() -> None:
    text = PLAIN + "FR,2024-03-01T13:00:00Z,900\n"

    assert len(parse_intensity_csv(PLAIN + "FR,2024-03-01T13:00:00Z,2000\n").rows) == 1
    assert "is above 800" in only_error(text, max_g_per_kwh=Decimal("800")).reason


def test_basis_other_than_direct_or_lifecycle_is_rejected() -> None:
    plain = only_error(PLAIN_BASIS + "FR,2024-03-01T13:00:00Z,56,market\n")
    annual = errors_of(
        ANNUAL
        + "FR,France,2023,56,LCA,CO2e,production,S,L,https://u.example,2024\n"
        + "DE,Germany,2023,380,,CO2e,production,S,L,https://u.example,2024\n"
    )

    assert (plain.line, plain.reason) == (2, "basis 'market' is not 'direct' or 'lifecycle'")
    assert [(e.line, e.reason) for e in annual] == [
        (2, "basis 'LCA' is not 'direct' or 'lifecycle'"),
        (3, "basis is empty; it must be 'direct' or 'lifecycle'"),
    ]


def test_unknown_zone_is_rejected_when_known_zones_are_given() -> None:
    text = PLAIN + "FR,2024-03-01T13:00:00Z,56\nfr,2024-03-01T14:00:00Z,56\nXX,2024-03-01T15:00:00Z,56\n"

    errors = errors_of(text, known_zones={"FR", "DE"})

    assert [(e.line, e.reason) for e in errors] == [(3, "unknown zone 'fr'"), (4, "unknown zone 'XX'")]


def test_known_zones_are_compared_after_stripping_spaces() -> None:
    text = PLAIN + "FR,2024-03-01T13:00:00Z,56\n DE ,2024-03-01T13:00:00Z,380\n"

    parsed = parse_intensity_csv(text, known_zones=[" FR", "DE "])

    assert [r.zone for r in parsed.rows] == ["FR", "DE"]


def test_any_zone_is_accepted_without_known_zones() -> None:
    assert parse_intensity_csv(PLAIN + "XX,2024-03-01T13:00:00Z,56\n").rows[0].zone == "XX"


def test_empty_zone_is_rejected() -> None:
    plain = only_error(PLAIN + "  ,2024-03-01T13:00:00Z,56\n")
    em = only_error(EM + "2023-01-01 00:00:00,France,France,,22,56,,,,false,\n")

    assert (plain.line, plain.reason) == (2, "zone is empty")
    assert (em.line, em.reason) == (2, "Zone Id is empty")


def test_duplicate_hour_is_rejected_on_the_later_line_naming_the_earlier() -> None:
    text = (
        PLAIN + "FR,2024-03-01T13:00:00Z,56\nDE,2024-03-01T13:00:00Z,380\nFR,2024-03-01T14:00:00+01:00,57\n"
    )

    error = only_error(text)

    assert error.line == 4
    assert "duplicate" in error.reason and "'FR'" in error.reason and "2024-03-01T13:00Z" in error.reason
    assert "already given on line 2" in error.reason


def test_same_hour_with_another_basis_is_not_a_duplicate() -> None:
    parsed = parse_intensity_csv(
        PLAIN_BASIS + "FR,2024-03-01T13:00:00Z,22,direct\nFR,2024-03-01T13:00:00Z,56,lifecycle\n"
    )

    assert len(parsed.rows) == 2


def test_duplicate_year_and_duplicate_electricitymaps_hour_are_rejected() -> None:
    row = "FR,France,2023,56,lifecycle,CO2e,production,S,L,https://u.example,2024\n"
    annual = only_error(ANNUAL + row + row)
    em_errors = errors_of(EM + EM_ROW + EM_ROW.replace("22.5", "23"))

    assert annual.line == 3 and "year 2023 already given on line 2" in annual.reason
    # One per basis: the direct and the lifecycle factor of line 3 both repeat line 2.
    assert [(e.line, "already given on line 2" in e.reason) for e in em_errors] == [(3, True), (3, True)]


def test_empty_file_is_rejected() -> None:
    for text in ("", "\ufeff", "\n\n  \n"):
        error = only_error(text)
        assert error.line == 1 and "empty" in error.reason


def test_header_without_rows_is_rejected() -> None:
    for text in (PLAIN, PLAIN.rstrip("\n"), PLAIN + "\n\n"):
        error = only_error(text)
        assert (error.line, error.reason) == (2, "the file has a header but no data rows")


def test_blank_line_between_data_rows_is_rejected() -> None:
    error = only_error(PLAIN + "FR,2024-03-01T13:00:00Z,56\n\nFR,2024-03-01T14:00:00Z,57\n")

    assert (error.line, error.reason) == (3, "blank line between data rows")


def test_unknown_header_names_the_expected_layouts() -> None:
    error = only_error("country,hour,value\nFR,2024-03-01T13:00:00Z,56\n")

    assert error.line == 1
    assert "unrecognised header 'country,hour,value'" in error.reason
    for expected in (
        "plain",
        "zone,datetime,g_co2e_per_kwh",
        "electricitymaps",
        "Zone Id",
        "annual",
        "gco2e_per_kwh",
    ):
        assert expected in error.reason


def test_header_with_a_repeated_column_is_not_recognised() -> None:
    error = only_error("zone,zone,datetime,g_co2e_per_kwh\nFR,FR,2024-03-01T13:00:00Z,56\n")

    assert "unrecognised header" in error.reason


# ----------------------------------------------------------------------------------------------------------------
# All or nothing, and the error report
# ----------------------------------------------------------------------------------------------------------------


def test_one_bad_row_rejects_the_whole_file() -> None:
    good = "".join(f"FR,2024-03-01T{h:02d}:00:00Z,{50 + h}\n" for h in range(10))

    with pytest.raises(IntensityImportError) as caught:
        parse_intensity_csv(PLAIN + good + "FR,2024-03-02T00:00:00Z,-1\n")

    assert [e.line for e in caught.value.errors] == [12]


def test_every_problem_of_the_file_is_reported_with_its_line() -> None:
    text = (
        PLAIN_BASIS
        + "FR,2024-03-01T13:00:00Z,56,direct\n"  # 2 ok
        + "FR,2024-03-01T13:30:00Z,56,direct\n"  # 3 not on the hour
        + "DE,2024-03-01T13:00:00Z,abc,direct\n"  # 4 not a number
        + "PL,2024-03-01T13:00:00Z,600\n"  # 5 wrong number of columns
        + "FR,2024-03-01T13:00:00Z,57,direct\n"  # 6 duplicate of 2
        + ",2024-03-01,-3,solar\n"  # 7 four problems
        + "IT,2024-03-01T13:00:00Z,300,lifecycle\n"  # 8 ok
    )

    errors = errors_of(text)

    assert [e.line for e in errors] == [3, 4, 5, 6, 7, 7, 7, 7]
    assert "already given on line 2" in errors[3].reason
    reasons_7 = " | ".join(e.reason for e in errors[4:])
    for part in ("zone is empty", "no time of day", "'-3' is negative", "basis 'solar'"):
        assert part in reasons_7


def test_error_message_summarises_the_count_and_the_first_problems() -> None:
    text = PLAIN + "".join(f"FR,2024-03-01T{h:02d}:00:00Z,x{h}\n" for h in range(7))

    with pytest.raises(IntensityImportError) as caught:
        parse_intensity_csv(text)

    message = str(caught.value)
    assert message.startswith("intensity CSV rejected, nothing imported: 7 problems on 7 lines")
    assert "line 2: g_co2e_per_kwh 'x0' is not a number" in message
    assert "line 6:" in message and "line 7:" not in message
    assert message.endswith("and 2 more")


def test_import_error_survives_pickling_with_its_errors() -> None:
    with pytest.raises(IntensityImportError) as caught:
        parse_intensity_csv(PLAIN + "FR,2024-03-01T13:00:00Z,-1\n")

    copy = pickle.loads(pickle.dumps(caught.value))

    assert copy.errors == caught.value.errors and str(copy) == str(caught.value)


def test_long_offending_values_are_shortened_in_messages() -> None:
    error = only_error(PLAIN + f"FR,2024-03-01T13:00:00Z,{'9' * 5000}x\n")

    assert len(error.reason) < 200 and "..." in error.reason


# ----------------------------------------------------------------------------------------------------------------
# Size
# ----------------------------------------------------------------------------------------------------------------


def test_a_hundred_thousand_rows_parse_quickly() -> None:
    start = datetime(2020, 1, 1, tzinfo=UTC)
    rows = "".join(
        f"{start + timedelta(hours=i):%Y-%m-%d %H:%M:%S},France,France,FR,{i % 90}.5,{i % 90 + 20}.25,,,src,false,\n"
        for i in range(100_000)
    )

    began = time.perf_counter()
    parsed = parse_intensity_csv(EM + rows)
    elapsed = time.perf_counter() - began

    assert len(parsed.rows) == 200_000
    assert parsed.rows[-1].period_start == start + timedelta(hours=99_999)
    # About 1.5 s on a 2-core CI machine; the margin keeps a loaded runner from failing the test.
    assert elapsed < 8, f"{elapsed:.1f} s for 100,000 rows"


# ----------------------------------------------------------------------------------------------------------------
# Framework-free
# ----------------------------------------------------------------------------------------------------------------


def test_module_imports_only_the_standard_library() -> None:
    tree = ast.parse(MODULE.read_text(encoding="utf-8"))
    imported = {alias.name for node in ast.walk(tree) if isinstance(node, ast.Import) for alias in node.names}
    imported |= {node.module for node in ast.walk(tree) if isinstance(node, ast.ImportFrom) and node.module}

    assert {name.split(".")[0] for name in imported} <= set(sys.stdlib_module_names) | {"__future__"}


def test_texts_longer_than_their_column_and_non_http_addresses_are_rejected_by_name() -> None:
    long_zone = "Z" * 33
    errors = errors_of(
        ANNUAL
        + f"{long_zone},Somewhere,2023,56,lifecycle,CO2e,production,S,L,https://u.example,2024\n"
        + "FR,France,2023,56,lifecycle,CO2e,production,S,L,javascript:alert(1),2024\n"
        + "DE,Germany,2023,380,lifecycle,CO2e,production,S,"
        + "L" * 201
        + ",https://u.example,2024\n"
    )
    assert [e.line for e in errors] == [2, 3, 4]
    assert "zone is 33 characters long; at most 32" in errors[0].reason
    assert "is not an http(s) address" in errors[1].reason
    assert "licence is 201 characters long; at most 200" in errors[2].reason


def test_a_licence_or_address_given_for_the_whole_file_is_checked_once() -> None:
    with pytest.raises(IntensityImportError) as caught:
        parse_intensity_csv("zone,datetime,g_co2e_per_kwh\nFR,2025-01-01T00:00Z,30\n", url="ftp://x.example")
    assert [(e.line, e.reason) for e in caught.value.errors] == [
        (0, "url 'ftp://x.example' is not an http(s) address")
    ]
