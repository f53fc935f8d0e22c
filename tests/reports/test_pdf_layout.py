"""The PDF's layout, checked on WeasyPrint's own layout boxes of a generated report (issue 25): table rows kept
whole, a table's header repeated on the pages it continues onto, nothing past the right margin, names and
numbers never broken across lines, and no near-empty last page.

The report is made long on purpose: an hourly factor file gives the factor table more rows than a page holds,
names are as long as real ones ("demo-cloud-us-east-1"), a factor source carries a long URL."""

from __future__ import annotations

import itertools
from collections import defaultdict
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from django.db import transaction
from weasyprint.formatting_structure import boxes

from carbon import services as carbon
from carbon.rollups import rollups_update
from ledger.writer import append_records
from reports.models import Report, ReportingProfile
from reports.pdf import html_to_document
from reports.render import render_html
from tenancy.models import Device
from tests.factories import OrganizationFactory
from tests.reports.conftest import KWH_UJ, generate
from tests.support.ledger import one_request_records

pytestmark = pytest.mark.django_db
HOURS = 90  # hourly French factors, two in three used: sixty factor rows, more than a page holds
SLACK_PX = 0.5
MODELS = ("resnet50-int8-quantized", "distilbert-base-uncased-sst2", "whisper-small-en")


def _long_report() -> Report:
    carbon.load_shipped_factors()
    org = OrganizationFactory(slug="demo-inference-services", name="Demo Inference Services Europe")
    ReportingProfile.objects.create(organization=org, responsible_person="Ada Lovelace", base_year=2024)
    start = datetime(2025, 1, 6, tzinfo=UTC)
    rows = "".join(
        f"FR,{(start + timedelta(hours=h)):%Y-%m-%dT%H:00:00Z},{30 + h % 40}\n" for h in range(HOURS)
    )
    carbon.factor_import_csv(
        data=("zone,datetime,g_co2e_per_kwh\n" + rows).encode(),
        name="fr-hourly-january.csv",
        source="RTE eco2mix, hourly CO2 intensity of French electricity generation",
        url="https://www.rte-france.com/themes/swi/xls/eco2mix_co2_emissions_per_kwh_produced_in_france_2025_01_hourly.csv",
    )
    paris = carbon.site_create(name="paris-gpu-cluster-a", zone="FR", pue="1.25", organization=org)
    berlin = carbon.site_create(
        name="berlin-colocation-rack-12", zone="DE", pue="1.4", electricity="colocated", organization=org
    )
    cloud = carbon.site_create(
        name="demo-cloud-us-east-1", zone="US-VA", pue="1.1", electricity="cloud", organization=org
    )
    devices = [
        Device.objects.create(
            device_id=f"{site.name}-gpu-0",
            kind="gpu",
            method=method,
            measured=measured,
            relative_uncertainty=u,
            site=site,
        )
        for site, method, measured, u in (
            (paris, "nvml-counter", True, 0.05),
            (berlin, "rapl", True, 0.1),
            (cloud, "modelled", False, 0.3),
        )
    ]
    numbers = itertools.count(1)
    records: list[dict[str, object]] = []
    for h in range(HOURS):
        at = start + timedelta(hours=h, minutes=5)
        device = devices[0] if h % 3 else devices[1 + h % 2]
        records += one_request_records(
            "layout",
            next(numbers),
            org.pk,
            device.device_id,
            int(at.timestamp()) * 10**9,
            KWH_UJ // 7,
            MODELS[h % 3],
        )
    append_records("layout-chain-with-a-long-identifier", records)
    rollups_update()
    return generate(org)


def _walk(box: boxes.Box) -> Iterator[boxes.Box]:
    """Every box under ``box``, the page's margin boxes (running header, page numbers) left out."""
    yield box
    if isinstance(box, boxes.ParentBox):
        for child in box.children:
            if not isinstance(child, boxes.MarginBox):
                yield from _walk(child)


def _text(element: Any) -> str:
    return " ".join("".join(element.itertext()).split())


@pytest.fixture(scope="module")
def layout(django_db_setup: None, django_db_blocker: Any) -> tuple[Report, Any]:
    """The long report and its laid-out document, made once for the module's checks (its rows rolled back)."""
    with django_db_blocker.unblock(), transaction.atomic():
        report = _long_report()
        document = html_to_document(render_html(report.snapshot))
        transaction.set_rollback(True)
    return report, document


def test_the_report_is_long_enough_to_test_the_page_breaks(layout: tuple[Report, Any]) -> None:
    report, document = layout
    assert len(report.snapshot["inputs"]["factors"]) >= HOURS * 2 // 3
    assert len(document.pages) >= 5


