"""The models page's traffic figures: the last hour of raw ledger rows, read in bounded size however busy the hour
was (at 5,000 requests a second an hour is 18 million rows)."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from carbon import model_stats as model_stats_module
from carbon.model_stats import model_stats
from carbon.services import load_shipped_factors
from demo.synthetic_ledger import generate_ledger
from ledger.models import LedgerRequest
from tenancy.models import Organization
from tests.factories import OrganizationFactory
from tests.support.accounts import signed_in

pytestmark = pytest.mark.django_db

NS = 10**9


@pytest.fixture
def org() -> Organization:
    load_shipped_factors()
    org = OrganizationFactory()
    # 6,000 requests over 2 hours: about 3,000 in the last hour of traffic.
    generate_ledger(organization=org, requests=6000, days=2 / 24, end=datetime.now(UTC), seed=9)
    return org


def _hour(org: Organization) -> list[int]:
    latest = LedgerRequest.objects.filter(organization=org).order_by("-received_ns")[0].received_ns
    return list(
        LedgerRequest.objects.filter(organization=org, received_ns__gt=latest - 3600 * NS).values_list(
            "received_ns", flat=True
        )
    )


def test_a_quiet_hour_is_read_whole(org: Organization) -> None:
    hour = _hour(org)
    stats = model_stats(org.pk)
    assert sum(m["requests"] for m in stats["models"]) == len(hour)
    assert stats["window_s"] == 3600 and not stats["sampled"]
    assert sum(m["per_second"] for m in stats["models"]) == pytest.approx(len(hour) / 3600)


def test_a_busy_hour_is_read_as_its_newest_requests_only(
    org: Organization, monkeypatch: pytest.MonkeyPatch
) -> None:
    hour = sorted(_hour(org), reverse=True)
    monkeypatch.setattr(model_stats_module, "RECENT_REQUESTS_MAX", 500)
    stats = model_stats(org.pk)
    read = sum(m["requests"] for m in stats["models"])
    oldest_read = hour[499]
    assert read == sum(1 for t in hour if t >= oldest_read)  # the newest 500 (and any at the same instant)
    assert stats["sampled"]
    assert stats["window_s"] == pytest.approx((hour[0] - oldest_read) / NS + 1e-9, rel=1e-6)
    assert sum(m["per_second"] for m in stats["models"]) == pytest.approx(read / stats["window_s"])
    assert sum(sum(n * c for n, c in sizes.items()) for sizes in stats["batch_sizes"].values()) == read


def test_the_models_page_says_when_it_read_a_busy_hour_in_part(
    org: Organization, monkeypatch: pytest.MonkeyPatch
) -> None:
    client = signed_in(org, "viewer")
    assert "read in part" not in client.get("/dashboard/models").content.decode()
    monkeypatch.setattr(model_stats_module, "RECENT_REQUESTS_MAX", 500)
    assert "a busy hour is read in part" in client.get("/dashboard/models").content.decode()
