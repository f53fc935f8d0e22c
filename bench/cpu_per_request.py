"""CPU our gateway spends a request, per thread: under perf_analyzer at concurrency 32 and at 100 requests/s.

A diagnostic, not a target: it answers "where does a request's CPU go" for the throughput comparison
(compare_triton.py) and for the energy knob, whose modelled energy is this CPU (efficiency.py). One
gateway (`manage.py serve`, ledger on, as served) with its own throw-away SQLite database; `linear` only.

1. perf_analyzer, concurrency 32, binary tensors (compare_triton.py's input data), 3 windows of 4 s.
2. Open-loop Poisson arrivals at 100 requests/s for 15 s from aiohttp in this process, JSON bodies.

For each phase the requests are counted from the gateway's own statistics (inference_count), and the
CPU from /proc: the serving process as a whole, its main thread (the event loop) and every other
thread that used more than 10 ms (non-Python threads show up too, such as an OpenBLAS worker spinning
between calls). The ledger drainer (`drain_ledger`, its own process and session) is not included.

    .venv/bin/python bench/cpu_per_request.py               # about 45 s
    .venv/bin/python bench/cpu_per_request.py --label before-change
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import subprocess
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
import compare_triton as ct  # same folder: Triton's perf_analyzer and its input data
from common import (
    CLK_TCK,
    REPO,
    RESULTS_DIR,
    Server,
    create_bench_key,
    free_port_block,
    gateway_env,
    group_cpu_seconds,
    http,
    log,
    machine_info,
    serve_argv,
    utc_stamp,
    wait_ready,
    write_json,
)


def thread_cpu_s(pid: int) -> dict[int, tuple[float, float]]:
    """(user + system, system) CPU seconds of each thread of ``pid``."""
    out: dict[int, tuple[float, float]] = {}
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            raw = Path(f"/proc/{pid}/task/{tid}/stat").read_text()
        except OSError:
            continue
        fields = raw[raw.rindex(")") + 2 :].split()
        user, system = int(fields[11]), int(fields[12])
        out[int(tid)] = ((user + system) / CLK_TCK, system / CLK_TCK)
    return out


def served(port: int, headers: dict[str, str]) -> tuple[int, int]:
    status, body = http("GET", f"http://127.0.0.1:{port}/v2/models/linear/stats", headers=headers)
    if status != 200:
        raise RuntimeError(f"statistics answered {status}: {body[:200]!r}")
    stats = json.loads(body)["model_stats"][0]
    return int(stats["inference_count"]), int(stats["execution_count"])


async def poisson(port: int, key: str, rate: float, seconds: float) -> int:
    import aiohttp

    body = json.dumps({"inputs": [{"name": "x", "shape": [1, 256], "datatype": "FP32", "data": [0.5] * 256}]})
    headers = {"Authorization": f"Bearer {key}", "Content-Type": "application/json"}
    failures = 0

    async def one(session: aiohttp.ClientSession) -> None:
        nonlocal failures
        async with session.post(
            f"http://127.0.0.1:{port}/v2/models/linear/infer", data=body, headers=headers
        ) as r:
            await r.read()
            failures += r.status != 200

    async with aiohttp.ClientSession() as session:
        rng = random.Random(1)
        tasks = []
        t = time.monotonic()
        end = t + seconds
        while t < end:
            t += rng.expovariate(rate)
            delay = t - time.monotonic()
            if delay > 0:
                await asyncio.sleep(delay)
            tasks.append(asyncio.create_task(one(session)))
        await asyncio.gather(*tasks)
    return failures


def measure(phase: str, server: Server, port: int, key: str, data: Path, triton_dir: Path) -> dict[str, Any]:
    headers = {"Authorization": f"Bearer {key}"}
    pid = server.pgid
    n0, e0 = served(port, headers)
    proc0, threads0 = group_cpu_seconds(pid), thread_cpu_s(pid)
    t0 = time.monotonic()
    failures = 0
    if phase == "c32":
        done = subprocess.run(
            [
                str(triton_dir / "perf_analyzer"), "-m", "linear", "-u", f"127.0.0.1:{port}", "-i", "http",
                "-b", "1", "--concurrency-range", "32:32", "--measurement-interval", "4000",
                "--max-trials", "3", "--stability-percentage", "50", "--input-data", str(data),
                "-H", f"Authorization: Bearer {key}",
            ],
            env=dict(os.environ, LD_LIBRARY_PATH=str(triton_dir / "pa_libs")),
            capture_output=True,
            text=True,
            check=False,
        )  # fmt: skip
        if done.returncode != 0:
            raise RuntimeError(f"perf_analyzer failed ({done.returncode}):\n{done.stdout[-2000:]}")
    else:
        failures = asyncio.run(poisson(port, key, 100.0, 15.0))
    time.sleep(0.5)  # the last answers' bookkeeping
    wall = time.monotonic() - t0
    n1, e1 = served(port, headers)
    proc1, threads1 = group_cpu_seconds(pid), thread_cpu_s(pid)
    n = n1 - n0
    if n <= 0:
        raise RuntimeError(f"{phase}: the gateway counted no requests")

    def per_request_us(seconds: float) -> float:
        return round(seconds / n * 1e6, 1)

    threads = {}
    for tid, (total, system) in threads1.items():
        total0, system0 = threads0.get(tid, (0.0, 0.0))
        if total - total0 > 0.01:
            name = "event loop (main thread)" if tid == pid else f"thread {tid}"
            threads[name] = {
                "us": per_request_us(total - total0),
                "system_us": per_request_us(system - system0),
            }
    return {
        "requests": n,
        "failed": failures,
        "rate_per_s": round(n / wall, 1),
        "rows_per_batch": round(n / max(1, e1 - e0), 2),
        "process_us_per_request": per_request_us(proc1 - proc0),
        "threads": threads,
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--label", default="", help="a word to tell runs apart in the JSON")
    p.add_argument("--triton-dir", type=Path, default=REPO / "var" / "triton")
    p.add_argument("--results-dir", type=Path, default=RESULTS_DIR)
    args = p.parse_args(argv)
    triton_dir = args.triton_dir.resolve()
    ct.ensure_triton(triton_dir)  # for perf_analyzer
    work = Path(tempfile.mkdtemp(prefix="cpu_per_request-"))
    models = work / "models"
    models.mkdir()
    ct.build_our_repository(models, ["linear"])
    env = gateway_env(work / "var", models)
    key = create_bench_key(env)
    port = free_port_block(1)
    server = Server("ours", port, serve_argv(port), env, work / "ours.log")
    data = work / "input.json"
    ct.write_validation_data(data)
    result: dict[str, Any] = {
        "label": args.label,
        "started_utc": datetime.now(UTC).isoformat(),
        **machine_info(),
    }
    try:
        server.start()
        wait_ready(server, {"Authorization": f"Bearer {key}"}, ["linear"])
        time.sleep(5)  # start-up work (migrations' aftermath, the first meter intervals) settles
        for phase in ("c32", "poisson_100"):
            result[phase] = measure(phase, server, port, key, data, triton_dir)
            log(f"{phase}: {json.dumps(result[phase])}")
    finally:
        server.stop()
    stamp = utc_stamp()
    out = write_json(
        args.results_dir / f"cpu_per_request-{stamp}{'-' + args.label if args.label else ''}.json", result
    )
    log(f"raw results: {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
