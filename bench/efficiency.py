"""The energy-efficiency knob (issue 7): joules per inference from the ledger against latency, in one run.

Usage (from the repository root)::

    .venv/bin/python bench/efficiency.py            # full run: about 9 minutes
    .venv/bin/python bench/efficiency.py --quick    # smoke run, about 2 minutes; not a measurement
    .venv/bin/python bench/efficiency.py --models linear --rates linear=20,100 --seconds 30

What it does:

1. builds three model repositories from ``inference/demo_repository`` in a temporary folder, one per value
   of ``energy_efficiency`` (0, 0.5, 1 by default; ``--knobs``). In each, ``linear`` and ``digits`` get
   ``parameters`` ``energy_efficiency`` = k and ``latency_slo_ms`` (50 ms for linear, 25 ms for digits;
   ``--slo-ms``); everything else (``dynamic_batching``, ``digits_int8`` and its ``variant_of: digits``) is
   the demo's, unchanged. Knob 0 is the Triton-equivalent setting: the demo's ``dynamic_batching`` as is;
2. prepares one throw-away SQLite database, organization and API key per repository (``manage.py``) and
   starts three gateways (``manage.py serve``) on free loopback ports, with ``CARBON_AWARE=false`` (the grid
   state must not move the knob: that is measured separately) and ``METER_INTERVAL_S=0.6`` (intervals
   close quickly, yet are long enough for the recorder to learn idle power), the default meter otherwise
   (``cpu-model`` on a host without NVML or RAPL: modelled energy, process CPU time x TDP/cores plus a
   memory term). One gateway per knob keeps the model names
   identical (the ledger of each gateway holds one knob only) and the ``digits`` variants linked as shipped;
3. for each model and rate (low, medium, high) and each knob (the knob order rotates from one rate to the
   next, so slow drift of the shared machine does not always hit the same knob), sends open-loop Poisson
   traffic: exponential inter-arrival times at the rate, independent of the answers, over HTTP/JSON with
   aiohttp to ``/v2/models/<model>/infer``, one row per request, for ``--warmup`` seconds (not counted: the
   planner learns) and then ``--seconds`` seconds (measured). ``linear`` gets seeded random rows, checked
   against numpy's ``x @ W + b``; ``digits`` gets the held-out images of scikit-learn's bundled digits (the
   split of ``inference/demo_repository/build_digits.py``), and the returned ``label`` is scored;
4. after each cell, waits until the gateway's ledger (its SQLite file, read only) holds final energy for
   every measured request (its shares in ``ledger_batch_energy``), then takes joules per
   inference = the sum of those requests' energy / their number, the batches that served them
   (``ledger_batch``: rows per batch, variant), and the device's intervals over the same span
   (``ledger_interval``: mean power, idle share). During the cell it samples the planner's ``/metrics``
   lines (``carbonledger_batch_target_rows``, ``_target_wait_seconds``, ``_expected_rows``,
   ``carbonledger_latency_safety``, ``carbonledger_arrival_rows_per_second``,
   ``carbonledger_latency_p99_seconds``, ``carbonledger_latency_late_share``) every second;
5. writes ``bench/results/efficiency-<UTC>.json`` (``-quick`` for ``--quick``), prints a markdown table and
   the issue's verdict: at low load, knob 1 (and 0.5) at least 30 % fewer joules per inference than knob 0
   with the client-side p99 inside the objective; at high load, no loss (joules per inference not above knob
   0's by more than the noise, p99 inside the objective). With ``--rounds N`` every (model, rate) runs its
   knobs N times, the order reversing each round, and the verdict compares the means of the N cells (their
   standard error from the spread between cells, the worst cell's p99): on a shared machine one cell's
   figure moves from one cell to the next by more than its own standard error shows, so one cell a knob
   is not a verdict.
   With ``--concurrent`` the knobs of a round are loaded at the same time below the high rate, each with its
   own Poisson stream (paired cells: the host's drift hits every knob of a round alike, and the verdict adds
   each round's paired saving); the high rate stays one knob at a time.

CPU contention: each cell records the CPU of every gateway's process tree (its ledger drainer included), of
this client process and of everything else on the machine (``other_cpu_cores``); a cell where others used
more than ``--disturbed-cores`` is marked disturbed. Before each cell the script waits up to ``--quiet-wait``
seconds for the machine to be quiet.

Exit status: 0 when the run completed (whatever the verdict), 1 when a cell failed (a gateway died, no
answers, or the ledger never held the cell's requests), 2 when set-up failed.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import gc
import json
import math
import os
import random
import re
import shutil
import sqlite3
import statistics
import sys
import tempfile
import threading
import time
import urllib.request
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import (
    CLK_TCK,
    REPO,
    RESULTS_DIR,
    Server,
    SetupError,
    create_bench_key,
    free_port_block,
    gateway_env,
    log,
    machine_busy_ticks,
    machine_info,
    proc_stat,
    run_main,
    serve_argv,
    tail,
    utc_stamp,
    wait_ready,
    write_json,
)

DEMO = REPO / "inference" / "demo_repository"
MODELS = ("linear", "digits")
DEFAULT_RATES = {"linear": (100.0, 400.0, 1200.0), "digits": (200.0, 600.0, 1500.0)}
DEFAULT_SLO_MS = {"linear": 50.0, "digits": 25.0}
DEFAULT_KNOBS = (0.0, 0.5, 1.0)
LEVELS = ("low", "medium", "high")
TARGET_SAVING = 0.30  # the issue: at least 30 % fewer joules per inference at low load
PLANNER_METRICS = (
    "carbonledger_energy_efficiency",
    "carbonledger_latency_slo_seconds",
    "carbonledger_batch_target_rows",
    "carbonledger_batch_target_wait_seconds",
    "carbonledger_batch_expected_rows",
    "carbonledger_latency_safety",
    "carbonledger_arrival_rows_per_second",
    "carbonledger_latency_p99_seconds",
    "carbonledger_latency_late_share",
)
LINEAR_TOLERANCE = 1e-3


# -- workload ---------------------------------------------------------------------------------------------


def linear_weights() -> tuple[np.ndarray, np.ndarray]:
    """W and b of the demo ``linear`` (inference/demo_repository/linear/1/model.py), recomputed here."""
    rng = np.random.default_rng(0)
    w = rng.standard_normal((256, 256), dtype=np.float32) / 16.0
    b = rng.standard_normal((256,), dtype=np.float32)
    return w, b


def digits_held_out() -> tuple[np.ndarray, np.ndarray]:
    """The held-out 25 % of scikit-learn's bundled digits, split as build_digits.py splits it
    (stratified, ``random_state=42``): the images ``digits`` was scored on in its accuracy.json."""
    from sklearn.datasets import load_digits
    from sklearn.model_selection import train_test_split

    x, y = load_digits(return_X_y=True)
    _, x_test, _, y_test = train_test_split(
        x.astype(np.float32), y.astype(np.int64), test_size=0.25, stratify=y, random_state=42
    )
    return x_test, y_test


@dataclass
class Workload:
    """Pre-encoded request bodies and what each should answer."""

    model: str
    bodies: list[bytes]
    expected: Any  # linear: (n, 256) float32 outputs; digits: (n,) labels

    @classmethod
    def build(cls, model: str) -> Workload:
        if model == "linear":
            w, b = linear_weights()
            x = np.random.default_rng(7).standard_normal((97, 256), dtype=np.float32)
            expected = (x.astype(np.float64) @ w.astype(np.float64) + b).astype(np.float32)
            name, dims = "x", 256
        else:
            x, expected = digits_held_out()
            name, dims = "input", 64
        bodies = [
            json.dumps(
                {"inputs": [{"name": name, "shape": [1, dims], "datatype": "FP32", "data": row.tolist()}]}
            ).encode()
            for row in x
        ]
        return cls(model, bodies, expected)

    def check(self, index: int, doc: dict[str, Any]) -> tuple[bool, float | None]:
        """(correct, error): linear: max |y - reference| within 1e-3; digits: the label is the truth."""
        i = index % len(self.bodies)
        outputs = {o["name"]: o for o in doc.get("outputs", [])}
        if self.model == "linear":
            y = np.asarray(outputs["y"]["data"], np.float32)
            err = float(np.max(np.abs(y - self.expected[i])))
            return err <= LINEAR_TOLERANCE, err
        label = int(np.asarray(outputs["label"]["data"]).reshape(-1)[0])
        return label == int(self.expected[i]), None


# -- processes and CPU ------------------------------------------------------------------------------------


def _all_stats() -> dict[int, list[str]]:
    stats = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            fields = proc_stat(int(entry))
            if fields is not None:
                stats[int(entry)] = fields
    return stats


def tree_cpu_seconds(roots: list[int]) -> dict[int, float]:
    """CPU seconds (user + system, plus reaped children) of each root's process tree: the gateway, its
    ledger drainer (a session of its own, but the gateway's child) and anything else it started."""
    stats = _all_stats()
    children: dict[int, list[int]] = {}
    for pid, fields in stats.items():
        children.setdefault(int(fields[1]), []).append(pid)
    out = {}
    for root in roots:
        total, todo, seen = 0, [root], set()
        while todo:
            pid = todo.pop()
            if pid in seen or pid not in stats:
                continue
            seen.add(pid)
            total += sum(int(stats[pid][i]) for i in (11, 12, 13, 14))
            todo.extend(children.get(pid, []))
        out[root] = total / CLK_TCK
    return out


def own_cpu_seconds() -> float:
    t = os.times()
    return t.user + t.system


class CpuWatch:
    """CPU used over a span by the gateways, this client and everyone else on the machine."""

    def __init__(self, gateways: list[Gateway]) -> None:
        self.gateways = gateways

    def __enter__(self) -> CpuWatch:
        self.t0 = time.monotonic()
        self.busy0 = machine_busy_ticks()
        self.own0 = own_cpu_seconds()
        self.srv0 = tree_cpu_seconds([g.server.pgid for g in self.gateways])
        return self

    def __exit__(self, *exc: Any) -> None:
        wall = max(1e-6, time.monotonic() - self.t0)
        busy1, total1 = machine_busy_ticks()
        srv1 = tree_cpu_seconds([g.server.pgid for g in self.gateways])
        cores = os.cpu_count() or 1
        self.machine_busy_cores = cores * (busy1 - self.busy0[0]) / max(1, total1 - self.busy0[1])
        self.client_cores = (own_cpu_seconds() - self.own0) / wall
        self.server_cores = {
            g.label: max(0.0, srv1.get(g.server.pgid, 0.0) - self.srv0.get(g.server.pgid, 0.0)) / wall
            for g in self.gateways
        }
        self.other_cores = self.machine_busy_cores - self.client_cores - sum(self.server_cores.values())

    def as_dict(self) -> dict[str, Any]:
        return {
            "machine_busy_cores": round(self.machine_busy_cores, 3),
            "client_cpu_cores": round(self.client_cores, 3),
            "server_cpu_cores": {k: round(v, 3) for k, v in self.server_cores.items()},
            "other_cpu_cores": round(self.other_cores, 3),
        }


def wait_quiet(limit_s: float, disturbed: float, gateways: list[Gateway]) -> dict[str, Any]:
    """Wait (up to ``limit_s``) until processes other than ours use under ``disturbed`` cores."""
    t0 = time.monotonic()
    while True:
        with CpuWatch(gateways) as w:
            time.sleep(0.5)
        waited = time.monotonic() - t0
        others = w.machine_busy_cores - w.client_cores - sum(w.server_cores.values())
        if others <= disturbed or waited >= limit_s:
            return {"other_cpu_cores_before": round(others, 3), "waited_for_quiet_s": round(waited, 1)}


# -- gateways ---------------------------------------------------------------------------------------------


def knob_label(k: float) -> str:
    return f"k{k:g}".replace(".", "")


def build_repository(
    root: Path, knob: float, slo_ms: dict[str, float], adaptive: str, source: Path = DEMO
) -> dict[str, str]:
    """The ``source`` repository (the demo's by default) with the knob and the objective in ``linear``'s and
    ``digits``' parameters."""
    shutil.copytree(
        source, root, ignore=shutil.ignore_patterns("build_digits.py", "README.md", "__pycache__", "*.pyc")
    )
    configs = {}
    for model in MODELS:
        path = root / model / "config.pbtxt"
        if not path.exists():
            raise SetupError(f"{source / model / 'config.pbtxt'} is missing")
        text = path.read_text()
        if re.search(r'key:\s*"(energy_efficiency|latency_slo_ms)"', text):
            raise SetupError(f"{path} already sets the knob; this benchmark sets it itself")
        extra = {"energy_efficiency": f"{knob:g}", "latency_slo_ms": f"{slo_ms[model]:g}"}
        if adaptive != "default":
            extra["adaptive_delay"] = "true" if adaptive == "on" else "false"
        text = (
            text.rstrip("\n")
            + "\n"
            + "".join(
                f'parameters {{ key: "{k}" value {{ string_value: "{v}" }} }}\n' for k, v in extra.items()
            )
        )
        path.write_text(text)
        configs[model] = text
    return configs


@dataclass
class Gateway:
    knob: float
    label: str
    var: Path
    server: Server
    key: str = ""
    configs: dict[str, str] = field(default_factory=dict)

    @property
    def base(self) -> str:
        return f"http://127.0.0.1:{self.server.port}"

    @property
    def db_path(self) -> Path:
        return self.var / "carbonledger.sqlite3"


def prepare_gateway(work: Path, knob: float, args: argparse.Namespace) -> Gateway:
    label = knob_label(knob)
    var = work / label
    models = var / "models"
    var.mkdir(parents=True)
    configs = build_repository(models, knob, args.slo_map, args.adaptive_delay, args.repository)
    env = gateway_env(
        var,
        models,
        CARBON_AWARE="false",
        METER_INTERVAL_S=f"{args.meter_interval:g}",
        # As `make run` serves (scripts/run.sh): without it OpenBLAS starts a worker thread per core and, for
        # matrices as large as a batch of ~24 `linear` rows, hands it half of each product; the worker then
        # spins between calls, and its CPU would be charged to the requests as energy.
        OPENBLAS_NUM_THREADS=os.environ.get("OPENBLAS_NUM_THREADS", "1"),
    )
    env.update(args.env_map)
    key = create_bench_key(env)
    # The port is chosen when the gateways start (start_gateways), in one free block for all of them.
    server = Server(f"gateway-{label}", 0, serve_argv(0), env, var / "serve.log")
    return Gateway(knob, label, var, server, key, configs)


def http_get(url: str, timeout: float = 5.0) -> str:
    with urllib.request.urlopen(url, timeout=timeout) as resp:
        return str(resp.read().decode())


_METRIC_RE = re.compile(r"^(\w+)\{([^}]*)\}\s+(\S+)$")


def parse_metrics(text: str, model: str) -> dict[str, Any]:
    """The planner's gauges and the variant counters of ``model`` from a /metrics page."""
    out: dict[str, Any] = {}
    for line in text.splitlines():
        m = _METRIC_RE.match(line)
        if not m:
            continue
        name, labels, value = m.groups()
        if f'model="{model}"' not in labels:
            continue
        if name in PLANNER_METRICS:
            out[name.removeprefix("carbonledger_")] = float(value)
        elif name == "carbonledger_variant_batches_total":
            vm = re.search(r'variant="([^"]*)"', labels)
            out.setdefault("variant_batches_total", {})[vm.group(1) if vm else "?"] = float(value)
    return out


# -- one cell: open-loop Poisson load ---------------------------------------------------------------------


@dataclass
class Sample:
    index: int
    measured: bool
    scheduled_s: float  # since the cell's start
    sent_s: float
    latency_ms: float
    status: int
    ledger_id: str | None
    variant: str
    correct: bool | None
    error: str = ""
    max_abs_err: float | None = None


async def drive(
    gateway: Gateway,
    workload: Workload,
    rate: float,
    warmup_s: float,
    seconds: float,
    seed: int,
    timeout_s: float,
) -> tuple[list[Sample], list[dict[str, Any]], float]:
    """Poisson arrivals at ``rate`` for warmup + seconds; returns the samples, the /metrics samples taken
    during the measured part, and the wall-clock (time.time_ns) start of the measured part."""
    import aiohttp
    import orjson

    rng = random.Random(seed)
    url = f"{gateway.base}/v2/models/{workload.model}/infer"
    headers = {"Authorization": f"Bearer {gateway.key}", "Content-Type": "application/json"}
    samples: list[Sample] = []
    answers: dict[int, bytes] = {}  # request index -> raw 200 answer, parsed after the cell
    metrics: list[dict[str, Any]] = []
    loop = asyncio.get_running_loop()
    total = warmup_s + seconds
    measured_wall_ns = 0
    conn = aiohttp.TCPConnector(limit=512, force_close=False)
    timeout = aiohttp.ClientTimeout(total=timeout_s)
    async with aiohttp.ClientSession(connector=conn, timeout=timeout) as session:
        # Open the connections the first seconds will need, outside the measurement.
        async def ping() -> None:
            async with session.get(f"{gateway.base}/v2/health/ready") as resp:
                await resp.read()

        await asyncio.gather(*(ping() for _ in range(4)), return_exceptions=True)
        start = loop.time()

        async def one(i: int, sched: float) -> None:
            measured = sched >= warmup_s
            t0 = loop.time()
            body = workload.bodies[i % len(workload.bodies)]
            status, ledger_id, variant, correct, err, max_err = 0, None, "", None, "", None
            raw = b""
            try:
                async with session.post(url, data=body, headers=headers) as resp:
                    status = resp.status
                    raw = await resp.read()
                t1 = loop.time()
                if status != 200:
                    err = raw[:200].decode(errors="replace")
            except Exception as exc:  # a timeout, a reset connection: counted as an error
                t1 = loop.time()
                err = f"{type(exc).__name__}: {exc}"[:200]
            if status == 200:
                # Parsed and checked after the cell: done here, a burst of answers from one large batch would
                # hold the client's event loop for milliseconds, delaying the next sends and reads, and the
                # client's own stall would count as the server's latency.
                answers[i] = raw
            samples.append(
                Sample(
                    i,
                    measured,
                    sched,
                    t0 - start,
                    (t1 - t0) * 1000.0,
                    status,
                    ledger_id,
                    variant,
                    correct,
                    err,
                    max_err,
                )
            )

        async def watch_metrics() -> None:
            await asyncio.sleep(max(0.0, warmup_s + start - loop.time()))
            while loop.time() - start < total:
                with contextlib.suppress(Exception):
                    async with session.get(f"{gateway.base}/metrics") as resp:
                        text = await resp.text()
                    metrics.append(
                        {"t_s": round(loop.time() - start, 2), **parse_metrics(text, workload.model)}
                    )
                await asyncio.sleep(1.0)

        watcher = asyncio.create_task(watch_metrics())
        tasks = set()
        sched, i = 0.0, 0
        marked = False
        while True:
            sched += rng.expovariate(rate)
            if sched >= total:
                break
            delay = start + sched - loop.time()
            if delay > 0:
                await asyncio.sleep(delay)
            if not marked and sched >= warmup_s:
                measured_wall_ns = time.time_ns()
                marked = True
            task = asyncio.create_task(one(i, sched))
            tasks.add(task)
            task.add_done_callback(tasks.discard)
            i += 1
        if tasks:
            await asyncio.gather(*list(tasks))
        watcher.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await watcher
    for sample in samples:
        answer = answers.pop(sample.index, None)
        if answer is None:
            continue
        try:
            doc = orjson.loads(answer)
            params = doc.get("parameters") or {}
            sample.ledger_id = params.get("ledger_id")
            sample.variant = str(params.get("variant", ""))
            sample.correct, sample.max_abs_err = workload.check(sample.index, doc)
        except Exception as exc:  # an answer that is not what the protocol says is a wrong answer
            sample.correct, sample.error = False, f"bad answer: {type(exc).__name__}: {exc}"[:200]
    return samples, metrics, measured_wall_ns


async def probe_capacity(
    gateway: Gateway, workload: Workload, seconds: float, concurrency: int = 32
) -> dict[str, Any]:
    """Closed loop (``concurrency`` requests always in flight) for ``seconds``: what this gateway, with this
    client on the same cores, answers at most. Only to check that the chosen rates are below it."""
    import aiohttp

    url = f"{gateway.base}/v2/models/{workload.model}/infer"
    headers = {"Authorization": f"Bearer {gateway.key}", "Content-Type": "application/json"}
    loop = asyncio.get_running_loop()
    ok = errors = 0
    lat: list[float] = []
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=concurrency)) as session:
        start = loop.time()
        deadline = start + seconds

        async def worker(w: int) -> None:
            nonlocal ok, errors
            i = w
            while loop.time() < deadline:
                t0 = loop.time()
                try:
                    async with session.post(
                        url, data=workload.bodies[i % len(workload.bodies)], headers=headers
                    ) as r:
                        await r.read()
                        if r.status == 200:
                            ok += 1
                            lat.append((loop.time() - t0) * 1000.0)
                        else:
                            errors += 1
                except Exception:
                    errors += 1
                i += concurrency

        await asyncio.gather(*(worker(w) for w in range(concurrency)))
        wall = loop.time() - start
    return {
        "concurrency": concurrency,
        "seconds": round(wall, 2),
        "answered_per_s": ok / wall,
        "errors": errors,
        "p50_ms": pct(lat, 0.5),
        "p99_ms": pct(lat, 0.99),
    }


