"""Tests for inference.meters: no Django, no database, no GPU, no RAPL needed.

NVML is replaced by tests/inference/fake_pynvml.py, RAPL by a fake sysfs tree
in tmp_path, Triton by a local http.server on 127.0.0.1.
"""

from __future__ import annotations

import importlib.util
import logging
import os
import re
import socket
import subprocess
import sys
import threading
import time
from collections import deque
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from types import ModuleType

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from inference.meters import (
    CounterAccumulator,
    CpuModelMeter,
    MeterError,
    NvmlMeter,
    RaplMeter,
    Reading,
    TritonMeter,
    detect_meters,
    find_packages,
    load_meter_class,
    parse_prometheus_text,
    probe_meters,
)
from tests.inference.fake_pynvml import (
    FakeGpu,
    FakeNvml,
    NVMLError,
    NVMLError_FunctionNotFound,
    NVMLError_GpuIsLost,
    NVMLError_LibraryNotFound,
    NVMLError_NoPermission,
)

REPO = Path(__file__).resolve().parents[2]
UUID0 = "GPU-11111111-2222-3333-4444-555555555555"
UUID1 = "GPU-66666666-7777-8888-9999-000000000000"


class FakeClock:
    """A monotonic_ns stand-in advanced by hand."""

    def __init__(self, start_ns: int = 1_000_000_000) -> None:
        self.t_ns = start_ns

    def __call__(self) -> int:
        return self.t_ns

    def advance(self, seconds: float) -> None:
        self.t_ns += round(seconds * 1e9)


