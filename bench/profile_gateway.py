"""Where our gateway's CPU goes under perf_analyzer: a py-spy profile of every process the gateway runs.

Starts our gateway as ``compare_triton.py`` does (``linear``, ledger and metering on, SQLite in a work
folder), drives it with perf_analyzer (``-i http`` or ``-i grpc``, one row a request, closed loop at
``--concurrency``) and, while it runs, samples the gateway's processes with py-spy (``--rate`` samples a
second, idle threads left out, native frames off). Writes the collapsed stacks (flame-graph input) and a
JSON summary: samples per process and thread, the functions with the most samples of their own (self), and
the share of samples under each top-level area (grpc, asyncio, our modules, Django...), so a claim about where
a request's CPU goes can be checked.

py-spy is not a dependency of the project: give its binary with ``--py-spy`` or have it on PATH
(``pip install --target /tmp/pyspy py_spy`` puts one in ``/tmp/pyspy/bin``).

Usage:
  .venv/bin/python bench/profile_gateway.py --protocol grpc --concurrency 8 --seconds 20 --py-spy /tmp/pyspy/bin/py-spy
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from common import (
    RESULTS_DIR,
    Server,
    SetupError,
    create_bench_key,
    free_port_block,
    gateway_env,
    group_cpu_seconds,
    http,
    log,
    machine_busy_ticks,
    machine_info,
    pids_in_group,
    run_main,
    serve_argv,
    utc_stamp,
    wait_ready,
    write_json,
)
from compare_triton import build_our_repository, ensure_triton, wait_grpc_ready, write_validation_data

# The area a frame's file belongs to, first match wins (paths as py-spy prints them).
# Self samples in ``Handle._run`` are C code an event-loop callback called directly (grpc.aio's cygrpc,
# transports' socket calls): py-spy sees no Python frame under it.
AREAS = (
    ("grpc (grpc.aio, cygrpc)", re.compile(r"grpc/|cygrpc|_cython")),
    ("C code under event-loop callbacks", re.compile(r"^Handle\._run \(asyncio/events\.py")),
    ("our HTTP protocol", re.compile(r"inference/http_protocol")),
    ("our gRPC front end", re.compile(r"inference/grpc_")),
    ("our inference core", re.compile(r"inference/")),
    ("ledger", re.compile(r"ledger/")),
    ("asyncio", re.compile(r"asyncio/|uvloop")),
    ("Django", re.compile(r"django/")),
    ("httptools", re.compile(r"httptools")),
    ("numpy", re.compile(r"numpy/")),
)


def area_of(frame: str) -> str:
    for name, pattern in AREAS:
        if pattern.search(frame):
            return name
    return "other"


def summarize(collapsed: Path, top: int = 30) -> dict[str, Any]:
    """Per process and thread sample counts, the hottest self frames, and self samples per area."""
    per_thread: collections.Counter[str] = collections.Counter()
    self_frames: collections.Counter[str] = collections.Counter()
    areas: collections.Counter[str] = collections.Counter()
    inclusive: collections.Counter[str] = collections.Counter()
    total = 0
    for line in collapsed.read_text().splitlines():
        stack, _, count_text = line.rpartition(" ")
        if not stack or not count_text.isdigit():
            continue
        count = int(count_text)
        frames = stack.split(";")
        # With --subprocesses and --threads the stack starts with the process, then the thread.
        heads = [f for f in frames[:2] if f.startswith(("process ", "thread "))]
        code = frames[len(heads) :]
        per_thread[" / ".join(heads) or "?"] += count
        total += count
        if code:
            self_frames[code[-1]] += count
            areas[area_of(code[-1])] += count
            for frame in set(code):
                inclusive[frame] += count
    share = lambda n: round(100.0 * n / total, 1) if total else 0.0  # noqa: E731
    return {
        "samples": total,
        "per_thread": [{"thread": t, "samples": n, "percent": share(n)} for t, n in per_thread.most_common()],
        "self_by_area_percent": {a: share(n) for a, n in areas.most_common()},
        "top_self": [{"frame": f, "percent": share(n)} for f, n in self_frames.most_common(top)],
        "top_inclusive": [{"frame": f, "percent": share(n)} for f, n in inclusive.most_common(top)],
    }


def successes(port: int, key: str) -> int:
    """Requests ``linear`` answered so far, from the gateway's own statistics (Triton's stats extension)."""
    status, body = http(
        "GET", f"http://127.0.0.1:{port}/v2/models/linear/stats", headers={"Authorization": f"Bearer {key}"}
    )
    if status != 200:
        raise SetupError(f"/v2/models/linear/stats answered {status}: {body[:300]!r}")
    return int(json.loads(body)["model_stats"][0]["inference_stats"]["success"]["count"])


def run(args: argparse.Namespace) -> int:
    py_spy = args.py_spy or shutil.which("py-spy")
    if not py_spy or not Path(py_spy).exists():
        raise SetupError("py-spy not found: give --py-spy PATH (pip install --target /tmp/pyspy py_spy)")
    stamp = utc_stamp()
    triton_dir = args.triton_dir.resolve()
    work = Path(tempfile.mkdtemp(prefix="profile_gateway-"))
    log(f"work folder {work}")
    ensure_triton(triton_dir)  # for perf_analyzer
    models = work / "models"
    models.mkdir()
    build_our_repository(models, ["linear"])
    env = gateway_env(work / "var", models)
    key = create_bench_key(env)
    input_data = work / "validation_data.json"
    write_validation_data(input_data)
    port = free_port_block(1)
    grpc_port = free_port_block(1)
    env["CARBONLEDGER_GRPC_PORT"] = str(grpc_port)
    ours = Server("ours", port, serve_argv(port), env, work / "ours.log")
    ours.start()
    try:
        wait_ready(ours, {"Authorization": f"Bearer {key}"}, ["linear"])
        if args.protocol == "grpc":
            wait_grpc_ready("ours", grpc_port)
        header = "authorization" if args.protocol == "grpc" else "Authorization"
        pa_argv = [
            str(triton_dir / "perf_analyzer"),
            "-m", "linear",
            "-u", f"127.0.0.1:{grpc_port if args.protocol == 'grpc' else port}",
            "-i", args.protocol,
            "-b", "1",
            "--concurrency-range", f"{args.concurrency}:{args.concurrency}",
            # Windows of 5 s until the profile is over: perf_analyzer only keeps the load on, the rate is
            # the gateway's own count over the profiled seconds.
            "--measurement-interval", "5000",
            "--stability-percentage", "0.01",
            "--max-trials", str(int((args.seconds + args.warmup_s) / 5) + 3),
            "--input-data", str(input_data),
            "-H", f"{header}: Bearer {key}",
        ]  # fmt: skip
        pa_env = dict(os.environ, LD_LIBRARY_PATH=str(triton_dir / "pa_libs"))
        pa = subprocess.Popen(pa_argv, env=pa_env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
        time.sleep(args.warmup_s)
        collapsed = work / "stacks.txt"
        busy0, total0 = machine_busy_ticks()
        srv0 = group_cpu_seconds(ours.pgid)
        done0 = successes(port, key)
        t0 = time.monotonic()
        spy = subprocess.run(
            [py_spy, "record", "--pid", str(ours.pgid), "--subprocesses", "--threads", "--nonblocking", "--gil",
             "--rate", str(args.rate), "--duration", str(args.seconds), "--format", "raw",
             "--output", str(collapsed)],
            capture_output=True, text=True, timeout=args.seconds + 60,
        )  # fmt: skip
        wall = time.monotonic() - t0
        server_cores = (group_cpu_seconds(ours.pgid) - srv0) / wall
        rate = (successes(port, key) - done0) / wall
        busy1, total1 = machine_busy_ticks()
        pa.kill()
        pa.communicate(timeout=30)
        if spy.returncode != 0 or not collapsed.exists():
            raise SetupError(f"py-spy failed (status {spy.returncode}): {spy.stderr[-2000:]}")
        processes = {pid: Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()[:200]
                     for pid in pids_in_group(ours.pgid) if Path(f"/proc/{pid}/cmdline").exists()}  # fmt: skip
    finally:
        ours.stop()
    doc: dict[str, Any] = {
        "meta": {"started_utc": stamp, **machine_info(), "processes": processes},
        "settings": {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()},
        "throughput_infer_per_s": round(rate, 1),
        "server_cpu_cores": round(server_cores, 3),
        "server_cpu_us_per_request": round(1e6 * server_cores / rate, 1) if rate else None,
        "machine_busy_cores": round((os.cpu_count() or 1) * (busy1 - busy0) / max(1, total1 - total0), 3),
        "profiled_s": round(wall, 1),
        "profile": summarize(collapsed),
    }
    name = f"profile_gateway-{args.protocol}-c{args.concurrency}-{stamp}"
    out = write_json([args.results_dir / f"{name}.json"], doc)
    shutil.copy(collapsed, args.results_dir / f"{name}.stacks.txt")
    log(f"wrote {out} (throughput {rate}/s, {doc['server_cpu_us_per_request']} us of server CPU a request)")
    for area, pct in doc["profile"]["self_by_area_percent"].items():
        log(f"  {pct:5.1f} %  {area}")
    shutil.rmtree(work, ignore_errors=True)
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--protocol", choices=("http", "grpc"), default="http")
    parser.add_argument("--concurrency", type=int, default=32)
    parser.add_argument("--seconds", type=int, default=20, help="profiled seconds (default 20)")
    parser.add_argument("--warmup-s", type=float, default=5.0)
    parser.add_argument("--rate", type=int, default=100, help="py-spy samples a second (default 100)")
    parser.add_argument("--py-spy", default=None, help="py-spy binary (default: on PATH)")
    parser.add_argument("--triton-dir", type=Path, default=Path("var/triton"))
    parser.add_argument("--results-dir", type=Path, default=RESULTS_DIR)
    args = parser.parse_args(argv)
    return run_main("profile_gateway", run, args)


if __name__ == "__main__":
    sys.exit(main())
