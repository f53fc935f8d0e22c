"""Throughput and p99 of a fleet through HAProxy: 1, 2 and 3 gateway replicas on this machine (issue 24).

Usage (from the repository root)::

    .venv/bin/python bench/fleet.py            # full run: 2 rounds, 5 s windows; 5-6 minutes on a quiet machine
    .venv/bin/python bench/fleet.py --quick    # smoke run: 1 round, 1 s windows; about 2 minutes

What it does:

1. perf_analyzer (Triton 2.51's, installed into ``var/triton`` by ``compare_triton.ensure_triton``, reused when
   there) and Debian's HAProxy (``/usr/sbin/haproxy``; ``apt-get install -y haproxy``);
2. one fresh PostgreSQL database on 127.0.0.1:5432 (``common.use_database``, dropped at the end), ``manage.py
   setup`` once, an organization and an API key; up to 3 gateway replicas (``manage.py serve --role gateway``,
   ledger on, each with its own var folder: spool, ledger chain, drainer) on it, serving the demo ``linear``
   (what compare_triton.py serves), ``METERS=cpu-model`` on every replica (one host: one meter each), each with
   Django's connection pool (``--pool-size``, as the fleet test runs them);
3. HAProxy in front of the first N replicas, with deploy/haproxy.cfg's rules (``balance leastconn``, health
   checks on ``/readyz``, keep-alive), for N = 1, 2, 3 in alternating order over ``--rounds`` (1,2,3 then 3,2,1,
   ...), and one configuration ``direct``: perf_analyzer straight to replica 1, no HAProxy (the balancer's own
   cost), first in even rounds and last in odd ones. Replicas not in a configuration are stopped (SIGTERM: the
   spool drained, the chain's lease released), so idle replicas take no CPU; one started again reuses its spool
   and chain;
4. for each configuration: a short warm-up, then perf_analyzer (closed loop, HTTP binary tensors, batch 1 per
   request, ``--concurrency`` 32, windows as compare_triton.py's, responses validated byte for byte) through the
   balancer. Around the measurement it reads each replica's ``/metrics`` (``nv_inference_count`` and
   ``nv_inference_exec_count``: the mean batch each replica formed, and how the balancer split the requests),
   HAProxy's counters (sessions per server, 5xx, errors) and the CPU, from ``/proc``, of: each replica's process
   tree (the serving process and its ledger drainer, which runs in a session of its own), HAProxy, PostgreSQL
   (the backends of this benchmark's database and the server's own processes: checkpointer, WAL writer...),
   perf_analyzer, this script, and everything else on the machine. Over ``--disturbed-cores`` (0.3) of
   everything else marks the measurement disturbed; an unstable or disturbed measurement is run again (up to
   ``--retries`` times) and the best attempt kept, as in compare_triton.py;
5. writes ``bench/results/fleet-<UTC>.json`` (``-quick`` for ``--quick``) and prints a markdown table: per
   configuration, the median over the rounds.

Exit status: 0 when every measurement ran without errors, 1 when one had errors (perf_analyzer, a replica that
died, 5xx from the balancer), 2 when set-up failed.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import pwd
import re
import resource
import secrets
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
import compare_triton as ct  # same folder: perf_analyzer's installation, input data and output parser
from common import (
    CLK_TCK,
    LIVE_CLIENTS,
    REPO,
    RESULTS_DIR,
    Server,
    SetupError,
    children_cpu_seconds,
    create_bench_key,
    drop_database,
    fmt,
    free_port_block,
    gateway_env,
    http,
    log,
    machine_busy_ticks,
    machine_info,
    manage,
    run_main,
    serve_argv,
    tail,
    use_database,
    utc_stamp,
    wait_ready,
    write_json,
)

MODEL = "linear"
MODEL_VERSION = "1"  # inference/demo_repository/linear/1
DIRECT = "direct"
HAPROXY_PATHS = ("/usr/sbin/haproxy",)
DEFAULT_REPLICAS = (1, 2, 3)

# deploy/haproxy.cfg's rules (balance, health check, keep-alive, time-outs) on loopback, with a stats socket
# for the per-server counters; maxconn 4000 (as the fleet test) rather than 20000, which needs twice as many file
# descriptors as a default shell allows.
HAPROXY_CFG = """\
global
    maxconn 4000
    stats socket {socket} mode 600 level admin

defaults
    mode http
    timeout connect 5s
    timeout client 120s
    timeout server 120s
    option http-keep-alive

frontend kserve_http
    bind 127.0.0.1:{port}
    default_backend gateways_http

