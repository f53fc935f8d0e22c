"""bench/gpu_serving.py, the GPU measurement of issue 28, prepared on a CPU before a device is lent.

Its arithmetic (the served configs, the alternating plan, each cell's figures, the comparisons and the spread
between rounds) on plain dictionaries; then the whole script in its smoke mode (``--smoke``: a tiny model on
KIND_CPU, a real gateway and ledger, short cells), where PyTorch is installed.
"""

from __future__ import annotations

import importlib
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from inference.config import parse_config_text

ROOT = Path(__file__).resolve().parents[2]
BENCH = ROOT / "bench"

BUILT_CONFIG = """# Built by scripts/build_gpu_demo_model.py
name: "digits_cnn_fp16"
platform: "pytorch_libtorch"
max_batch_size: 64
input [ { name: "input", data_type: TYPE_FP32, dims: [ 64 ] } ]
output [
  { name: "probabilities", data_type: TYPE_FP32, dims: [ 10 ] },
  { name: "label", data_type: TYPE_INT64, dims: [ 1 ] }
]
dynamic_batching {
  preferred_batch_size: [ 32, 64 ]
  max_queue_delay_microseconds: 1000
}
instance_group [ { count: 1, kind: KIND_GPU, gpus: [ 0 ] } ]
parameters: { key: "precision" value: { string_value: "fp16" } }
parameters: { key: "variant" value: { string_value: "fp16" } }
parameters: { key: "accuracy" value: { string_value: "0.98" } }
parameters: { key: "variant_of" value: { string_value: "digits_cnn" } }
"""


@pytest.fixture(scope="module")
def gs() -> Any:
    sys.path.insert(0, str(BENCH))
    try:
        return importlib.import_module("gpu_serving")
    finally:
        sys.path.remove(str(BENCH))


def test_a_served_copy_is_renamed_unlinked_from_its_variants_and_carries_the_knob(gs: Any) -> None:
    text = gs.served_config(BUILT_CONFIG, "cnn_fp16_k0", 0.0, 25.0)
    spec = parse_config_text(text, Path("config.pbtxt"), "cnn_fp16_k0")
    assert spec.name == "cnn_fp16_k0"
    assert "variant_of" not in spec.parameters  # served as itself, never as a stand-in
    assert spec.parameters["precision"] == "fp16"
    assert spec.parameters["energy_efficiency"] == "0"
    assert spec.parameters["latency_slo_ms"] == "25"
    assert [p.device for p in spec.instances] == ["cuda:0"]
    on_cpu = gs.served_config(BUILT_CONFIG, "m", 1.0, 30.0, kind="KIND_CPU")
    assert [p.device for p in parse_config_text(on_cpu, Path("c"), "m").instances] == ["cpu"]


def test_the_plan_runs_every_model_at_every_level_and_reverses_its_order_each_round(gs: Any) -> None:
    plan = gs.cell_plan(3)
    one = [(level, model) for level in ("low", "high") for model in gs.SERVED]
    assert len(plan) == 3 * len(one) == 18
    assert [(lv, m) for r, lv, m in plan if r == 0] == one
    assert [(lv, m) for r, lv, m in plan if r == 1] == one[::-1]
    assert [(lv, m) for r, lv, m in plan if r == 2] == one


def test_a_cells_figures_split_idle_from_the_requests_and_compare_p99_to_the_objective(gs: Any) -> None:
    summary = {"j_per_inference": 0.004, "achieved_rate": 200.0, "p99_ms": 26.0, "mean_batch_rows": 3.0}
    device = {
        "energy_j": 1200.0,
        "idle_j": 900.0,
        "seconds": 10.0,
        "busy_s": 2.0,
        "idle_power_w_min_max": [88, 90],
    }
    f = gs.cell_figures(summary, device, 25.0)
    assert f["j_per_inference_excl_idle"] == 0.004
    assert f["j_per_inference_incl_idle"] == pytest.approx(1200.0 / 10.0 / 200.0)
    assert f["mean_power_w"] == 120.0
    assert f["requests_share_of_energy"] == pytest.approx(0.25)
    assert f["busy_share_of_time"] == pytest.approx(0.2)
    assert f["idle_power_w"] == 90
    assert f["p99_inside_objective"] is False
    empty = gs.cell_figures({"j_per_inference": None, "achieved_rate": 0.0, "p99_ms": None}, {}, 25.0)
    assert empty["j_per_inference_incl_idle"] is None and empty["requests_share_of_energy"] is None


def cell(model: str, level: str, rnd: int, excl: float, incl: float, p99: float = 10.0) -> dict[str, Any]:
    return {
        "model": model,
        "level": level,
        "round": rnd,
        "figures": {"j_per_inference_excl_idle": excl, "j_per_inference_incl_idle": incl, "p99_ms": p99},
    }


