"""bench/compare_triton.py's summary of several rounds and issue 27's targets, on plain dictionaries; and its
wake-up probe of the host, on real loopback sockets with a child process."""

from __future__ import annotations

import importlib
import os
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


def test_perf_analyzer_output_gives_the_batch_cycle_and_the_time_between_batches(tmp_path: Path) -> None:
    csv = tmp_path / "pa.csv"
    csv.write_text(
        "Concurrency,Inferences/Second,Client Send,Network+Server Send/Recv,Server Queue,Server Compute Input,"
        "Server Compute Infer,Server Compute Output,Client Recv,p50 latency,p90 latency,p95 latency,p99 latency\n"
        "8,2500,17,775,184,13,2144,43,0,3060,3500,4000,4610\n"
    )
    stdout = "  Server: \n    Inference count: 80000\n    Execution count: 10000\n"
    res = compare_triton.parse_perf_analyzer(stdout, csv)
    assert res["avg_batch_size"] == 8.0
    assert res["server_compute_us"] == 2200.0  # input, infer and output: one batch's model call
    assert res["batch_cycle_ms"] == 3.2  # 8 rows a batch at 2,500 rows a second
    assert res["model_call_ms"] == 2.2
    assert round(res["between_batches_ms"], 9) == 1.0


def test_a_target_is_out_of_reach_of_one_instance_when_its_cycle_is_shorter_than_the_model_call() -> None:
    cycle = {"avg_batch_size": 16.0, "model_call_ms": 2.2}
    runs = [
        _run("triton", 0, 4000.0, 10.0, 1.0, **{**cycle, "between_batches_ms": 0.4}),
        _run("ours", 0, 6000.0, 6.0, 0.9, **{**cycle, "between_batches_ms": 0.47}),
        _run("triton", 0, 2000.0, 10.0, 1.0, concurrency=8, avg_batch_size=8.0, model_call_ms=2.5),
        _run("ours", 0, 2400.0, 6.0, 0.9, concurrency=8, avg_batch_size=8.0, model_call_ms=2.2),
    ]
    rows = compare_triton.summarize(runs, ["linear"], [8, 32], ["http"])
    checks = {c["concurrency"]: c for c in compare_triton.targets(rows)["issue27"]}
    # c = 32: 1.8 x 4,000 = 7,200/s at 16 rows is a batch every 2.22 ms, about the model call alone.
    assert checks[32]["needed_throughput"] == 7200.0
    assert checks[32]["rows_without_gaps"] == 7200.0 * 2.2 / 1000
    # c = 8: 1.4 x 2,000 = 2,800/s at 8 rows is a batch every 2.857 ms, leaving 0.657 ms beside our 2.2 ms.
    assert round(checks[8]["needed_batch_cycle_ms"], 3) == 2.857
    assert round(checks[8]["needed_between_batches_ms"], 3) == 0.657
    row8 = next(r for r in rows if r["concurrency"] == 8)
    assert "0.66 ms between batches" in compare_triton.cycle_lines(checks[8], row8)
    tight = {**runs[0], "throughput": 5000.0}
    rows = compare_triton.summarize([tight, runs[1]], ["linear"], [32], ["http"])
    (check,) = compare_triton.targets(rows)["issue27"]
    assert check["needed_between_batches_ms"] < 0
    assert "out of reach at this batch size" in compare_triton.cycle_lines(check, rows[0])
    assert "| 16.0 / 16.0 |" in compare_triton.cycle_table(rows)


def test_the_wakeup_probe_times_round_trips_blocking_and_polling() -> None:
    probe = compare_triton.wakeup_probe(n=50)
    assert "error" not in probe, probe
    assert probe["round_trips"] == 50
    assert probe["blocking_us"] > 0
    if len(os.sched_getaffinity(0)) >= 2:
        assert probe["polling_us"] > 0
        assert probe["wakeup_us"] == round(max(0.0, probe["blocking_us"] - probe["polling_us"]) / 2, 1)
    else:
        assert "polling_us" not in probe


def test_the_machine_info_says_how_idle_cpus_wait() -> None:
    cpuidle = compare_triton.machine_info()["cpuidle"]
    driver = Path("/sys/devices/system/cpu/cpuidle/current_driver")
    if driver.exists():
        assert cpuidle["driver"] == driver.read_text().strip()
    for word in Path("/proc/cmdline").read_text().split():
        if "halt_poll" in word:
            assert cpuidle[word.split("=", 1)[0]] == word.partition("=")[2]
