"""The modelled CPU meter of a gateway books its serving work only: a real gateway process (the one-box role,
the gateway and Django in one process) answering dashboard and management-API requests alone books no energy
on its inference device beyond the device's idle power, while inference traffic does book energy."""

from __future__ import annotations

import http.client
import threading
import time
from collections.abc import Callable
from pathlib import Path

from tests.support.gateway_process import (
    GatewayProcess,
    LedgerDatabase,
    gateway_env,
    infer_body,
    prepare_gateway,
    wait_until,
)


def _keep_sending(
    address: tuple[str, int], requests: list[tuple[str, str, bytes | None, dict[str, str]]], seconds: float
) -> dict[int, int]:
    """Send ``requests`` round-robin on one keep-alive connection for ``seconds``; the statuses seen."""
    statuses: dict[int, int] = {}
    conn = http.client.HTTPConnection(*address, timeout=15)
    end = time.monotonic() + seconds
    i = 0
    try:
        while time.monotonic() < end:
            method, path, body, headers = requests[i % len(requests)]
            i += 1
            conn.request(method, path, body=body, headers=headers)
            resp = conn.getresponse()
            resp.read()
            statuses[resp.status] = statuses.get(resp.status, 0) + 1
    finally:
        conn.close()
    return statuses


def _in_parallel(fn: Callable[[], dict[int, int]], n: int) -> dict[int, int]:
    results: list[dict[int, int]] = []
    threads = [threading.Thread(target=lambda: results.append(fn())) for _ in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    total: dict[int, int] = {}
    for r in results:
        for status, count in r.items():
            total[status] = total.get(status, 0) + count
    return total


def _power_w(intervals: list[tuple[int, int, int]], start_ns: int, end_ns: int) -> float:
    """Mean metered power over [start_ns, end_ns): each interval's energy counted for the part of it inside."""
    energy_uj = 0.0
    for t0, t1, uj in intervals:
        overlap = min(t1, end_ns) - max(t0, start_ns)
        if overlap > 0 and t1 > t0:
            energy_uj += uj * overlap / (t1 - t0)
    return energy_uj / 1e6 / ((end_ns - start_ns) / 1e9)


def test_dashboard_and_api_traffic_books_no_energy_beyond_idle_while_inference_does(tmp_path: Path) -> None:
    env = gateway_env(tmp_path / "var", None, METER_INTERVAL_S="0.25", METERS="cpu-model")
    env.pop("DATABASE_URL", None)
    key = prepare_gateway(env)
    auth = {"Authorization": f"Bearer {key}"}
    api = [
        ("GET", "/api/v1/ledger/requests", None, auth),
        ("GET", "/api/v1/whoami", None, auth),
        ("GET", "/accounts/login/", None, {}),  # a dashboard page, rendered by Django
        ("GET", "/api/docs/", None, {}),
    ]
    infer = [("POST", "/v2/models/linear/infer", infer_body(), {**auth, "Content-Type": "application/json"})]
    with GatewayProcess(env, tmp_path / "gateway.log").start(60) as gateway:
        time.sleep(2.0)  # start-up work (loading the model, the first readings) out of the way
        quiet = (time.time_ns(), 0)
        time.sleep(3.0)
        quiet = (quiet[0], time.time_ns())
        api_window = (time.time_ns(), 0)
        api_statuses = _in_parallel(lambda: _keep_sending(gateway.address, api, 4.0), 2)
        api_window = (api_window[0], time.time_ns())
        time.sleep(0.6)
        infer_window = (time.time_ns(), 0)
        infer_statuses = _in_parallel(lambda: _keep_sending(gateway.address, infer, 3.0), 2)
        infer_window = (infer_window[0], time.time_ns())
        time.sleep(0.6)
        assert gateway.terminate(), gateway.log_tail()
    assert set(api_statuses) == {200}, api_statuses
    assert sum(api_statuses.values()) >= 20, api_statuses
    assert set(infer_statuses) == {200}, infer_statuses

    db = LedgerDatabase(sqlite_path=tmp_path / "var" / "carbonledger.sqlite3")
    assert wait_until(lambda: db.query("SELECT COUNT(*) FROM ledger_interval")[0][0] > 0, 30)
    (device,) = {d for (d,) in db.query("SELECT DISTINCT device_id FROM ledger_interval")}
    intervals = [
        (int(t0), int(t1), int(uj))
        for t0, t1, uj in db.query(
            f"SELECT t0_ns, t1_ns, energy_uj FROM ledger_interval WHERE device_id = '{device}' ORDER BY t0_ns"
        )
    ]
    idle_w = _power_w(intervals, *quiet)
    api_w = _power_w(intervals, *api_window)
    infer_w = _power_w(intervals, *infer_window)
    shown = f"idle {idle_w:.3f} W, API and dashboard {api_w:.3f} W, inference {infer_w:.3f} W"
    # Dashboard and API work is not the device's: its power stays the idle power (memory term, event loop ticks).
    assert api_w <= idle_w * 1.3 + 0.05, shown
    # Inference work is: well above idle, and charged to the batches (not only to the idle line).
    assert infer_w >= idle_w + 0.5, shown
    (batch_uj,) = db.query(
        "SELECT COALESCE(SUM(e.energy_uj), 0) FROM ledger_batch_energy e "
        f"JOIN ledger_interval i ON i.interval_id = e.interval_id WHERE i.device_id = '{device}'"
    )[0]
    assert int(batch_uj) > 0, shown