# -- the ledger -------------------------------------------------------------------------------------------


def _chunks(items: list[str], n: int = 500) -> list[list[str]]:
    return [items[i : i + n] for i in range(0, len(items), n)]


def read_ledger(db_path: Path, ledger_ids: list[str]) -> dict[str, tuple[str, str, int, bool]]:
    """request_id -> (batch_id, variant, energy µJ, final) for the ids the ledger holds so far: the request's
    shares in its batch's energy rows, and its per-request parts where older records hold them."""
    out: dict[str, tuple[str, str, int, bool]] = {}
    con = sqlite3.connect(f"file:{db_path}?mode=ro", uri=True, timeout=10)
    try:
        for chunk in _chunks(ledger_ids):
            marks = ",".join("?" * len(chunk))
            requests = con.execute(
                f"SELECT request_id, batch_id, variant FROM ledger_request WHERE request_id IN ({marks})",
                chunk,
            ).fetchall()
            energy: dict[str, list[int]] = {rid: [0, 0] for rid, _, _ in requests}
            for rid, uj, final in con.execute(
                f"SELECT request_id, energy_uj, final FROM ledger_request_energy WHERE request_id IN ({marks})",
                chunk,
            ):
                energy[rid][0] += int(uj)
                energy[rid][1] |= int(final)
            batch_ids = sorted({b for _, b, _ in requests})
            for batches in _chunks(batch_ids):
                bmarks = ",".join("?" * len(batches))
                for request_ids, shares_uj, final in con.execute(
                    f"SELECT request_ids, shares_uj, final FROM ledger_batch_energy WHERE batch_id IN ({bmarks})",
                    batches,
                ):
                    for rid, uj in zip(json.loads(request_ids), json.loads(shares_uj), strict=True):
                        if rid in energy:
                            energy[rid][0] += int(uj)
                            energy[rid][1] |= int(final)
            for rid, batch_id, variant in requests:
                uj, final = energy[rid]
                out[rid] = (batch_id, variant or "", uj, bool(final))
    finally:
        con.close()
    return out


