"""Background threads survive a failing iteration: they log it once with context, count it in /metrics
(``carbonledger_thread_errors_total{thread=...}``) and go on. Covered: the batcher's reaper and instance
threads, the meters' periodic threads, the recorder's meter thread and the carbon-signal thread; and a client
timeout too large for any wait is refused at the edge with a 400 naming the parameter.
"""

from __future__ import annotations

import logging
import re
import shutil
import threading
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import requests

from carbonledger.gateway_app import GridSignalService
from inference import errors as inference_errors
from inference.batcher import BatchPolicy, DynamicBatcher, Pending
from inference.errors import InferenceError, RequestTimeout
from inference.gateway import Gateway
from inference.keys import Principal
from inference.meters.base import Meter, PeriodicThread
from inference.recorder import LedgerRecorder, RecorderOptions
from inference.repository import GatewayOptions
from inference.spool import Spool
from tests.support.models import DEMO
from tests.support.servers import serve_asgi

MS = 1_000_000
KEY = "thread-survival-key"
AUTH = {"Authorization": f"Bearer {KEY}"}
ONE_HOUR_US = 3_600_000_000


async def resolver(token: str) -> Principal | None:
    return Principal(1, "acme", 10, frozenset({"infer"})) if token == KEY else None


def wait_for(cond: Any, timeout: float = 5.0) -> None:
    end = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > end:
            raise AssertionError("condition not reached in time")
        time.sleep(0.002)


def thread_errors(name: str) -> int:
    return int(inference_errors.THREAD_ERRORS.count(name))


def error_logs(caplog: pytest.LogCaptureFixture, needle: str) -> list[logging.LogRecord]:
    return [r for r in caplog.records if r.levelno >= logging.ERROR and needle in r.getMessage()]


class Recorder:
    """A deliver function that keeps what it was given."""

    def __init__(self) -> None:
        self.items: list[tuple[Pending, Any]] = []
        self.lock = threading.Lock()

    def __call__(self, items: list[tuple[Pending, Any]]) -> None:
        with self.lock:
            self.items.extend(items)

    def result_of(self, p: Pending) -> Any:
        with self.lock:
            for q, result in self.items:
                if q is p:
                    return result
        return None


def batcher(name: str, deliver: Any, run: Any = None) -> DynamicBatcher:
    def default_run(batch: list[Pending]) -> tuple[Sequence[Any], tuple[int, int, int]]:
        return [f"ok:{p.payload}" for p in batch], (0, 0, 0)

    policy = BatchPolicy(max_batch_size=4, preferred_batch_sizes=(4,), max_queue_delay_ns=1 * MS)
    return DynamicBatcher(name, policy, lambda i: run or default_run, deliver)


# -- the edge: a client timeout has a documented bound ------------------------------------------------------


@pytest.fixture(scope="module")
def gateway_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, Gateway]]:
    root = tmp_path_factory.mktemp("models")
    shutil.copytree(DEMO / "linear", root / "linear")
    gateway = Gateway(root, GatewayOptions(), resolver)
    with serve_asgi(gateway) as address:
        yield address, gateway


def linear_doc(**parameters: Any) -> dict[str, Any]:
    x = np.zeros(256, dtype=np.float32)
    return {
        "inputs": [{"name": "x", "shape": [1, 256], "datatype": "FP32", "data": x.tolist()}],
        "parameters": parameters,
    }


def test_a_client_timeout_above_one_hour_is_refused_with_400_naming_the_parameter(
    gateway_server: tuple[str, Gateway],
) -> None:
    address, _ = gateway_server
    infer = f"http://{address}/v2/models/linear/infer"
    for too_long in (10**16, ONE_HOUR_US + 1):
        r = requests.post(infer, json=linear_doc(timeout=too_long), headers=AUTH, timeout=10)
        assert r.status_code == 400, r.text
        assert "'timeout'" in r.json()["error"] and str(ONE_HOUR_US) in r.json()["error"]
    ok = requests.post(infer, json=linear_doc(timeout=ONE_HOUR_US), headers=AUTH, timeout=10)
    assert ok.status_code == 200, ok.text


