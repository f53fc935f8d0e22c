"""bench/fleet.py, the fleet benchmark of issue 24: its pure parts, nothing timed.

The alternating plan, the options, the counters read from a replica's real ``/metrics`` text, the PostgreSQL
process kinds, the CPU of a process tree whose drainer runs in a session of its own, the HAProxy configuration
(checked by HAProxy itself where it is installed) and the summary table.
"""

from __future__ import annotations

import importlib
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from inference.stats import ModelStats, prometheus_text

ROOT = Path(__file__).resolve().parents[2]
BENCH = ROOT / "bench"


@pytest.fixture(scope="module")
def fleet() -> Any:
    sys.path.insert(0, str(BENCH))
    try:
        return importlib.import_module("fleet")
    finally:
        sys.path.remove(str(BENCH))


def test_the_plan_alternates_the_replica_order_and_keeps_direct_next_to_one_replica(fleet: Any) -> None:
    assert fleet.plan([3, 1, 2], rounds=2) == [
        (0, "direct"), (0, "1"), (0, "2"), (0, "3"),
        (1, "3"), (1, "2"), (1, "1"), (1, "direct"),
    ]  # fmt: skip
    assert fleet.plan([1, 2, 3], rounds=3, direct=False) == [
        (0, "1"), (0, "2"), (0, "3"), (1, "3"), (1, "2"), (1, "1"), (2, "1"), (2, "2"), (2, "3"),
    ]  # fmt: skip
    assert fleet.replicas_of("direct") == 1
    assert fleet.replicas_of("3") == 3


def test_the_options_default_to_two_rounds_at_concurrency_32_and_quick_shortens_everything(
    fleet: Any,
) -> None:
    full = fleet.parse_args([])
    assert (full.rounds, full.concurrency, full.replica_list) == (2, 32, [1, 2, 3])
    assert (full.measurement_interval, full.max_trials, full.retries, full.balance) == (
        5000,
        6,
        1,
        "leastconn",
    )
    quick = fleet.parse_args(["--quick"])
    assert (quick.rounds, quick.measurement_interval, quick.max_trials, quick.retries) == (1, 1000, 3, 0)
    custom = fleet.parse_args(["--replicas", "2,1,2", "--concurrency", "8", "--rounds", "3"])
    assert (custom.replica_list, custom.concurrency, custom.rounds) == ([1, 2], 8, 3)


@pytest.mark.parametrize(
    "argv", [["--replicas", "0"], ["--replicas", "a"], ["--rounds", "0"], ["--concurrency", "0"]]
)
def test_the_options_refuse_what_cannot_be_measured(fleet: Any, argv: list[str]) -> None:
    with pytest.raises(SystemExit):
        fleet.parse_args(argv)


def test_the_batch_counters_come_from_a_replicas_metrics_for_the_model_alone(fleet: Any) -> None:
    linear = ModelStats("linear", "1")
    for rows in (8, 8, 4):
        linear.record_batch(rows, rows, 0, 0, 0, 0, 0)
    other = ModelStats("digits", "1")
    other.record_batch(32, 32, 0, 0, 0, 0, 0)
    text = prometheus_text([(linear, 0), (other, 0)]).decode()
    assert fleet.inference_counters(text) == (20, 3)
    assert fleet.inference_counters(text, "digits") == (32, 1)
    assert fleet.inference_counters("# nothing served yet\n") == (0, 0)


def test_postgresql_processes_are_told_apart_by_database(fleet: Any) -> None:
    kind = fleet.postgres_process_kind
    assert kind("postgres: 15/main: postgres cl_bench_ab12 127.0.0.1(37410) idle", "cl_bench_ab12") == "own"
    assert kind("postgres: 15/main: autovacuum worker cl_bench_ab12", "cl_bench_ab12") == "own"
    assert kind("postgres: 15/main: postgres test_h_x 127.0.0.1(46930) idle", "cl_bench_ab12") == "other"
    assert kind("postgres: 15/main: postgres other [local] idle", "cl_bench_ab12") == "other"
    assert kind("postgres: 15/main: walwriter ", "cl_bench_ab12") == "server"
    assert (
        kind("/usr/lib/postgresql/15/bin/postgres\x00-D\x00/var/lib/postgresql/15/main\x00", "cl_bench_ab12")
        == "server"
    )


