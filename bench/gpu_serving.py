"""A convolutional network served on a GPU through the gateway, metered by NVML (issue 28): joules per inference
from the ledger for the energy-efficiency knob and for FP16 against FP32, in one run of at most 8 minutes.

Usage (from the repository root)::

    python3 bench/gpu_serving.py --results-dir "$OUT"      # on the GPU machine (bench/device/gpu_serving.sh)
    .venv/bin/python bench/gpu_serving.py --smoke          # on a CPU: tiny model, KIND_CPU; not a measurement

What it does:

1. builds ``digits_cnn`` with ``scripts/build_gpu_demo_model.py`` (trained on scikit-learn's digits upsampled to
   64x64; FP32 and FP16 TorchScript, held-out accuracy of each) into a temporary folder;
2. serves three copies of it from one gateway (``manage.py serve``, its own SQLite ledger and API key,
   ``CARBON_AWARE=false``, ``METER_INTERVAL_S=0.6``, the default meters: NVML for the GPU), each with the
   latency objective ``latency_slo_ms``: ``cnn_fp32_k0`` (FP32, ``energy_efficiency`` 0: Triton's batching),
   ``cnn_fp32_k1`` (FP32, knob 1) and ``cnn_fp16_k0`` (the FP16 file, knob 0). The copies declare no
   variants, so FP32 is FP32 whatever the load;
3. after an idle settle (the recorder learns the board's idle power), runs the cells (model x low/high load)
   one at a time, open-loop Poisson load of held-out digits over HTTP/JSON as ``bench/efficiency.py`` sends
   it, every answer's label scored; ``--rounds`` repeats them, the order reversing each round;
4. per cell, from the ledger: joules per inference with idle excluded (the requests' shares) and included (the
   device's metered energy over the cell's intervals / answers), the requests' share of the metered energy
   against the device's busy-time share over the same intervals (the idle balance on a real counter), the
   client's p99 against the objective; then the knob-1 and FP16 cells against ``cnn_fp32_k0`` of the same round
   and level, and how far each cell moves between rounds;
5. runs ``bench/gpu_check.py`` (NVML counter against power integration) once the GPU is idle again;
6. writes ``gpu_serving-<UTC>.json`` (``-smoke`` for ``--smoke``) after every cell, so a run cut short still
   leaves what it measured, and stops starting cells when ``--budget-s`` (default 450 s from its start) would be
   exceeded.

Nothing here needs pip on the GPU machine beyond the wheels bench/README.md lists ("On a GPU").

Exit status: 0 when every cell ran and was recorded, 1 when a cell failed or was skipped for the budget, 2 when
set-up failed.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import gc
import json
import math
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import (
    REPO,
    RESULTS_DIR,
    Server,
    SetupError,
    create_bench_key,
    free_port_block,
    gateway_env,
    http,
    log,
    machine_info,
    run_main,
    serve_argv,
    tail,
    utc_stamp,
    wait_ready,
    write_json,
)
from efficiency import (
    Gateway,
    Workload,
    drive,
    read_batches,
    read_intervals,
    summarize_cell,
    wait_for_ledger,
)

BUILD_SCRIPT = REPO / "scripts" / "build_gpu_demo_model.py"
GPU_CHECK = REPO / "bench" / "gpu_check.py"
BASE = "cnn_fp32_k0"
# name -> (the built model it copies, energy_efficiency)
SERVED: dict[str, tuple[str, float]] = {
    "cnn_fp32_k0": ("digits_cnn", 0.0),
    "cnn_fp32_k1": ("digits_cnn", 1.0),
    "cnn_fp16_k0": ("digits_cnn_fp16", 0.0),
}
LEVELS = ("low", "high")
DROPPED_PARAMETERS = ("accuracy_floor", "variants", "variant_of", "energy_efficiency", "latency_slo_ms")
SHUTDOWN_RESERVE_S = 15.0


def served_config(text: str, name: str, knob: float, slo_ms: float, kind: str | None = None) -> str:
    """A built model's config.pbtxt as one served copy: renamed, without its variant links (each copy serves
    as itself), with the knob and the objective; ``kind`` replaces the instance kind (the smoke run's CPU)."""
    lines = []
    for line in text.splitlines():
        if line.startswith("name:"):
            line = f'name: "{name}"'
        elif any(f'key: "{key}"' in line for key in DROPPED_PARAMETERS):
            continue
        elif kind is not None and line.startswith("instance_group"):
            line = f"instance_group [ {{ count: 1, kind: {kind} }} ]"
        lines.append(line)
    for key, value in (("energy_efficiency", f"{knob:g}"), ("latency_slo_ms", f"{slo_ms:g}")):
        lines.append(f'parameters: {{ key: "{key}" value: {{ string_value: "{value}" }} }}')
    return "\n".join(lines) + "\n"


def cell_plan(rounds: int) -> list[tuple[int, str, str]]:
    """(round, level, model) in run order: every model at each level, the whole order reversed every other
    round, so that slow drift of the board (temperature, clocks) does not always favour the same cell."""
    one = [(level, model) for level in LEVELS for model in SERVED]
    plan = []
    for rnd in range(rounds):
        order = one if rnd % 2 == 0 else list(reversed(one))
        plan += [(rnd, level, model) for level, model in order]
    return plan


def cell_figures(summary: dict[str, Any], device: dict[str, Any], slo_ms: float) -> dict[str, Any]:
    """What the issue asks of one cell, from its summary (efficiency.summarize_cell) and its device intervals
    (efficiency.read_intervals): J/inference without and with idle, p99 against the objective, and the
    requests' share of the metered energy against the device's busy share of the time."""
    energy, seconds = device.get("energy_j") or 0.0, device.get("seconds") or 0.0
    answered_per_s = summary.get("achieved_rate") or 0.0
    incl = energy / seconds / answered_per_s if energy and seconds and answered_per_s else None
    p99 = summary.get("p99_ms")
    return {
        "j_per_inference_excl_idle": summary.get("j_per_inference"),
        "j_per_inference_incl_idle": incl,
        "p99_ms": p99,
        "slo_ms": slo_ms,
        "p99_inside_objective": p99 is not None and p99 <= slo_ms,
        "mean_power_w": energy / seconds if energy and seconds else None,
        "requests_share_of_energy": (energy - device.get("idle_j", 0.0)) / energy if energy else None,
        "busy_share_of_time": device.get("busy_s", 0.0) / seconds if seconds else None,
        "idle_power_w": (device.get("idle_power_w_min_max") or [None])[-1],
        "mean_batch_rows": summary.get("mean_batch_rows"),
        "accuracy": summary.get("accuracy"),
    }


def _ratio(a: float | None, b: float | None) -> float | None:
    return a / b - 1.0 if a is not None and b else None


def comparisons(cells: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The knob-1 and FP16 cells against ``cnn_fp32_k0`` at the same level: per round (the cells of a round ran
    minutes apart at most) and pooled over the rounds (means of the cells)."""
    by_key = {(c["round"], c["level"], c["model"]): c["figures"] for c in cells}
    out = []
    for model, what in (
        ("cnn_fp32_k1", "energy_efficiency 1 vs 0 (FP32)"),
        ("cnn_fp16_k0", "FP16 vs FP32 (knob 0)"),
    ):
        for level in LEVELS:
            rounds = sorted(
                {r for r, lv, m in by_key if lv == level and m == model and (r, lv, BASE) in by_key}
            )
            row: dict[str, Any] = {
                "what": what,
                "model": model,
                "base": BASE,
                "level": level,
                "rounds": len(rounds),
            }
            for metric in ("j_per_inference_excl_idle", "j_per_inference_incl_idle"):
                changes = [
                    _ratio(by_key[(r, level, model)][metric], by_key[(r, level, BASE)][metric])
                    for r in rounds
                ]
                present = [c for c in changes if c is not None]
                row[f"{metric}_change_rounds"] = changes
                mine = [by_key[(r, level, model)][metric] for r in rounds]
                base = [by_key[(r, level, BASE)][metric] for r in rounds]
                row[f"{metric}_change_pooled"] = (
                    _ratio(statistics.fmean(mine), statistics.fmean(base))
                    if rounds and None not in mine and None not in base
                    else None
                )
                row[f"{metric}_change_spread"] = max(present) - min(present) if len(present) > 1 else None
            row["p99_ms_worst"] = max(
                (by_key[(r, level, model)]["p99_ms"] or math.inf for r in rounds), default=None
            )
            row["p99_ms_worst_base"] = max(
                (by_key[(r, level, BASE)]["p99_ms"] or math.inf for r in rounds), default=None
            )
            out.append(row)
    return out


def round_spread(cells: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """How far one cell moves between rounds: per model and level, (max - min) / mean of its J/inference."""
    groups: dict[tuple[str, str], list[dict[str, Any]]] = {}
    for c in cells:
        groups.setdefault((c["model"], c["level"]), []).append(c["figures"])
    out = []
    for (model, level), figs in groups.items():
        row: dict[str, Any] = {"model": model, "level": level, "cells": len(figs)}
        for metric in ("j_per_inference_excl_idle", "j_per_inference_incl_idle"):
            values = [f[metric] for f in figs if f[metric] is not None]
            mean = statistics.fmean(values) if values else None
            row[f"{metric}_mean"] = mean
            row[f"{metric}_spread"] = (max(values) - min(values)) / mean if len(values) > 1 and mean else None
        out.append(row)
    return out


def _mj(v: float | None) -> str:
    return "n/a" if v is None else f"{v * 1000:.3f}"


def _num(v: float | None, spec: str) -> str:
    return "n/a" if v is None else format(v, spec)


def _pct(v: float | None) -> str:
    return "n/a" if v is None else f"{v * 100:+.1f} %"


def markdown(cells: list[dict[str, Any]], compared: list[dict[str, Any]]) -> str:
    out = [
        "| round | level | model | rate (achieved) | mJ/inf excl. idle | mJ/inf incl. idle | mean W | p99 ms (SLO) "
        "| requests' energy share | busy time share | mean batch | accuracy |",
        "|---:|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for c in cells:
        f, s = c["figures"], c["summary"]
        cols = [
            str(c["round"] + 1),
            c["level"],
            c["model"],
            f"{c['rate']:g} ({s['achieved_rate']:.0f})",
            _mj(f["j_per_inference_excl_idle"]),
            _mj(f["j_per_inference_incl_idle"]),
            _num(f["mean_power_w"], ".1f"),
            f"{_num(f['p99_ms'], '.2f')} ({f['slo_ms']:g})",
            _num(f["requests_share_of_energy"], ".3f"),
            _num(f["busy_share_of_time"], ".3f"),
            _num(f["mean_batch_rows"], ".1f"),
            _num(f["accuracy"], ".4f"),
        ]
        out.append("| " + " | ".join(cols) + " |")
    out += [
        "",
        "| comparison | level | rounds | excl. idle, pooled (per round) | incl. idle, pooled (per round) |",
    ]
    out.append("|---|---|---:|---|---|")
    for r in compared:
        cols = []
        for metric in ("j_per_inference_excl_idle", "j_per_inference_incl_idle"):
            rounds = ", ".join(_pct(x) for x in r[f"{metric}_change_rounds"])
            cols.append(f"{_pct(r[f'{metric}_change_pooled'])} ({rounds})")
        out.append(f"| {r['what']} | {r['level']} | {r['rounds']} | {cols[0]} | {cols[1]} |")
    return "\n".join(out)


# -- running it -------------------------------------------------------------------------------------------


def build_model(work: Path, args: argparse.Namespace) -> dict[str, Any]:
    out = work / "built"
    cmd = [
        sys.executable,
        str(BUILD_SCRIPT),
        str(out),
        "--width",
        str(args.width),
        "--epochs",
        str(args.epochs),
        "--precisions",
        "fp32,fp16",
        "--threads",
        str(args.build_threads),
    ]
    if args.smoke:
        cmd += ["--kind", "KIND_CPU", "--device", "cpu"]
    log(f"building the model: {' '.join(cmd[1:])}")
    proc = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=args.budget_s)
    (work / "build.log").write_text(proc.stdout + proc.stderr)
    if proc.returncode != 0:
        raise SetupError(
            f"the model build failed (status {proc.returncode}):\n{(proc.stdout + proc.stderr)[-3000:]}"
        )
    built: dict[str, Any] = json.loads((out / "build.json").read_text())
    return built


def served_repository(work: Path, args: argparse.Namespace) -> tuple[Path, dict[str, str]]:
    root = work / "models"
    configs = {}
    for name, (source, knob) in SERVED.items():
        src = work / "built" / source
        (root / name / "1").mkdir(parents=True)
        shutil.copy2(src / "1" / "model.pt", root / name / "1" / "model.pt")
        shutil.copy2(src / "accuracy.json", root / name / "accuracy.json")
        text = served_config(
            (src / "config.pbtxt").read_text(), name, knob, args.slo_ms, "KIND_CPU" if args.smoke else None
        )
        if not args.smoke and "KIND_GPU" not in text:
            raise SetupError(f"{src / 'config.pbtxt'} is not KIND_GPU: the build saw no CUDA")
        (root / name / "config.pbtxt").write_text(text)
        configs[name] = text
    return root, configs


def start_gateway(work: Path, models: Path, args: argparse.Namespace) -> Gateway:
    var = work / "gateway"
    var.mkdir()
    env = gateway_env(
        var,
        models,
        CARBON_AWARE="false",
        METER_INTERVAL_S=f"{args.meter_interval:g}",
        OPENBLAS_NUM_THREADS=os.environ.get("OPENBLAS_NUM_THREADS", "1"),
        CUDA_DEVICE_ORDER="PCI_BUS_ID",  # CUDA numbers GPUs as NVML does
    )
    key = create_bench_key(env)
    port = free_port_block(1)
    server = Server("gateway", port, serve_argv(port), env, var / "serve.log")
    server.start()
    gateway = Gateway(0.0, "gateway", var, server, key)
    wait_ready(server, {"Authorization": f"Bearer {key}"}, list(SERVED), args.ready_timeout)
    log(f"gateway ready on port {port}")
    return gateway


def measure_cell(
    gateway: Gateway, digits: Workload, model: str, level: str, rnd: int, seed: int, args: argparse.Namespace
) -> dict[str, Any]:
    rate = args.rates[LEVELS.index(level)]
    workload = Workload(model, digits.bodies, digits.expected)
    # The client's cyclic collector could stall its event loop for milliseconds, counted as the server's latency.
    gc.collect()
    gc.disable()
    try:
        samples, _metrics, measured_wall_ns = asyncio.run(
            drive(gateway, workload, rate, args.warmup, args.seconds, seed, args.request_timeout)
        )
    finally:
        gc.enable()
    ids = [s.ledger_id for s in samples if s.measured and s.status == 200 and s.ledger_id]
    ledger, waited = wait_for_ledger(gateway.db_path, ids, args.ledger_timeout)
    batches = read_batches(gateway.db_path, sorted({row[0] for row in ledger.values()}))
    summary = summarize_cell(samples, ledger, batches, args.seconds, args.warmup)
    span = (min(b[4] for b in batches), max(b[5] for b in batches)) if batches else (0, 0)
    device = read_intervals(gateway.db_path, *span, {b[6] for b in batches}) if batches else {}
    cell = {
        "round": rnd,
        "level": level,
        "model": model,
        "rate": rate,
        "seed": seed,
        "measured_from_wall_ns": measured_wall_ns,
        "ledger_wait_s": round(waited, 2),
        "summary": summary,
        "device": device,
        "figures": cell_figures(summary, device, args.slo_ms),
    }
    f = cell["figures"]
    log(
        f"  round {rnd + 1} {level} {rate:g}/s {model}: {summary['achieved_rate']:.0f}/s, "
        f"{_mj(f['j_per_inference_excl_idle'])} mJ/inf excl. idle, {_mj(f['j_per_inference_incl_idle'])} incl., "
        f"p99 {_num(f['p99_ms'], '.2f')} ms, batch {_num(f['mean_batch_rows'], '.2f')}, errors {summary['errors']}, "
        f"methods {device.get('methods')}"
    )
    return cell


def compute_by_batch_size(gateway: Gateway) -> dict[str, dict[str, float]]:
    """Per served model, the gateway's mean compute_infer time (ms) per batch size over the whole run (Triton's
    statistics): how long the device took for a batch of 32, under load."""
    out: dict[str, dict[str, float]] = {}
    for model in SERVED:
        status, body = http(
            "GET",
            f"{gateway.base}/v2/models/{model}/stats",
            headers={"Authorization": f"Bearer {gateway.key}"},
        )
        if status != 200:
            continue
        for stats in json.loads(body).get("model_stats", []):
            out[model] = {
                str(b["batch_size"]): round(b["compute_infer"]["ns"] / b["compute_infer"]["count"] / 1e6, 3)
                for b in stats.get("batch_stats", [])
                if b["compute_infer"]["count"]
            }
    return out


def run_gpu_check(args: argparse.Namespace) -> dict[str, Any]:
    cmd = [sys.executable, str(GPU_CHECK), "--seconds", f"{args.gpu_check_s:g}"]
    log(f"gpu_check: {' '.join(cmd[1:])}")
    try:
        proc = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=args.gpu_check_s + 60)
    except subprocess.TimeoutExpired:
        return {"command": cmd[1:], "status": None, "output": "timed out"}
    return {"command": cmd[1:], "status": proc.returncode, "output": (proc.stdout + proc.stderr)[-4000:]}


def run(args: argparse.Namespace) -> int:
    started = time.monotonic()
    deadline = started + args.budget_s
    stamp = utc_stamp()
    work = Path(tempfile.mkdtemp(prefix="gpu-serving-"))
    out_path = args.results_dir / f"gpu_serving-{stamp}{'-smoke' if args.smoke else ''}.json"
    doc: dict[str, Any] = {
        "meta": {"started_utc": stamp, **machine_info(), "work": str(work)},
        "settings": {
            k: v for k, v in vars(args).items() if k not in {"results_dir"} and not isinstance(v, Path)
        },
        "cells": [],
        "failures": [],
    }
    doc["settings"]["served"] = {k: {"source": s, "energy_efficiency": kn} for k, (s, kn) in SERVED.items()}
    doc["settings"]["j_per_inference"] = {
        "excl_idle": "sum of the measured requests' shares in ledger_batch_energy / requests",
        "incl_idle": "the device's metered energy over the intervals inside the cell's batches / seconds / answers per s",
    }
    gateway: Gateway | None = None
    failures: list[str] = doc["failures"]

    def save() -> None:
        doc["meta"]["wall_s"] = round(time.monotonic() - started, 1)
        doc["comparisons"] = comparisons(doc["cells"])
        doc["round_spread"] = round_spread(doc["cells"])
        write_json(out_path, doc, indent=1)

    log(f"work folder {work}; results {out_path}")
    try:
        digits = Workload.build("digits")  # the held-out split the model's accuracy was measured on
        doc["build"] = build_model(work, args)
        log(
            f"built: {doc['build']['flops_per_inference'] / 1e9:.3f} GFLOP per inference, "
            f"trained in {doc['build']['train_seconds']} s on {doc['build']['train_device']}; "
            + ", ".join(
                f"{m}: accuracy {r['accuracy']:.4f}, batch of 32 {r['batch32_ms_median']} ms"
                for m, r in doc["build"]["models"].items()
            )
        )
        models, doc["configs"] = served_repository(work, args)
        gateway = start_gateway(work, models, args)
        log(f"settling {args.settle:g} s so the recorder learns the idle power")
        time.sleep(args.settle)
        cell_s = args.warmup + args.seconds + 5.0
        for i, (rnd, level, model) in enumerate(cell_plan(args.rounds)):
            left = (
                deadline
                - time.monotonic()
                - SHUTDOWN_RESERVE_S
                - (args.gpu_check_s + 10 if args.gpu_check_s else 0)
            )
            if left < cell_s:
                failures.append(f"round {rnd + 1} {level} {model}: skipped, {left:.0f} s left of the budget")
                continue
            if not gateway.server.alive():
                failures.append(f"the gateway died (see {gateway.server.log_path})")
                log(tail(gateway.server.log_path, 20))
                break
            cell = measure_cell(gateway, digits, model, level, rnd, args.seed * 1000 + i, args)
            s = cell["summary"]
            if not s["answered"]:
                failures.append(f"round {rnd + 1} {level} {model}: no answers ({s['error_examples']})")
            elif s["energy_final"] < s["answered"]:
                failures.append(
                    f"round {rnd + 1} {level} {model}: final energy for {s['energy_final']} of {s['answered']}"
                )
            doc["cells"].append(cell)
            save()
    except BaseException:
        print(f"gpu_serving: logs kept in {work}", file=sys.stderr)
        raise
    finally:
        if gateway is not None:
            with contextlib.suppress(OSError, ValueError, KeyError):
                doc["compute_infer_ms_by_batch_size"] = compute_by_batch_size(gateway)
            gateway.server.stop()
            with contextlib.suppress(OSError):
                doc["serve_log_tail"] = tail(gateway.server.log_path, 40)
    doc["methods"] = sorted({m for c in doc["cells"] for m in c["device"].get("methods", [])})
    if not args.smoke and doc["cells"] and not any("nvml" in m for m in doc["methods"]):
        failures.append(f"the cells were not metered by NVML ({doc['methods']})")
    if args.gpu_check_s > 0:
        doc["gpu_check"] = run_gpu_check(args)
    save()
    print()
    print(
        f"gpu_serving{' (SMOKE: not a measurement)' if args.smoke else ''}: {doc['meta']['cpu_model']}, "
        f"commit {doc['meta']['git_commit'][:10]}, meters {', '.join(doc['methods']) or '?'}, "
        f"{doc['build']['flops_per_inference'] / 1e9:.3f} GFLOP per inference"
    )
    print()
    print(markdown(doc["cells"], doc["comparisons"]))
    for model, by_size in doc.get("compute_infer_ms_by_batch_size", {}).items():
        print(f"{model}: mean compute_infer ms by batch size {by_size}")
    if "gpu_check" in doc:
        print(f"\ngpu_check (status {doc['gpu_check']['status']}):\n{doc['gpu_check']['output']}")
    print(f"\nraw results: {out_path} ({doc['meta']['wall_s']} s)")
    for f in failures:
        print(f"FAILED: {f}", file=sys.stderr)
    if args.keep_work or failures:
        print(f"work folder kept: {work}")
    else:
        shutil.rmtree(work, ignore_errors=True)
    return 1 if failures else 0


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawTextHelpFormatter
    )
    p.add_argument(
        "--smoke",
        "--cpu",
        action="store_true",
        help="on a CPU: a tiny model (width 4, 3 epochs) on KIND_CPU, low rates, short cells; not a measurement",
    )
    p.add_argument("--width", type=int, default=None, help="the network's width (default 128; smoke 4)")
    p.add_argument("--epochs", type=int, default=None, help="training epochs (default 20; smoke 3)")
    p.add_argument("--rates", default=None, help="low,high requests/s (default 200,1200; smoke 20,60)")
    p.add_argument("--slo-ms", type=float, default=25.0, help="latency_slo_ms of every copy (default 25)")
    p.add_argument(
        "--rounds", type=int, default=None, help="rounds of the cells, order reversing (default 2)"
    )
    p.add_argument(
        "--seconds", type=float, default=None, help="measured seconds a cell (default 12; smoke 2)"
    )
    p.add_argument(
        "--warmup", type=float, default=None, help="uncounted seconds before each cell (3; smoke 1)"
    )
    p.add_argument("--settle", type=float, default=None, help="idle seconds after start-up (8; smoke 2)")
    p.add_argument("--meter-interval", type=float, default=0.6, help="METER_INTERVAL_S (0.6)")
    p.add_argument(
        "--budget-s", type=float, default=450.0, help="no cell starts past this many seconds (450)"
    )
    p.add_argument(
        "--gpu-check-s", type=float, default=None, help="gpu_check.py --seconds (20; smoke 1; 0: off)"
    )
    p.add_argument("--ledger-timeout", type=float, default=20.0, help="seconds to wait for final energy (20)")
    p.add_argument("--ready-timeout", type=float, default=180.0, help="seconds for the gateway to load (180)")
    p.add_argument("--request-timeout", type=float, default=30.0)
    p.add_argument("--build-threads", type=int, default=1, help="PyTorch CPU threads of the build (1)")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--results-dir", type=Path, default=RESULTS_DIR)
    p.add_argument("--keep-work", action="store_true", help="keep the temporary folder (logs, database)")
    args = p.parse_args(argv)
    smoke = args.smoke

    def pick(value: Any, full: Any, small: Any) -> Any:
        return value if value is not None else (small if smoke else full)

    args.width = pick(args.width, 128, 4)
    args.epochs = pick(args.epochs, 20, 3)
    args.rounds = pick(args.rounds, 2, 2)
    args.seconds = pick(args.seconds, 12.0, 2.0)
    args.warmup = pick(args.warmup, 3.0, 1.0)
    args.settle = pick(args.settle, 8.0, 2.0)
    args.gpu_check_s = pick(args.gpu_check_s, 20.0, 1.0)
    try:
        rates = [float(r) for r in pick(args.rates, "200,1200", "20,60").split(",")]
    except ValueError:
        p.error(f"--rates: two numbers, low,high; got {args.rates!r}")
    if len(rates) != 2 or min(rates) <= 0:
        p.error(f"--rates: two positive numbers, low,high; got {rates}")
    args.rates = rates
    if args.rounds < 1 or args.seconds <= 0 or args.slo_ms <= 0:
        p.error("--rounds, --seconds and --slo-ms must be positive")
    if args.budget_s <= 0:
        p.error("--budget-s must be a positive number of seconds")
    return args


def main(argv: list[str] | None = None) -> int:
    return run_main("gpu_serving", run, parse_args(argv), "gateway stopped")


if __name__ == "__main__":
    sys.exit(main())