def wait_until(condition: Callable[[], bool], timeout_s: float = 2.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError("condition not reached in time")
        time.sleep(0.001)


# --------------------------------------------------------------------------
# base


def test_reading_rejects_negative_or_non_finite_energy() -> None:
    with pytest.raises(ValueError, match="energy_j"):
        Reading("d", 0, -1.0)
    with pytest.raises(ValueError, match="energy_j"):
        Reading("d", 0, float("nan"))


def test_reading_delta_is_energy_between_two_readings_of_one_device() -> None:
    a, b = Reading("d", 1_000, 2.0), Reading("d", 3_000, 5.5)
    assert b.delta_j(a) == 3.5
    assert a.delta_j(b) == 0.0  # out-of-order readings never give negative energy
    assert b.seconds_since(a) == 2e-6
    with pytest.raises(ValueError, match="different devices"):
        b.delta_j(Reading("other", 0, 0.0))


def test_counter_accumulator_takes_first_value_as_baseline() -> None:
    acc = CounterAccumulator()
    assert acc.feed(500) == 0
    assert acc.feed(700) == 200
    assert acc.feed(100) == 300  # reset: new raw value is the energy since the reset
    assert acc.resets == 1


def test_meter_life_cycle_is_enforced() -> None:
    meter = CpuModelMeter(cpu_time_s=lambda: 0.0, rss_bytes=lambda: 0, clock_ns=FakeClock())
    with pytest.raises(MeterError, match="not started"):
        meter.read()
    meter.start()
    with pytest.raises(MeterError, match="already started"):
        meter.start()
    meter.close()
    meter.close()
    with pytest.raises(MeterError, match="closed"):
        meter.read()
    with pytest.raises(MeterError, match="closed"):
        meter.start()


def test_meter_context_manager_starts_and_closes() -> None:
    with CpuModelMeter(cpu_time_s=lambda: 0.0, rss_bytes=lambda: 0, clock_ns=FakeClock()) as meter:
        assert meter.started
        assert meter.read().energy_j == 0.0
    assert not meter.started


# --------------------------------------------------------------------------
# NVML


def make_nvml(**gpu: object) -> FakeNvml:
    return FakeNvml([FakeGpu(UUID0, name="NVIDIA H200", **gpu)])  # type: ignore[arg-type]


def test_nvml_counter_reading_converts_millijoules_to_joules() -> None:
    fake = make_nvml(energy_mj=5_000_000)
    meter = NvmlMeter(0, nvml_module=fake)
    meter.start()
    fake.gpu().energy_mj += 1_500
    reading = meter.read()
    assert reading.energy_j == 1.5
    assert reading.device_id == UUID0
    assert meter.method == "nvml-counter"
    assert meter.measured
    assert meter.relative_uncertainty == 0.05
    meter.close()


def test_nvml_counter_short_interval_can_read_zero() -> None:
    # The driver refreshes the counter every ~20-100 ms: no change is a valid answer.
    fake = make_nvml(energy_mj=42)
    meter = NvmlMeter(0, nvml_module=fake)
    meter.start()
    first, second = meter.read(), meter.read()
    assert first.energy_j == second.energy_j == 0.0
    assert second.t_ns >= first.t_ns
    meter.close()


def test_nvml_counter_reset_does_not_lose_or_invent_energy() -> None:
    fake = make_nvml(energy_mj=10_000)
    meter = NvmlMeter(0, nvml_module=fake)
    meter.start()
    fake.gpu().energy_mj = 12_000
    assert meter.read().energy_j == 2.0
    fake.reset_counter(0, 300)  # driver reload; 300 mJ used since
    assert meter.read().energy_j == pytest.approx(2.3)
    fake.gpu().energy_mj = 1_300
    assert meter.read().energy_j == pytest.approx(3.3)
    meter.close()


@settings(max_examples=200, deadline=None)
@given(st.lists(st.integers(min_value=0, max_value=2**40), min_size=1, max_size=50))
def test_nvml_cumulative_reading_is_non_decreasing_and_sums_non_negative_deltas(raws: list[int]) -> None:
    fake = make_nvml()
    meter = NvmlMeter(0, nvml_module=fake)
    fake.gpu().queued_energy_mj.extend(raws)
    meter.start()
    expected_mj, previous_raw, previous_j = 0, raws[0], 0.0
    for raw in raws[1:]:
        reading = meter.read()
        # Each step adds the non-negative delta; a drop means "counter restarted at 0".
        expected_mj += raw - previous_raw if raw >= previous_raw else raw
        previous_raw = raw
        assert reading.energy_j >= previous_j
        assert reading.energy_j == expected_mj / 1000
        previous_j = reading.energy_j
    meter.close()


@settings(max_examples=200, deadline=None)
@given(
    st.integers(min_value=0, max_value=2**40),
    st.lists(st.tuples(st.booleans(), st.integers(min_value=0, max_value=10**9)), max_size=50),
)
def test_nvml_visible_resets_keep_the_true_energy(start_mj: int, steps: list[tuple[bool, int]]) -> None:
    fake = make_nvml(energy_mj=start_mj)
    meter = NvmlMeter(0, nvml_module=fake)
    meter.start()
    raw, true_mj = start_mj, 0
    for reset, used_mj in steps:
        # A reset is visible when the counter restarts below its last value;
        # otherwise it is indistinguishable from ordinary growth.
        raw = used_mj if reset and used_mj < raw else raw + used_mj
        true_mj += used_mj
        fake.gpu().energy_mj = raw
        assert meter.read().energy_j == true_mj / 1000
    meter.close()


def test_nvml_falls_back_to_power_integration_when_counter_unsupported() -> None:
    fake = make_nvml(counter_supported=False, power_mw=200_000)
    clock = FakeClock()
    meter = NvmlMeter(0, nvml_module=fake, background_sampling=False, clock_ns=clock)
    assert meter.method == "nvml-power-integration"
    assert meter.relative_uncertainty == 0.10
    assert meter.device_info()["method"] == "nvml-power-integration"
    meter.start()
    clock.advance(0.5)
    reading = meter.read()
    assert reading.energy_j == pytest.approx(100.0)
    assert reading.t_ns == clock.t_ns
    meter.close()


def test_nvml_power_integration_uses_the_trapezoid_rule() -> None:
    fake = make_nvml(counter_supported=False, power_mw=100_000)
    clock = FakeClock()
    meter = NvmlMeter(0, nvml_module=fake, background_sampling=False, clock_ns=clock)
    meter.start()
    clock.advance(1.0)
    fake.gpu().power_mw = 300_000
    assert meter.read().energy_j == pytest.approx(200.0)  # (100 W + 300 W) / 2 x 1 s
    clock.advance(2.0)
    assert meter.read().energy_j == pytest.approx(800.0)
    meter.read()  # same clock tick: nothing elapsed, nothing added
    assert meter.read().energy_j == pytest.approx(800.0)
    meter.close()


def test_nvml_background_sampler_integrates_power_between_reads() -> None:
    fake = make_nvml(counter_supported=False, power_mw=150_000)
    times: list[int] = []

    def clock() -> int:
        times.append(time.monotonic_ns())
        return times[-1]

    meter = NvmlMeter(0, nvml_module=fake, sample_period_s=0.001, clock_ns=clock)
    meter.start()
    calls_at_start = fake.gpu().power_calls
    wait_until(lambda: fake.gpu().power_calls >= calls_at_start + 5)
    reading = meter.read()
    # Constant power: the trapezoid sum is exactly P x elapsed, however it was sampled.
    assert reading.energy_j == pytest.approx(150.0 * (reading.t_ns - times[0]) / 1e9, rel=1e-9)
    meter.close()
    calls = fake.gpu().power_calls
    time.sleep(0.01)
    assert fake.gpu().power_calls == calls, "sampler thread still running after close()"
    assert meter.last_sample_error is None


def test_nvml_function_not_found_also_falls_back_to_power_integration() -> None:
    fake = make_nvml()
    fake.fail["nvmlDeviceGetTotalEnergyConsumption"] = NVMLError_FunctionNotFound()
    meter = NvmlMeter(0, nvml_module=fake, background_sampling=False)
    assert meter.method == "nvml-power-integration"
    meter.close()


def test_nvml_force_power_integration_ignores_a_working_counter() -> None:
    meter = NvmlMeter(0, nvml_module=make_nvml(), force_power_integration=True, background_sampling=False)
    assert meter.method == "nvml-power-integration"
    meter.close()


def test_nvml_read_error_becomes_meter_error_naming_device_and_nvml_message() -> None:
    fake = make_nvml()
    meter = NvmlMeter(0, nvml_module=fake)
    meter.start()
    fake.fail["nvmlDeviceGetTotalEnergyConsumption"] = NVMLError_GpuIsLost()
    with pytest.raises(MeterError) as info:
        meter.read()
    message = str(info.value)
    assert "GPU 0" in message
    assert UUID0 in message
    assert "nvmlDeviceGetTotalEnergyConsumption" in message
    assert "GPU is lost" in message
    assert isinstance(info.value.__cause__, NVMLError)
    meter.close()


def test_nvml_probe_error_other_than_not_supported_is_meter_error_and_releases_nvml() -> None:
    fake = make_nvml()
    fake.fail["nvmlDeviceGetTotalEnergyConsumption"] = NVMLError_NoPermission()
    with pytest.raises(MeterError, match="Insufficient Permissions"):
        NvmlMeter(0, nvml_module=fake)
    assert fake.active_inits == 0


def test_nvml_init_failure_is_meter_error() -> None:
    fake = FakeNvml(init_error=NVMLError_LibraryNotFound())
    with pytest.raises(MeterError, match="nvmlInit failed: NVML Shared Library Not Found"):
        NvmlMeter(0, nvml_module=fake)


def test_nvml_unknown_index_is_meter_error_and_releases_nvml() -> None:
    fake = make_nvml()
    with pytest.raises(MeterError, match=r"GPU 3.*nvmlDeviceGetHandleByIndex failed: Invalid Argument"):
        NvmlMeter(3, nvml_module=fake)
    assert fake.active_inits == 0


def test_nvml_without_counter_or_power_readings_is_meter_error() -> None:
    fake = make_nvml(counter_supported=False, power_supported=False)
    with pytest.raises(MeterError, match="neither the energy counter nor power readings"):
        NvmlMeter(0, nvml_module=fake)
    assert fake.active_inits == 0


@pytest.mark.parametrize("return_bytes", [False, True])
def test_nvml_device_info_reports_uuid_name_and_driver_from_str_or_bytes(return_bytes: bool) -> None:
    fake = FakeNvml([FakeGpu(UUID0, name="NVIDIA H200")], return_bytes=return_bytes)
    meter = NvmlMeter(0, nvml_module=fake)
    assert meter.device_id == UUID0
    assert meter.device_info() == {
        "index": "0",
        "uuid": UUID0,
        "name": "NVIDIA H200",
        "driver_version": "550.54.15",
        "method": "nvml-counter",
    }
    meter.close()


def test_nvml_device_info_omits_what_nvml_cannot_tell() -> None:
    fake = make_nvml()
    fake.fail["nvmlSystemGetDriverVersion"] = NVMLError_NoPermission()
    meter = NvmlMeter(0, nvml_module=fake)
    assert "driver_version" not in meter.device_info()
    meter.close()


def test_nvml_close_is_idempotent_and_balances_nvml_init() -> None:
    fake = make_nvml()
    meters = [NvmlMeter(0, nvml_module=fake) for _ in range(3)]
    assert fake.active_inits == 3
    meters[0].start()
    for meter in meters:
        meter.close()
        meter.close()
    assert fake.active_inits == 0


def test_nvml_concurrent_reads_are_serialised_and_never_look_like_resets() -> None:
    # Every counter call advances the fake counter, so a value accounted out of
    # order would look like a reset and invent energy.
    fake = make_nvml(energy_mj=1_000, energy_step_mj=7)
    meter = NvmlMeter(0, nvml_module=fake)
    meter.start()
    base_mj = fake.gpu().energy_mj
    problems: list[str] = []

    def reader() -> None:
        last = 0.0
        for _ in range(200):
            energy = meter.read().energy_j
            if energy < last:
                problems.append(f"{energy} < {last}")
            last = energy

    threads = [threading.Thread(target=reader) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    final = meter.read()
    assert not problems
    assert final.energy_j == pytest.approx((fake.gpu().energy_mj - base_mj) / 1000)
    meter.close()


def test_nvml_real_library_missing_is_meter_error() -> None:
    pynvml = pytest.importorskip("pynvml")
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError:
        pass
    else:
        pynvml.nvmlShutdown()
        pytest.skip("NVML works on this machine")
    with pytest.raises(MeterError, match="nvmlInit failed"):
        NvmlMeter(0)


# --------------------------------------------------------------------------
# RAPL


def write_zone(path: Path, name: str, energy_uj: int, max_uj: int = 262_143_328_850) -> None:
    path.mkdir(parents=True, exist_ok=True)
    (path / "name").write_text(name + "\n")
    (path / "energy_uj").write_text(f"{energy_uj}\n")
    (path / "max_energy_range_uj").write_text(f"{max_uj}\n")


def set_energy(path: Path, energy_uj: int) -> None:
    (path / "energy_uj").write_text(f"{energy_uj}\n")


def make_rapl(root: Path, packages: int = 1, dram: bool = True) -> Path:
    """A powercap tree like a 2-socket server: package, core, (dram) per socket, plus noise."""
    for n in range(packages):
        pkg = root / f"intel-rapl:{n}"
        write_zone(pkg, f"package-{n}", 1_000_000)
        write_zone(pkg / f"intel-rapl:{n}:0", "core", 500_000)
        if dram:
            write_zone(pkg / f"intel-rapl:{n}:1", "dram", 2_000_000, max_uj=65_712_999_613)
    write_zone(root / "intel-rapl-mmio:0", "package-0", 7)
    return root


def test_rapl_reads_package_energy_in_joules(tmp_path: Path) -> None:
    root = make_rapl(tmp_path)
    meter = RaplMeter(0, root=root, include_dram=False, host_id="node-7")
    assert meter.device_id == "rapl:node-7:intel-rapl:0"
    assert (meter.method, meter.measured, meter.relative_uncertainty) == ("rapl", True, 0.05)
    meter.start()
    set_energy(root / "intel-rapl:0", 3_500_000)
    assert meter.read().energy_j == 2.5
    meter.close()


def test_rapl_counter_wraps_at_max_energy_range_uj(tmp_path: Path) -> None:
    root = make_rapl(tmp_path, dram=False)
    pkg = root / "intel-rapl:0"
    write_zone(pkg, "package-0", 262_143_328_850 - 1_000_000)
    meter = RaplMeter(0, root=root)
    meter.start()
    set_energy(pkg, 500_000)
    assert meter.read().energy_j == 1.5
    assert meter.wraps == 1
    set_energy(pkg, 700_000)
    assert meter.read().energy_j == pytest.approx(1.7)
    meter.close()


def test_rapl_adds_the_dram_domain_when_asked(tmp_path: Path) -> None:
    root = make_rapl(tmp_path)
    with_dram = RaplMeter(0, root=root, include_dram=True)
    without = RaplMeter(0, root=root, include_dram=False)
    with_dram.start()
    without.start()
    set_energy(root / "intel-rapl:0", 3_000_000)
    set_energy(root / "intel-rapl:0" / "intel-rapl:0:1", 2_500_000)
    assert with_dram.read().energy_j == 2.5
    assert without.read().energy_j == 2.0
    assert with_dram.device_info()["dram"] == "included"
    assert without.device_info()["dram"] == "not included"
    assert (
        RaplMeter(0, root=make_rapl(tmp_path / "client", dram=False)).device_info()["dram"] == "not present"
    )


def test_rapl_finds_only_package_zones_and_their_dram(tmp_path: Path) -> None:
    root = make_rapl(tmp_path, packages=2)
    write_zone(root / "intel-rapl:2", "psys", 0)  # platform zone, not a CPU package
    packages = find_packages(root)
    assert [(p.number, p.zone.name) for p in packages] == [(0, "package-0"), (1, "package-1")]
    assert [p.dram.path.name if p.dram else None for p in packages] == ["intel-rapl:0:1", "intel-rapl:1:1"]


def test_rapl_unreadable_file_message_names_the_file(tmp_path: Path) -> None:
    root = make_rapl(tmp_path)
    energy = root / "intel-rapl:0" / "energy_uj"
    energy.chmod(0)
    try:
        try:
            energy.read_text()
        except PermissionError:
            pass
        else:
            pytest.skip("running as root: chmod 000 does not stop reads (see the injected-reader test)")
        with pytest.raises(MeterError, match="permission denied") as info:
            RaplMeter(0, root=root)
        assert str(energy) in str(info.value)
    finally:
        energy.chmod(0o644)


def test_rapl_permission_error_message_names_the_file_and_explains_root_only(tmp_path: Path) -> None:
    root = make_rapl(tmp_path)
    denied = root / "intel-rapl:0" / "energy_uj"

    def read_text(path: Path) -> str:
        if path == denied:
            raise PermissionError(13, "Permission denied", str(path))
        return path.read_text()

    with pytest.raises(MeterError) as info:
        RaplMeter(0, root=root, read_text=read_text)
    message = str(info.value)
    assert str(denied) in message
    assert "permission denied" in message
    assert "root" in message


def test_rapl_missing_powercap_says_intel_rapl_0_not_present(tmp_path: Path) -> None:
    with pytest.raises(MeterError, match=r"intel-rapl:0 not present"):
        RaplMeter(0, root=tmp_path / "powercap")
    with pytest.raises(MeterError, match=r"intel-rapl:0 not present"):
        find_packages(tmp_path)  # exists but holds no RAPL zone


def test_rapl_unknown_package_number_is_meter_error(tmp_path: Path) -> None:
    with pytest.raises(MeterError, match=r"intel-rapl:5 not present"):
        RaplMeter(5, root=make_rapl(tmp_path))


def test_rapl_background_poll_catches_wraps_between_reads(tmp_path: Path) -> None:
    root = make_rapl(tmp_path, dram=False)
    energy_file = root / "intel-rapl:0" / "energy_uj"
    write_zone(root / "intel-rapl:0", "package-0", 900, max_uj=1_000)
    values = iter([900, 900] + [100, 900] * 10_000)  # init, start, then a wrap every other poll

    def read_text(path: Path) -> str:
        return str(next(values)) if path == energy_file else path.read_text()

    meter = RaplMeter(0, root=root, poll_interval_s=0.001, read_text=read_text)
    meter.start()
    wait_until(lambda: meter.wraps >= 3)
    reading = meter.read()
    # Each 900 -> 100 -> 900 cycle is a full 1000 uJ period.
    assert reading.energy_j * 1e6 == pytest.approx(round(reading.energy_j * 1e6 / 100) * 100)
    assert reading.energy_j >= 3 * 200 / 1e6
    meter.close()
    assert meter.last_poll_error is None


@pytest.fixture(scope="module")
def rapl_tree_for_property(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_rapl(tmp_path_factory.mktemp("powercap"), dram=False)


@settings(max_examples=200, deadline=None)
@given(
    st.integers(min_value=2, max_value=2**32).flatmap(
        lambda wrap: st.tuples(
            st.just(wrap),
            st.integers(min_value=0, max_value=wrap - 1),
            st.lists(st.integers(min_value=0, max_value=wrap - 1), max_size=50),
        )
    )
)
def test_rapl_wrapping_counter_keeps_the_true_energy_with_one_read_per_wrap(
    rapl_tree_for_property: Path, case: tuple[int, int, list[int]]
) -> None:
    wrap, start, used = case
    raws = deque([start, start])  # construction check, start()
    counter = start
    for used_uj in used:
        counter = (counter + used_uj) % wrap
        raws.append(counter)
    energy_file = rapl_tree_for_property / "intel-rapl:0" / "energy_uj"

    def read_text(path: Path) -> str:
        if path == energy_file:
            return str(raws.popleft())
        if path.name == "max_energy_range_uj":
            return str(wrap)
        return path.read_text()

    meter = RaplMeter(0, root=rapl_tree_for_property, read_text=read_text)
    meter.start()
    previous, true_uj = 0.0, 0
    for used_uj in used:
        true_uj += used_uj
        reading = meter.read()
        assert reading.energy_j >= previous
        assert reading.energy_j == true_uj / 1e6
        previous = reading.energy_j
    meter.close()


# --------------------------------------------------------------------------
# Triton

TRITON_METRICS = """\
# HELP nv_inference_request_success Number of successful inference requests, all batch sizes
# TYPE nv_inference_request_success counter
nv_inference_request_success{{model="resnet50",version="1"}} 12
# HELP nv_energy_consumption GPU energy consumption in joules since the Triton Server started
# TYPE nv_energy_consumption counter
nv_energy_consumption{{gpu_uuid="{u0}"}} {e0}
nv_energy_consumption{{gpu_uuid="{u1}"}} 20
# HELP nv_gpu_power_usage GPU power usage in watts
# TYPE nv_gpu_power_usage gauge
nv_gpu_power_usage{{gpu_uuid="{u0}"}} 250.5
"""

TRITON_CPU_ONLY_METRICS = """\
# HELP nv_inference_count Number of inferences performed
# TYPE nv_inference_count counter
nv_inference_count{model="resnet50",version="1"} 3
# HELP nv_cpu_utilization CPU utilization rate [0.0 - 1.0]
# TYPE nv_cpu_utilization gauge
nv_cpu_utilization 0.25
"""


def triton_text(e0: float) -> str:
    return TRITON_METRICS.format(u0=UUID0, u1=UUID1, e0=e0)


class MetricsServer(ThreadingHTTPServer):
    body = ""
    requests = 0


class MetricsHandler(BaseHTTPRequestHandler):
    server: MetricsServer

    def do_GET(self) -> None:
        self.server.requests += 1
        if self.path != "/metrics":
            self.send_error(404)
            return
        data = self.server.body.encode()
        self.send_response(200)
        self.send_header("Content-Type", "text/plain; version=0.0.4; charset=utf-8")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, format: str, *args: object) -> None:
        pass


@pytest.fixture
def metrics_server() -> Iterator[MetricsServer]:
    server = MetricsServer(("127.0.0.1", 0), MetricsHandler)
    server.body = triton_text(1000.5)
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.01}, daemon=True)
    thread.start()
    yield server
    server.shutdown()
    server.server_close()