def test_a_replicas_cpu_includes_its_drainer_in_a_session_of_its_own(fleet: Any) -> None:
    row = fleet.ProcRow
    procs = {
        100: row(100, 1, 100, 0, 2.0, 2.0),  # the serving process, leader of its group
        101: row(101, 100, 100, 0, 0.5, 0.5),  # a thread-like helper in its group
        102: row(102, 100, 102, 0, 1.0, 1.0),  # the drainer: its own session
        103: row(103, 102, 102, 0, 0.25, 0.25),  # the drainer's COPY preparer
        200: row(200, 1, 200, 0, 9.0, 9.0),  # someone else
    }
    assert fleet.tree_cpu(procs, 100) == (2.5, 1.25)


def test_postgresql_cpu_counts_processes_born_during_the_window_whole(fleet: Any) -> None:
    before = {1: ("own", 1.0), 2: ("server", 3.0), 3: ("other", 5.0), 4: ("own", 9.0)}
    after = {1: ("own", 1.5), 2: ("server", 3.25), 3: ("other", 6.0), 5: ("own", 0.25)}
    assert fleet.postgres_delta(before, after) == {"own": 0.75, "server": 0.25, "other": 1.0}


def test_the_haproxy_configuration_balances_over_the_replicas_checked_on_readyz(
    fleet: Any, tmp_path: Path
) -> None:
    text = fleet.haproxy_config(
        18000, tmp_path / "s.sock", [("gateway-1", 18001), ("gateway-2", 18002)], "leastconn"
    )
    assert "balance leastconn" in text
    assert "option httpchk GET /readyz" in text
    assert "bind 127.0.0.1:18000" in text
    assert "    server gateway-1 127.0.0.1:18001 check\n    server gateway-2 127.0.0.1:18002 check" in text
    haproxy = shutil.which("haproxy") or ("/usr/sbin/haproxy" if Path("/usr/sbin/haproxy").exists() else None)
    if haproxy is None:
        pytest.skip(
            "HAProxy is not installed (apt-get install haproxy): its own check of the file is skipped"
        )
    cfg = tmp_path / "haproxy.cfg"
    cfg.write_text(text)
    checked = subprocess.run([haproxy, "-c", "-f", str(cfg)], capture_output=True, text=True, timeout=30)
    assert checked.returncode == 0, checked.stdout + checked.stderr


def run(
    config: str, rnd: int, throughput: float, p99: float, batches: list[float], **extra: Any
) -> dict[str, Any]:
    n = len(batches)
    return {
        "config": config,
        "round": rnd,
        "final": True,
        "throughput": throughput,
        "p50_ms": p99 / 2,
        "p99_ms": p99,
        "stable": True,
        "disturbed": False,
        "errors": [],
        "machine_busy_cores": 2.0,
        "other_cpu_cores": 0.1,
        "replicas": [{"mean_batch": b, "request_share": 1 / n} for b in batches],
        "cpu_ms_per_request": {
            "gateways": 0.1 * n,
            "haproxy": 0.04,
            "postgres": 0.02,
            "total": 0.1 * n + 0.06,
        },
        **extra,
    }


def test_the_summary_takes_the_median_of_the_rounds_and_compares_with_one_replica(fleet: Any) -> None:
    runs = [
        run("direct", 0, 3300, 18.0, [14.0]),
        run("1", 0, 3000, 20.0, [12.0]),
        run("2", 0, 3600, 24.0, [8.0, 8.0]),
        run("2", 1, 3000, 30.0, [7.0, 7.0], disturbed=True),
        run("2", 1, 1.0, 99.0, [1.0, 1.0], final=False),  # an attempt that was not kept
        run("1", 1, 3200, 22.0, [13.0]),
        run("direct", 1, 3500, 16.0, [15.0], errors=["perf_analyzer exited with status 99"]),
    ]
    rows = fleet.summarize(runs)
    assert [r["config"] for r in rows] == ["direct", "1", "2"]
    direct, one, two = rows
    assert one["throughput"] == 3100 and one["throughput_vs_1"] == 1.0
    assert two["throughput"] == 3300 and two["p99_ms"] == 27.0 and two["rounds"] == 2
    assert two["throughput_vs_1"] == pytest.approx(3300 / 3100)
    assert two["mean_batch_per_replica"] == [7.5, 7.5]
    assert two["disturbed"] == 1
    assert direct["errors"] == ["perf_analyzer exited with status 99"]
    table = fleet.markdown_table(rows)
    lines = table.splitlines()
    assert len(lines) == 2 + 3
    assert lines[2].startswith("| direct (no HAProxy) | 2 | 3,400 | 1.10x |") and lines[2].endswith(
        "| errors |"
    )
    assert "| 2 via HAProxy | 2 | 3,300 | 1.06x | 13.50 | 27.00 | 7.5 / 7.5 | 50% / 50% |" in lines[4]
    assert lines[4].endswith("| disturbed x1 |")