def test_metrics_count_the_errors_a_reaper_survived(gateway_server: tuple[str, Gateway]) -> None:
    address, gateway = gateway_server
    b = gateway.repository.version("linear", None).batcher
    assert b is not None
    real_expire = b._expire_due
    failures = [0]

    def expire_failing_once_on_the_reaper(now: int) -> list[Pending]:
        if threading.current_thread().name.endswith("-reaper") and not failures[0]:
            failures[0] += 1
            raise RuntimeError("injected reaper failure")
        return real_expire(now)

    b._expire_due = expire_failing_once_on_the_reaper  # type: ignore[method-assign]
    infer = f"http://{address}/v2/models/linear/infer"
    for _ in range(3):
        r = requests.post(infer, json=linear_doc(timeout=200_000), headers=AUTH, timeout=10)
        assert r.status_code == 200, r.text
    wait_for(lambda: failures[0] == 1)
    assert b._reaper is not None
    wait_for(lambda: thread_errors("linear/1-reaper") == 1)
    assert b._reaper.is_alive()
    metrics = requests.get(f"http://{address}/metrics", timeout=10).text
    assert "# TYPE carbonledger_thread_errors_total counter" in metrics
    assert re.search(r'^carbonledger_thread_errors_total\{thread="linear/1-reaper"\} 1$', metrics, re.M), (
        metrics
    )


# -- the batcher's threads --------------------------------------------------------------------------------


def test_the_reaper_survives_a_timeout_too_long_to_wait_for_and_keeps_enforcing_timeouts() -> None:
    deliver = Recorder()
    release = threading.Event()

    def busy_run(batch: list[Pending]) -> tuple[Sequence[Any], tuple[int, int, int]]:
        release.wait(5)
        return [p.payload for p in batch], (0, 0, 0)

    b = batcher("huge", deliver, busy_run)
    b.start()
    try:
        busy = Pending("busy")
        b.enqueue(busy)
        wait_for(lambda: busy.state == 1)  # RUNNING: the only instance is taken
        b.enqueue(Pending("patient", timeout_us=10**16))  # a wait of 1e13 s overflows any lock timeout
        time.sleep(0.05)
        assert b._reaper is not None and b._reaper.is_alive()
        hurried = Pending("hurried", timeout_us=20_000)
        t0 = time.monotonic()
        b.enqueue(hurried)
        wait_for(lambda: deliver.result_of(hurried) is not None, timeout=2)
        assert isinstance(deliver.result_of(hurried), RequestTimeout)
        assert time.monotonic() - t0 < 1.0  # while the instance is still busy
        assert b._reaper.is_alive()
    finally:
        release.set()
        b.stop()


def test_the_reaper_survives_a_failing_iteration_logs_it_once_and_counts_it(
    caplog: pytest.LogCaptureFixture,
) -> None:
    deliver = Recorder()
    release = threading.Event()

    def busy_run(batch: list[Pending]) -> tuple[Sequence[Any], tuple[int, int, int]]:
        release.wait(5)
        return [p.payload for p in batch], (0, 0, 0)

    b = batcher("reaped", deliver, busy_run)
    real_expire = b._expire_due
    failures = [0]

    def failing_expire(now: int) -> list[Pending]:
        if threading.current_thread().name == "reaped-reaper" and failures[0] < 5:
            failures[0] += 1
            raise RuntimeError("injected reaper failure")
        return real_expire(now)

    b._expire_due = failing_expire  # type: ignore[method-assign]
    b.start()
    try:
        busy = Pending("busy")
        b.enqueue(busy)
        wait_for(lambda: busy.state == 1)
        late = Pending("late", timeout_us=30_000)
        with caplog.at_level(logging.ERROR):
            b.enqueue(late)
            wait_for(lambda: deliver.result_of(late) is not None, timeout=3)
        assert isinstance(deliver.result_of(late), RequestTimeout)
        assert failures[0] == 5
        assert b._reaper is not None and b._reaper.is_alive()
        logged = error_logs(caplog, "injected reaper failure")
        assert len(logged) == 1, [r.getMessage() for r in logged]
        assert "reaped" in logged[0].getMessage()  # the context: which model's thread
        assert thread_errors("reaped-reaper") == 5
    finally:
        release.set()
        b.stop()


def test_an_instance_thread_survives_a_failing_iteration_and_serves_what_was_queued() -> None:
    deliver = Recorder()
    b = batcher("planned", deliver)
    real_plan = b.plan
    failures = [0]

    def plan_failing_once(now: int) -> tuple[int, int | None]:
        if not failures[0]:
            failures[0] += 1
            raise RuntimeError("injected planning failure")
        return real_plan(now)

    b.plan = plan_failing_once  # type: ignore[method-assign]
    b.start()
    try:
        first = Pending("first")
        b.enqueue(first)
        wait_for(lambda: deliver.result_of(first) is not None)
        assert deliver.result_of(first) == "ok:first"
        second = Pending("second")
        b.enqueue(second)
        wait_for(lambda: deliver.result_of(second) is not None)
        assert deliver.result_of(second) == "ok:second"
        assert all(t.is_alive() for t in b._threads)
        assert thread_errors("planned-0") == 1
    finally:
        b.stop()


