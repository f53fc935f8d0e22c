"""/metrics of the gateway without Django: latency histograms, per-model energy and CO2e counters, key-store
errors, read back with a strict Prometheus text parser (tests/support/prometheus.py).

The energy counters are checked against the spool the recorder wrote: every µJ a model's batches were given
in the spool is in that model's counter, and the models' shares plus the idle lines add up to what the device
metered, as in the ledger. The meter is the only stand-in (a constant-power fake: hardware)."""

from __future__ import annotations

import json
import math
import shutil
import threading
import time
from collections import defaultdict
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import orjson
import pytest
import requests
from hypothesis import given, settings
from hypothesis import strategies as st

from inference.gateway import Gateway
from inference.keys import Principal
from inference.meters.base import Meter
from inference.metrics import EnergyMetrics
from inference.recorder import LedgerRecorder, RecorderOptions
from inference.repository import GatewayOptions
from inference.spool import Spool
from inference.stats import LATENCY_BUCKETS_US, Histogram
from tests.support.models import DEMO
from tests.support.prometheus import parse_exposition, value, values
from tests.support.servers import serve_asgi

KEY = "metrics-key"
AUTH = {"Authorization": f"Bearer {KEY}"}
PRINCIPAL = Principal(1, "acme", 10, frozenset({"infer"}))

HISTOGRAMS = (
    "carbonledger_inference_request_duration_us",
    "carbonledger_inference_queue_duration_us",
    "carbonledger_inference_compute_infer_duration_us",
)


class ConstantPowerMeter(Meter):
    """A device drawing ``power_w`` on the monotonic clock (the hardware is the only thing faked here)."""

    def __init__(self, power_w: float = 20.0) -> None:
        super().__init__("test-gpu0")
        self.power_w = power_w
        self._t0 = time.monotonic_ns()

    @property
    def method(self) -> Any:
        return "modelled"

    def device_info(self) -> dict[str, str]:
        return {"name": "test device"}

    def _start(self) -> None:
        self._t0 = time.monotonic_ns()

    def _read(self) -> tuple[float, int]:
        now = time.monotonic_ns()
        return self.power_w * (now - self._t0) / 1e9, now


async def resolver(token: str) -> Principal | None:
    return PRINCIPAL if token == KEY else None


def linear_doc(rows: int = 1) -> str:
    x = np.full((rows, 256), 0.5, dtype=np.float32)
    return json.dumps(
        {"inputs": [{"name": "x", "shape": [rows, 256], "datatype": "FP32", "data": x.ravel().tolist()}]}
    )


def send(address: str, n: int, threads: int = 6) -> None:
    """``n`` infer requests from ``threads`` clients at once; every one must be answered 200."""
    failures: list[str] = []
    counter = iter(range(n))
    lock = threading.Lock()

    def client() -> None:
        with requests.Session() as s:
            while True:
                with lock:
                    i = next(counter, None)
                if i is None:
                    return
                r = s.post(
                    f"http://{address}/v2/models/linear/infer",
                    data=linear_doc(1 + i % 3),
                    headers=AUTH,
                    timeout=10,
                )
                if r.status_code != 200:
                    failures.append(f"{r.status_code} {r.text}")

    workers = [threading.Thread(target=client) for _ in range(threads)]
    for w in workers:
        w.start()
    for w in workers:
        w.join(30)
    assert not failures, failures[:3]


def scrape(address: str) -> dict[str, Any]:
    r = requests.get(f"http://{address}/metrics", timeout=5)
    assert r.status_code == 200
    assert r.headers["content-type"].startswith("text/plain; version=0.0.4")
    return parse_exposition(r.text)


@pytest.fixture
def models(tmp_path: Path) -> Path:
    shutil.copytree(DEMO / "linear", tmp_path / "models" / "linear")
    return tmp_path / "models"


@pytest.fixture
def metered(tmp_path: Path, models: Path) -> Iterator[tuple[Gateway, EnergyMetrics, Path]]:
    spool_dir = tmp_path / "spool"
    spool = Spool(spool_dir)
    energy = EnergyMetrics()
    energy.set_intensity(intensity_g_per_kwh=52.0, pue=1.25, zone="FR")
    recorder = LedgerRecorder(
        spool,
        [(ConstantPowerMeter(), "test")],
        RecorderOptions(sample_interval_s=0.05, flush_interval_s=0.05, idle_power_w=4.0),
        energy_metrics=energy,
    )
    gateway = Gateway(
        models, GatewayOptions(), resolver, hooks=[recorder.hook_for], services=[recorder], admission=recorder
    )
    gateway.metric_sources.append(energy.prometheus_lines)
    yield gateway, energy, spool_dir
    spool.close()