def test_the_knob_and_fp16_cells_are_compared_with_fp32_knob_0_per_round_and_pooled(gs: Any) -> None:
    cells = [
        cell("cnn_fp32_k0", "low", 0, 0.010, 0.100),
        cell("cnn_fp32_k1", "low", 0, 0.008, 0.090, p99=20.0),
        cell("cnn_fp16_k0", "low", 0, 0.005, 0.080),
        cell("cnn_fp32_k0", "low", 1, 0.012, 0.110),
        cell("cnn_fp32_k1", "low", 1, 0.006, 0.099, p99=22.0),
    ]
    rows = {(r["model"], r["level"]): r for r in gs.comparisons(cells)}
    knob = rows[("cnn_fp32_k1", "low")]
    assert knob["rounds"] == 2
    assert knob["j_per_inference_excl_idle_change_rounds"] == pytest.approx([-0.2, -0.5])
    assert knob["j_per_inference_excl_idle_change_pooled"] == pytest.approx(0.007 / 0.011 - 1)
    assert knob["j_per_inference_excl_idle_change_spread"] == pytest.approx(0.3)
    assert knob["j_per_inference_incl_idle_change_rounds"] == pytest.approx([-0.1, -0.1])
    assert knob["p99_ms_worst"] == 22.0
    fp16 = rows[("cnn_fp16_k0", "low")]
    assert fp16["rounds"] == 1  # round 1 has no FP16 cell
    assert fp16["j_per_inference_excl_idle_change_pooled"] == pytest.approx(-0.5)
    assert fp16["j_per_inference_excl_idle_change_spread"] is None
    assert rows[("cnn_fp16_k0", "high")]["rounds"] == 0


def test_the_spread_between_rounds_is_per_model_and_level(gs: Any) -> None:
    cells = [cell("cnn_fp32_k0", "low", 0, 0.009, 0.1), cell("cnn_fp32_k0", "low", 1, 0.011, 0.1)]
    (row,) = gs.round_spread(cells)
    assert row["cells"] == 2
    assert row["j_per_inference_excl_idle_mean"] == pytest.approx(0.010)
    assert row["j_per_inference_excl_idle_spread"] == pytest.approx(0.2)
    assert row["j_per_inference_incl_idle_spread"] == 0.0


def test_smoke_mode_takes_the_small_settings_and_the_full_run_the_device_ones(gs: Any) -> None:
    smoke = gs.parse_args(["--smoke"])
    assert (smoke.width, smoke.epochs, smoke.rates, smoke.gpu_check_s) == (4, 3, [20.0, 60.0], 1.0)
    full = gs.parse_args([])
    assert (full.width, full.epochs, full.rates, full.rounds, full.gpu_check_s) == (
        128,
        20,
        [200.0, 1200.0],
        2,
        20.0,
    )
    assert full.budget_s <= 480  # the issue: JSON within 8 minutes
    with pytest.raises(SystemExit):
        gs.parse_args(["--rates", "100"])


def test_the_smoke_run_serves_every_cell_through_the_gateway_and_writes_its_json(tmp_path: Path) -> None:
    pytest.importorskip(
        "torch", reason="PyTorch is optional (requirements-torch.txt); the smoke run builds a model"
    )
    if os.environ.get("DATABASE_URL"):
        pytest.skip(
            "the smoke run keeps its own SQLite ledger whatever the suite's database: it runs on the SQLite pass"
        )
    env = {k: v for k, v in os.environ.items() if k != "DATABASE_URL"}
    cmd = [sys.executable, str(BENCH / "gpu_serving.py"), "--smoke", "--results-dir", str(tmp_path)]
    cmd += ["--epochs", "1", "--rounds", "1", "--seconds", "1", "--warmup", "0.5", "--settle", "1"]
    proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=400)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    (path,) = tmp_path.glob("gpu_serving-*-smoke.json")
    doc = json.loads(path.read_text())
    assert doc["failures"] == []
    assert [(c["level"], c["model"]) for c in doc["cells"]] == [(lv, m) for _, lv, m in _plan(1)]
    for c in doc["cells"]:
        s, f = c["summary"], c["figures"]
        assert s["answered"] == s["sent"] > 0 and s["energy_final"] == s["answered"]
        assert f["j_per_inference_excl_idle"] > 0 and f["j_per_inference_incl_idle"] > 0
        assert 0 < f["requests_share_of_energy"] <= 1
    assert all(m.endswith("(modelled)") for m in doc["methods"])  # no NVML here: the CPU model meters
    assert {r["model"] for r in doc["comparisons"]} == {"cnn_fp32_k1", "cnn_fp16_k0"}
    assert doc["build"]["models"]["digits_cnn_fp16"]["variant"] == "fp16"
    assert doc["build"]["models"]["digits_cnn"]["batch32_ms_median"] > 0
    assert (
        set(doc["compute_infer_ms_by_batch_size"])
        == set(doc["configs"])
        == {"cnn_fp32_k0", "cnn_fp32_k1", "cnn_fp16_k0"}
    )
    assert "| comparison |" in proc.stdout
    # gpu_check ran once the cells were done; without NVML it says why it skipped and exits 0.
    assert doc["gpu_check"]["status"] == 0 and "gpu_check: skipped" in doc["gpu_check"]["output"]


def _plan(rounds: int) -> list[tuple[int, str, str]]:
    sys.path.insert(0, str(BENCH))
    try:
        return list(importlib.import_module("gpu_serving").cell_plan(rounds))
    finally:
        sys.path.remove(str(BENCH))
