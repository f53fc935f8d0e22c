"""bench/compare_triton.py's summary of several rounds and issue 27's targets, on plain dictionaries."""

from __future__ import annotations

import importlib
import sys
from pathlib import Path
from typing import Any

BENCH = Path(__file__).resolve().parents[2] / "bench"
# bench/ on the path only while importing: its common.py must not shadow anything for other tests.
sys.path.insert(0, str(BENCH))
try:
    compare_triton = importlib.import_module("compare_triton")
finally:
    sys.path.remove(str(BENCH))


def _run(
    server: str, rnd: int, throughput: float, p99_ms: float, cpu_cores: float, **extra: Any
) -> dict[str, Any]:
    return {
        "final": True,
        "server": server,
        "protocol": extra.pop("protocol", "http"),
        "model": "linear",
        "concurrency": extra.pop("concurrency", 32),
        "round": rnd,
        "throughput": throughput,
        "p50_ms": p99_ms / 2,
        "p99_ms": p99_ms,
        "stable": True,
        "errors": [],
        "disturbed": False,
        "other_cpu_cores": 0.05,
        "server_cpu_cores": {server: cpu_cores},
        **extra,
    }


def test_summary_takes_the_median_of_each_rounds_ratio_and_reports_cpu_per_request() -> None:
    runs = []
    for rnd, ours in enumerate((1500.0, 2100.0, 1800.0)):
        runs += [_run("triton", rnd, 1000.0, 10.0, 1.0), _run("ours", rnd, ours, 6.0, 0.9)]
    (row,) = compare_triton.summarize(runs, ["linear"], [32], ["http"])
    assert row["rounds"] == 3
    assert row["throughput_ratio_by_round"] == [1.5, 2.1, 1.8]
    assert row["throughput_ratio"] == 1.8
    assert row["ours_throughput"] == 1800.0
    assert row["p99_ratio"] == 0.6
    assert row["triton_cpu_us_per_request"] == 1000.0  # 1 core / 1,000 requests a second
    assert row["ours_cpu_us_per_request"] == 500.0  # 0.9 core / 1,800 a second (the median round)


def test_a_non_final_attempt_is_left_out_of_the_summary() -> None:
    runs = [_run("triton", 0, 1000.0, 10.0, 1.0), _run("ours", 0, 1500.0, 6.0, 0.9)]
    runs.append({**_run("ours", 0, 9000.0, 1.0, 0.1), "final": False})
    (row,) = compare_triton.summarize(runs, ["linear"], [32], ["http"])
    assert row["throughput_ratio"] == 1.5


def test_issue_27_targets_need_the_ratio_and_over_http_the_p99() -> None:
    runs = [
        _run("triton", 0, 1000.0, 10.0, 1.0, concurrency=8),
        _run("ours", 0, 1500.0, 8.0, 0.9, concurrency=8),  # 1.5x but p99 0.8x: not met
        _run("triton", 0, 1000.0, 10.0, 1.0, concurrency=32),
        _run("ours", 0, 1900.0, 6.0, 0.9, concurrency=32),  # 1.9x, p99 0.6x: met
        _run("triton", 0, 1000.0, 10.0, 1.0, concurrency=8, protocol="grpc"),
        _run("ours", 0, 990.0, 20.0, 0.9, concurrency=8, protocol="grpc"),  # 0.99x: not met
        _run("triton", 0, 1000.0, 10.0, 1.0, concurrency=32, protocol="grpc"),
        _run("ours", 0, 1000.0, 20.0, 0.9, concurrency=32, protocol="grpc"),  # 1.0x, p99 free: met
    ]
    rows = compare_triton.summarize(runs, ["linear"], [8, 32], ["http", "grpc"])
    met = {(c["protocol"], c["concurrency"]): c["met"] for c in compare_triton.targets(rows)["issue27"]}
    assert met == {("http", 8): False, ("http", 32): True, ("grpc", 8): False, ("grpc", 32): True}


def test_rounds_default_to_one_and_widen_the_time_budget() -> None:
    one = compare_triton.parse_args([])
    three = compare_triton.parse_args(["--rounds", "3", "--protocols", "http"])
    assert one.rounds == 1
    assert three.time_budget == 3 * 540.0