def test_an_instance_thread_that_fails_to_deliver_a_batch_answers_it_with_an_error_and_goes_on() -> None:
    deliver = Recorder()
    calls = [0]

    def deliver_failing_once(items: list[tuple[Pending, Any]]) -> None:
        calls[0] += 1
        if calls[0] == 1:
            raise RuntimeError("injected delivery failure")
        deliver(items)

    b = batcher("delivering", deliver_failing_once)
    b.start()
    try:
        first = Pending("first")
        b.enqueue(first)
        wait_for(lambda: deliver.result_of(first) is not None)
        result = deliver.result_of(first)
        assert isinstance(result, InferenceError) and result.status == 500
        assert b.pending_count == 0  # nothing left counted in flight
        second = Pending("second")
        b.enqueue(second)
        wait_for(lambda: deliver.result_of(second) is not None)
        assert deliver.result_of(second) == "ok:second"
        assert thread_errors("delivering-0") == 1
    finally:
        b.stop()


# -- meters' periodic threads -------------------------------------------------------------------------------


def test_a_periodic_meter_thread_survives_failures_logs_them_once_and_counts_them(
    caplog: pytest.LogCaptureFixture,
) -> None:
    calls = [0]

    def sample() -> None:
        calls[0] += 1
        if calls[0] <= 20:
            raise OSError("injected sampling failure")

    thread = PeriodicThread("fake-power-0", 0.002, sample)
    with caplog.at_level(logging.ERROR):
        thread.start()
        try:
            wait_for(lambda: calls[0] >= 30)
        finally:
            thread.stop()
    assert thread.errors == 20
    logged = error_logs(caplog, "injected sampling failure")
    assert len(logged) == 1, [r.getMessage() for r in logged]
    assert "fake-power-0" in logged[0].getMessage()
    assert thread_errors("fake-power-0") == 20


# -- the recorder's meter thread ----------------------------------------------------------------------------


class FlakyMeter(Meter):
    """A meter that raises while ``failing`` is set."""

    def __init__(self) -> None:
        super().__init__("flaky-cpu")
        self.failing = False
        self.reads = 0

    @property
    def method(self) -> Any:
        return "modelled"

    def device_info(self) -> dict[str, str]:
        return {"name": "flaky"}

    def _start(self) -> None:
        pass

    def _read(self) -> tuple[float, int]:
        self.reads += 1
        if self.failing:
            raise OSError("injected meter failure")
        return self.reads * 0.001, time.monotonic_ns()


def test_the_recorders_meter_thread_survives_a_failing_meter_and_logs_it_once(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    spool = Spool(tmp_path / "spool")
    meter = FlakyMeter()
    recorder = LedgerRecorder(
        spool,
        [(meter, "test")],
        RecorderOptions(sample_interval_s=0.002, flush_interval_s=0.002, idle_power_w=1.0),
    )
    recorder.start()
    try:
        assert recorder._thread is not None
        name = recorder._thread.name
        before = thread_errors(name)
        with caplog.at_level(logging.ERROR):
            meter.failing = True
            start = meter.reads
            wait_for(lambda: meter.reads >= start + 20)
            meter.failing = False
            recovered = meter.reads
            wait_for(lambda: meter.reads >= recovered + 5)
        assert recorder._thread.is_alive()
        logged = error_logs(caplog, "injected meter failure")
        assert len(logged) == 1, [r.getMessage() for r in logged]
        assert "flaky-cpu" in logged[0].getMessage()
        assert thread_errors(name) - before >= 19
    finally:
        recorder.stop()
        spool.close()


# -- the carbon-signal thread -------------------------------------------------------------------------------


def test_the_carbon_signal_thread_survives_a_failing_refresh_and_logs_it_once(
    caplog: pytest.LogCaptureFixture,
) -> None:
    # A tally of its own: the process's one keeps, for five minutes, that an earlier test logged this context.
    errors = inference_errors.ThreadErrors()
    service = GridSignalService(interval_s=0.002, thread_errors=errors)
    calls = [0]

    def refresh() -> None:
        calls[0] += 1
        if calls[0] <= 10:
            raise ConnectionError("injected database outage")

    service.refresh = refresh  # type: ignore[method-assign]
    with caplog.at_level(logging.ERROR):
        service.start()
        try:
            wait_for(lambda: calls[0] >= 15)
            assert service._thread is not None and service._thread.is_alive()
        finally:
            service.stop()
    logged = error_logs(caplog, "injected database outage")
    assert len(logged) == 1, [r.getMessage() for r in logged]
    assert "carbon-aware signal" in logged[0].getMessage()
    assert errors.count("carbon-signal") == 10