def url_of(server: MetricsServer, path: str = "/metrics") -> str:
    return f"http://127.0.0.1:{server.server_address[1]}{path}"


def test_parse_prometheus_text_handles_labels_comments_and_escapes() -> None:
    text = (
        "# HELP odd A help text with \\\\ and \\n escapes\n"
        "# TYPE odd gauge\n"
        "\n"
        'odd{path="C:\\\\dir",quote="say \\"hi\\"",nl="a\\nb", spaced = "x" ,} 1.5e3 1700000000000\n'
        "plain 42\n"
        "empty{} -0.5\n"
        'specials{v="nan"} NaN\n'
        "inf +Inf\n"
        "  # indented comment\n"
    )
    samples = parse_prometheus_text(text)
    assert [s.name for s in samples] == ["odd", "plain", "empty", "specials", "inf"]
    odd = samples[0]
    assert odd.labels == {"path": "C:\\dir", "quote": 'say "hi"', "nl": "a\nb", "spaced": "x"}
    assert (odd.value, odd.timestamp_ms) == (1500.0, 1700000000000)
    assert samples[1].value == 42.0 and samples[1].labels == {}
    assert samples[2].value == -0.5
    assert samples[3].value != samples[3].value  # NaN
    assert samples[4].value == float("inf")


@pytest.mark.parametrize(
    "line",
    ['m{a="x} 1', "m{a=x} 1", "m{a} 1", "m", 'm{a="1"} one', "m 1 2 3", '{a="b"} 1', 'm{a="1",a="2"} 1'],
)
def test_parse_prometheus_text_rejects_malformed_lines(line: str) -> None:
    with pytest.raises(ValueError, match="line 1"):
        parse_prometheus_text(line + "\n")