backend gateways_http
    balance {balance}
    option httpchk GET /readyz
    http-check expect status 200
    default-server inter 1s fall 2 rise 2
{servers}
"""


# -- pure parts (tests/bench/test_fleet_bench.py) ------------------------------------------------------------


def plan(replicas: Sequence[int], rounds: int, direct: bool = True) -> list[tuple[int, str]]:
    """(round, configuration) in measuring order: ascending replicas in even rounds, descending in odd ones,
    so slow drift of the machine hits every size alike; ``direct`` next to N=1 (first in even rounds, last in
    odd ones), the pair it is compared with measured back to back."""
    up = [str(n) for n in sorted(replicas)]
    if direct:
        up = [DIRECT, *up]
    out: list[tuple[int, str]] = []
    for r in range(rounds):
        out += [(r, c) for c in (up if r % 2 == 0 else list(reversed(up)))]
    return out


def replicas_of(config: str) -> int:
    """How many gateway replicas a configuration runs (``direct``: one, without the balancer)."""
    return 1 if config == DIRECT else int(config)


def haproxy_config(port: int, stats_socket: Path, servers: Sequence[tuple[str, int]], balance: str) -> str:
    lines = "\n".join(f"    server {name} 127.0.0.1:{p} check" for name, p in servers)
    return HAPROXY_CFG.format(socket=stats_socket, port=port, balance=balance, servers=lines)


_METRIC_RE = re.compile(r"^(nv_inference_count|nv_inference_exec_count)\{([^}]*)\}\s+([0-9.eE+]+)\s*$", re.M)


def inference_counters(metrics_text: str, model: str = MODEL) -> tuple[int, int]:
    """(inferences, executions) of ``model`` from Prometheus text: Triton's ``nv_inference_count`` and
    ``nv_inference_exec_count`` summed over its versions. Inferences / executions is the mean batch size."""
    totals = {"nv_inference_count": 0.0, "nv_inference_exec_count": 0.0}
    for name, labels, value in _METRIC_RE.findall(metrics_text):
        if f'model="{model}"' in labels:
            totals[name] += float(value)
    return int(totals["nv_inference_count"]), int(totals["nv_inference_exec_count"])


def postgres_process_kind(cmdline: str, database: str) -> str:
    """``own`` (a backend or autovacuum worker of ``database``), ``other`` (another database's backend) or
    ``server`` (the postmaster and its auxiliary processes: checkpointer, background writer, WAL writer...),
    from a PostgreSQL process's command line (``postgres: 15/main: postgres cl_bench_x 127.0.0.1(5) idle``)."""
    words = cmdline.replace("\x00", " ").split()
    if database in words:
        return "own"
    if any(w.startswith(("127.", "[local]", "::1", "localhost")) or re.search(r"\(\d+\)$", w) for w in words):
        return "other"
    return "server"


def _median(values: Iterable[float | None]) -> float | None:
    present = [v for v in values if v is not None]
    return statistics.median(present) if present else None


def config_order(configs: Iterable[str]) -> list[str]:
    return sorted(set(configs), key=lambda c: (c != DIRECT, replicas_of(c)))


def summarize(runs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One row per configuration: the median over the rounds of each kept (``final``) measurement's figures,
    and the throughput relative to N=1 through the balancer."""
    by_config: dict[str, list[dict[str, Any]]] = {}
    for r in runs:
        if r.get("final"):
            by_config.setdefault(r["config"], []).append(r)
    rows: list[dict[str, Any]] = []
    for config in config_order(by_config):
        rs = by_config[config]
        row: dict[str, Any] = {"config": config, "replicas": replicas_of(config), "rounds": len(rs)}
        for k in ("throughput", "p50_ms", "p99_ms", "machine_busy_cores", "other_cpu_cores"):
            row[k] = _median(r.get(k) for r in rs)
        row["mean_batch_per_replica"] = [
            _median(r["replicas"][i].get("mean_batch") for r in rs if len(r.get("replicas", [])) > i)
            for i in range(row["replicas"])
        ]
        row["request_share_per_replica"] = [
            _median(r["replicas"][i].get("request_share") for r in rs if len(r.get("replicas", [])) > i)
            for i in range(row["replicas"])
        ]
        for part in ("gateways", "haproxy", "postgres", "perf_analyzer", "total"):
            row[f"cpu_ms_per_request_{part}"] = _median(r.get("cpu_ms_per_request", {}).get(part) for r in rs)
        row["stable"] = all(r.get("stable", False) for r in rs)
        row["disturbed"] = sum(bool(r.get("disturbed")) for r in rs)
        row["errors"] = [e for r in rs for e in r.get("errors", [])]
        rows.append(row)
    base = next((r["throughput"] for r in rows if r["config"] == "1"), None)
    for row in rows:
        row["throughput_vs_1"] = row["throughput"] / base if base and row["throughput"] else None
    return rows


def markdown_table(rows: list[dict[str, Any]]) -> str:
    out = [
        "| configuration | rounds | infer/s | vs N=1 | p50 ms | p99 ms | mean batch per replica | share per replica "
        "| CPU ms/request: gateways | HAProxy | PostgreSQL | all ours | busy cores | notes |",
        "|---|---:|---:|---:|---:|---:|---|---|---:|---:|---:|---:|---:|---|",
    ]
    for r in rows:
        name = "direct (no HAProxy)" if r["config"] == DIRECT else f"{r['config']} via HAProxy"
        notes = []
        if not r["stable"]:
            notes.append("unstable")
        if r["disturbed"]:
            notes.append(f"disturbed x{r['disturbed']}")
        if r["errors"]:
            notes.append("errors")
        cells = [
            name,
            str(r["rounds"]),
            fmt(r["throughput"], 0),
            "n/a" if r["throughput_vs_1"] is None else f"{r['throughput_vs_1']:.2f}x",
            fmt(r["p50_ms"], 2),
            fmt(r["p99_ms"], 2),
            " / ".join(fmt(b, 1) for b in r["mean_batch_per_replica"]),
            " / ".join("n/a" if s is None else f"{s:.0%}" for s in r["request_share_per_replica"]),
            fmt(r["cpu_ms_per_request_gateways"], 3),
            fmt(r["cpu_ms_per_request_haproxy"], 3),
            fmt(r["cpu_ms_per_request_postgres"], 3),
            fmt(r["cpu_ms_per_request_total"], 3),
            fmt(r["machine_busy_cores"], 2),
            ", ".join(notes),
        ]
        out.append("| " + " | ".join(cells) + " |")
    return "\n".join(out)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawTextHelpFormatter
    )
    p.add_argument(
        "--quick", action="store_true", help="smoke run: 1 round, 1 s windows, at most 3, no retries"
    )
    p.add_argument(
        "--rounds", type=int, default=None, help="rounds over the configurations (default 2; quick 1)"
    )
    p.add_argument(
        "--replicas", default=",".join(map(str, DEFAULT_REPLICAS)), help="comma list (default 1,2,3)"
    )
    p.add_argument("--no-direct", action="store_true", help="skip the run straight to one gateway")
    p.add_argument("--concurrency", type=int, default=32, help="perf_analyzer's concurrency (default 32)")
    p.add_argument(
        "--measurement-interval", type=int, default=None, help="ms per window (default 5000; quick 1000)"
    )
    p.add_argument(
        "--max-trials", type=int, default=None, help="windows per measurement (default 6; quick 3)"
    )
    p.add_argument("--stability-percentage", type=int, default=20)
    p.add_argument(
        "--warmup-s", type=float, default=None, help="load before each measurement (default 3; quick 1)"
    )
    p.add_argument(
        "--retries", type=int, default=None, help="re-runs of an unstable or disturbed one (1; quick 0)"
    )
    p.add_argument("--disturbed-cores", type=float, default=0.3)
    p.add_argument(
        "--quiet-wait",
        type=float,
        default=None,
        help="max s to wait for a quiet machine (default 20; quick 3)",
    )
    p.add_argument(
        "--balance", default="leastconn", help="HAProxy's algorithm (default leastconn, as deploy/)"
    )
    p.add_argument(
        "--pool-size", type=int, default=3, help="CARBONLEDGER_DB_POOL_MAX_SIZE of each replica (default 3)"
    )
    p.add_argument(
        "--triton-dir", type=Path, default=REPO / "var" / "triton", help="perf_analyzer's cache (var/triton)"
    )
    p.add_argument("--results-dir", type=Path, default=RESULTS_DIR)
    p.add_argument("--keep-work", action="store_true", help="keep the temporary folder (logs, outputs)")
    args = p.parse_args(argv)
    try:
        args.replica_list = sorted({int(x) for x in args.replicas.split(",") if x.strip()})
    except ValueError:
        p.error(f"--replicas must be a comma-separated list of integers, got {args.replicas!r}")
    if not args.replica_list or min(args.replica_list) < 1:
        p.error("--replicas needs at least one value, each >= 1")
    if args.concurrency < 1:
        p.error("--concurrency must be >= 1")
    args.rounds = args.rounds if args.rounds is not None else (1 if args.quick else 2)
    if args.rounds < 1:
        p.error("--rounds must be >= 1")
    args.measurement_interval = args.measurement_interval or (1000 if args.quick else 5000)
    args.max_trials = args.max_trials or (3 if args.quick else 6)
    args.warmup_s = args.warmup_s if args.warmup_s is not None else (1.0 if args.quick else 3.0)
    args.retries = args.retries if args.retries is not None else (0 if args.quick else 1)
    args.quiet_wait = args.quiet_wait if args.quiet_wait is not None else (3.0 if args.quick else 20.0)
    return args


# -- CPU from /proc --------------------------------------------------------------------------------------------


@dataclass
class ProcRow:
    pid: int
    ppid: int
    pgid: int
    uid: int
    cpu_s: float  # user + system, and that of reaped children
    own_cpu_s: float  # user + system alone


def read_procs() -> dict[int, ProcRow]:
    rows: dict[int, ProcRow] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            raw = Path(f"/proc/{entry}/stat").read_text()
            uid = os.stat(f"/proc/{entry}").st_uid
        except OSError:
            continue
        f = raw[raw.rindex(")") + 2 :].split()
        own = int(f[11]) + int(f[12])
        rows[int(entry)] = ProcRow(
            int(entry), int(f[1]), int(f[2]), uid, (own + int(f[13]) + int(f[14])) / CLK_TCK, own / CLK_TCK
        )
    return rows


def tree_cpu(procs: dict[int, ProcRow], root: int) -> tuple[float, float]:
    """(CPU s of ``root``'s process group, CPU s of its other descendants): the gateway's drainer runs in a
    session of its own, so a process group alone would miss it."""
    children: dict[int, list[int]] = {}
    for row in procs.values():
        children.setdefault(row.ppid, []).append(row.pid)
    members = {pid for pid, row in procs.items() if row.pgid == root}
    stack = [root]
    seen: set[int] = set()
    while stack:
        pid = stack.pop()
        if pid in seen:
            continue
        seen.add(pid)
        stack += children.get(pid, [])
    group = sum(procs[p].cpu_s for p in members if p in procs)
    others = sum(procs[p].cpu_s for p in seen - members if p in procs)
    return group, others


def _cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace")
    except OSError:
        return ""


def postgres_cpu(procs: dict[int, ProcRow], database: str, uid: int | None) -> dict[int, tuple[str, float]]:
    """Each PostgreSQL process: (kind, own CPU s) (children's time left out: the postmaster reaps everyone's
    backends)."""
    if uid is None:
        return {}
    return {
        pid: (postgres_process_kind(_cmdline(pid), database), row.own_cpu_s)
        for pid, row in procs.items()
        if row.uid == uid
    }


def _postgres_uid() -> int | None:
    try:
        return pwd.getpwnam("postgres").pw_uid
    except KeyError:
        return None


def _self_cpu_s() -> float:
    ru = resource.getrusage(resource.RUSAGE_SELF)
    return ru.ru_utime + ru.ru_stime


# -- the fleet -------------------------------------------------------------------------------------------------


def haproxy_stats(stats_socket: Path) -> dict[str, dict[str, str]]:
    """HAProxy's ``show stat`` rows of the backend, keyed by server name (and ``BACKEND``)."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.settimeout(2)
        sock.connect(str(stats_socket))
        sock.sendall(b"show stat\n")
        data = b""
        while chunk := sock.recv(65536):
            data += chunk
    lines = data.decode().splitlines()
    header = lines[0].lstrip("# ").split(",")
    out: dict[str, dict[str, str]] = {}
    for line in lines[1:]:
        row = dict(zip(header, line.split(","), strict=False))
        if row.get("pxname") == "gateways_http":
            out[row["svname"]] = row
    return out


def _stat_int(rows: dict[str, dict[str, str]], server: str, column: str) -> int:
    value = rows.get(server, {}).get(column, "")
    return int(value) if value.isdigit() else 0


@dataclass
class Fleet:
    args: argparse.Namespace
    work: Path
    gateways: list[Server]
    headers: dict[str, str]
    database: str
    haproxy_bin: str
    lb_port: int
    haproxy: Server | None = None
    haproxy_size: int = 0
    events: list[str] = field(default_factory=list)
    # Inferences answered by replica processes since stopped (a restarted one counts from 0 again).
    retired_inferences: int = 0

    @property
    def stats_socket(self) -> Path:
        return self.work / "haproxy.sock"

    def resize(self, n: int) -> None:
        """Replicas 1..n running and ready, the others stopped (SIGTERM: spool drained, lease released)."""
        for g in self.gateways[n:]:
            self.stop_gateway(g)
        for g in self.gateways[:n]:
            if not g.alive():
                if g.proc is not None:
                    self.events.append(f"{time.strftime('%H:%M:%S')} {g.name} started again")
                g.start()
        for g in self.gateways[:n]:
            self.wait_gateway(g)

    def answered(self, g: Server) -> int:
        status, body = http("GET", f"http://127.0.0.1:{g.port}/metrics")
        if status != 200:
            raise SetupError(f"{g.name}: /metrics answered {status}")
        return inference_counters(body.decode(errors="replace"))[0]

    def stop_gateway(self, g: Server) -> None:
        """SIGTERM (the spool drained into the ledger, the lease released), counting what it answered first."""
        if g.alive():
            self.retired_inferences += self.answered(g)
            g.stop(grace_s=30.0)

    def answered_total(self) -> int:
        """Inferences every replica process answered so far, the stopped ones included."""
        return self.retired_inferences + sum(self.answered(g) for g in self.gateways if g.alive())

    def wait_gateway(self, g: Server, timeout_s: float = 120.0) -> None:
        wait_ready(g, self.headers, [MODEL], timeout_s=timeout_s)
        deadline = time.monotonic() + timeout_s
        while http("GET", f"http://127.0.0.1:{g.port}/readyz")[0] != 200:
            if not g.alive() or time.monotonic() > deadline:
                raise SetupError(
                    f"{g.name}: /readyz never answered 200; last lines of {g.log_path}:\n{tail(g.log_path)}"
                )
            time.sleep(0.25)

    def balance(self, n: int) -> None:
        """HAProxy in front of replicas 1..n, every one of them UP in its health checks."""
        if self.haproxy is not None and self.haproxy.alive() and self.haproxy_size == n:
            return
        if self.haproxy is not None and self.haproxy.alive():
            self.haproxy.stop(grace_s=5.0)
        cfg = self.work / f"haproxy-{n}.cfg"
        cfg.write_text(
            haproxy_config(
                self.lb_port,
                self.stats_socket,
                [(g.name, g.port) for g in self.gateways[:n]],
                self.args.balance,
            )
        )
        with contextlib.suppress(FileNotFoundError):
            self.stats_socket.unlink()
        self.haproxy = Server(
            "haproxy", self.lb_port, [self.haproxy_bin, "-db", "-f", str(cfg)], dict(os.environ),
            self.work / "haproxy.log",
        )  # fmt: skip
        self.haproxy.start()
        self.haproxy_size = n
        deadline = time.monotonic() + 30.0
        while True:
            if not self.haproxy.alive():
                raise SetupError(f"HAProxy exited; last lines of its log:\n{tail(self.haproxy.log_path)}")
            with contextlib.suppress(OSError, IndexError):
                rows = haproxy_stats(self.stats_socket)
                if all(rows.get(g.name, {}).get("status") == "UP" for g in self.gateways[:n]):
                    return
            if time.monotonic() > deadline:
                raise SetupError(f"HAProxy did not mark {n} replica(s) UP within 30 s")
            time.sleep(0.2)

    def stop_all(self) -> None:
        if self.haproxy is not None and self.haproxy.alive():
            self.haproxy.stop(grace_s=5.0)
        for g in self.gateways:
            with contextlib.suppress(SetupError, OSError):
                self.stop_gateway(g)
            if g.alive():
                g.stop(grace_s=30.0)


@dataclass
class Snapshot:
    at: float
    counters: list[tuple[int, int]]
    gateway_cpu: list[tuple[float, float]]
    haproxy_cpu: float
    postgres: dict[int, tuple[str, float]]
    haproxy_rows: dict[str, dict[str, str]]
    busy: tuple[int, int]
    client_cpu: float
    self_cpu: float


def snapshot(fleet: Fleet, n: int, via_haproxy: bool, pg_uid: int | None) -> Snapshot:
    counters = []
    for g in fleet.gateways[:n]:
        status, body = http("GET", f"http://127.0.0.1:{g.port}/metrics")
        counters.append(inference_counters(body.decode(errors="replace")) if status == 200 else (0, 0))
    procs = read_procs()
    rows: dict[str, dict[str, str]] = {}
    if via_haproxy:
        with contextlib.suppress(OSError, IndexError):
            rows = haproxy_stats(fleet.stats_socket)
    hp = fleet.haproxy
    return Snapshot(
        at=time.monotonic(),
        counters=counters,
        gateway_cpu=[tree_cpu(procs, g.pgid) for g in fleet.gateways[:n]],
        haproxy_cpu=sum(tree_cpu(procs, hp.pgid)) if hp is not None and hp.alive() else 0.0,
        postgres=postgres_cpu(procs, fleet.database, pg_uid),
        haproxy_rows=rows,
        busy=machine_busy_ticks(),
        client_cpu=children_cpu_seconds(),
        self_cpu=_self_cpu_s(),
    )


def postgres_delta(a: dict[int, tuple[str, float]], b: dict[int, tuple[str, float]]) -> dict[str, float]:
    """CPU s by kind between two samples; a process born meanwhile counts whole, one gone meanwhile is lost
    (the pool keeps the benchmark's connections open, so few come and go)."""
    out = {"own": 0.0, "server": 0.0, "other": 0.0}
    for pid, (kind, cpu) in b.items():
        out[kind] += max(0.0, cpu - a[pid][1]) if pid in a else cpu
    return out


def compare(a: Snapshot, b: Snapshot, fleet: Fleet, n: int, via_haproxy: bool) -> dict[str, Any]:
    wall = max(1e-6, b.at - a.at)
    replicas: list[dict[str, Any]] = []
    total_inferences = 0
    for i, g in enumerate(fleet.gateways[:n]):
        inf = b.counters[i][0] - a.counters[i][0]
        exe = b.counters[i][1] - a.counters[i][1]
        total_inferences += inf
        serve_cpu = b.gateway_cpu[i][0] - a.gateway_cpu[i][0]
        drain_cpu = b.gateway_cpu[i][1] - a.gateway_cpu[i][1]
        replicas.append(
            {
                "name": g.name,
                "inferences": inf,
                "executions": exe,
                "mean_batch": inf / exe if exe > 0 else None,
                "serve_cpu_cores": round(serve_cpu / wall, 3),
                "drainer_cpu_cores": round(drain_cpu / wall, 3),
                "cpu_s": serve_cpu + drain_cpu,
            }
        )
    for r in replicas:
        r["request_share"] = r["inferences"] / total_inferences if total_inferences else None
    pg = postgres_delta(a.postgres, b.postgres)
    cpu_s = {
        "gateways": sum(r["cpu_s"] for r in replicas),
        "haproxy": b.haproxy_cpu - a.haproxy_cpu if via_haproxy else 0.0,
        "postgres": pg["own"] + pg["server"],
        "perf_analyzer": b.client_cpu - a.client_cpu,
        "this_script": b.self_cpu - a.self_cpu,
    }
    cores = os.cpu_count() or 1
    busy = cores * (b.busy[0] - a.busy[0]) / max(1, b.busy[1] - a.busy[1])
    ours = sum(cpu_s.values()) / wall
    res: dict[str, Any] = {
        "counted_s": round(wall, 2),  # the whole perf_analyzer run: requests and CPU over the same span
        "inferences": total_inferences,
        "replicas": replicas,
        "cpu_cores": {k: round(v / wall, 3) for k, v in cpu_s.items()},
        "postgres_other_databases_cpu_cores": round(pg["other"] / wall, 3),
        "machine_busy_cores": round(busy, 3),
        "other_cpu_cores": round(busy - ours, 3),
    }
    if total_inferences:
        per = {k: 1000.0 * v / total_inferences for k, v in cpu_s.items() if k != "this_script"}
        per["total"] = sum(per[k] for k in ("gateways", "haproxy", "postgres"))
        res["cpu_ms_per_request"] = {k: round(v, 4) for k, v in per.items()}
    if via_haproxy:
        hp: dict[str, Any] = {}
        for name in [g.name for g in fleet.gateways[:n]] + ["BACKEND"]:
            hp[name] = {
                col: _stat_int(b.haproxy_rows, name, col) - _stat_int(a.haproxy_rows, name, col)
                for col in ("stot", "hrsp_2xx", "hrsp_5xx", "econ", "eresp")
            }
        res["haproxy"] = hp
    return res


# -- measuring -------------------------------------------------------------------------------------------------


@dataclass
class Bench:
    args: argparse.Namespace
    fleet: Fleet
    key: str
    input_data: Path
    work: Path
    pg_uid: int | None
    runs: list[dict[str, Any]] = field(default_factory=list)

    def perf_analyzer_argv(
        self, port: int, csv_path: Path, interval_ms: int, trials: int, stability: int
    ) -> list[str]:
        return [
            str(self.args.triton_dir / "perf_analyzer"),
            # -x: an explicit version. Without one perf_analyzer looks for the version "in use" between the
            # statistics it reads before and after a window; through the balancer those come from different
            # replicas, and a window whose second replica has counted less fails ("failed to find the
            # requested model version").
            "-m", MODEL, "-x", MODEL_VERSION, "-u", f"127.0.0.1:{port}", "-i", "http", "-b", "1",
            "--concurrency-range", f"{self.args.concurrency}:{self.args.concurrency}",
            "--measurement-interval", str(interval_ms), "--max-trials", str(trials),
            "--stability-percentage", str(stability), "--input-data", str(self.input_data),
            "-f", str(csv_path), "-v", "-H", f"Authorization: Bearer {self.key}",
        ]  # fmt: skip

    def run_client(self, argv: list[str], limit_s: float) -> tuple[str, int | None, bool]:
        env = dict(os.environ, LD_LIBRARY_PATH=str(self.args.triton_dir / "pa_libs"))
        proc = subprocess.Popen(
            argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True
        )
        LIVE_CLIENTS.append(proc)
        try:
            raw, _ = proc.communicate(timeout=limit_s)
            timed_out = False
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            raw, _ = proc.communicate()
            timed_out = True
        finally:
            LIVE_CLIENTS.remove(proc)
        return raw.decode(errors="replace"), proc.returncode, timed_out

    def wait_quiet(self) -> dict[str, Any]:
        t0 = time.monotonic()
        cores = os.cpu_count() or 1
        while True:
            b0, n0 = machine_busy_ticks()
            time.sleep(1.0)
            b1, n1 = machine_busy_ticks()
            busy = cores * (b1 - b0) / max(1, n1 - n0)
            waited = time.monotonic() - t0
            if busy <= self.args.disturbed_cores or waited >= self.args.quiet_wait:
                return {"machine_busy_cores_before": round(busy, 3), "waited_for_quiet_s": round(waited, 1)}

    def once(self, round_no: int, config: str, attempt: int) -> dict[str, Any]:
        a = self.args
        n = replicas_of(config)
        via = config != DIRECT
        port = self.fleet.lb_port if via else self.fleet.gateways[0].port
        tag = f"r{round_no}-{config}-a{attempt}"
        if a.warmup_s > 0:
            ms = max(500, int(a.warmup_s * 1000))
            out, _, _ = self.run_client(
                self.perf_analyzer_argv(port, self.work / f"{tag}-warmup.csv", ms, 1, 100), a.warmup_s + 30
            )
            (self.work / f"{tag}-warmup.out").write_text(out)
        quiet = self.wait_quiet()
        csv_path = self.work / f"{tag}.csv"
        argv = self.perf_analyzer_argv(
            port, csv_path, a.measurement_interval, a.max_trials, a.stability_percentage
        )
        limit = (a.max_trials + 2) * a.measurement_interval / 1000.0 + 30.0
        before = snapshot(self.fleet, n, via, self.pg_uid)
        stdout, rc, timed_out = self.run_client(argv, limit)
        after = snapshot(self.fleet, n, via, self.pg_uid)
        (self.work / f"{tag}.out").write_text(stdout)
        res = ct.parse_perf_analyzer(stdout, csv_path)
        # perf_analyzer's server-side figures come from whichever replica answered its statistics request:
        # the replicas' own /metrics (in compare()) replace them.
        for k in (
            "avg_batch_size",
            "server_inference_count",
            "server_execution_count",
            "server_success_count",
        ):
            res.pop(k, None)
        res.update(compare(before, after, self.fleet, n, via))
        res.update(quiet)
        res.update(
            round=round_no, config=config, attempt=attempt, returncode=rc, timed_out=timed_out,
            command=" ".join(argv).replace(self.key, "<key>"),
        )  # fmt: skip
        marker = stdout.find("*** Measurement Settings ***")
        res["stdout"] = stdout[marker:] if marker >= 0 else stdout[-4000:]
        if timed_out:
            res["errors"].append(f"perf_analyzer ran past {limit:.0f} s and was killed")
        elif rc != 0 and res["stable"] and not res["errors"]:
            res["errors"].append(f"perf_analyzer exited with status {rc}")
        for g in self.fleet.gateways[:n]:
            if not g.alive():
                res["errors"].append(f"{g.name} died during the run; see {g.log_path}")
        bad = res.get("haproxy", {}).get("BACKEND", {})
        if bad.get("hrsp_5xx") or bad.get("econ") or bad.get("eresp"):
            res["errors"].append(f"the balancer counted errors: {bad}")
        res["disturbed"] = res["other_cpu_cores"] > a.disturbed_cores
        res["final"] = False
        return res

    def measure(self, round_no: int, config: str) -> dict[str, Any]:
        n = replicas_of(config)
        self.fleet.resize(n)
        if config != DIRECT:
            self.fleet.balance(n)
        elif self.fleet.haproxy is not None and self.fleet.haproxy.alive():
            self.fleet.haproxy.stop(grace_s=5.0)  # not even its health checks during the direct run
        attempts: list[dict[str, Any]] = []
        while True:
            res = self.once(round_no, config, len(attempts) + 1)
            attempts.append(res)
            self.runs.append(res)
            if res["errors"] or (res["stable"] and not res["disturbed"]) or len(attempts) > self.args.retries:
                break
            why = (
                "did not stabilize"
                if not res["stable"]
                else f"was disturbed ({res['other_cpu_cores']:.2f} cores)"
            )
            log(f"  round {round_no} {config} {why}; running it again")
            if any(not g.alive() for g in self.fleet.gateways[:n]):
                break
        best = min(attempts, key=lambda r: (bool(r["errors"]), not r["stable"], r["other_cpu_cores"]))
        best["final"] = True
        batches = " / ".join(fmt(r["mean_batch"], 1) for r in best["replicas"])
        flag = "" if best["stable"] else " (UNSTABLE)"
        flag += f" (disturbed: others used {best['other_cpu_cores']:.2f} cores)" if best["disturbed"] else ""
        flag += f" ERRORS: {best['errors']}" if best["errors"] else ""
        log(
            f"  round {round_no} {config:>6}: {best.get('throughput', float('nan')):.0f}/s "
            f"p50 {best.get('p50_ms', float('nan')):.2f} ms p99 {best.get('p99_ms', float('nan')):.2f} ms, "
            f"batch {batches}, CPU {best.get('cpu_ms_per_request', {}).get('total', float('nan')):.3f} ms/request"
            f"{flag} [attempt {best['attempt']}]"
        )
        return best


# -- main ------------------------------------------------------------------------------------------------------


def find_haproxy() -> str:
    found = shutil.which("haproxy") or next((p for p in HAPROXY_PATHS if Path(p).exists()), None)
    if found is None:
        raise SetupError("HAProxy is missing: apt-get install -y haproxy (Debian's /usr/sbin/haproxy)")
    return found


def ledger_counts(database_url: str) -> dict[str, int]:
    import psycopg

    with psycopg.connect("postgresql" + database_url[database_url.index(":") :], autocommit=True) as conn:
        requests = conn.execute("SELECT COUNT(*) FROM ledger_request").fetchone()
        chains = conn.execute("SELECT COUNT(*) FROM carbonledger_ledgerchain").fetchone()
    return {
        "ledger_requests": int(requests[0]) if requests else 0,
        "ledger_chains": int(chains[0]) if chains else 0,
    }


def run(args: argparse.Namespace) -> int:
    started = time.monotonic()
    stamp = utc_stamp()
    work = Path(tempfile.mkdtemp(prefix="fleet-"))
    meta: dict[str, Any] = {"started_utc": stamp, **machine_info()}
    log(f"work folder {work}")
    fleet: Fleet | None = None
    database_url = ""
    bench: Bench | None = None
    try:
        haproxy_bin = find_haproxy()
        meta["haproxy_version"] = subprocess.run(
            [haproxy_bin, "-v"], capture_output=True, text=True, timeout=10
        ).stdout.splitlines()[0]
        meta.update(ct.ensure_triton(args.triton_dir.resolve()))
        models = work / "models"
        models.mkdir()
        shutil.copytree(ct.DEMO_LINEAR, models / MODEL)
        database_url = use_database("postgres", work)
        database = database_url.rsplit("/", 1)[1]
        meta["database"] = database
        log(f"database {database}")
        shared = {
            "DATABASE_URL": database_url,
            "SECRET_KEY": secrets.token_urlsafe(48),
            "METERS": "cpu-model",
            "OPENBLAS_NUM_THREADS": "1",
            "CARBONLEDGER_DB_POOL_MAX_SIZE": str(args.pool_size),
        }
        n_max = max(args.replica_list)
        envs = []
        for i in range(1, n_max + 1):
            var = work / f"gateway-{i}"
            var.mkdir()
            envs.append(gateway_env(var, models, **shared))
        log("manage.py setup (migrations, emission factors), an organization and an API key")
        manage(envs[0], "setup")
        key = create_bench_key(envs[0])
        input_data = work / "validation_data.json"
        ct.write_validation_data(input_data)
        base = free_port_block(n_max + 1)
        gateways = [
            Server(f"gateway-{i + 1}", base + i, [*serve_argv(base + i), "--role", "gateway"], envs[i],
                   work / f"gateway-{i + 1}.log")
            for i in range(n_max)
        ]  # fmt: skip
        headers = {"Authorization": f"Bearer {key}"}
        fleet = Fleet(args, work, gateways, headers, database, haproxy_bin, base + n_max)
        bench = Bench(args, fleet, key, input_data, work, _postgres_uid())
        order = plan(args.replica_list, args.rounds, direct=not args.no_direct)
        meta["order"] = [f"r{r}:{c}" for r, c in order]
        log(f"order: {', '.join(c for _, c in order)}")
        for round_no, config in order:
            bench.measure(round_no, config)
        fleet.stop_all()
        meta["answered_inferences"] = fleet.retired_inferences
        # A stopped replica has drained its spool; allow its drainer process a moment to commit the last batch.
        deadline = time.monotonic() + 30.0
        while True:
            meta.update(ledger_counts(database_url))
            if meta["ledger_requests"] >= meta["answered_inferences"] or time.monotonic() > deadline:
                break
            time.sleep(1.0)
    except BaseException:
        print(f"fleet: logs and perf_analyzer output kept in {work}", file=sys.stderr)
        raise
    finally:
        if fleet is not None:
            fleet.stop_all()
            meta["events"] = fleet.events
        if database_url:
            try:
                drop_database(database_url)
            except Exception as exc:
                log(f"could not drop the database {database_url}: {exc}")
    meta["wall_s"] = round(time.monotonic() - started, 1)
    assert bench is not None
    rows = summarize(bench.runs)
    table = markdown_table(rows)
    doc: dict[str, Any] = {
        "meta": meta,
        "settings": {
            "quick": args.quick,
            "model": MODEL,
            "replicas": args.replica_list,
            "rounds": args.rounds,
            "direct": not args.no_direct,
            "concurrency": args.concurrency,
            "measurement_interval_ms": args.measurement_interval,
            "max_trials": args.max_trials,
            "stability_percentage": args.stability_percentage,
            "warmup_s": args.warmup_s,
            "retries": args.retries,
            "disturbed_cores": args.disturbed_cores,
            "balance": args.balance,
            "db_pool_max_size": args.pool_size,
            "meters": "cpu-model",
        },
        "summary": rows,
        "table_markdown": table,
        "runs": bench.runs,
    }
    out = args.results_dir / f"fleet-{stamp}{'-quick' if args.quick else ''}.json"
    write_json(out, doc, indent=1)
    print()
    print(
        f"fleet through HAProxy ({meta.get('haproxy_version', '?').split(' - ')[0]}), {MODEL}, concurrency "
        f"{args.concurrency}, commit {meta['git_commit'][:10]}, {meta['nproc']} CPUs, {stamp}"
        f"{' (QUICK: smoke run, not a measurement)' if args.quick else ''}"
    )
    print()
    print(table)
    print()
    ledger_ok = meta["ledger_requests"] == meta["answered_inferences"]
    print(
        f"ledger: {meta['ledger_requests']} request records in {meta['ledger_chains']} chains for "
        f"{meta['answered_inferences']} inferences the replicas answered (warm-ups included): "
        f"{'equal' if ledger_ok else 'NOT EQUAL'}"
    )
    print(f"raw results: {out}")
    errors = [r for r in bench.runs if r["errors"] and r.get("final")]
    if args.keep_work or errors:
        print(f"work folder kept: {work}")
    else:
        shutil.rmtree(work, ignore_errors=True)
    for r in errors:
        print(f"ERROR round {r['round']} {r['config']}: {r['errors']}", file=sys.stderr)
    if not ledger_ok:
        print("ERROR: the ledger does not hold one record per answered inference", file=sys.stderr)
    return 1 if errors or not ledger_ok else 0


def main(argv: list[str] | None = None) -> int:
    return run_main("fleet", run, parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