def _tables(document: Any) -> tuple[dict[int, set[int]], dict[int, dict[int, bool]], dict[int, str]]:
    """Body rows -> the pages they appear on; tables -> page -> whether its header row is on that page; and
    the text of each, to name them."""
    row_pages: dict[int, set[int]] = defaultdict(set)
    table_pages: dict[int, dict[int, bool]] = defaultdict(dict)
    names: dict[int, str] = {}
    for number, page in enumerate(document.pages):
        for box in _walk(page._page_box):
            if isinstance(box, boxes.TableBox):
                header = any(isinstance(g, boxes.TableRowGroupBox) and g.is_header for g in box.children)
                table_pages[id(box.element)][number] = header
                names[id(box.element)] = _text(box.element)[:60]
            if isinstance(box, boxes.TableRowGroupBox) and not (box.is_header or box.is_footer):
                for row in box.children:
                    row_pages[id(row.element)].add(number)
                    names[id(row.element)] = _text(row.element)[:80]
    return row_pages, table_pages, names


def test_table_rows_are_kept_whole(layout: tuple[Report, Any]) -> None:
    row_pages, _, names = _tables(layout[1])
    split = [names[r] for r, pages in row_pages.items() if len(pages) > 1]
    assert not split, f"table rows split across pages: {split}"


def test_a_table_continued_on_another_page_repeats_its_header(layout: tuple[Report, Any]) -> None:
    _, table_pages, names = _tables(layout[1])
    continued = {t: pages for t, pages in table_pages.items() if len(pages) > 1}
    assert continued, "no table continues onto a second page: the test proves nothing"
    headless = [names[t] for t, pages in continued.items() if not all(pages.values())]
    assert not headless, f"tables continued without their header row: {headless}"


def _past_margin(document: Any) -> list[str]:
    past: list[str] = []
    for number, page in enumerate(document.pages):
        page_box = page._page_box
        right = page_box.content_box_x() + page_box.width
        for box in _walk(page_box):
            if box is page_box or not hasattr(box, "position_x"):
                continue
            end = box.border_box_x() + box.border_width()
            if end > right + SLACK_PX:
                label = box.text if isinstance(box, boxes.TextBox) else type(box).__name__
                if isinstance(box, boxes.TableBox | boxes.TableCellBox) and box.element is not None:
                    label += f" {_text(box.element)[:80]}"
                past.append(f"page {number + 1}: {label!r} ends at {end:.1f} px, margin at {right:.1f} px")
    return past


def test_nothing_runs_past_the_right_margin(layout: tuple[Report, Any]) -> None:
    past = _past_margin(layout[1])
    assert not past, past[:10]


def test_names_and_numbers_in_tables_are_never_broken_across_lines(layout: tuple[Report, Any]) -> None:
    _, document = layout
    broken: set[str] = set()
    for page in document.pages:
        for box in _walk(page._page_box):
            if not isinstance(box, boxes.TableCellBox) or box.element is None:
                continue
            text = _text(box.element)
            one_token = text and " " not in text
            number = box.element_tag == "td" and "n" in (box.element.get("class") or "").split()
            if not (one_token or number):
                continue
            lines = [b for b in _walk(box) if isinstance(b, boxes.LineBox)]
            if len(lines) > 1:
                broken.add(text)
    assert not broken, f"broken over several lines: {sorted(broken)}"


def test_the_last_page_is_not_near_empty(layout: tuple[Report, Any]) -> None:
    _, document = layout
    page_box = document.pages[-1]._page_box
    top = page_box.content_box_y()
    bottom = max(
        (b.border_box_y() + b.border_height() for b in _walk(page_box) if isinstance(b, boxes.LineBox)),
        default=top,
    )
    lines = sum(1 for b in _walk(page_box) if isinstance(b, boxes.LineBox) and b.children)
    assert lines >= 5 and bottom - top >= 0.1 * page_box.height, (
        f"the last page holds {lines} lines over {bottom - top:.0f} of {page_box.height:.0f} px"
    )


def test_the_layout_checks_see_a_split_row_a_missing_header_and_an_overflow() -> None:
    """The checks above can fail: on a page made to break them, each finds its fault."""
    tall = "<tr><td>" + "tall<br>" * 120 + "</td></tr>"
    html = (
        "<style>@page { size: A4; margin: 20mm } td { border: 1px solid }</style>"
        f"<table><tbody>{tall}</tbody></table>"
        f"<table><tr><td>{'unbreakable_' * 30}</td></tr></table>"
    )
    document = html_to_document(html)
    row_pages, table_pages, _ = _tables(document)
    assert any(len(pages) > 1 for pages in row_pages.values())
    assert any(len(pages) > 1 and not all(pages.values()) for pages in table_pages.values())
    assert _past_margin(document)
