"""Compare our inference gateway with a real Triton 2.51 on the same machine, in one run.

Usage (from the repository root)::

    .venv/bin/python bench/compare_triton.py            # full run: about 4 minutes a protocol on a quiet machine
    .venv/bin/python bench/compare_triton.py --quick    # smoke run, about 1 minute a protocol
    .venv/bin/python bench/compare_triton.py --protocols grpc   # one protocol only (http or grpc)

What it does, in this order:

1. installs tritonserver 2.51 and perf_analyzer 2.41 with the Triton reference's ``setup.sh`` (``CARBONLEDGER_TRITON_REFERENCE``) into a
   cache folder (``var/triton`` by default, reused when already there; ``--triton-dir``);
2. builds a model repository for our gateway (``linear`` copied from ``inference/demo_repository``, and
   ``linear_nobatch``: the same without ``dynamic_batching``), a throw-away SQLite database with an
   organization and an API key, and starts the real Triton (on the reference's ``models``)
   and our gateway (``manage.py serve``) on free loopback ports, both at once, and waits until both are ready;
3. checks that both servers answer the same ``y = x @ W + b`` as a numpy reference (JSON protocol);
4. drives each server with Triton's own C++ load generator, perf_analyzer (closed loop, binary tensors,
   batch 1 per request), over HTTP and over gRPC (``-i grpc``: Triton's gRPC port and ours,
   ``CARBONLEDGER_GRPC_PORT``; ``--protocols``), on every model and concurrency, alternating which server goes first
   from one configuration to the next (ABBA) so slow drift of the shared machine hits both alike.
   perf_analyzer validates every response byte for byte against ``validation_data`` (one-hot inputs,
   whose outputs are exact in float32 whatever the batch), so a wrong or mixed-up row is an error;
5. stops both servers (SIGTERM to their process groups, SIGKILL after a grace period; also at exit and
   on SIGTERM/SIGINT), writes the raw results to ``bench/results/compare_triton-<UTC>.json`` and
   ``bench/results/compare_triton-latest.json`` (``...-quick.json`` for ``--quick``, so a smoke run never
   replaces the latest full run; ``...-diag...`` with ``--ours-env``) and prints a markdown table.

Each run also records the CPU each server's process tree, perf_analyzer and everything else on the machine
used while it ran (``server_cpu_cores``, ``perf_analyzer_cpu_cores``, ``other_cpu_cores``), and, before the
servers start, what waking a blocked thread costs on the host (``meta.wakeup_probe``, ``common.wakeup_probe``).

Stability: perf_analyzer's default criterion (average latency and throughput of the last three windows
within ``--stability-percentage``); p50/p99 are read from its report, which merges those windows.
Stabilizing on p99 (``--percentile=99``) is not the default: on a shared 2-core machine it does not
converge within 4-6 windows for either server; ``--stability-percentile 99`` switches to it.

Other people's load on the 2 shared cores lands on whichever server is being measured. Before each
measurement the script waits (up to ``--quiet-wait`` s) for the rest of the machine to use under
``--disturbed-cores``; a measurement during which others used more is marked disturbed. A disturbed or
unstable measurement is run again (up to ``--retries`` times, within ``--time-budget``) and the best attempt
is kept: stable first, then least disturbed. An unstable one keeps the mean throughput of its last passes,
without percentiles. A server that died is restarted (at most 3 times) and the measurement repeated.
Triton is started from a private folder that links the cached venv: ``start_triton.sh`` rewrites
``DIR/backends`` in place with ``cp``, which kills (SIGBUS) any Triton already running from the same DIR.

Exit status: 0 when every measurement ran without errors, 1 when perf_analyzer reported an error (such as
a response that failed validation) or a measurement failed, 2 when set-up failed.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import (
    LIVE_CLIENTS,
    REPO,
    RESULTS_DIR,
    SCRUBBED_ENV,
    TRITON_REFERENCE,
    Server,
    SetupError,
    children_cpu_seconds,
    create_bench_key,
    fmt,
    free_port_block,
    gateway_env,
    group_cpu_seconds,
    http,
    log,
    machine_busy_cores,
    machine_busy_ticks,
    machine_info,
    run_main,
    serve_argv,
    tail,
    utc_stamp,
    wait_ready,
    wakeup_probe,
    write_json,
)

DEMO_LINEAR = REPO / "inference" / "demo_repository" / "linear"
SERVERS = ("triton", "ours")
DEFAULT_MODELS = ("linear", "linear_nobatch")
DEFAULT_CONCURRENCY = (1, 8, 32)
PROTOCOLS = ("http", "grpc")


# -- set-up -----------------------------------------------------------------------------------------------


def ensure_triton(triton_dir: Path) -> dict[str, str]:
    """Install Triton + perf_analyzer with the shared setup.sh unless triton_dir already holds them."""
    pa = triton_dir / "perf_analyzer"
    needed = [pa, triton_dir / "pa_libs" / "libb64.so.0d", triton_dir / "venv" / "bin" / "python"]
    if all(p.exists() for p in needed) and list(triton_dir.glob("venv/lib/python3*/site-packages/pytriton")):
        log(f"reusing Triton + perf_analyzer in {triton_dir}")
    else:
        setup = TRITON_REFERENCE / "setup.sh"
        if not setup.exists():
            raise SetupError(
                f"{setup} is missing: set CARBONLEDGER_TRITON_REFERENCE to the Triton reference folder"
            )
        try:
            triton_dir.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise SetupError(f"cannot create the Triton cache folder {triton_dir}: {exc}") from None
        setup_log = triton_dir / "setup.log"
        log(f"installing Triton 2.51 + perf_analyzer 2.41 into {triton_dir} (about 30 s; log {setup_log})")
        env = {k: v for k, v in os.environ.items() if k != "VIRTUAL_ENV"}
        try:
            with setup_log.open("wb") as out:
                rc = subprocess.run(
                    ["bash", str(setup), str(triton_dir)],
                    stdout=out,
                    stderr=subprocess.STDOUT,
                    env=env,
                    timeout=600,
                ).returncode
        except subprocess.TimeoutExpired:
            raise SetupError(f"setup.sh took over 10 minutes; see {setup_log}") from None
        missing = [str(p) for p in needed if not p.exists()]
        if rc != 0 or missing:
            raise SetupError(
                f"setup.sh failed (status {rc}{', missing ' + ', '.join(missing) if missing else ''}); "
                f"last lines of {setup_log}:\n{tail(setup_log)}\n"
                "It needs python3 with venv, and pip access to nvidia-pytriton==0.7.0 and tritonclient==2.41.0."
            )
    pa_env = dict(os.environ, LD_LIBRARY_PATH=str(triton_dir / "pa_libs"))
    probe = subprocess.run([str(pa), "--help"], capture_output=True, env=pa_env, timeout=30)
    help_text = (probe.stdout + probe.stderr).decode(errors="replace")
    if "-H <HTTP header>" not in help_text:
        raise SetupError(
            f"{pa} does not run or has no -H option (needed for the Authorization header); output:\n"
            f"{help_text[-2000:]}"
        )
    wheel = next(iter(sorted(triton_dir.glob("dl/tritonclient-*.whl"))), None)
    pa_version = wheel.name.split("-")[1] if wheel else "?"
    tpy = subprocess.run(
        [str(triton_dir / "venv" / "bin" / "python"), "-c", "import sys; print(sys.version.split()[0])"],
        capture_output=True,
        text=True,
        timeout=30,
    ).stdout.strip()
    return {"perf_analyzer_version": pa_version, "triton_venv_python": tpy}


def reference_weights() -> tuple[Any, Any]:
    """W and b of the reference model (the Triton reference's models/linear/1/model.py)."""
    import numpy as np

    rng = np.random.default_rng(0)
    w = rng.standard_normal((256, 256), dtype=np.float32) / 16.0
    b = rng.standard_normal((256,), dtype=np.float32)
    return w, b


def write_validation_data(path: Path, steps: int = 17) -> None:
    """perf_analyzer input data: one-hot rows (scaled by 1, 2 or 4) with their exact expected outputs.

    x = s * e_k gives y = s * W[k] + b exactly in float32, whatever BLAS kernel or batch size computes it,
    so perf_analyzer can compare the response bytes. Every step has a different k: a row delivered to the
    wrong request fails. The step count is prime so that every perf_analyzer thread (each advances by the
    number of threads) cycles through all steps.
    """
    import numpy as np

    w, b = reference_weights()
    data, expected = [], []
    for i in range(steps):
        k = (i * 15 + 3) % 256
        x = np.zeros(256, np.float32)
        x[k] = float(2 ** (i % 3))
        y = (x @ w + b).astype(np.float32)
        assert np.array_equal(y, (x[k] * w[k] + b).astype(np.float32))
        data.append({"x": {"content": [float(v) for v in x], "shape": [256]}})
        expected.append({"y": {"content": [float(v) for v in y], "shape": [256]}})
    path.write_text(json.dumps({"data": data, "validation_data": expected}))


def build_our_repository(root: Path, models: list[str]) -> None:
    if not (DEMO_LINEAR / "config.pbtxt").exists():
        raise SetupError(f"{DEMO_LINEAR} is missing")
    shutil.copytree(DEMO_LINEAR, root / "linear")
    nobatch = root / "linear_nobatch"
    (nobatch / "1").mkdir(parents=True)
    shutil.copy2(DEMO_LINEAR / "1" / "model.py", nobatch / "1" / "model.py")
    config = (DEMO_LINEAR / "config.pbtxt").read_text()
    config, n = re.subn(r'^name:\s*"linear"\s*$', 'name: "linear_nobatch"', config, count=1, flags=re.M)
    config, m = re.subn(r"^dynamic_batching\s*\{.*?^\}\s*$\n?", "", config, count=1, flags=re.M | re.S)
    if n != 1 or m != 1:
        raise SetupError(
            f"could not derive linear_nobatch from {DEMO_LINEAR / 'config.pbtxt'} (layout changed?)"
        )
    (nobatch / "config.pbtxt").write_text(config)
    for name in models:
        if not (root / name / "config.pbtxt").exists():
            raise SetupError(f"model {name!r} is not one this benchmark builds ({', '.join(DEFAULT_MODELS)})")


def check_answers(servers: list[Server], headers: dict[str, str], models: list[str]) -> dict[str, Any]:
    """JSON-protocol inference on random rows, compared with numpy and between the servers."""
    import numpy as np

    w, b = reference_weights()
    x = np.random.default_rng(1).standard_normal((3, 256), dtype=np.float32)
    ref = x.astype(np.float64) @ w.astype(np.float64) + b
    body = json.dumps(
        {"inputs": [{"name": "x", "shape": [3, 256], "datatype": "FP32", "data": x.ravel().tolist()}]}
    ).encode()
    out: dict[str, Any] = {}
    answers: dict[tuple[str, str], Any] = {}
    for server in servers:
        for model in models:
            url = f"http://127.0.0.1:{server.port}/v2/models/{model}/infer"
            status, raw = http("POST", url, body, {**headers, "Content-Type": "application/json"}, timeout=10)
            if status != 200:
                raise SetupError(f"{server.name} answered {status} to a JSON infer on {model}: {raw[:500]!r}")
            doc = json.loads(raw)
            y = np.asarray(next(o for o in doc["outputs"] if o["name"] == "y")["data"], np.float32).reshape(
                3, 256
            )
            err = float(np.max(np.abs(y - ref)))
            if err > 1e-3:
                raise SetupError(f"{server.name} computes a different {model}: max |y - reference| = {err:g}")
            answers[(server.name, model)] = y
            out[f"{server.name}/{model}/max_abs_err_vs_numpy"] = err
    for model in models:
        if ("triton", model) in answers and ("ours", model) in answers:
            diff = np.abs(answers[("triton", model)] - answers[("ours", model)])
            out[f"{model}/max_abs_diff_triton_vs_ours"] = float(np.max(diff))
    return out


def check_grpc_answers(
    grpc_ports: dict[str, int], headers: dict[str, str], models: list[str]
) -> dict[str, Any]:
    """The same check over gRPC (tritonclient.grpc, raw tensors), each server on its gRPC port."""
    import numpy as np
    import tritonclient.grpc as grpcclient

    w, b = reference_weights()
    x = np.random.default_rng(2).standard_normal((3, 256), dtype=np.float32)
    ref = x.astype(np.float64) @ w.astype(np.float64) + b
    out: dict[str, Any] = {}
    for name, port in grpc_ports.items():
        with grpcclient.InferenceServerClient(f"127.0.0.1:{port}") as client:
            for model in models:
                tensor = grpcclient.InferInput("x", [3, 256], "FP32")
                tensor.set_data_from_numpy(x)
                try:
                    y = client.infer(model, [tensor], headers=grpc_metadata(name, headers)).as_numpy("y")
                except Exception as exc:
                    raise SetupError(f"{name} refused a gRPC infer on {model}: {exc}") from None
                err = float(np.max(np.abs(y - ref)))
                if err > 1e-3:
                    raise SetupError(
                        f"{name} computes a different {model} over gRPC: max |y - reference| = {err:g}"
                    )
                out[f"{name}/{model}/grpc_max_abs_err_vs_numpy"] = err
    return out


def grpc_metadata(server: str, headers: dict[str, str]) -> dict[str, str]:
    """gRPC metadata keys are lower-case: perf_analyzer's gRPC client aborts on ``Authorization``."""
    return {k.lower(): v for k, v in headers.items()} if server == "ours" else {}


def wait_grpc_ready(name: str, port: int, timeout_s: float = 30.0) -> None:
    """Until ServerReady over gRPC says ready (no key needed, as for /v2/health/ready)."""
    import tritonclient.grpc as grpcclient

    deadline = time.monotonic() + timeout_s
    with grpcclient.InferenceServerClient(f"127.0.0.1:{port}") as client:
        while True:
            try:
                if client.is_server_ready(client_timeout=2.0):
                    return
            except Exception:
                pass
            if time.monotonic() > deadline:
                raise SetupError(f"{name} is not ready over gRPC on 127.0.0.1:{port} after {timeout_s:.0f} s")
            time.sleep(0.25)


# -- perf_analyzer ----------------------------------------------------------------------------------------

_PASS_RE = re.compile(r"Pass \[(\d+)\] throughput: ([\d.]+) infer/sec\. (.*)")
_NUM = r"([\d.]+)"


def _grab(pattern: str, text: str) -> float | None:
    m = re.search(pattern, text)
    return float(m.group(1)) if m else None


# What perf_analyzer prints when no window met its stability criterion.
UNSTABLE_MARKER = "Failed to obtain stable measurement"


def parse_perf_analyzer(stdout: str, csv_path: Path) -> dict[str, Any]:
    res: dict[str, Any] = {}
    passes: list[dict[str, Any]] = []
    for m in _PASS_RE.finditer(stdout):
        lat = _grab(r"latency: (\d+) usec", m.group(3))
        passes.append({"pass": int(m.group(1)), "throughput": float(m.group(2)), "latency_us": lat})
    res["passes"] = passes
    res["stable"] = UNSTABLE_MARKER not in stdout
    res["errors"] = sorted(set(re.findall(r"Thread \[\d+\] had error: (.*)", stdout)))
    for line in stdout.splitlines():
        low = line.lower()
        if (
            ("error" in low or "failed" in low)
            and "had error" not in line
            and line.strip() not in res["errors"]
        ):
            res.setdefault("error_lines", []).append(line.strip())
    if csv_path.exists():
        rows = csv_path.read_text().strip().splitlines()
        if len(rows) >= 2:
            head = rows[0].split(",")
            vals = rows[1].split(",")
            row = dict(zip(head, vals, strict=False))
            res["csv"] = row
            res["throughput"] = float(row["Inferences/Second"])
            for p in ("p50", "p90", "p95", "p99"):
                res[f"{p}_ms"] = float(row[f"{p} latency"]) / 1000.0
            # The server's own timing of a request's model call (each request of a batch is charged the
            # batch's), as both servers report it in their model statistics: a batch's model call, in µs.
            parts = [row.get(f"Server Compute {part}") for part in ("Input", "Infer", "Output")]
            if all(parts):
                res["server_compute_us"] = sum(float(part) for part in parts if part)
    res["avg_latency_ms"] = (lambda v: v / 1000.0 if v is not None else None)(
        _grab(rf"Avg latency: {_NUM} usec", stdout)
    )
    res["client_request_count"] = _grab(rf"Request count: {_NUM}", stdout)
    res["server_inference_count"] = _grab(rf"Inference count: {_NUM}", stdout)
    res["server_execution_count"] = _grab(rf"Execution count: {_NUM}", stdout)
    res["server_success_count"] = _grab(rf"Successful request count: {_NUM}", stdout)
    if res["server_inference_count"] and res["server_execution_count"]:
        res["avg_batch_size"] = res["server_inference_count"] / res["server_execution_count"]
        res.update(batch_cycle(res.get("throughput"), res["avg_batch_size"], res.get("server_compute_us")))
    if "throughput" not in res and passes:
        # Unstable: report the mean of the last three passes, without percentiles.
        last = passes[-3:]
        res["throughput"] = statistics.fmean(p["throughput"] for p in last)
        res["throughput_from"] = f"mean of the last {len(last)} passes (unstable)"
    return res


def batch_cycle(
    throughput: float | None, rows_per_batch: float | None, compute_us: float | None
) -> dict[str, float]:
    """Where a model instance's time goes, for a model served by one instance (``linear``'s count: 1).

    Its batches run one after another, so a batch takes ``rows / throughput`` from its start to the next one's
    start (the cycle), of which the model call (compute input, infer and output, as the server's statistics time
    it) is one part and the rest is the instance's time between batches: the answers going out, the clients'
    next requests coming in, and the next batch being formed and started."""
    if not throughput or not rows_per_batch:
        return {}
    cycle_ms = rows_per_batch / throughput * 1000.0
    out = {"batch_cycle_ms": cycle_ms}
    if compute_us is not None:
        out["model_call_ms"] = compute_us / 1000.0
        out["between_batches_ms"] = cycle_ms - compute_us / 1000.0
    return out


@dataclass
class Bench:
    args: argparse.Namespace
    triton_dir: Path
    work: Path
    key: str
    input_data: Path
    started: float
    budget_s: float
    servers: list[Server] = field(default_factory=list)
    runs: list[dict[str, Any]] = field(default_factory=list)
    remaining: int = 0
    grpc_ports: dict[str, int] = field(default_factory=dict)  # server name -> its gRPC port
    headers: dict[str, str] = field(default_factory=dict)
    events: list[str] = field(default_factory=list)
    round: int = 0  # the round being measured (--rounds)

    def ensure_alive(self, server: Server) -> str | None:
        """Restart a server that died (at most 3 times); returns an error message if it cannot be."""
        if server.alive():
            return None
        status = server.proc.returncode if server.proc else "?"
        if server.restarts >= 3:
            return f"{server.name} is down (status {status}) and was restarted 3 times already"
        event = f"{time.strftime('%H:%M:%S')} {server.name} had exited (status {status}); restarted"
        log(f"  {event}; last lines of its log:\n{tail(server.log_path, 8)}")
        server.stop()
        server.restarts += 1
        server.start()
        try:
            wait_ready(server, self.headers, self.args.model_list)
        except SetupError as exc:
            self.events.append(f"{event}, but it did not come back")
            return str(exc)
        self.events.append(event)
        return None

    def perf_analyzer(
        self, server: Server, model: str, concurrency: int, attempt: int, protocol: str = "http"
    ) -> dict[str, Any]:
        a = self.args
        tag = f"{server.name}-{protocol}-{model}-c{concurrency}-a{attempt}"
        port = server.port if protocol == "http" else self.grpc_ports[server.name]
        csv_path = self.work / f"{tag}.csv"
        argv = [
            str(self.triton_dir / "perf_analyzer"),
            "-m", model,
            "-u", f"127.0.0.1:{port}",
            "-i", protocol,
            "-b", "1",
            "--concurrency-range", f"{concurrency}:{concurrency}",
            "--measurement-interval", str(a.measurement_interval),
            "--max-trials", str(a.max_trials),
            "--stability-percentage", str(a.stability_percentage),
            "--input-data", str(self.input_data),
            "-f", str(csv_path),
            "-v",
        ]  # fmt: skip
        if a.stability_percentile:
            argv.append(f"--percentile={a.stability_percentile}")
        if server.name == "ours":
            argv += ["-H", f"{'Authorization' if protocol == 'http' else 'authorization'}: Bearer {self.key}"]
        env = dict(os.environ, LD_LIBRARY_PATH=str(self.triton_dir / "pa_libs"))
        limit = (a.max_trials + 2) * a.measurement_interval / 1000.0 + 30.0
        busy0, total0 = machine_busy_ticks()
        srv0 = {s.name: group_cpu_seconds(s.pgid) for s in self.servers}
        cli0 = children_cpu_seconds()
        t0 = time.monotonic()
        proc = subprocess.Popen(
            argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True
        )
        LIVE_CLIENTS.append(proc)
        try:
            raw, _ = proc.communicate(timeout=limit)
            timed_out = False
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            raw, _ = proc.communicate()
            timed_out = True
        finally:
            LIVE_CLIENTS.remove(proc)
        wall = time.monotonic() - t0
        busy1, total1 = machine_busy_ticks()
        stdout = raw.decode(errors="replace")
        (self.work / f"{tag}.out").write_text(stdout)
        res = parse_perf_analyzer(stdout, csv_path)
        cores = os.cpu_count() or 1
        res.update(
            server=server.name,
            protocol=protocol,
            model=model,
            concurrency=concurrency,
            attempt=attempt,
            returncode=proc.returncode,
            timed_out=timed_out,
            wall_s=round(wall, 2),
            command=" ".join(argv).replace(self.key, "<key>"),
            perf_analyzer_cpu_cores=round((children_cpu_seconds() - cli0) / wall, 3),
            server_cpu_cores={
                s.name: round(max(0.0, group_cpu_seconds(s.pgid) - srv0[s.name]) / wall, 3)
                for s in self.servers
            },
            machine_busy_cores=round(cores * (busy1 - busy0) / max(1, total1 - total0), 3),
        )
        res["other_cpu_cores"] = round(
            res["machine_busy_cores"]
            - res["perf_analyzer_cpu_cores"]
            - sum(res["server_cpu_cores"].values()),
            3,
        )
        # Keep the report part of the output (not the model config -v prints first).
        marker = stdout.find("*** Measurement Settings ***")
        res["stdout"] = stdout[marker:] if marker >= 0 else stdout[-4000:]
        if timed_out:
            res["errors"].append(f"perf_analyzer ran past {limit:.0f} s and was killed")
        elif proc.returncode != 0 and res["stable"] and not res["errors"]:
            res["errors"].append(f"perf_analyzer exited with status {proc.returncode}")
        if not server.alive():
            res["errors"].append(f"{server.name} died during the run; see {server.log_path}")
        return res

    def _est_run_s(self) -> float:
        # A measurement that stabilizes at once: three windows plus start-up.
        return 3 * float(self.args.measurement_interval) / 1000.0 + 4.0

    def _slack_s(self) -> float:
        """Seconds of the time budget not needed by the measurements still to do."""
        elapsed = time.monotonic() - self.started
        return self.budget_s - elapsed - self.remaining * self._est_run_s()

    def wait_quiet(self) -> dict[str, Any]:
        """Wait (within the budget) until the rest of the machine is quiet: other people's load on these
        2 shared cores lands on whichever server is being measured."""
        a = self.args
        limit = min(a.quiet_wait, max(0.0, self._slack_s() / max(1, self.remaining)))
        t0 = time.monotonic()
        while True:
            busy = machine_busy_cores(1.0)
            waited = time.monotonic() - t0
            if busy <= a.disturbed_cores or waited >= limit:
                return {"machine_busy_cores_before": round(busy, 3), "waited_for_quiet_s": round(waited, 1)}

    def measure(self, server: Server, model: str, concurrency: int, protocol: str = "http") -> dict[str, Any]:
        """Measure one configuration; re-run it (within the budget) if it did not stabilize or if other
        processes took more than --disturbed-cores of CPU meanwhile. Returns the attempt kept."""
        a = self.args
        attempts: list[dict[str, Any]] = []
        while True:
            down = self.ensure_alive(server)
            if down is not None:
                res = {"server": server.name, "protocol": protocol, "model": model, "concurrency": concurrency,
                       "attempt": len(attempts) + 1, "errors": [down], "stable": False, "passes": [],
                       "other_cpu_cores": 0.0, "disturbed": False, "wall_s": 0.0}  # fmt: skip
                attempts.append(res)
                self.runs.append(res)
                break
            quiet = self.wait_quiet()
            if quiet["machine_busy_cores_before"] > a.disturbed_cores:
                log(
                    f"  machine busy ({quiet['machine_busy_cores_before']:.2f} cores used by others); measuring anyway"
                )
            res = self.perf_analyzer(server, model, concurrency, len(attempts) + 1, protocol)
            res.update(quiet)
            res["disturbed"] = res["other_cpu_cores"] > a.disturbed_cores
            res["final"] = False
            attempts.append(res)
            self.runs.append(res)
            died = not server.alive()
            if (res["errors"] and not died) or (res["stable"] and not res["disturbed"]):
                break
            if len(attempts) > a.retries or self._slack_s() < self._est_run_s():
                break
            if died:
                why = f"failed: {server.name} died"
            elif not res["stable"]:
                why = "did not stabilize"
            else:
                why = f"was disturbed ({res['other_cpu_cores']:.2f} cores used by others)"
            log(f"  {server.name} {protocol} {model} c={concurrency} {why}; running it again")
        self.remaining -= 1
        # Keep the best attempt: without errors, stable, least disturbed (an attempt whose only fault was
        # that its server died is superseded by a later good one; any other error is kept and reported).
        best = min(attempts, key=lambda r: (bool(r["errors"]), not r["stable"], r["other_cpu_cores"]))
        real_errors = [r for r in attempts if r["errors"] and not any("died" in e for e in r["errors"])]
        if real_errors:
            best = real_errors[0]
        best["final"] = True
        for r in attempts:
            r["round"] = self.round
        what = (
            f"{best.get('throughput', float('nan')):.0f}/s p50 {best.get('p50_ms', float('nan')):.2f} ms "
            f"p99 {best.get('p99_ms', float('nan')):.2f} ms"
        )
        flag = "" if best["stable"] else " (UNSTABLE)"
        flag += f" (disturbed: others used {best['other_cpu_cores']:.2f} cores)" if best["disturbed"] else ""
        errs = f" ERRORS: {best['errors']}" if best["errors"] else ""
        log(
            f"  {server.name:6s} {protocol:4s} {model} c={concurrency}: {what}{flag}{errs} [attempt {best['attempt']}, {best['wall_s']:.0f} s]"
        )
        return best


# -- report -----------------------------------------------------------------------------------------------


def _median(values: list[float | None]) -> float | None:
    present = [v for v in values if v is not None]
    return statistics.median(present) if present else None


def summarize(
    runs: list[dict[str, Any]],
    models: list[str],
    concurrencies: list[int],
    protocols: tuple[str, ...] | list[str] = ("http",),
) -> list[dict[str, Any]]:
    """One row per protocol, model and concurrency: each server's median over the rounds (the final attempt of
    each), and the median of the rounds' ratios ours/Triton (each round's pair measured back to back)."""
    final: dict[tuple[str, str, str, int], dict[int, dict[str, Any]]] = {}
    for r in runs:
        if r.get("final"):
            key = (r["server"], r.get("protocol", "http"), r["model"], r["concurrency"])
            final.setdefault(key, {})[r.get("round", 0)] = r
    rows = []
    for protocol, model, c in ((p, m, c) for p in protocols for m in models for c in concurrencies):
        t = final.get(("triton", protocol, model, c), {})
        o = final.get(("ours", protocol, model, c), {})
        row: dict[str, Any] = {"protocol": protocol, "model": model, "concurrency": c, "rounds": len(o)}
        for name, by_round in (("triton", t), ("ours", o)):
            rs = [by_round[k] for k in sorted(by_round)]
            for k in (
                "throughput",
                "p50_ms",
                "p99_ms",
                "avg_batch_size",
                "batch_cycle_ms",
                "model_call_ms",
                "between_batches_ms",
            ):
                row[f"{name}_{k}"] = _median([r.get(k) for r in rs])
            row[f"{name}_stable"] = bool(rs) and all(r.get("stable", False) for r in rs)
            row[f"{name}_errors"] = [e for r in rs for e in r.get("errors", [])] if rs else ["not measured"]
            row[f"{name}_disturbed"] = any(r.get("disturbed", False) for r in rs)
            row[f"{name}_other_cpu_cores"] = _median([r.get("other_cpu_cores") for r in rs])
            row[f"{name}_server_cpu_cores"] = _median([r.get("server_cpu_cores", {}).get(name) for r in rs])
            # CPU of the server's whole process tree per answered request, in microseconds.
            row[f"{name}_cpu_us_per_request"] = _median(
                [
                    r["server_cpu_cores"][name] / r["throughput"] * 1e6
                    if r.get("throughput") and r.get("server_cpu_cores", {}).get(name) is not None
                    else None
                    for r in rs
                ]
            )
        pairs = [(t[k], o[k]) for k in sorted(set(t) & set(o))]
        row["throughput_ratio"] = _median(
            [b["throughput"] / a["throughput"] if a.get("throughput") and b.get("throughput") else None
             for a, b in pairs]
        )  # fmt: skip
        row["p99_ratio"] = _median(
            [b["p99_ms"] / a["p99_ms"] if a.get("p99_ms") and b.get("p99_ms") else None for a, b in pairs]
        )
        row["throughput_ratio_by_round"] = [
            round(b["throughput"] / a["throughput"], 3)
            if a.get("throughput") and b.get("throughput")
            else None
            for a, b in pairs
        ]
        rows.append(row)
    return rows


def markdown_table(rows: list[dict[str, Any]]) -> str:
    out = [
        "| protocol | model | concurrency | Triton infer/s | Triton p50 ms | Triton p99 ms "
        "| ours infer/s | ours p50 ms | ours p99 ms | throughput ours/Triton | p99 ours/Triton "
        "| CPU µs/request Triton | CPU µs/request ours |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        cells = [r.get("protocol", "http"), r["model"], str(r["concurrency"])]
        for name in SERVERS:
            mark = "" if r[f"{name}_stable"] else " (unstable)"
            if r[f"{name}_disturbed"]:
                mark += " (disturbed)"
            if r[f"{name}_errors"]:
                mark += " (errors)"
            cells += [
                fmt(r[f"{name}_throughput"], 0) + mark,
                fmt(r[f"{name}_p50_ms"], 2),
                fmt(r[f"{name}_p99_ms"], 2),
            ]
        cells += [
            "n/a" if r["throughput_ratio"] is None else f"{r['throughput_ratio']:.2f}x",
            "n/a" if r["p99_ratio"] is None else f"{r['p99_ratio']:.2f}x",
            fmt(r.get("triton_cpu_us_per_request"), 0),
            fmt(r.get("ours_cpu_us_per_request"), 0),
        ]
        out.append("| " + " | ".join(cells) + " |")
    return "\n".join(out)


def cycle_needed(row: dict[str, Any], min_ratio: float) -> dict[str, float]:
    """What a throughput target asks of our one model instance, at the batch size and model call it measured.

    ``needed_between_batches_ms`` is the time between batches the target leaves (negative: the target needs
    batches faster than the model call alone allows at that size); ``rows_without_gaps`` the batch size at which
    the model call alone, back to back, reaches the target."""
    triton, rows, call_ms = (
        row.get("triton_throughput"),
        row.get("ours_avg_batch_size"),
        row.get("ours_model_call_ms"),
    )
    if not triton or not rows or call_ms is None:
        return {}
    needed = min_ratio * triton
    cycle_ms = rows / needed * 1000.0
    return {
        "needed_throughput": needed,
        "needed_batch_cycle_ms": cycle_ms,
        "needed_between_batches_ms": cycle_ms - call_ms,
        "rows_without_gaps": needed * call_ms / 1000.0,
    }


def cycle_lines(chk: dict[str, Any], row: dict[str, Any]) -> str:
    """One sentence on the batch cycle a target needs, against each server's own (``cycle_needed``)."""
    if "needed_throughput" not in chk:
        return ""
    rows, call_ms = row["ours_avg_batch_size"], row["ours_model_call_ms"]
    gap = chk["needed_between_batches_ms"]
    head = (
        f"  one instance: {chk['needed_throughput']:,.0f}/s at {rows:.1f} rows a batch is a batch every "
        f"{chk['needed_batch_cycle_ms']:.2f} ms, and the model call takes {call_ms:.2f} ms"
    )
    if gap <= 0:
        return (
            f"{head}: out of reach at this batch size (it would take {chk['rows_without_gaps']:.1f} rows a batch "
            "with no time between batches)"
        )
    return (
        f"{head}: {gap:.2f} ms between batches (ours: {fmt(row.get('ours_between_batches_ms'), 2)} ms, "
        f"Triton's: {fmt(row.get('triton_between_batches_ms'), 2)} ms)"
    )


def cycle_table(rows: list[dict[str, Any]]) -> str:
    """Each server's batch cycle (``batch_cycle``): rows a batch, cycle, model call and the time between."""
    out = [
        "| protocol | model | concurrency | rows a batch Triton / ours | batch cycle ms Triton / ours "
        "| model call ms Triton / ours | between batches ms Triton / ours |",
        "|---|---|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        cells = [r.get("protocol", "http"), r["model"], str(r["concurrency"])]
        for key, digits in (
            ("avg_batch_size", 1),
            ("batch_cycle_ms", 2),
            ("model_call_ms", 2),
            ("between_batches_ms", 2),
        ):
            cells.append(f"{fmt(r.get(f'triton_{key}'), digits)} / {fmt(r.get(f'ours_{key}'), digits)}")
        out.append("| " + " | ".join(cells) + " |")
    return "\n".join(out)


def targets(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """The issue's targets: throughput >= Triton's at concurrency 8 and 32, p99 <= Triton's."""
    checks = []
    for r in rows:
        if r["concurrency"] in (8, 32):
            checks.append(
                {
                    "protocol": r.get("protocol", "http"),
                    "model": r["model"],
                    "concurrency": r["concurrency"],
                    "throughput_at_least_triton": None
                    if r["throughput_ratio"] is None
                    else r["throughput_ratio"] >= 1.0,
                    "p99_at_most_triton": None if r["p99_ratio"] is None else r["p99_ratio"] <= 1.0,
                }
            )
    aim = next(
        (
            r["throughput_ratio"]
            for r in rows
            if r.get("protocol", "http") == "http" and r["model"] == "linear" and r["concurrency"] == 32
        ),
        None,
    )
    # Issue 27's targets on `linear`, on the medians of the rounds: over HTTP >= 1.4x Triton's throughput at 8
    # and >= 1.8x at 32 with p99 <= 0.7x at both; over gRPC >= 1.0x at 8 and 32.
    goals = {
        ("http", 8): (1.4, 0.7),
        ("http", 32): (1.8, 0.7),
        ("grpc", 8): (1.0, None),
        ("grpc", 32): (1.0, None),
    }
    issue27 = []
    for r in rows:
        goal = goals.get((r.get("protocol", "http"), r["concurrency"]))
        if r["model"] != "linear" or goal is None:
            continue
        min_ratio, max_p99 = goal
        met = r["throughput_ratio"] is not None and r["throughput_ratio"] >= min_ratio
        if max_p99 is not None:
            met = met and r["p99_ratio"] is not None and r["p99_ratio"] <= max_p99
        issue27.append(
            {
                "protocol": r.get("protocol", "http"),
                "concurrency": r["concurrency"],
                "throughput_ratio": r["throughput_ratio"],
                "min_throughput_ratio": min_ratio,
                "p99_ratio": r["p99_ratio"],
                "max_p99_ratio": max_p99,
                "met": met,
                **cycle_needed(r, min_ratio),
            }
        )
    return {
        "checks": checks,
        "architecture_aim_linear_c32_ratio": 1.8,
        "linear_c32_ratio": aim,
        "issue27": issue27,
    }


# -- main -------------------------------------------------------------------------------------------------


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawTextHelpFormatter
    )
    p.add_argument(
        "--triton-dir", type=Path, default=REPO / "var" / "triton", help="install cache (default var/triton)"
    )
    p.add_argument("--quick", action="store_true", help="smoke run: 1 s windows, at most 3 per measurement")
    p.add_argument(
        "--concurrency", default=",".join(map(str, DEFAULT_CONCURRENCY)), help="comma list (default 1,8,32)"
    )
    p.add_argument(
        "--models", default=",".join(DEFAULT_MODELS), help="comma list (default linear,linear_nobatch)"
    )
    p.add_argument(
        "--protocols",
        default=",".join(PROTOCOLS),
        help="comma list of http, grpc (default: both, in one run)",
    )
    p.add_argument(
        "--measurement-interval", type=int, default=None, help="ms per window (default 5000; quick 1000)"
    )
    p.add_argument(
        "--max-trials", type=int, default=None, help="windows per measurement (default 6; quick 3)"
    )
    p.add_argument(
        "--rounds", type=int, default=1, help="times the whole set is measured, alternating (default 1)"
    )
    p.add_argument("--stability-percentage", type=int, default=20)
    p.add_argument(
        "--stability-percentile",
        type=int,
        default=None,
        help="stabilize on this latency percentile (e.g. 99)",
    )
    p.add_argument(
        "--retries",
        type=int,
        default=2,
        help="re-runs of a measurement that was unstable or disturbed (default 2)",
    )
    p.add_argument(
        "--disturbed-cores",
        type=float,
        default=0.3,
        help="CPU (in cores) other processes may use during a measurement before it counts as disturbed (0.3)",
    )
    p.add_argument(
        "--quiet-wait",
        type=float,
        default=20.0,
        help="max seconds to wait for a quiet machine before each run (20)",
    )
    p.add_argument(
        "--time-budget",
        type=float,
        default=None,
        help="seconds; no re-runs past it (default 540 a protocol)",
    )
    p.add_argument(
        "--ours-env",
        action="append",
        default=[],
        metavar="NAME=VALUE",
        help="extra environment for our gateway, for diagnostics (e.g. LEDGER_ENABLED=false); recorded",
    )
    p.add_argument("--results-dir", type=Path, default=RESULTS_DIR)
    p.add_argument(
        "--keep-work", action="store_true", help="keep the temporary folder (logs, perf_analyzer output)"
    )
    args = p.parse_args(argv)
    args.measurement_interval = args.measurement_interval or (1000 if args.quick else 5000)
    args.max_trials = args.max_trials or (3 if args.quick else 6)
    try:
        args.concurrency_list = [int(c) for c in args.concurrency.split(",") if c.strip()]
    except ValueError:
        p.error(f"--concurrency must be a comma-separated list of integers, got {args.concurrency!r}")
    if not args.concurrency_list or min(args.concurrency_list) < 1:
        p.error("--concurrency needs at least one value, each >= 1")
    args.ours_env_map = {}
    for item in args.ours_env:
        name, sep, value = item.partition("=")
        if not sep or not name:
            p.error(f"--ours-env wants NAME=VALUE, got {item!r}")
        args.ours_env_map[name] = value
    args.model_list = [m.strip() for m in args.models.split(",") if m.strip()]
    args.protocol_list = [x.strip() for x in args.protocols.split(",") if x.strip()]
    if not args.protocol_list or set(args.protocol_list) - set(PROTOCOLS):
        p.error(f"--protocols: choose among {', '.join(PROTOCOLS)}")
    args.time_budget = args.time_budget or 540.0 * len(args.protocol_list) * args.rounds
    unknown = set(args.model_list) - set(DEFAULT_MODELS)
    if unknown or not args.model_list:
        p.error(f"--models: choose among {', '.join(DEFAULT_MODELS)}")
    return args


def run(args: argparse.Namespace) -> int:
    started = time.monotonic()
    stamp = utc_stamp()
    triton_dir = args.triton_dir.resolve()
    work = Path(tempfile.mkdtemp(prefix="compare_triton-"))
    meta: dict[str, Any] = {"started_utc": stamp, **machine_info()}
    log(f"work folder {work}")
    servers: list[Server] = []
    try:
        meta.update(ensure_triton(triton_dir))
        # Before any server runs: the host's wake-up cost, one of the costs in a closed loop's turn-around that
        # differ between hosts, so runs on different hosts can be told apart.
        meta["wakeup_probe"] = wakeup_probe()
        log(f"wake-up probe: {meta['wakeup_probe']}")
        # Our gateway: its own repository, database and key.
        models_dir = work / "models"
        models_dir.mkdir()
        build_our_repository(models_dir, args.model_list)
        env = gateway_env(work / "var", models_dir, **args.ours_env_map)
        log("preparing our gateway: migrate, organization, API key")
        key = create_bench_key(env)
        input_data = work / "validation_data.json"
        write_validation_data(input_data)

        t_port = free_port_block(3)
        o_port = free_port_block(1)
        while t_port <= o_port < t_port + 3:
            o_port = free_port_block(1)
        o_grpc = free_port_block(1)
        while t_port <= o_grpc < t_port + 3 or o_grpc == o_port:
            o_grpc = free_port_block(1)
        env["CARBONLEDGER_GRPC_PORT"] = str(o_grpc)  # Triton's gRPC port is its HTTP port + 1
        tenv = {k: v for k, v in os.environ.items() if k not in SCRUBBED_ENV}
        # start_triton.sh copies the python backend into DIR/backends with cp, which rewrites the files
        # in place: a second start from the same DIR (the test suite's tests/support/triton.py also uses
        # var/triton) crashes a running Triton with SIGBUS. Start from a private DIR that links the venv.
        triton_home = work / "triton-home"
        triton_home.mkdir()
        (triton_home / "venv").symlink_to(triton_dir / "venv")
        triton = Server(
            "triton",
            t_port,
            [
                "bash",
                str(TRITON_REFERENCE / "start_triton.sh"),
                str(triton_home),
                str(TRITON_REFERENCE / "models"),
                str(t_port),
            ],
            tenv,
            work / "triton.log",
        )
        ours = Server("ours", o_port, serve_argv(o_port), env, work / "ours.log")
        servers = [triton, ours]
        headers = {"Authorization": f"Bearer {key}"}
        for s in servers:
            s.start()
        for s in servers:
            wait_ready(s, headers, args.model_list)
            log(f"{s.name} ready (version {s.version})")
        meta["triton_version"] = triton.version
        meta["ours_version"] = ours.version
        meta["answers"] = check_answers(servers, headers, args.model_list)
        grpc_ports = {"triton": t_port + 1, "ours": o_grpc}
        if "grpc" in args.protocol_list:
            for name, port in grpc_ports.items():
                wait_grpc_ready(name, port)
            meta["answers"].update(check_grpc_answers(grpc_ports, headers, args.model_list))
        log(f"answers agree with numpy: {meta['answers']}")
        # CPU the servers burn while idle (Triton's python backend polls).
        idle0 = {s.name: group_cpu_seconds(s.pgid) for s in servers}
        time.sleep(2.0)
        meta["idle_server_cpu_cores"] = {
            s.name: round((group_cpu_seconds(s.pgid) - idle0[s.name]) / 2.0, 3) for s in servers
        }

        bench = Bench(
            args,
            triton_dir,
            work,
            key,
            input_data,
            started,
            args.time_budget,
            servers=servers,
            headers=headers,
            grpc_ports=grpc_ports,
        )
        bench.remaining = (
            2 * args.rounds * len(args.protocol_list) * len(args.model_list) * len(args.concurrency_list)
        )
        i = 0
        for rnd in range(args.rounds):
            bench.round = rnd
            for protocol in args.protocol_list:
                for model in args.model_list:
                    for c in args.concurrency_list:
                        order = [triton, ours] if i % 2 == 0 else [ours, triton]
                        i += 1
                        for s in order:
                            bench.measure(s, model, c, protocol)
    except BaseException:
        # Set-up failure, Ctrl-C, SIGTERM: the servers are stopped below; say where the logs are.
        print(f"compare_triton: logs and perf_analyzer output kept in {work}", file=sys.stderr)
        raise
    finally:
        for s in servers:
            s.stop()
    meta["stopped"] = {s.name: s.stopped_by for s in servers}
    meta["restarts"] = {s.name: s.restarts for s in servers}
    meta["events"] = bench.events
    meta["wall_s"] = round(time.monotonic() - started, 1)

    rows = summarize(bench.runs, args.model_list, args.concurrency_list, args.protocol_list)
    table = markdown_table(rows)
    doc: dict[str, Any] = {
        "meta": meta,
        "settings": {
            "quick": args.quick,
            "ours_extra_env": args.ours_env_map,
            "models": args.model_list,
            "protocols": args.protocol_list,
            "concurrency": args.concurrency_list,
            "measurement_interval_ms": args.measurement_interval,
            "max_trials": args.max_trials,
            "rounds": args.rounds,
            "stability_percentage": args.stability_percentage,
            "stability_metric": f"p{args.stability_percentile} latency"
            if args.stability_percentile
            else "average latency",
            "order": "ABBA: Triton first on even-numbered configurations, ours first on odd ones",
            "input_data": "17 one-hot rows with exact validation_data (perf_analyzer compares response bytes)",
        },
        "summary": rows,
        "targets": targets(rows),
        "table_markdown": table,
        "cycle_table_markdown": cycle_table(rows),
        "runs": bench.runs,
    }
    # A --quick smoke run never replaces the latest full run.
    suffix = ("-quick" if args.quick else "") + ("-diag" if args.ours_env_map else "")
    out = args.results_dir / f"compare_triton-{stamp}{suffix}.json"
    latest = args.results_dir / f"compare_triton-latest{suffix}.json"
    write_json([out, latest], doc, indent=1)
    print()
    print(
        f"Triton {meta.get('triton_version')} vs ours ({meta['git_commit'][:10]}), "
        f"{meta['nproc']} CPUs, Python {meta['python']}, {stamp}, "
        f"loopback round trip {fmt(meta['wakeup_probe'].get('blocking_us'))} µs blocking, "
        f"{fmt(meta['wakeup_probe'].get('polling_us'))} µs polling"
        f"{' (QUICK: smoke run, not a measurement)' if args.quick else ''}"
        f"{f' (DIAGNOSTIC: our gateway ran with {args.ours_env_map})' if args.ours_env_map else ''}"
    )
    print()
    print(table)
    print()
    print(doc["cycle_table_markdown"])
    print()
    tgt = doc["targets"]
    for chk in tgt["checks"]:
        print(
            f"- {chk['protocol']} {chk['model']} c={chk['concurrency']}: "
            f"throughput >= Triton: {chk['throughput_at_least_triton']}, "
            f"p99 <= Triton: {chk['p99_at_most_triton']}"
        )
    for chk in tgt["issue27"]:
        print(
            f"- issue 27, {chk['protocol']} linear c={chk['concurrency']}: {chk['throughput_ratio'] or 0:.2f}x "
            f"(target >= {chk['min_throughput_ratio']}x)"
            + (
                ""
                if chk["max_p99_ratio"] is None
                else f", p99 {chk['p99_ratio'] or 0:.2f}x (<= {chk['max_p99_ratio']}x)"
            )
            + f": {'met' if chk['met'] else 'NOT met'}"
        )
        row = next(
            r
            for r in rows
            if r["model"] == "linear"
            and r.get("protocol", "http") == chk["protocol"]
            and r["concurrency"] == chk["concurrency"]
        )
        line = cycle_lines(chk, row)
        if line:
            print(line)
    if tgt["linear_c32_ratio"] is not None:
        print(
            f"- linear c=32 throughput ratio {tgt['linear_c32_ratio']:.2f}x (architecture's aim: about 1.8x)"
        )
    print(f"\nraw results: {out} (and {latest})")
    errors = [r for r in bench.runs if r["errors"] and r.get("final")]
    if args.keep_work or errors:
        print(f"work folder kept: {work}")
    else:
        shutil.rmtree(work, ignore_errors=True)
    if errors:
        for r in errors:
            print(f"ERROR {r['server']} {r['model']} c={r['concurrency']}: {r['errors']}", file=sys.stderr)
        return 1
    return 0


def main(argv: list[str] | None = None) -> int:
    return run_main("compare_triton", run, parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
