"""/metrics of a real replica: ``manage.py serve`` with its drainer process on its own database (a SQLite file,
or a fresh PostgreSQL database in the suite's PostgreSQL run) and a real Celery worker. Read with a strict
Prometheus text parser: the drainer's state per chain (up, restarts, lag, records written), the spool's
bytes, energy and CO2e counters that move with traffic, latency histograms counting every request, and the
workers' heartbeats."""

from __future__ import annotations

import contextlib
import http.client
import os
import signal
from pathlib import Path
from typing import Any

from tests.support.gateway_process import (
    CeleryWorker,
    GatewayProcess,
    gateway_env,
    infer_once,
    manage,
    prepare_gateway,
    wait_until,
)
from tests.support.prometheus import parse_exposition, value, values


def scrape(gateway: GatewayProcess) -> dict[str, Any]:
    conn = http.client.HTTPConnection(*gateway.address, timeout=10)
    try:
        conn.request("GET", "/metrics")
        resp = conn.getresponse()
        assert resp.status == 200
        return parse_exposition(resp.read().decode())
    finally:
        conn.close()


def drainer_pid(gateway_pid: int) -> int:
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            with contextlib.suppress(OSError):
                ppid = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
                if ppid == gateway_pid and b"drain_ledger" in (entry / "cmdline").read_bytes():
                    return int(entry.name)
    raise AssertionError(f"no drainer process under {gateway_pid}")


def test_a_replicas_metrics_show_its_drainer_spool_energy_latency_and_workers(
    tmp_path: Path, database_url: str
) -> None:
    var_dir = tmp_path / "var"
    url = None if database_url.startswith("sqlite") else database_url
    env = gateway_env(
        var_dir,
        url,
        LEDGER_STATUS_INTERVAL_S="0.2",
        METER_INTERVAL_S="0.2",
        WORKER_HEARTBEAT_INTERVAL_S="0.5",
        CELERY_QUEUE=f"metrics-{os.getpid()}",
        CARBONLEDGER_GRPC_PORT="0",  # concurrent test gateways would all want the default port
    )
    key = prepare_gateway(env)
    loaded = manage(env, "load_factors")  # the shipped figures: the site's zone (FR) gets an intensity
    assert loaded.returncode == 0, loaded.stderr
    with GatewayProcess(env, tmp_path / "gateway.log") as gateway:
        gateway.start()
        chain = (var_dir / "spool" / "chain_id").read_text().strip()
        first = scrape(gateway)
        assert value(first, "carbonledger_ledger_drainer_up", chain=chain) == 1
        assert value(first, "carbonledger_ledger_drainer_restarts_total", chain=chain) == 0
        assert value(first, "carbonledger_spool_max_bytes", chain=chain) == 1 << 30
        # Read by the carbon signal's thread as the gateway starts, off the event loop.
        assert wait_until(
            lambda: values(scrape(gateway), "carbonledger_co2e_location_intensity_g_per_kwh"), 10
        )
        assert value(scrape(gateway), "carbonledger_co2e_location_intensity_g_per_kwh", zone="FR") > 0
        written_before = value(first, "carbonledger_ledger_records_written_total", chain=chain)

        for _ in range(40):
            status, body = infer_once(gateway.address, key)
            assert status == 200, body

        def settled() -> bool:
            families = scrape(gateway)
            return (
                value(families, "carbonledger_ledger_records_written_total", chain=chain)
                >= written_before + 80
                and value(families, "carbonledger_inference_energy_joules_total", model="linear", version="1")
                > 0
            )

        assert wait_until(settled, 30), scrape(gateway)
        families = scrape(gateway)
        # 40 requests: 40 request records and at least one batch each written (plus intervals, idle lines).
        assert (
            value(families, "carbonledger_inference_co2e_location_grams_total", model="linear", version="1")
            > 0
        )
        for name in (
            "carbonledger_inference_request_duration_us",
            "carbonledger_inference_queue_duration_us",
            "carbonledger_inference_compute_infer_duration_us",
        ):
            assert value(families, name, "_count", model="linear", version="1") == 40
        assert value(families, "nv_inference_request_success", model="linear", version="1") == 40
        # The meter spools an interval every 0.2 s and the drainer writes every second: some bytes always wait,
        # none for long.
        assert value(families, "carbonledger_ledger_drain_lag_seconds", chain=chain) < 5
        assert value(families, "carbonledger_spool_backlog_bytes", chain=chain) < 1 << 20
        assert value(families, "carbonledger_key_store_errors_total", outcome="refused") == 0

        # The drainer killed: the watchdog starts another, and /metrics counts the restart.
        assert gateway.proc is not None
        os.kill(drainer_pid(gateway.proc.pid), signal.SIGKILL)
        assert wait_until(
            lambda: value(scrape(gateway), "carbonledger_ledger_drainer_restarts_total", chain=chain) == 1, 15
        ), gateway.log_tail()
        assert wait_until(
            lambda: value(scrape(gateway), "carbonledger_ledger_drainer_up", chain=chain) == 1, 15
        )

        # A worker's heartbeat reaches the gateway's /metrics through the database; it goes down when stopped.
        worker = CeleryWorker(env, tmp_path / "worker.log").start()
        try:

            def workers_up() -> dict[Any, float]:
                return values(scrape(gateway), "carbonledger_celery_worker_up")

            assert wait_until(lambda: list(workers_up().values()) == [1.0], 60), worker.log_tail()
            (labels,) = workers_up()
            assert dict(labels)["worker"].startswith("celery@")
        finally:
            worker.stop()
        assert wait_until(lambda: list(workers_up().values()) == [0.0], 15), scrape(gateway)
        assert gateway.terminate(), gateway.log_tail()