def spooled_records(spool_dir: Path) -> list[dict[str, Any]]:
    records = []
    for path in sorted(spool_dir.glob("*.spool")):
        records.extend(orjson.loads(line) for line in path.read_bytes().splitlines() if line)
    return records


# -- latency histograms ---------------------------------------------------------------------------


def test_latency_histograms_count_every_answered_request_and_agree_with_tritons_counters(
    models: Path,
) -> None:
    gateway = Gateway(models, GatewayOptions(), resolver)
    with serve_asgi(gateway) as address:
        before = scrape(address)
        for name in HISTOGRAMS:
            assert before[name].type == "histogram"
            assert value(before, name, "_count", model="linear", version="1") == 0
        send(address, 37)
        after = scrape(address)
        send(address, 5)
        later = scrape(address)
    assert value(after, "nv_inference_request_success", model="linear", version="1") == 37
    for name in HISTOGRAMS:
        assert value(after, name, "_count", model="linear", version="1") == 37, name
        assert value(later, name, "_count", model="linear", version="1") == 42, name
        buckets = values(after, name, "_bucket")
        les = sorted(float(dict(k)["le"]) for k in buckets)
        assert les[:-1] == [float(b) for b in LATENCY_BUCKETS_US] and math.isinf(les[-1])
    # The histograms' sums are the same durations Triton's counters add up (µs, the counters truncated).
    for hist, counter in (
        ("carbonledger_inference_request_duration_us", "nv_inference_request_duration_us"),
        ("carbonledger_inference_queue_duration_us", "nv_inference_queue_duration_us"),
        ("carbonledger_inference_compute_infer_duration_us", "nv_inference_compute_infer_duration_us"),
    ):
        total = value(after, hist, "_sum", model="linear", version="1")
        assert total > 0
        assert abs(total - value(after, counter, model="linear", version="1")) <= 1.0, hist


@settings(max_examples=200, deadline=None)
@given(st.lists(st.floats(min_value=0, max_value=1e8, allow_nan=False), max_size=60), st.integers(1, 5))
def test_a_histogram_puts_each_value_in_the_first_bucket_it_does_not_exceed(
    samples: list[float], n: int
) -> None:
    hist = Histogram(LATENCY_BUCKETS_US)
    for v in samples:
        hist.observe(v, n)
    cumulative = hist.cumulative()
    assert len(cumulative) == len(LATENCY_BUCKETS_US) + 1
    assert cumulative[-1] == hist.count == n * len(samples)
    for bound, count in zip(LATENCY_BUCKETS_US, cumulative, strict=False):
        assert count == n * sum(1 for v in samples if v <= bound)
    assert hist.sum == pytest.approx(n * sum(samples))


@settings(max_examples=200, deadline=None)
@given(st.lists(st.integers(min_value=0, max_value=10**11), max_size=60))
def test_a_batch_observed_in_nanoseconds_lands_where_each_value_in_microseconds_would(
    values_ns: list[int],
) -> None:
    batch, each = Histogram(LATENCY_BUCKETS_US), Histogram(LATENCY_BUCKETS_US)
    batch.observe_ns(values_ns)
    for ns in values_ns:
        each.observe(ns / 1000)
    assert batch.cumulative() == each.cumulative()
    assert batch.count == each.count == len(values_ns)
    assert batch.sum == pytest.approx(each.sum)


# -- energy and CO2e ------------------------------------------------------------------------------


