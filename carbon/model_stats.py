"""Reads: per-model traffic of the ledger and per-model energy of the rollups (the models page and API)."""

from __future__ import annotations

from collections import defaultdict
from datetime import UTC, datetime, timedelta
from typing import Any

from django.db.models import Avg, Count, Max, Sum

from carbon.models import HourlyRollup
from ledger.models import LedgerRequest, period_of_ns

# The last hour is read from raw ledger rows (latency and batch sizes are not in the rollups); at thousands of
# requests a second an hour holds millions of them, so the page reads at most the newest this many (an index
# range of the (organization, received_ns) index) and gives the rates over the span they cover.
RECENT_REQUESTS_MAX = 20_000
HOUR_NS = 3600 * 10**9


def last_traffic_ns(organization_id: int) -> int | None:
    return LedgerRequest.objects.filter(organization_id=organization_id).aggregate(t=Max("received_ns"))["t"]


def model_stats(organization_id: int) -> dict[str, Any]:
    """Per model, version and the variant that served it (fp32, int8...) over the last hour of traffic, or its
    newest ``RECENT_REQUESTS_MAX`` requests when it held more (``sampled``; ``window_s`` the span read):
    throughput, queue and compute latency, batch sizes; J per inference per model over the last 30 days of
    rollups."""
    latest = last_traffic_ns(organization_id)
    if latest is None:
        return {
            "window_end": None,
            "window_s": 0,
            "sampled": False,
            "models": [],
            "batch_sizes": {},
            "energy": [],
        }
    since = latest - HOUR_NS
    # period >= since's month changes nothing (no record is placed before its own month) and spares PostgreSQL
    # the older months' partitions.
    hour = LedgerRequest.objects.filter(
        organization_id=organization_id, received_ns__gt=since, period__gte=period_of_ns(since)
    )
    oldest_read = (
        hour.order_by("-received_ns")
        .values_list("received_ns", flat=True)[RECENT_REQUESTS_MAX - 1 : RECENT_REQUESTS_MAX]
        .first()
    )
    sampled = oldest_read is not None
    if sampled:
        since = oldest_read - 1  # the newest RECENT_REQUESTS_MAX (and any received at that same instant)
    window_s = (latest - since) / 1e9
    recent = hour.filter(received_ns__gt=since)
    models = list(
        recent.values("model", "version", "variant")
        .annotate(
            requests=Count("id"),
            queue_ms=Avg("queue_ns") / 1e6,
            compute_ms=Avg("compute_ns") / 1e6,
            max_queue_ms=Max("queue_ns") / 1e6,
        )
        .order_by("model", "version", "variant")
    )
    for m in models:
        m["per_second"] = m["requests"] / window_s
    sizes: dict[str, dict[int, int]] = defaultdict(lambda: defaultdict(int))
    per_batch = recent.values("model", "batch_id").annotate(n=Count("id"))
    for row in per_batch:
        sizes[row["model"]][row["n"]] += 1
    end = datetime.fromtimestamp(latest / 1e9, UTC)
    energy = list(
        HourlyRollup.objects.filter(
            organization_id=organization_id, kind="request", hour__gte=end - timedelta(days=30)
        )
        .values("model")
        .annotate(requests=Sum("requests"), uj=Sum("energy_uj"), co2e=Sum("location_co2e_g"))
        .order_by("model")
    )
    for e in energy:
        e["j_per_inference"] = e["uj"] / 1e6 / e["requests"] if e["requests"] else None
        e["g_per_1000"] = float(e["co2e"] or 0) * 1000 / e["requests"] if e["requests"] else None
    return {
        "window_end": end,
        "window_s": window_s,
        "sampled": sampled,
        "models": models,
        "batch_sizes": {m: dict(sorted(s.items())) for m, s in sorted(sizes.items())},
        "energy": energy,
    }
