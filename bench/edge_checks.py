"""What the gateway's checks at the edge cost: this checkout's gateway against the same gateway at a base
commit (before the checks), side by side in one run.

Both serve the demo `linear` model (python backend, 2 ms a batch) with metering and the ledger on, as
`make run` serves it; the base commit runs from a temporary git worktree with this checkout's Python. Triton's
perf_analyzer drives each in turn at the same concurrency, in ABBA order, so that drift of the machine hits
both alike. The verdict is the median over the rounds of each round's throughput ratio (this checkout / base):
the issue's target is at least 0.97 at concurrency 32 (the checks cost at most 3 %).

Usage: .venv/bin/python bench/edge_checks.py --base REV [--concurrency 32] [--rounds 3]
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import (
    REPO,
    RESULTS_DIR,
    cleanup,
    git,
    group_cpu_seconds,
    machine_info,
    utc_stamp,
    write_json,
)
from compare_triton import ensure_triton
from cpu_per_request import served
from ledger_overhead import run_pa, start_gateway

TARGET_RATIO = 0.97


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--base", required=True, help="the commit to compare with (before the edge checks)")
    ap.add_argument("--concurrency", type=int, default=32)
    ap.add_argument("--rounds", type=int, default=3, help="ABBA rounds (each runs both gateways twice)")
    ap.add_argument("--measurement-interval", type=int, default=5000)
    ap.add_argument("--retries", type=int, default=2)
    ap.add_argument("--triton-dir", default=str(REPO / "var" / "triton"))
    args = ap.parse_args()
    triton_dir = Path(args.triton_dir)
    ensure_triton(triton_dir)
    base_rev = git("rev-parse", "--short", args.base)
    work = Path(tempfile.mkdtemp(prefix="edge-checks-"))
    worktree = work / "base-checkout"
    subprocess.run(["git", "worktree", "add", "--detach", str(worktree), args.base], cwd=REPO, check=True)
    try:
        base, base_key = start_gateway("base", work, ledger=True, root=worktree)
        head, head_key = start_gateway("head", work, ledger=True)
        keys = {"base": base_key, "head": head_key}
        runs = []
        for r in range(args.rounds):
            order = [base, head, head, base] if r % 2 == 0 else [head, base, base, head]
            for i, server in enumerate(order):
                # The serving process group's CPU per answered request beside the throughput: a steadier
                # figure than throughput on a shared host (it does not move with what else gets the cores).
                auth = {"Authorization": f"Bearer {keys[server.name]}"}
                count0, _ = served(server.port, auth)
                cpu0 = group_cpu_seconds(server.pgid)
                res = run_pa(
                    triton_dir,
                    server,
                    keys[server.name],
                    args.concurrency,
                    args.measurement_interval,
                    work,
                    f"{server.name}-r{r}-{i}",
                    args.retries,
                )
                cpu1 = group_cpu_seconds(server.pgid)
                count1, _ = served(server.port, auth)
                res["round"] = r
                res["cpu_us_per_request"] = round((cpu1 - cpu0) * 1e6 / max(1, count1 - count0), 1)
                runs.append(res)
                print(
                    f"round {r} {server.name}: {res['throughput']:.0f}/s p99 {res['p99_ms']:.2f} ms "
                    f"cpu {res['cpu_us_per_request']:.1f} µs/request",
                    flush=True,
                )
        head.stop()
        base.stop()
        ratios = []
        for r in range(args.rounds):
            mean = {
                n: statistics.mean(x["throughput"] for x in runs if x["server"] == n and x["round"] == r)
                for n in ("base", "head")
            }
            ratios.append(round(mean["head"] / mean["base"], 4))
        verdict = statistics.median(ratios)
        result = {
            "benchmark": "edge_checks",
            "date_utc": utc_stamp(),
            "base": base_rev,
            "meta": machine_info(),
            "concurrency": args.concurrency,
            "ratio_per_round": ratios,
            "ratio_median": verdict,
            "target_ratio": TARGET_RATIO,
            "meets_target": verdict >= TARGET_RATIO,
            "p99_ms": {
                n: round(statistics.median(x["p99_ms"] for x in runs if x["server"] == n), 2)
                for n in ("base", "head")
            },
            "cpu_us_per_request": {
                n: statistics.median(x["cpu_us_per_request"] for x in runs if x["server"] == n)
                for n in ("base", "head")
            },
            "runs": runs,
        }
        print(json.dumps({k: v for k, v in result.items() if k not in ("runs", "meta")}, indent=2))
        write_json(RESULTS_DIR / f"edge_checks-{result['date_utc']}.json", result)
        return 0
    finally:
        cleanup()
        subprocess.run(["git", "worktree", "remove", "--force", str(worktree)], cwd=REPO, check=False)
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