def test_triton_reads_gpu_energy_from_the_metrics_endpoint(metrics_server: MetricsServer) -> None:
    meter = TritonMeter(url_of(metrics_server), UUID0, timeout_s=2.0)
    assert (meter.method, meter.measured, meter.relative_uncertainty) == ("triton", True, 0.10)
    assert meter.device_id == UUID0
    assert meter.device_info()["metrics_url"] == url_of(metrics_server)
    meter.start()
    metrics_server.body = triton_text(1003.0)
    assert meter.read().energy_j == 2.5
    meter.close()


def test_triton_server_restart_counts_as_counter_reset(metrics_server: MetricsServer) -> None:
    metrics_server.body = triton_text(1000.0)
    meter = TritonMeter(url_of(metrics_server), UUID0)
    meter.start()
    metrics_server.body = triton_text(1010.0)
    assert meter.read().energy_j == 10.0
    metrics_server.body = triton_text(4.0)  # restarted, 4 J since
    assert meter.read().energy_j == 14.0
    meter.close()


def test_triton_without_energy_metric_is_clear_meter_error(metrics_server: MetricsServer) -> None:
    metrics_server.body = TRITON_CPU_ONLY_METRICS
    with pytest.raises(MeterError, match=r"exports no nv_energy_consumption metric.*CPU-only"):
        TritonMeter(url_of(metrics_server), UUID0)


