"""Writes: a realistic synthetic ledger for demos and benchmarks, marked synthetic in the data.

Everything goes through the same chaining and bulk insert as the gateway's records (one chain of its own),
so ``verify_ledger`` checks it and the rollups read it like live traffic. What is synthetic is marked:
request records carry ``synthetic=true``, devices carry ``info.synthetic`` (their idle lines inherit it).

The shape: two sites (an owned site in France, a cloud region in US-VA), a GPU and a CPU whose records carry
the ``synthetic`` method (no meter measured them, so no report or page counts them as measured); traffic
follows a day curve (busier in the afternoon, UTC); every minute is a metering interval of each device whose
energy is exactly idle + the batches' shares, split over requests by work units, as the accountant does.

What the devices serve is a workload: ``bench`` (the default) is the three small demo models, cheap to write
by the million; ``demo`` adds a generative model whose requests take seconds of GPU time, so that a month of a
few hundred thousand requests keeps the GPU busy about a fifth of the time and idle is 20-40 % of the devices'
energy, as in a service sized for its load (``bench`` leaves the devices idle almost all the time).
"""

from __future__ import annotations

import math
import random
import time
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from django.db import IntegrityError

from carbon import co2e
from carbon.services import site_create
from inference.allocation import split_largest_remainder
from ledger.models import LedgerChain
from ledger.writer import append_records
from tenancy.models import Device, Organization, Site
from tenancy.services import ServiceError

_INTERVAL_S = 60
_NS = 1_000_000_000
_BUSY_LIMIT_NS = (_INTERVAL_S - 1) * _NS
# Bounds of one load: ten years of minutes, and a number of requests a benchmark can still wait for.
MAX_DAYS = 3660
MAX_REQUESTS = 100_000_000


#: The method every synthetic record carries: no meter read it (see inference.meters for the real ones).
SYNTHETIC_METHOD = "synthetic"


@dataclass(frozen=True)
class _Model:
    name: str
    device: str
    weight: float
    work_units: int  # per request (input elements)
    fixed_us: int  # batch time: fixed part
    per_request_us: int  # batch time: per request
    max_batch: int = 16


@dataclass(frozen=True)
class _Device:
    device_id: str
    kind: str
    method: str
    measured: bool
    relative_uncertainty: float
    idle_w: float
    busy_w: float  # the device's power while a batch runs
    site: str


@dataclass(frozen=True)
class ModelSpec:
    """A model of a workload: the device kind it runs on, its share of the batches, its batch time."""

    name: str
    on: str  # "gpu" or "cpu"
    weight: float
    work_units: int
    fixed_us: int
    per_request_us: int
    max_batch: int = 16


@dataclass(frozen=True)
class Workload:
    """What the synthetic devices draw and serve."""

    gpu_idle_w: float
    gpu_busy_w: float
    cpu_idle_w: float
    cpu_busy_w: float
    models: tuple[ModelSpec, ...]


WORKLOADS: dict[str, Workload] = {
    "bench": Workload(
        32.0,
        110.0,
        12.0,
        20.0,
        (
            ModelSpec("digits", "gpu", 0.5, 64, 400, 30),
            ModelSpec("digits_int8", "gpu", 0.2, 64, 300, 15),
            ModelSpec("linear", "cpu", 0.3, 4, 2000, 20),
        ),
    ),
    # A GPU server with an 8B-parameter chat model beside the small models: a request generates about a
    # thousand tokens (8 s of GPU time, batches of up to 4), the GPU draws 300 W busy and 30 W idle; the
    # cloud CPU is a small instance slice (5 W idle).
    "demo": Workload(
        30.0,
        300.0,
        5.0,
        25.0,
        (
            ModelSpec("assistant-8b", "gpu", 0.6, 1024, 0, 8_000_000, 4),
            ModelSpec("digits", "gpu", 0.2, 64, 400, 30),
            ModelSpec("digits_int8", "gpu", 0.08, 64, 300, 15),
            ModelSpec("linear", "cpu", 0.12, 4, 2000, 20),
        ),
    ),
}


def _devices(slug: str, workload: Workload) -> tuple[_Device, _Device]:
    return (
        _Device(
            f"synthetic-{slug}-gpu0",
            "gpu",
            SYNTHETIC_METHOD,
            False,
            0.05,
            workload.gpu_idle_w,
            workload.gpu_busy_w,
            f"{slug}-paris",
        ),
        _Device(
            f"synthetic-{slug}-cpu0",
            "cpu",
            SYNTHETIC_METHOD,
            False,
            0.30,
            workload.cpu_idle_w,
            workload.cpu_busy_w,
            f"{slug}-cloud-us",
        ),
    )


# The variant each synthetic model's records name, as the gateway would (inference/variants.py).
_VARIANTS = {"digits": "fp32", "digits_int8": "int8"}


def _models(gpu: str, cpu: str, workload: Workload) -> tuple[_Model, ...]:
    return tuple(
        _Model(
            m.name,
            gpu if m.on == "gpu" else cpu,
            m.weight,
            m.work_units,
            m.fixed_us,
            m.per_request_us,
            m.max_batch,
        )
        for m in workload.models
    )


