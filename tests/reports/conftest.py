"""What the report tests share: an organization with an owned and a cloud site, reports generated for it, the
PDF's text, and quantities read back out of printed text."""

from __future__ import annotations

import io
import itertools
import re
from datetime import UTC, date, datetime
from decimal import Decimal

import pypdf
import pytest

from carbon import services as carbon
from carbon.rollups import rollups_update
from ledger.writer import append_records
from reports.models import Report, ReportingProfile
from reports.services import report_generate, report_request
from tenancy.models import Device, Organization
from tests.factories import OrganizationFactory
from tests.support.ledger import one_request_records

KWH_UJ = 3_600_000_000_000
JAN = (date(2025, 1, 1), date(2025, 2, 1))
# The two sites of `two_sites`, valued by hand from the shipped figures:
#   FR, owned (Scope 2, ISO Category 2), PUE 1.2: 1 kWh IT x 1.2 x 41.44 g/kWh (Ember 2025)   = 49.728 g
#   US-VA, cloud (Scope 3 cat. 1, ISO Category 4), PUE 1.1: 0.5 kWh x 1.1 x 244.758 g/kWh    = 134.6169 g
OWNED_G = Decimal("1.2") * Decimal("41.44")
CLOUD_G = Decimal("0.55") * Decimal("244.758")

_numbers = itertools.count(1)


def serve(org: Organization, device: Device, at: datetime, energy_uj: int, model: str) -> None:
    """One answered request of ``energy_uj`` on ``device`` at ``at``, written to the ledger."""
    n = next(_numbers)
    t_ns = int(at.timestamp()) * 10**9
    append_records(
        "reports-conftest", one_request_records("q", n, org.pk, device.device_id, t_ns, energy_uj, model)
    )


def two_site_organization(
    *,
    when: tuple[datetime, datetime] = (
        datetime(2025, 1, 10, 9, tzinfo=UTC),
        datetime(2025, 1, 20, 15, tzinfo=UTC),
    ),
) -> Organization:
    """An owned French site (1 kWh of IT energy at ``when[0]``) and a cloud site in Virginia (0.5 kWh at
    ``when[1]``), rolled up."""
    carbon.load_shipped_factors()
    org = OrganizationFactory(name="Acme Inference")
    ReportingProfile.objects.create(
        organization=org, responsible_person="Ada Lovelace", base_year=2024, description="Acme serves models."
    )
    owned = carbon.site_create(name=f"paris-{org.slug}", zone="FR", pue="1.2", organization=org)
    cloud = carbon.site_create(
        name=f"cloud-va-{org.slug}", zone="US-VA", pue="1.1", electricity="cloud", organization=org
    )
    gpu = Device.objects.create(
        device_id=f"gpu-{org.slug}",
        kind="gpu",
        method="nvml-counter",
        measured=True,
        relative_uncertainty=0.05,
        site=owned,
    )
    cpu = Device.objects.create(
        device_id=f"cpu-{org.slug}", kind="cpu", method="modelled", relative_uncertainty=0.3, site=cloud
    )
    serve(org, gpu, when[0], KWH_UJ, "digits")
    serve(org, cpu, when[1], KWH_UJ // 2, "linear")
    rollups_update()
    return org


@pytest.fixture
def two_sites(db: None) -> Organization:
    return two_site_organization()


def generate(org: Organization, start: date = JAN[0], end: date = JAN[1], **kwargs: object) -> Report:
    """Request and generate a report of [start, end) (the service's bounds: ``end`` exclusive)."""
    report = report_request(organization=org, start=start, end=end, **kwargs)  # type: ignore[arg-type]
    done = report_generate(report.pk)
    assert done is not None and done.status == "done", done and done.failure_reason
    return done


def pdf_bytes(report: Report) -> bytes:
    return bytes(report.files.get(format="pdf").content)


def pdf_text(report: Report) -> str:
    """The PDF's text as pypdf extracts it, whitespace runs collapsed to one space."""
    reader = pypdf.PdfReader(io.BytesIO(pdf_bytes(report)))
    return re.sub(r"\s+", " ", "\n".join(page.extract_text() for page in reader.pages))


def section(text: str, heading: str) -> str:
    """The text from the last ``heading`` (the one in the body, not in the contents) to the next numbered
    heading: after "4. Scope 2: ...", up to "5. "."""
    start = text.rindex(heading)
    number = re.search(r"(\d{1,2})\. $", text[max(0, start - 4) : start])
    if number is None:
        return text[start:]
    end = text.find(f" {int(number.group(1)) + 1}. ", start)
    return text[start : end if end >= 0 else len(text)]


UNIT_G = {"g": Decimal(1), "kg": Decimal(1000), "t": Decimal(10**6)}
QUANTITY = re.compile(r"(?<![\w.,])(-?\d{1,3}(?:,\d{3})*(?:\.\d+)?|-?\d+(?:\.\d+)?)\s?(t|kg|g)(?![\w/])")


def masses_g(text: str) -> list[Decimal]:
    """Every mass printed in ``text`` with its unit (``12.3 kg``, ``0.000184 t``, ``1,234 g``), in grams."""
    return [Decimal(value.replace(",", "")) * UNIT_G[unit] for value, unit in QUANTITY.findall(text)]


def shows(text: str, grams: Decimal, relative: Decimal = Decimal("0.001")) -> bool:
    """Whether ``text`` prints a mass within ``relative`` of ``grams``."""
    return any(abs(m - grams) <= relative * abs(grams) for m in masses_g(text))