def test_triton_unknown_gpu_uuid_lists_the_available_ones(metrics_server: MetricsServer) -> None:
    with pytest.raises(MeterError, match=re.escape(f"gpu_uuid='GPU-nope' (it has: {UUID0}, {UUID1})")):
        TritonMeter(url_of(metrics_server), "GPU-nope")


def test_triton_server_down_fails_fast() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    started = time.monotonic()
    with pytest.raises(MeterError, match=re.escape(f"127.0.0.1:{port}/metrics unreachable")):
        TritonMeter(f"http://127.0.0.1:{port}/metrics", UUID0, timeout_s=1.0)
    assert time.monotonic() - started < 2.0


def test_triton_unresponsive_server_times_out_within_the_timeout() -> None:
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen(1)  # accepts the TCP connection via the backlog, never answers
        url = f"http://127.0.0.1:{listener.getsockname()[1]}/metrics"
        started = time.monotonic()
        with pytest.raises(MeterError, match=re.escape(url)):
            TritonMeter(url, UUID0, timeout_s=0.2)
        assert time.monotonic() - started < 2.0


def test_triton_http_error_status_is_meter_error(metrics_server: MetricsServer) -> None:
    with pytest.raises(MeterError, match="HTTP 404"):
        TritonMeter(url_of(metrics_server, "/nope"), UUID0)