@dataclass
class SyntheticResult:
    requests: int
    records: int
    start: datetime
    end: datetime
    chain_id: str
    seconds: float


def _place(org: Organization, device: _Device) -> None:
    site = Site.objects.filter(name=device.site, organization=org).first()
    if site is None:
        cloud = device.site.endswith("cloud-us")
        try:
            site = site_create(
                name=device.site,
                zone="US-VA" if cloud else "FR",
                pue="1.1" if cloud else "1.35",
                pue_source="declared" if cloud else "measured",
                pue_relative_uncertainty="0.05" if cloud else "0.02",
                electricity=Site.Electricity.CLOUD if cloud else Site.Electricity.OWNED,
                organization=org,
            )
        except ServiceError as exc:
            raise ServiceError(f"cannot create the demo site {device.site}: {exc}") from None
    facts = {
        "kind": device.kind,
        "name": f"synthetic {device.kind}",
        "method": device.method,
        "measured": device.measured,
        "relative_uncertainty": device.relative_uncertainty,
        "info": {"synthetic": True, "reason": "load_demo_ledger"},
        "site": site,
        "idle_power_w": device.idle_w,
    }
    Device.objects.update_or_create(device_id=device.device_id, defaults=facts)


def _minute_counts(requests: int, minutes: int, rng: random.Random) -> list[int]:
    # A day curve: low at night, peak mid-afternoon UTC; counts sum to ``requests`` exactly.
    weights = [1.0 + 0.8 * math.sin(2 * math.pi * ((m % 1440) / 1440 - 0.35)) for m in range(minutes)]
    weights = [w * (0.85 + 0.3 * rng.random()) for w in weights]
    total = sum(weights)
    counts = [int(requests * w / total) for w in weights]
    for i in rng.sample(range(minutes), requests - sum(counts)) if requests > sum(counts) else []:
        counts[i] += 1
    return counts


def generate_ledger(
    *,
    organization: Organization,
    requests: int,
    days: float,
    end: datetime | None = None,
    seed: int = 1,
    workload: str = "bench",
) -> SyntheticResult:
    """Write ``requests`` synthetic requests spread over ``days`` days ending at ``end`` (default: the start
    of the current hour), with their batches, metering intervals, idle lines and energy parts, as served by
    ``workload`` (:data:`WORKLOADS`)."""
    if workload not in WORKLOADS:
        raise ServiceError(f"workload must be one of {', '.join(WORKLOADS)}, got {workload!r}")
    if not 0 <= requests <= MAX_REQUESTS:
        raise ServiceError(f"requests must be from 0 to {MAX_REQUESTS}, got {requests}")
    if not (math.isfinite(days) and 0 < days <= MAX_DAYS):
        raise ServiceError(f"days must be above 0 and at most {MAX_DAYS}, got {days}")
    started = time.perf_counter()
    end_at = (end or datetime.now(UTC)).astimezone(UTC).replace(minute=0, second=0, microsecond=0)
    minutes = max(1, int(days * 1440))
    start_at = end_at - timedelta(minutes=minutes)
    for bound, name in ((start_at, "the first minute"), (end_at, "the end")):
        problem = co2e.year_problem(bound, f"{name} of the synthetic ledger")
        if problem:
            raise ServiceError(problem)
    rng = random.Random(seed)
    # Ids start with this prefix (the chain id's last six digits): the same organization and seed give the
    # same ids, so a second load of them is refused here, by name, rather than by the ledger's unique keys.
    prefix = f"{(rng.getrandbits(24) ^ (organization.pk * 0x9E3779)) & 0xFFFFFF:06x}"
    earlier = LedgerChain.objects.filter(
        chain_id__startswith=f"synthetic-{organization.slug}-", chain_id__endswith=f"-{prefix}"
    ).first()
    if earlier is not None:
        raise ServiceError(
            f"the synthetic ledger of seed {seed} is already loaded for {organization.slug} (chain "
            f"{earlier.chain_id}); pass another seed to add more traffic"
        )
    gpu, cpu = _devices(organization.slug, WORKLOADS[workload])
    for device in (gpu, cpu):
        _place(organization, device)
    chain_id = f"synthetic-{organization.slug}-{int(time.time())}-{prefix}"
    written = 0
    buffer: list[dict[str, Any]] = []
    try:
        batches = _minutes(
            organization.pk, chain_id, start_at, minutes, requests, gpu, cpu, rng, WORKLOADS[workload]
        )
        for records in batches:
            buffer.extend(records)
            if len(buffer) >= 60_000:
                written += append_records(chain_id, buffer)
                buffer = []
        if buffer:
            written += append_records(chain_id, buffer)
    except IntegrityError:
        # Another organization's load whose prefix came out the same (one in 16 million).
        raise ServiceError(
            f"the ids of this synthetic ledger (s{prefix}.*) are already in the ledger; pass another seed"
        ) from None
    return SyntheticResult(requests, written, start_at, end_at, chain_id, time.perf_counter() - started)