def test_energy_and_location_co2e_counters_move_with_traffic_and_match_the_spooled_shares(
    metered: tuple[Gateway, EnergyMetrics, Path],
) -> None:
    gateway, _energy, spool_dir = metered
    with serve_asgi(gateway) as address:
        first = scrape(address)
        assert value(first, "carbonledger_inference_energy_joules_total", model="linear", version="1") == 0
        send(address, 60)
        deadline = time.monotonic() + 10
        while True:
            moved = scrape(address)
            joules = value(moved, "carbonledger_inference_energy_joules_total", model="linear", version="1")
            if joules > 0 or time.monotonic() > deadline:
                break
            time.sleep(0.1)
        assert joules > 0, "the energy of 60 requests never reached /metrics"
        assert (
            value(moved, "carbonledger_inference_co2e_location_grams_total", model="linear", version="1") > 0
        )
        assert value(moved, "carbonledger_co2e_location_intensity_g_per_kwh", zone="FR") == 52.0
    # Stopped: the recorder closed and spooled its last interval, so the spool and the counters are final.
    final = parse_exposition(gateway.metrics().decode())
    records = spooled_records(spool_dir)
    model_of = {r["batch_id"]: (r["model"], r["version"]) for r in records if r["k"] == "batch"}
    per_model: dict[tuple[str, str], int] = defaultdict(int)
    for r in records:
        if r["k"] == "batch_energy":
            per_model[model_of[r["batch_id"]]] += r["energy_uj"]
    metered_uj = sum(r["energy_uj"] for r in records if r["k"] == "interval")
    idle_uj = sum(r["energy_uj"] for r in records if r["k"] == "idle")
    assert per_model[("linear", "1")] > 0
    model_j = value(
        final, "carbonledger_inference_energy_joules_total", model="linear", version="1", device="test-gpu0"
    )
    assert model_j == per_model[("linear", "1")] / 1e6
    assert value(final, "carbonledger_device_energy_joules_total", device="test-gpu0") == metered_uj / 1e6
    assert value(final, "carbonledger_device_idle_energy_joules_total", device="test-gpu0") == idle_uj / 1e6
    assert metered_uj == idle_uj + sum(per_model.values())  # conservation, as the ledger holds it
    # Location-based: energy x the site's PUE x the grid's intensity, in grams (J -> kWh is / 3.6e6).
    co2e = value(
        final,
        "carbonledger_inference_co2e_location_grams_total",
        model="linear",
        version="1",
        device="test-gpu0",
    )
    assert co2e == pytest.approx(per_model[("linear", "1")] / 1e6 / 3.6e6 * 1.25 * 52.0, rel=1e-9)
    idle_co2e = value(final, "carbonledger_device_idle_co2e_location_grams_total", device="test-gpu0")
    assert idle_co2e == pytest.approx(idle_uj / 1e6 / 3.6e6 * 1.25 * 52.0, rel=1e-9)
    assert value(final, "carbonledger_co2e_location_unpriced_joules_total") == 0


def test_energy_closed_while_no_intensity_is_known_is_counted_as_unpriced(
    metered: tuple[Gateway, EnergyMetrics, Path],
) -> None:
    gateway, energy, spool_dir = metered
    energy.set_intensity(intensity_g_per_kwh=None, pue=1.25, zone="FR")
    with serve_asgi(gateway) as address:
        send(address, 10)
    final = parse_exposition(gateway.metrics().decode())
    metered_uj = sum(r["energy_uj"] for r in spooled_records(spool_dir) if r["k"] == "interval")
    assert metered_uj > 0
    assert value(final, "carbonledger_co2e_location_unpriced_joules_total") == metered_uj / 1e6
    assert value(final, "carbonledger_inference_co2e_location_grams_total", model="linear", version="1") == 0
    assert not values(final, "carbonledger_co2e_location_intensity_g_per_kwh")  # declared, no sample: unknown


def test_the_request_path_never_waits_for_the_energy_counters(
    metered: tuple[Gateway, EnergyMetrics, Path],
) -> None:
    """The energy counters are written by the meter thread once per closed interval, not per request, and
    outside every lock a batch takes: while their lock is held, requests are still answered."""
    gateway, energy, _spool_dir = metered
    with serve_asgi(gateway) as address:
        with energy._lock:
            send(address, 12)
        assert value(scrape(address), "nv_inference_request_success", model="linear", version="1") == 12


# -- key store ------------------------------------------------------------------------------------


def test_key_store_errors_are_counted_by_what_the_gateway_did_instead(models: Path) -> None:
    down = threading.Event()

    async def flaky(token: str) -> Principal | None:
        if down.is_set():
            raise ConnectionError("key store unreachable")
        return PRINCIPAL if token == KEY else None

    gateway = Gateway(models, GatewayOptions(), flaky, key_cache_seconds=0.0)
    with serve_asgi(gateway) as address:
        url = f"http://{address}/v2/models/linear/infer"
        assert requests.post(url, data=linear_doc(), headers=AUTH, timeout=10).status_code == 200
        down.set()
        # A key answered before: served on its last answer. An unknown key: refused with 503, not 401.
        assert requests.post(url, data=linear_doc(), headers=AUTH, timeout=10).status_code == 200
        assert requests.post(url, data=linear_doc(), headers=AUTH, timeout=10).status_code == 200
        other = requests.post(url, data=linear_doc(), headers={"Authorization": "Bearer unknown"}, timeout=10)
        assert other.status_code == 503
        families = scrape(address)
    assert value(families, "carbonledger_key_store_errors_total", outcome="stale_answer") == 2
    assert value(families, "carbonledger_key_store_errors_total", outcome="refused") == 1