def read_batches(db_path: Path, batch_ids: list[str]) -> list[tuple[str, int, int, str, int, int, str]]:
    con = sqlite3.connect(f"file:{db_path}?mode=ro", uri=True, timeout=10)
    try:
        rows = []
        for chunk in _chunks(batch_ids):
            marks = ",".join("?" * len(chunk))
            rows += con.execute(
                f"SELECT batch_id, rows, requests, variant, start_ns, end_ns, device_id FROM ledger_batch "
                f"WHERE batch_id IN ({marks})",
                chunk,
            ).fetchall()
        return rows
    finally:
        con.close()


def read_intervals(db_path: Path, t0_ns: int, t1_ns: int, devices: set[str]) -> dict[str, Any]:
    """The closed intervals, within [t0_ns, t1_ns], of ``devices`` (those the cell's batches ran on): energy,
    idle part, duration. A gateway with a GPU model meters the host's CPU too, as a second device; its
    intervals are not the cell's."""
    con = sqlite3.connect(f"file:{db_path}?mode=ro", uri=True, timeout=10)
    try:
        on = f"device_id IN ({','.join('?' * len(devices))})"
        ordered = sorted(devices)
        n, energy, idle, dur, busy = con.execute(
            f"""SELECT COUNT(*), COALESCE(SUM(energy_uj), 0), COALESCE(SUM(idle_uj), 0),
                      COALESCE(SUM(t1_ns - t0_ns), 0), COALESCE(SUM(busy_ns), 0)
               FROM ledger_interval WHERE t0_ns >= ? AND t1_ns <= ? AND {on}""",
            (t0_ns, t1_ns, *ordered),
        ).fetchone()
        method = con.execute(
            f"SELECT DISTINCT device_id || ' (' || method || ')' FROM ledger_interval WHERE {on}", ordered
        ).fetchall()
        idle_w = con.execute(
            f"SELECT MIN(idle_power_w), MAX(idle_power_w) FROM ledger_idle WHERE t0_ns >= ? AND t1_ns <= ? "
            f"AND {on}",
            (t0_ns, t1_ns, *ordered),
        ).fetchone()
    finally:
        con.close()
    return {
        "intervals": n,
        "energy_j": energy / 1e6,
        "idle_j": idle / 1e6,
        "seconds": dur / 1e9,
        "busy_s": busy / 1e9,
        "methods": sorted(m for (m,) in method),
        "idle_power_w_min_max": list(idle_w),
    }