def _minutes(
    org_id: int,
    chain_id: str,
    start_at: datetime,
    minutes: int,
    requests: int,
    gpu: _Device,
    cpu: _Device,
    rng: random.Random,
    workload: Workload,
) -> Iterator[list[dict[str, Any]]]:
    models = _models(gpu.device_id, cpu.device_id, workload)
    weights = [m.weight for m in models]
    devices = {gpu.device_id: gpu, cpu.device_id: cpu}
    counters_j = {gpu.device_id: 1000.0, cpu.device_id: 0.0}
    base_ns = int(start_at.timestamp()) * _NS
    prefix = chain_id[-6:]
    next_id = 0
    for minute, count in enumerate(_minute_counts(requests, minutes, rng)):
        t0 = base_ns + minute * _INTERVAL_S * _NS
        t1 = t0 + _INTERVAL_S * _NS
        records: list[dict[str, Any]] = []
        busy: dict[str, int] = {d: 0 for d in devices}
        parts: dict[str, list[dict[str, Any]]] = {d: [] for d in devices}
        batch_uj: dict[str, int] = {d: 0 for d in devices}
        left = count
        while left > 0:
            size = min(left, rng.choice((1, 2, 4, 4, 8, 8, 8, 16)))
            model = rng.choices(models, weights)[0]
            size = min(size, model.max_batch)
            left -= size
            device = devices[model.device]
            duration_ns = (model.fixed_us + model.per_request_us * size) * 1000
            # A device runs at most the interval: a minute too full for the batch gets a shorter one.
            duration_ns = max(1000, min(duration_ns, _BUSY_LIMIT_NS - busy[device.device_id]))
            begin = t0 + rng.randrange(0, _INTERVAL_S * _NS - duration_ns)
            finish = begin + duration_ns
            next_id += 1
            batch_id = f"s{prefix}.b{next_id}"
            energy_uj = round(device.busy_w * duration_ns / 1000)  # W x ns / 1000 = µJ
            busy[device.device_id] += duration_ns
            batch_uj[device.device_id] += energy_uj
            records.append(
                {
                    "k": "batch",
                    "batch_id": batch_id,
                    "model": model.name,
                    "version": "1",
                    "device_id": device.device_id,
                    "instance": 0,
                    "start_ns": begin,
                    "end_ns": finish,
                    "requests": size,
                    "rows": size,
                    "status": "ok",
                    "variant": _VARIANTS.get(model.name, ""),
                }
            )
            request_ids: list[str] = []
            for _ in range(size):
                next_id += 1
                request_id = f"s{prefix}.r{next_id}"
                request_ids.append(request_id)
                queue_ns = rng.randrange(50_000, 3_000_000)
                records.append(
                    {
                        "k": "req",
                        "request_id": request_id,
                        "client_request_id": "",
                        "organization_id": org_id,
                        "api_key_id": None,
                        "model": model.name,
                        "version": "1",
                        "batch_id": batch_id,
                        "device_id": device.device_id,
                        "received_ns": begin - queue_ns,
                        "started_ns": begin,
                        "finished_ns": finish,
                        "queue_ns": queue_ns,
                        "compute_ns": duration_ns,
                        "work_units": model.work_units,
                        "status": "ok",
                        "synthetic": True,
                        "variant": _VARIANTS.get(model.name, ""),
                    }
                )
            parts[device.device_id].append(
                {
                    "k": "batch_energy",
                    "batch_id": batch_id,
                    "energy_uj": energy_uj,
                    "request_ids": request_ids,
                    "shares_uj": split_largest_remainder(energy_uj, [1] * size),  # equal work units
                    "final": True,
                }
            )
        for device_id, device in devices.items():
            idle_ns = _INTERVAL_S * _NS - busy[device_id]
            idle_uj = round(device.idle_w * idle_ns / 1000)
            energy_uj = idle_uj + batch_uj[device_id]
            interval_id = f"s{prefix}.i{minute}.{device.kind}"
            start_j = counters_j[device_id]
            counters_j[device_id] = start_j + energy_uj / 1e6
            records.append(
                {
                    "k": "interval",
                    "interval_id": interval_id,
                    "device_id": device_id,
                    "method": device.method,
                    "relative_uncertainty": device.relative_uncertainty,
                    "t0_ns": t0,
                    "t1_ns": t1,
                    "counter_start_j": start_j,
                    "counter_end_j": counters_j[device_id],
                    "energy_uj": energy_uj,
                    "idle_uj": idle_uj,
                    "busy_ns": busy[device_id],
                    "idle_ns": idle_ns,
                }
            )
            records.append(
                {
                    "k": "idle",
                    "interval_id": interval_id,
                    "device_id": device_id,
                    "t0_ns": t0,
                    "t1_ns": t1,
                    "energy_uj": idle_uj,
                    "idle_ns": idle_ns,
                    "idle_power_w": device.idle_w,
                }
            )
            for part in parts[device_id]:
                part["interval_id"] = interval_id
                records.append(part)
        yield records