def test_triton_read_error_after_start_is_meter_error(metrics_server: MetricsServer) -> None:
    meter = TritonMeter(url_of(metrics_server), UUID0)
    meter.start()
    metrics_server.body = "nv_energy_consumption{gpu_uuid=broken} 1\n"
    with pytest.raises(MeterError, match="malformed metrics"):
        meter.read()
    meter.close()


def test_triton_metrics_url_must_be_http() -> None:
    with pytest.raises(MeterError, match="http"):
        TritonMeter("file:///etc/passwd", UUID0)


# --------------------------------------------------------------------------
# CPU model


def test_cpu_model_energy_is_cpu_time_times_tdp_per_core_plus_memory_term() -> None:
    cpu_s, rss = [10.0], [2_000_000_000]
    clock = FakeClock()
    meter = CpuModelMeter(
        tdp_w=64.0,
        cores=8,
        memory_w_per_gb=0.5,
        cpu_time_s=lambda: cpu_s[0],
        rss_bytes=lambda: rss[0],
        clock_ns=clock,
    )
    meter.start()
    cpu_s[0] = 12.0
    clock.advance(4.0)
    # 2 CPU-s x 64 W / 8 cores = 16 J; 2 GB x 0.5 W/GB x 4 s = 4 J
    assert meter.read().energy_j == pytest.approx(20.0)
    rss[0] = 4_000_000_000
    clock.advance(2.0)
    # RSS 2 -> 4 GB over 2 s: mean 3 GB x 0.5 W/GB x 2 s = 3 J; no CPU time
    assert meter.read().energy_j == pytest.approx(23.0)
    meter.close()