def wait_for_ledger(
    db_path: Path, ledger_ids: list[str], timeout_s: float
) -> tuple[dict[str, tuple[str, str, int, bool]], float]:
    t0 = time.monotonic()
    found: dict[str, tuple[str, str, int, bool]] = {}
    todo = list(ledger_ids)
    while True:
        with contextlib.suppress(sqlite3.OperationalError):  # a writer holding the lock: try again
            for rid, row in read_ledger(db_path, todo).items():
                if row[3]:
                    found[rid] = row
            todo = [rid for rid in todo if rid not in found]
        if not todo or time.monotonic() - t0 > timeout_s:
            if todo:  # report what is there, final or not
                with contextlib.suppress(sqlite3.OperationalError):
                    found.update(read_ledger(db_path, todo))
            return found, time.monotonic() - t0
        time.sleep(0.3)


# -- summary ----------------------------------------------------------------------------------------------


def pct(values: list[float], q: float) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, math.ceil(q * len(ordered)) - 1))]


def summarize_cell(
    samples: list[Sample],
    ledger: dict[str, tuple[str, str, int, bool]],
    batches: list[tuple[str, int, int, str, int, int, str]],
    seconds: float,
    warmup_s: float,
    chunks: int = 5,
) -> dict[str, Any]:
    measured = [s for s in samples if s.measured]
    ok = [s for s in measured if s.status == 200]
    errors = [s for s in measured if s.status != 200]
    lat = [s.latency_ms for s in ok]
    lag = [max(0.0, (s.sent_s - s.scheduled_s) * 1000.0) for s in measured]
    with_energy = [(s, ledger[s.ledger_id]) for s in ok if s.ledger_id in ledger]
    final = [row for _, row in with_energy if row[3]]
    energy_j = sum(row[2] for _, row in with_energy) / 1e6
    j_per_inf = energy_j / len(with_energy) if with_energy else None
    # The noise of J/inference: the measured window cut into equal parts by send time.
    parts: list[float] = []
    for c in range(chunks):
        lo, hi = warmup_s + seconds * c / chunks, warmup_s + seconds * (c + 1) / chunks
        sel = [row[2] for s, row in with_energy if lo <= s.scheduled_s < hi]
        if sel:
            parts.append(sum(sel) / len(sel) / 1e6)
    se = statistics.stdev(parts) / math.sqrt(len(parts)) if len(parts) >= 2 else None
    rows = [b[1] for b in batches]
    by_variant: dict[str, int] = {}
    for s in ok:
        by_variant[s.variant or "-"] = by_variant.get(s.variant or "-", 0) + 1
    ledger_variants: dict[str, int] = {}
    for _, row in with_energy:
        ledger_variants[row[1] or "-"] = ledger_variants.get(row[1] or "-", 0) + 1
    checked = [s for s in ok if s.correct is not None]
    correct = sum(1 for s in checked if s.correct)
    acc_by_variant = {}
    for v in by_variant:
        sel = [s for s in checked if (s.variant or "-") == v]
        if sel:
            acc_by_variant[v] = round(sum(1 for s in sel if s.correct) / len(sel), 4)
    max_errs = [s.max_abs_err for s in ok if s.max_abs_err is not None]
    return {
        "sent": len(measured),
        "answered": len(ok),
        "errors": len(errors),
        "error_examples": sorted({f"{s.status} {s.error}" for s in errors})[:5],
        "offered_rate": len(measured) / seconds,
        "achieved_rate": len(ok) / seconds,
        "p50_ms": pct(lat, 0.50),
        "p90_ms": pct(lat, 0.90),
        "p99_ms": pct(lat, 0.99),
        "max_ms": max(lat) if lat else None,
        "send_lag_p50_ms": pct(lag, 0.50),
        "send_lag_p99_ms": pct(lag, 0.99),
        "warmup_requests": len(samples) - len(measured),
        "in_ledger": len(with_energy),
        "energy_final": len(final),
        "not_in_ledger": len(ok) - len(with_energy),
        "no_ledger_id": sum(1 for s in ok if not s.ledger_id),
        "energy_j": energy_j,
        "j_per_inference": j_per_inf,
        "j_per_inference_chunks": parts,
        "j_per_inference_se": se,
        "batches": len(rows),
        "mean_batch_rows": statistics.fmean(rows) if rows else None,
        "request_weighted_batch_rows": (sum(r * r for r in rows) / sum(rows)) if rows else None,
        "batch_rows_histogram": {str(k): rows.count(k) for k in sorted(set(rows))},
        "variants_served": by_variant,
        "variants_in_ledger": ledger_variants,
        "checked": len(checked),
        "correct": correct,
        "accuracy": correct / len(checked) if checked else None,
        "accuracy_by_variant": acc_by_variant,
        "mismatches": len(checked) - correct,
        "max_abs_err": max(max_errs) if max_errs else None,
    }


def planner_summary(metrics: list[dict[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {"samples": len(metrics)}
    for key in (
        "batch_target_rows",
        "batch_target_wait_seconds",
        "batch_expected_rows",
        "latency_safety",
        "arrival_rows_per_second",
        "latency_late_share",
    ):
        vals = [m[key] for m in metrics if key in m]
        if vals:
            out[f"{key}_median"] = statistics.median(vals)
            out[f"{key}_last"] = vals[-1]
    waiting = [m for m in metrics if m.get("batch_target_rows", 1) > 1]
    out["share_of_samples_with_target_above_1"] = round(len(waiting) / len(metrics), 3) if metrics else None
    if metrics and "batch_target_rows" not in metrics[-1]:
        out["note"] = "no planner lines for this model (knob 0 without carbon-aware mode builds no planner)"
    return out


def _f(v: float | None, digits: int = 2) -> str:
    return "n/a" if v is None else f"{v:,.{digits}f}"


def markdown_table(cells: list[dict[str, Any]]) -> str:
    out = [
        "| model | load | rate req/s (achieved) | knob | mJ/inference (ledger) | vs knob 0 | device mJ/inf incl. idle "
        "| idle W learned | p50 ms | p99 ms | SLO ms | mean batch | planner expected rows | errors "
        "| int8 share | accuracy | other CPU |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    # Each cell against knob 0's cell of the same round (the verdict compares the rounds' means).
    base = {
        (c["model"], c["level"], c.get("round", 0)): c["summary"]["j_per_inference"]
        for c in cells
        if c["knob"] == 0
    }
    for c in cells:
        s = c["summary"]
        j0 = base.get((c["model"], c["level"], c.get("round", 0)))
        j = s["j_per_inference"]
        rel = "" if c["knob"] == 0 or not j0 or j is None else f"{(j / j0 - 1) * 100:+.0f} %"
        served = s["variants_served"]
        int8 = served.get("int8", 0) / max(1, sum(served.values()))
        variants = f"{int8 * 100:.0f} %" if c["model"] == "digits" else "-"
        acc = (
            "n/a"
            if s["accuracy"] is None
            else (f"{s['accuracy'] * 100:.2f} %" if c["model"] == "digits" else f"{s['mismatches']} wrong")
        )
        flag = " (disturbed)" if c.get("disturbed") else ""
        # The rows the planner expects by its wait (the table's column before the planner filled batches to
        # the deadline held its target, which is now the most a batch may take).
        target = c["planner"].get("batch_expected_rows_median", c["planner"].get("batch_target_rows_median"))
        dev_j = c["device"].get("j_per_inference_incl_idle")
        idle_w = (c["device"].get("idle_power_w_min_max") or [None])[-1]
        out.append(
            "| "
            + " | ".join(
                [
                    c["model"],
                    c["level"],
                    f"{c['rate']:g} ({s['achieved_rate']:.0f})",
                    f"{c['knob']:g}",
                    _f(None if j is None else j * 1000, 3),
                    rel or "-",
                    _f(None if dev_j is None else dev_j * 1000, 3),
                    "n/a" if idle_w is None else f"{idle_w:.2f}",
                    _f(s["p50_ms"]),
                    _f(s["p99_ms"]),
                    f"{c['slo_ms']:g}",
                    _f(s["mean_batch_rows"]),
                    "-" if target is None else f"{target:g}",
                    str(s["errors"]),
                    variants,
                    acc,
                    f"{c['cpu']['other_cpu_cores']:.2f}{flag}",
                ]
            )
            + " |"
        )
    return "\n".join(out)


def _mean_or_none(values: list[float | None]) -> float | None:
    present = [v for v in values if v is not None]
    return statistics.fmean(present) if present and len(present) == len(values) else None


def pooled(cells: list[dict[str, Any]]) -> dict[str, Any]:
    """One knob's figures over its rounds (``--rounds``): the mean of the cells' joules per inference (each
    cell weighs the same: on a shared host the noise is between cells, not between requests), its
    standard error from the spread between cells (from the cell's own chunks when there is one cell), the
    worst cell's p99 (every round must be inside the objective) and the mean device figures."""
    js = [c["summary"]["j_per_inference"] for c in cells]
    p99s = [c["summary"]["p99_ms"] for c in cells]
    if any(j is None for j in js):
        j = se = None
    elif len(js) == 1:
        j, se = js[0], cells[0]["summary"]["j_per_inference_se"]
    else:
        j, se = statistics.fmean(js), statistics.stdev(js) / math.sqrt(len(js))
    dev = [c["device"].get("j_per_inference_incl_idle") for c in cells]
    idle = [(c["device"].get("idle_power_w_min_max") or [None])[-1] for c in cells]
    return {
        "cells": len(cells),
        "j_per_inference": j,
        "j_per_inference_se": se,
        "j_per_inference_cells": js,
        "p99_ms": None if any(p is None for p in p99s) else max(p99s),
        "disturbed": any(c.get("disturbed") for c in cells),
        "device_j_per_inference_incl_idle": _mean_or_none(dev),
        "idle_power_w": _mean_or_none(idle),
    }


def paired_savings(cells: list[dict[str, Any]], base: list[dict[str, Any]]) -> list[float]:
    """Each round's saving against knob 0's cell of the same round, for the rounds whose two cells ran at the
    same time (``--concurrent``): their spread is the noise left once the host's drift, shared by both, cancels.
    Empty when the cells ran one after the other."""
    by_round = {c["round"]: c for c in base if c.get("concurrent_with")}
    out = []
    for c in cells:
        b = by_round.get(c["round"])
        if b is None or b["gateway"] not in c.get("concurrent_with", []):
            continue
        j, j0 = c["summary"]["j_per_inference"], b["summary"]["j_per_inference"]
        if j is not None and j0:
            out.append(1.0 - j / j0)
    return out


def verdict(cells: list[dict[str, Any]], min_noise: float) -> list[dict[str, Any]]:
    """The issue's targets per model: low load >= 30 % fewer J/inference than knob 0, p99 inside the
    objective; high load no loss (J/inference at most knob 0's + noise), p99 inside the objective. With
    several rounds, each knob's cells are pooled first (:func:`pooled`)."""
    out = []
    groups: dict[tuple[str, str, float], list[dict[str, Any]]] = {}
    for c in cells:
        groups.setdefault((c["model"], c["level"], c["knob"]), []).append(c)
    for model in dict.fromkeys(c["model"] for c in cells):
        for level in ("low", "high"):
            if (model, level, 0.0) not in groups:
                continue
            base = pooled(groups[(model, level, 0.0)])
            for knob in sorted({c["knob"] for c in cells if c["model"] == model and c["knob"] > 0}):
                group = groups.get((model, level, knob))
                if group is None:
                    continue
                s = pooled(group)
                first = group[0]
                j, j0 = s["j_per_inference"], base["j_per_inference"]
                p99_ok = s["p99_ms"] is not None and s["p99_ms"] <= first["slo_ms"]
                row: dict[str, Any] = {
                    "model": model,
                    "level": level,
                    "knob": knob,
                    "rate": first["rate"],
                    "rounds": s["cells"],
                    "j_per_inference": j,
                    "j_per_inference_knob0": j0,
                    "j_per_inference_cells": s["j_per_inference_cells"],
                    "j_per_inference_knob0_cells": base["j_per_inference_cells"],
                    "p99_ms": s["p99_ms"],
                    "slo_ms": first["slo_ms"],
                    "p99_inside_objective": p99_ok,
                    "disturbed": s["disturbed"] or base["disturbed"],
                    "device_j_per_inference_incl_idle": s["device_j_per_inference_incl_idle"],
                    "device_j_per_inference_incl_idle_knob0": base["device_j_per_inference_incl_idle"],
                    "idle_power_w": s["idle_power_w"],
                    "idle_power_w_knob0": base["idle_power_w"],
                }
                if j is None or not j0:
                    row.update(met=False, why="no energy in the ledger for one of the two cells")
                elif level == "low":
                    saving = 1.0 - j / j0
                    row.update(
                        saving=saving,
                        target=f">= {TARGET_SAVING:.0%} fewer J/inference, p99 <= SLO",
                        met=saving >= TARGET_SAVING and p99_ok,
                    )
                    ses = [x for x in (s["j_per_inference_se"], base["j_per_inference_se"]) if x is not None]
                    if s["cells"] > 1 and base["cells"] > 1 and len(ses) == 2:
                        # The ratio's standard error to first order: relative errors add in quadrature.
                        rel = math.sqrt((ses[0] / j) ** 2 + (ses[1] / j0) ** 2) if j else 0.0
                        row["saving_se"] = (j / j0) * rel
                    paired = paired_savings(group, groups[(model, level, 0.0)])
                    if paired:
                        row["saving_paired_rounds"] = paired
                        row["saving_paired"] = statistics.fmean(paired)
                        if len(paired) > 1:
                            row["saving_paired_se"] = statistics.stdev(paired) / math.sqrt(len(paired))
                else:
                    ses = [x for x in (s["j_per_inference_se"], base["j_per_inference_se"]) if x is not None]
                    noise = max(min_noise, 2.0 * math.sqrt(sum(x * x for x in ses)) / j0 if ses else 0.0)
                    row.update(
                        change=j / j0 - 1.0,
                        noise=noise,
                        target="J/inference <= knob 0's + noise, p99 <= SLO",
                        met=j <= j0 * (1.0 + noise) and p99_ok,
                    )
                out.append(row)
    return out


def verdict_lines(rows: list[dict[str, Any]]) -> list[str]:
    lines = []
    for r in rows:
        mark = "PASS" if r["met"] else "NOT MET"
        p99 = f"p99 {_f(r['p99_ms'])} ms vs SLO {r['slo_ms']:g} ms"
        if "saving" in r:
            what = (
                f"{r['j_per_inference'] * 1000:.3f} vs {r['j_per_inference_knob0'] * 1000:.3f} mJ/inference "
                f"({r['saving'] * 100:+.1f} %"
                + (f" ± {r['saving_se'] * 100:.1f}" if "saving_se" in r else "")
                + f" saved; target >= 30 %), {p99}"
            )
        elif "change" in r:
            what = (
                f"{r['j_per_inference'] * 1000:.3f} vs {r['j_per_inference_knob0'] * 1000:.3f} mJ/inference "
                f"({r['change'] * 100:+.1f} %; allowed +{r['noise'] * 100:.1f} % noise), {p99}"
            )
        else:
            what = r.get("why", "")
        if r.get("rounds", 1) > 1:
            what += f", means of {r['rounds']} rounds"
        if "saving_paired" in r:
            what += (
                f"; paired rounds (run at the same time) {r['saving_paired'] * 100:+.1f} %"
                + (f" ± {r['saving_paired_se'] * 100:.1f}" if "saving_paired_se" in r else "")
                + f" ({', '.join(f'{x * 100:+.1f}' for x in r['saving_paired_rounds'])})"
            )
        flag = " (disturbed run)" if r["disturbed"] else ""
        dj, dj0 = r.get("device_j_per_inference_incl_idle"), r.get("device_j_per_inference_incl_idle_knob0")
        if dj and dj0:
            flag += (
                f"; device incl. idle {dj * 1000:.3f} vs {dj0 * 1000:.3f} mJ ({(dj / dj0 - 1) * 100:+.1f} %)"
            )
        lines.append(
            f"- {mark}: {r['model']} {r['level']} load ({r['rate']:g} req/s), knob {r['knob']:g}: {what}{flag}"
        )
    return lines


# -- main -------------------------------------------------------------------------------------------------


def _parse_map(items: list[str], what: str, models: list[str]) -> dict[str, list[float]]:
    out: dict[str, list[float]] = {}
    for item in items:
        name, sep, values = item.partition("=")
        targets = [name] if sep else models
        raw = values if sep else item
        try:
            nums = [float(v) for v in raw.split(",") if v.strip()]
        except ValueError:
            raise SystemExit(f"{what}: bad value {item!r}") from None
        for t in targets:
            if t not in MODELS:
                raise SystemExit(f"{what}: unknown model {t!r} (choose among {', '.join(MODELS)})")
            out[t] = nums
    return out


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawTextHelpFormatter
    )
    p.add_argument("--quick", action="store_true", help="smoke run: 3 s cells after a 2 s warm-up")
    p.add_argument("--models", default=",".join(MODELS), help="comma list (default linear,digits)")
    p.add_argument(
        "--rates",
        action="append",
        default=[],
        metavar="[MODEL=]R1,R2,R3",
        help="low,medium,high req/s, for one model (MODEL=...) or all; default "
        + " ".join(f"{m}={','.join(f'{r:g}' for r in rs)}" for m, rs in DEFAULT_RATES.items()),
    )
    p.add_argument(
        "--slo-ms",
        action="append",
        default=[],
        metavar="[MODEL=]MS",
        help="latency objective (latency_slo_ms); default linear=50 digits=25",
    )
    p.add_argument("--knobs", default="0,0.5,1", help="energy_efficiency values (default 0,0.5,1; 0 first)")
    p.add_argument(
        "--seconds", type=float, default=None, help="measured seconds per cell (default 20; quick 3)"
    )
    p.add_argument(
        "--warmup", type=float, default=None, help="uncounted seconds before each cell (default 5; quick 2)"
    )
    p.add_argument(
        "--meter-interval",
        type=float,
        default=0.6,
        help="METER_INTERVAL_S (default 0.6; under 0.5 the recorder never learns the idle power)",
    )
    p.add_argument(
        "--adaptive-delay",
        choices=("default", "on", "off"),
        default="default",
        help="the gateway's adaptive_delay model parameter: its default (on), or forced on/off in every config",
    )
    p.add_argument(
        "--probe-seconds",
        type=float,
        default=None,
        help="closed-loop capacity probe per model (3; quick 1; 0: off)",
    )
    p.add_argument(
        "--settle",
        type=float,
        default=None,
        help="idle seconds after start-up and the probe, for the idle power to settle (10; quick 6)",
    )
    p.add_argument("--min-noise", type=float, default=0.05, help="smallest noise allowed at high load (0.05)")
    p.add_argument("--ledger-timeout", type=float, default=60.0, help="seconds to wait for final energy (60)")
    p.add_argument("--request-timeout", type=float, default=30.0, help="client timeout per request (30 s)")
    p.add_argument(
        "--disturbed-cores", type=float, default=0.3, help="others' CPU that marks a cell disturbed (0.3)"
    )
    p.add_argument(
        "--quiet-wait", type=float, default=None, help="max s to wait for quiet (default 3; quick 0)"
    )
    p.add_argument(
        "--rounds",
        type=int,
        default=1,
        help="cells per model, rate and knob, the knob order rotating each round; the verdict pools them (1)",
    )
    p.add_argument(
        "--concurrent",
        action="store_true",
        help="below the high rate, load every knob's gateway at the same time, each with its own Poisson stream\n"
        "at the rate, so the knobs of a round share the host's state (paired cells); the high rate still\n"
        "runs one knob at a time (the machine would serve it once per knob)",
    )
    p.add_argument("--seed", type=int, default=1, help="arrival seed (each cell derives its own)")
    p.add_argument(
        "--env",
        action="append",
        default=[],
        metavar="NAME=VALUE",
        help="extra environment for every gateway (recorded), e.g. DEVICE_IDLE_POWER_W=5",
    )
    p.add_argument(
        "--repository",
        type=Path,
        default=DEMO,
        help="model repository holding linear and digits (default: the demo's); bench/gpu_repository runs\n"
        "both on an NVIDIA GPU with PyTorch, metered by NVML",
    )
    p.add_argument("--results-dir", type=Path, default=RESULTS_DIR)
    p.add_argument("--keep-work", action="store_true", help="keep the temporary folder (logs, databases)")
    args = p.parse_args(argv)
    args.repository = args.repository.resolve()
    missing = [m for m in MODELS if not (args.repository / m / "config.pbtxt").exists()]
    if missing:
        p.error(f"--repository {args.repository}: no {', '.join(missing)} (each needs <model>/config.pbtxt)")
    args.model_list = [m.strip() for m in args.models.split(",") if m.strip()]
    if not args.model_list or set(args.model_list) - set(MODELS):
        p.error(f"--models: choose among {', '.join(MODELS)}")
    rates = {m: list(DEFAULT_RATES[m]) for m in MODELS}
    rates.update(_parse_map(args.rates, "--rates", args.model_list))
    args.rate_map = rates
    for m in args.model_list:
        if not rates[m] or min(rates[m]) <= 0 or len(rates[m]) > 3:
            p.error(f"--rates for {m}: one to three positive rates (low, medium, high), got {rates[m]}")
    slo = dict(DEFAULT_SLO_MS)
    slo.update({m: v[0] for m, v in _parse_map(args.slo_ms, "--slo-ms", args.model_list).items()})
    if min(slo.values()) <= 0:
        p.error("--slo-ms must be positive")
    args.slo_map = slo
    try:
        args.knob_list = [float(k) for k in args.knobs.split(",") if k.strip()]
    except ValueError:
        p.error(f"--knobs: comma list of numbers, got {args.knobs!r}")
    if not args.knob_list or any(not 0 <= k <= 1 for k in args.knob_list) or 0.0 not in args.knob_list:
        p.error("--knobs: values in [0, 1], including 0 (the baseline)")
    if args.rounds < 1:
        p.error(f"--rounds must be at least 1, got {args.rounds}")
    args.seconds = args.seconds or (3.0 if args.quick else 20.0)
    args.warmup = args.warmup if args.warmup is not None else (2.0 if args.quick else 5.0)
    if args.settle is None:
        args.settle = 6.0 if args.quick else 10.0
    if args.probe_seconds is None:
        args.probe_seconds = 1.0 if args.quick else 3.0
    if args.meter_interval < 0.5:
        print(
            "efficiency: warning: METER_INTERVAL_S under 0.5 s: the recorder learns idle power only from "
            "batch-free intervals of 0.5 s or more, so idle is charged 0 W and the whole process's energy "
            "goes to requests",
            file=sys.stderr,
        )
    args.quiet_wait = args.quiet_wait if args.quiet_wait is not None else (0.0 if args.quick else 3.0)
    args.env_map = {}
    for item in args.env:
        name, sep, value = item.partition("=")
        if not sep or not name:
            p.error(f"--env wants NAME=VALUE, got {item!r}")
        args.env_map[name] = value
    return args


def level_names(n: int) -> tuple[str, ...]:
    return {1: ("low",), 2: ("low", "high"), 3: LEVELS}[n]


def knob_groups(order: list[float], level: str, concurrent: bool) -> list[list[float]]:
    """The knobs loaded together, group after group: one knob a group, or with ``--concurrent`` every knob at
    once below the high rate. The high rate stays one knob at a time even then: served once per knob at the
    same time (3 x 1,200 or 1,500 req/s on two cores) it would measure the gateways fighting for the CPU, not
    a knob, and its check (no loss) has the noise allowance of the unpaired comparison anyway."""
    if concurrent and level != "high":
        return [list(order)]
    return [[knob] for knob in order]


def served_models(repository: Path) -> list[str]:
    """Every model of the repository (the demo's ``digits_int8`` too): the gateway is ready when all are."""
    return sorted(p.parent.name for p in repository.glob("*/config.pbtxt"))


def start_gateways(work: Path, args: argparse.Namespace) -> list[Gateway]:
    gateways: list[Gateway | None] = [None] * len(args.knob_list)
    failures: list[BaseException] = []

    def prep(i: int, knob: float) -> None:
        try:
            gateways[i] = prepare_gateway(work, knob, args)
        except BaseException as exc:  # reported below, in this thread's caller
            failures.append(exc)

    log("preparing one gateway per knob: repository, migrate, organization, API key")
    threads = [threading.Thread(target=prep, args=(i, k)) for i, k in enumerate(args.knob_list)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if failures:
        raise failures[0]
    ready = [g for g in gateways if g is not None]
    ports = free_port_block(len(ready))
    for i, g in enumerate(ready):
        g.server.port = ports + i
        g.server.argv[-1] = str(ports + i)
        g.server.start()
    for g in ready:
        wait_ready(g.server, {"Authorization": f"Bearer {g.key}"}, served_models(args.repository), 120.0)
        log(f"{g.server.name} ready on port {g.server.port}")
    return ready


def measure_cells(
    group: list[Gateway],
    seeds: list[int],
    gateways: list[Gateway],
    workload: Workload,
    level: str,
    rate: float,
    rnd: int,
    args: argparse.Namespace,
    failures: list[str],
) -> list[dict[str, Any]]:
    """One cell per gateway of ``group``, all loaded at the same time (one gateway unless ``--concurrent``),
    each with its own Poisson stream at ``rate``: the cells' dicts, in the group's order."""
    model = workload.model
    quiet = wait_quiet(args.quiet_wait, args.disturbed_cores, gateways) if args.quiet_wait > 0 else {}

    async def drive_all() -> list[tuple[list[Sample], list[dict[str, Any]], float]]:
        return list(
            await asyncio.gather(
                *(
                    drive(g, workload, rate, args.warmup, args.seconds, seed, args.request_timeout)
                    for g, seed in zip(group, seeds, strict=True)
                )
            )
        )

    # The client's cyclic garbage collector can stall its event loop for tens of milliseconds while bursts of
    # answers arrive, which would count as the server's latency: off during the cell.
    gc.collect()
    gc.disable()
    try:
        with CpuWatch(gateways) as cpu:
            driven = asyncio.run(drive_all())
    finally:
        gc.enable()
    out = []
    for g, seed, (samples, metrics, measured_wall_ns) in zip(group, seeds, driven, strict=True):
        ids = [s.ledger_id for s in samples if s.measured and s.status == 200 and s.ledger_id]
        ledger, waited = wait_for_ledger(g.db_path, ids, args.ledger_timeout)
        batch_ids = sorted({row[0] for row in ledger.values()})
        batches = read_batches(g.db_path, batch_ids)
        summary = summarize_cell(samples, ledger, batches, args.seconds, args.warmup)
        span = (min(b[4] for b in batches), max(b[5] for b in batches)) if batches else (0, 0)
        device = read_intervals(g.db_path, *span, {b[6] for b in batches}) if batches else {}
        if device.get("seconds"):
            device["mean_power_w"] = device["energy_j"] / device["seconds"]
            device["idle_share"] = device["idle_j"] / max(1e-12, device["energy_j"])
            if summary["achieved_rate"]:
                device["j_per_inference_incl_idle"] = device["mean_power_w"] / summary["achieved_rate"]
        cell = {
            "model": model,
            "level": level,
            "rate": rate,
            "knob": g.knob,
            "round": rnd,
            "gateway": g.label,
            "concurrent_with": [o.label for o in group if o is not g],
            "slo_ms": args.slo_map[model],
            "seed": seed,
            "measured_from_utc": datetime.fromtimestamp(measured_wall_ns / 1e9, UTC).isoformat(),
            "ledger_wait_s": round(waited, 2),
            "summary": summary,
            "device": device,
            "cpu": cpu.as_dict(),
            **quiet,
            "planner": planner_summary(metrics),
            "planner_metrics": metrics,
        }
        # The other gateways of a concurrent group are part of the design, not a disturbance.
        cell["disturbed"] = cell["cpu"]["other_cpu_cores"] > args.disturbed_cores
        s = summary
        if not s["answered"]:
            failures.append(f"{model} {level} knob {g.knob:g}: no answers")
        elif s["energy_final"] < s["answered"]:
            failures.append(
                f"{model} {level} knob {g.knob:g}: final energy for {s['energy_final']} of "
                f"{s['answered']} requests after {waited:.0f} s"
            )
        log(
            f"  {model} {level} {rate:g}/s knob {g.knob:g}"
            f"{f' round {rnd + 1}' if args.rounds > 1 else ''}{' (concurrent)' if len(group) > 1 else ''}: "
            f"{s['achieved_rate']:.0f}/s, "
            f"{_f(None if s['j_per_inference'] is None else s['j_per_inference'] * 1000, 3)} "
            f"mJ/inf, p50 {_f(s['p50_ms'])} ms p99 {_f(s['p99_ms'])} ms, batch "
            f"{_f(s['mean_batch_rows'])}, expected {cell['planner'].get('batch_expected_rows_median', '-')}, "
            f"errors {s['errors']}, other CPU {cell['cpu']['other_cpu_cores']:.2f}"
            f"{' DISTURBED' if cell['disturbed'] else ''}"
        )
        out.append(cell)
    return out


def run(args: argparse.Namespace) -> int:
    started = time.monotonic()
    stamp = utc_stamp()
    work = Path(tempfile.mkdtemp(prefix="efficiency-"))
    meta: dict[str, Any] = {"started_utc": stamp, **machine_info(), "repository": str(args.repository)}
    log(f"work folder {work}")
    workloads = {m: Workload.build(m) for m in args.model_list}
    digits_acc = {}
    for name in ("digits", "digits_int8"):
        with contextlib.suppress(OSError, ValueError):
            doc = json.loads((args.repository / name / "accuracy.json").read_text())
            digits_acc[name] = {"accuracy": doc["accuracy"], "n_test": doc["n_test"]}
    if "digits" in workloads and digits_acc.get("digits", {}).get("n_test") not in (
        None,
        len(workloads["digits"].bodies),
    ):
        raise SetupError(
            f"the held-out split has {len(workloads['digits'].bodies)} images, accuracy.json says "
            f"{digits_acc['digits']['n_test']}: build_digits.py's split changed"
        )
    meta["declared_accuracy"] = digits_acc
    gateways: list[Gateway] = []
    cells: list[dict[str, Any]] = []
    failures: list[str] = []
    try:
        gateways = start_gateways(work, args)
        by_knob = {g.knob: g for g in gateways}
        meta["gateway_env"] = {
            "CARBON_AWARE": "false",
            "METER_INTERVAL_S": f"{args.meter_interval:g}",
            "OPENBLAS_NUM_THREADS": os.environ.get("OPENBLAS_NUM_THREADS", "1"),
            "METERS": "auto (default)",
            **args.env_map,
        }
        meta["configs"] = {g.label: g.configs for g in gateways}
        with contextlib.suppress(Exception):
            metrics_text = http_get(f"{gateways[0].base}/metrics")
            meta["metrics_at_start"] = [
                line for line in metrics_text.splitlines() if "efficien" in line or "carbon_aware" in line
            ][:40]
        # A capacity probe on the knob-0 gateway (closed loop), so an overloaded "high" rate shows.
        meta["capacity_probe"] = {}
        if args.probe_seconds > 0:
            for model in args.model_list:
                cap = asyncio.run(probe_capacity(by_knob[0.0], workloads[model], args.probe_seconds))
                meta["capacity_probe"][model] = cap
                top = max(args.rate_map[model])
                log(
                    f"capacity probe {model}: {cap['answered_per_s']:.0f} answers/s at concurrency 32 "
                    f"(p50 {_f(cap['p50_ms'])} ms); highest rate asked {top:g}/s"
                )
                if top > 0.85 * cap["answered_per_s"]:
                    log(f"  WARNING: {top:g}/s is above 85 % of the probed capacity: the queue may grow")
        # Let every gateway learn its idle power from batch-free intervals (the recorder keeps the median of the
        # last 9): the first ones after start-up or the probe still carry their CPU.
        if args.settle > 0:
            log(f"settling {args.settle:g} s so the gateways learn their idle power")
            time.sleep(args.settle)
        cell_no = 0
        for model in args.model_list:
            rates = args.rate_map[model]
            for li, (level, rate) in enumerate(zip(level_names(len(rates)), rates, strict=True)):
                for rnd in range(args.rounds):
                    order = list(args.knob_list)
                    # Rotate the knob order from one rate, and one round, to the next (0, 0.5, 1 / 1, 0.5, 0 / ...).
                    if (li + rnd) % 2 == 1:
                        order.reverse()
                    groups = knob_groups(order, level, args.concurrent)
                    for group in groups:
                        live = []
                        for knob in group:
                            g = by_knob[knob]
                            if g.server.alive():
                                live.append(g)
                                continue
                            failures.append(f"{g.server.name} is down (see {g.server.log_path})")
                            log(f"  {g.server.name} died; last lines:\n{tail(g.server.log_path, 10)}")
                        if not live:
                            continue
                        seeds = []
                        for _ in live:
                            cell_no += 1
                            seeds.append(args.seed * 1000 + cell_no)
                        cells.extend(
                            measure_cells(
                                live, seeds, gateways, workloads[model], level, rate, rnd, args, failures
                            )
                        )
    except BaseException:
        print(f"efficiency: logs and databases kept in {work}", file=sys.stderr)
        raise
    finally:
        for g in gateways:
            g.server.stop()
    meta["stopped"] = {g.label: g.server.stopped_by for g in gateways}
    meta["wall_s"] = round(time.monotonic() - started, 1)
    meta["methods"] = sorted({m for c in cells for m in c["device"].get("methods", [])})

    table = markdown_table(cells)
    checks = verdict(cells, args.min_noise)
    lines = verdict_lines(checks)
    doc: dict[str, Any] = {
        "meta": meta,
        "settings": {
            "quick": args.quick,
            "models": args.model_list,
            "rates": {m: args.rate_map[m] for m in args.model_list},
            "slo_ms": {m: args.slo_map[m] for m in args.model_list},
            "knobs": args.knob_list,
            "seconds": args.seconds,
            "rounds": args.rounds,
            "warmup_s": args.warmup,
            "meter_interval_s": args.meter_interval,
            "adaptive_delay": args.adaptive_delay,
            "min_noise": args.min_noise,
            "disturbed_cores": args.disturbed_cores,
            "load": "open loop, Poisson arrivals (exponential gaps), aiohttp, HTTP/JSON, 1 row per request",
            "latency": "client side, from just before the POST to the end of the response body",
            "j_per_inference": "sum over the measured requests of their shares in ledger_batch_energy / requests",
            "layout": "one gateway per knob, same model names; "
            + (
                "below the high rate, the knobs of a round loaded at the same time, each with its own Poisson "
                "stream (--concurrent); the high rate one knob at a time, the order rotating"
                if args.concurrent
                else "knob order rotates from one rate to the next"
            ),
            "concurrent": args.concurrent,
        },
        "verdict": checks,
        "table_markdown": table,
        "cells": cells,
        "failures": failures,
    }
    out = write_json(
        args.results_dir / f"efficiency-{stamp}{'-quick' if args.quick else ''}.json", doc, indent=1
    )
    print()
    print(
        f"energy_efficiency knob, {meta['nproc']} CPUs, commit {meta['git_commit'][:10]}, {stamp}, "
        f"meter {', '.join(meta['methods']) or '?'}"
        f"{' (QUICK: smoke run, not a measurement)' if args.quick else ''}"
    )
    print()
    print(table)
    print()
    print("Verdict (issue 7):")
    for line in lines:
        print(line)
    print(f"\nraw results: {out}")
    if failures:
        for f in failures:
            print(f"FAILED: {f}", file=sys.stderr)
    if args.keep_work or failures:
        print(f"work folder kept: {work}")
    else:
        shutil.rmtree(work, ignore_errors=True)
    return 1 if failures else 0


def main(argv: list[str] | None = None) -> int:
    return run_main("efficiency", run, parse_args(argv), "gateways stopped")


if __name__ == "__main__":
    sys.exit(main())