def test_cpu_model_is_reported_as_modelled_not_measured() -> None:
    meter = CpuModelMeter(tdp_w=65.0, cores=4)
    assert meter.method == "modelled"
    assert meter.measured is False
    assert meter.relative_uncertainty == 0.30
    assert meter.device_info()["tdp_w"] == "65"
    assert meter.device_info()["memory_w_per_gb"] == "0.375"
    assert meter.watts_per_busy_core == 16.25


def test_cpu_model_defaults_measure_this_process() -> None:
    meter = CpuModelMeter()
    assert meter.device_info()["cores"] == str(os.cpu_count() or 1)
    meter.start()
    deadline = time.process_time() + 0.02
    while time.process_time() < deadline:  # burn a little CPU
        pass
    assert meter.read().energy_j > 0
    meter.close()


def test_cpu_model_rejects_nonsense_configuration() -> None:
    with pytest.raises(ValueError, match="cores"):
        CpuModelMeter(cores=0)
    with pytest.raises(ValueError, match="tdp_w"):
        CpuModelMeter(tdp_w=-1)


# --------------------------------------------------------------------------
# registry


def test_load_meter_class_resolves_names_and_dotted_paths() -> None:
    assert load_meter_class("nvml") is NvmlMeter
    assert load_meter_class("rapl") is RaplMeter
    assert load_meter_class("triton") is TritonMeter
    assert load_meter_class("cpu-model") is CpuModelMeter
    assert load_meter_class("inference.meters.rapl.RaplMeter") is RaplMeter
    assert load_meter_class("inference.meters.cpu_model:CpuModelMeter") is CpuModelMeter


@pytest.mark.parametrize(
    ("name", "message"),
    [
        ("nope", "unknown meter"),
        ("no_such_package.module.Meter", "cannot import"),
        ("inference.meters.base.Nothing", "has no attribute"),
        ("inference.meters.base.Reading", "not a Meter subclass"),
    ],
)
def test_load_meter_class_rejects_what_is_not_a_meter(name: str, message: str) -> None:
    with pytest.raises(MeterError, match=message):
        load_meter_class(name)


def test_detect_meters_without_gpu_or_rapl_falls_back_to_cpu_model_and_says_why(tmp_path: Path) -> None:
    detection = probe_meters(
        nvml_module=FakeNvml(init_error=NVMLError_LibraryNotFound()),
        rapl_root=tmp_path / "powercap",
        cpu_model_options={"tdp_w": 95.0},
    )
    [(meter, why)] = detection.meters
    assert isinstance(meter, CpuModelMeter)
    assert meter.device_info()["tdp_w"] == "95"
    assert why.startswith("cpu-model: no NVML or RAPL")
    assert "NVML Shared Library Not Found" in why
    assert f"{tmp_path / 'powercap' / 'intel-rapl:0'} not present" in why
    assert "triton: no metrics URL configured" in detection.skipped
    detection.close_all()


def test_detect_meters_on_this_machine_without_gpu_or_rapl() -> None:
    pynvml = pytest.importorskip("pynvml")
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError:
        pass
    else:
        pynvml.nvmlShutdown()
        pytest.skip("this machine has NVML")
    if Path("/sys/class/powercap/intel-rapl:0").exists():
        pytest.skip("this machine has RAPL")
    meters = detect_meters()
    assert [(type(m), why.split(" (")[0]) for m, why in meters] == [
        (CpuModelMeter, "cpu-model: no NVML or RAPL")
    ]
    for meter, _ in meters:
        meter.close()


def test_detect_meters_lists_each_gpu_with_its_method(tmp_path: Path) -> None:
    fake = FakeNvml(
        [FakeGpu(UUID0, name="NVIDIA H200"), FakeGpu(UUID1, name="Tesla P4", counter_supported=False)]
    )
    detection = probe_meters(nvml_module=fake, rapl_root=tmp_path)
    reasons = [why for _, why in detection.meters]
    assert reasons == [
        f"nvml: 2 GPUs found; GPU 0 NVIDIA H200 ({UUID0}) uses the energy counter",
        f"nvml: 2 GPUs found; GPU 1 Tesla P4 ({UUID1}) integrates power samples (energy counter not supported)",
    ]
    assert "cpu-model: not needed, NVML/RAPL meters found" in detection.skipped
    detection.close_all()
    assert fake.active_inits == 0


def test_detect_meters_uses_each_rapl_package(tmp_path: Path) -> None:
    root = make_rapl(tmp_path, packages=2)
    detection = probe_meters(sources=("rapl", "cpu-model"), rapl_root=root, host_id="node-7")
    assert [(m.device_id, why) for m, why in detection.meters] == [
        ("rapl:node-7:intel-rapl:0", f"rapl: package-0 + dram at {root / 'intel-rapl:0'}"),
        ("rapl:node-7:intel-rapl:1", f"rapl: package-1 + dram at {root / 'intel-rapl:1'}"),
    ]
    detection.close_all()


def test_detect_meters_leaves_a_gpu_seen_by_nvml_and_triton_to_nvml(
    tmp_path: Path, metrics_server: MetricsServer
) -> None:
    detection = probe_meters(
        nvml_module=FakeNvml([FakeGpu(UUID0)]), rapl_root=tmp_path, triton_url=url_of(metrics_server)
    )
    assert [(type(m), m.device_id) for m, _ in detection.meters] == [(NvmlMeter, UUID0), (TritonMeter, UUID1)]
    assert f"triton: {UUID0} already metered locally by NVML" in detection.skipped
    assert "cpu-model: not needed, NVML/RAPL meters found" in detection.skipped
    detection.close_all()


def test_detect_meters_logs_skipped_sources(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.INFO, logger="inference.meters.registry"):
        meters = detect_meters(sources=("rapl", "cpu-model"), rapl_root=tmp_path / "none")
    assert any("intel-rapl:0 not present" in r.getMessage() for r in caplog.records)
    for meter, _ in meters:
        meter.close()


def test_detect_meters_rejects_unknown_sources() -> None:
    with pytest.raises(ValueError, match="unknown meter sources"):
        probe_meters(sources=("nvml", "wattmeter"))


# --------------------------------------------------------------------------
# bench/gpu_check.py


def load_gpu_check() -> ModuleType:
    spec = importlib.util.spec_from_file_location("gpu_check", REPO / "bench" / "gpu_check.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_gpu_check_skips_cleanly_without_nvml(capsys: pytest.CaptureFixture[str]) -> None:
    gpu_check = load_gpu_check()
    rc = gpu_check.main(["--seconds", "0.1"], nvml_module=FakeNvml(init_error=NVMLError_LibraryNotFound()))
    assert rc == 0
    assert "gpu_check: skipped" in capsys.readouterr().out


def test_gpu_check_script_exits_zero_on_a_machine_without_gpu() -> None:
    pynvml = pytest.importorskip("pynvml")
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError:
        pass
    else:
        pynvml.nvmlShutdown()
        pytest.skip("this machine has NVML; run bench/gpu_check.py by hand")
    result = subprocess.run(
        [sys.executable, str(REPO / "bench" / "gpu_check.py"), "--seconds", "1"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    assert "skipped" in result.stdout


@pytest.mark.parametrize("pretend_gpu_load", [False, True])
def test_gpu_check_compares_counter_integration_and_power_limit_on_a_fake_gpu(
    pretend_gpu_load: bool, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    gpu_check = load_gpu_check()
    monkeypatch.setattr(gpu_check, "_torch_load", lambda index: None)
    monkeypatch.setattr(gpu_check, "_cupy_load", lambda index: None)
    if pretend_gpu_load:
        monkeypatch.setattr(gpu_check, "_numpy_load", lambda: ("fake load", lambda: time.sleep(0.001), True))
    fake = FakeNvml([FakeGpu(UUID0, power_mw=250_000, power_limit_mw=300_000)], live=True)
    rc = gpu_check.main(["--seconds", "0.2", "--period-ms", "2"], nvml_module=fake)
    out = capsys.readouterr().out
    assert rc == 0, out
    for row in ("nvml-counter", "nvml-power-integration", "power-limit x wall (upper bound)"):
        assert row in out
    assert ("gpu_check: OK" in out) is pretend_gpu_load
    assert ("GPU was idle" in out) is not pretend_gpu_load
    assert fake.active_inits == 0
