"""scripts/build_gpu_demo_model.py end to end, reduced (width 4, 4 epochs) so that it trains on a CPU.

The build trains the network on scikit-learn's digits upsampled to 64x64, saves FP32, FP16 and BF16
TorchScript files with their configs and held-out accuracies; the repository it writes then loads with the
half-precision models as variants of the FP32 one, and serving the held-out split gives the accuracy the files
state. Skipped where PyTorch is not installed (requirements-torch.txt).
"""

from __future__ import annotations

import importlib
import json
import sys
import threading
from pathlib import Path
from typing import Any

import numpy as np
import pytest

torch = pytest.importorskip(
    "torch", reason="PyTorch is optional (requirements-torch.txt); the GPU demo model's build needs it"
)

from inference.batcher import Pending  # noqa: E402
from inference.config import load_config  # noqa: E402
from inference.repository import GatewayOptions, ModelRepository  # noqa: E402

SCRIPTS = Path(__file__).resolve().parents[2] / "scripts"
WIDTH, EPOCHS = 4, 4
MODELS = ("digits_cnn", "digits_cnn_fp16", "digits_cnn_bf16")
# PyTorch 2.13 marks TorchScript deprecated; it is still Triton's pytorch_libtorch format.
pytestmark = pytest.mark.filterwarnings("ignore:`torch.jit.:DeprecationWarning")


@pytest.fixture(scope="module")
def builder() -> Any:
    sys.path.insert(0, str(SCRIPTS))
    try:
        return importlib.import_module("build_gpu_demo_model")
    finally:
        sys.path.remove(str(SCRIPTS))


@pytest.fixture(scope="module")
def built(builder: Any, tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("gpu_demo")
    assert builder.main([str(out), "--width", str(WIDTH), "--epochs", str(EPOCHS), "--lr", "5e-3"]) == 0
    return out


def expected_flops(width: int, side: int = 64) -> int:
    """2 x multiply-adds: two 3x3 convolutions a block at side, side/2, side/4, side/8; the linear layer."""
    channels = [1, width, 2 * width, 4 * width, 8 * width]
    total = 0
    for block in range(4):
        pixels = (side >> block) ** 2
        c_in, c_out = channels[block], channels[block + 1]
        total += 2 * 9 * pixels * (c_in * c_out + c_out * c_out)
    return total + 2 * 8 * width * 10


def test_the_build_writes_each_precision_with_its_file_config_and_held_out_accuracy(built: Path) -> None:
    summary = json.loads((built / "build.json").read_text())
    assert summary["flops_per_inference"] == expected_flops(WIDTH)
    assert summary["image_side"] == 64
    assert len(summary["history"]) == EPOCHS
    assert summary["history"][-1]["loss"] < summary["history"][0]["loss"]  # trained, not a frozen random body
    for name, precision in zip(MODELS, ("fp32", "fp16", "bf16"), strict=True):
        record = json.loads((built / name / "accuracy.json").read_text())
        assert record["model"] == name and record["variant"] == precision
        assert record["n_test"] == 450
        assert record["accuracy"] > 0.8, record
        assert record["correct"] == round(record["accuracy"] * 450)
        spec = load_config(built / name)
        assert spec.platform == "pytorch_libtorch"
        assert spec.parameters["precision"] == precision
        assert float(spec.parameters["accuracy"]) == record["accuracy"]
        assert spec.parameters["flops_per_inference"] == str(expected_flops(WIDTH))
        assert (built / name / "1" / "model.pt").stat().st_size > 0
        saved = torch.jit.load(str(built / name / "1" / "model.pt"))
        assert {p.dtype for p in saved.parameters()} == {
            {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}[precision]
        }
    base = load_config(built / "digits_cnn").parameters
    assert base["accuracy_floor"] == "0.99"
    assert base["variants"] == "digits_cnn_fp16,digits_cnn_bf16"
    for name in MODELS[1:]:
        assert load_config(built / name).parameters["variant_of"] == "digits_cnn"


class Call:
    def __init__(self, x: np.ndarray[Any, Any]) -> None:
        self.inputs = {"input": x}
        self.received_ns = 0
        self.done = threading.Event()
        self.result: Any = None


def deliver(items: list[tuple[Pending, Any]]) -> None:
    for pending, result in items:
        pending.payload.result = result
        pending.payload.done.set()


def test_the_built_repository_serves_the_fp32_model_with_its_half_precision_variants_at_the_stated_accuracy(
    builder: Any, built: Path
) -> None:
    _, x_test, _, y_test = builder.load_split()
    repo = ModelRepository(built, GatewayOptions(), deliver)
    repo.load()
    try:
        for name in MODELS:
            mv = repo.version(name, None)
            labels = []
            for start in range(0, len(x_test), 64):
                call = Call(x_test[start : start + 64])
                assert mv.batcher is not None
                mv.batcher.enqueue(Pending(call, rows=len(call.inputs["input"])))
                assert call.done.wait(30)
                assert call.result["probabilities"].dtype == np.float32
                labels.append(call.result["label"][:, 0])
            accuracy = float((np.concatenate(labels) == y_test).mean())
            assert accuracy == json.loads((built / name / "accuracy.json").read_text())["accuracy"]
        base = repo.version("digits_cnn", None)
        assert base.variant_policy is not None
        fp32 = base.variant_policy.base.accuracy
        usable = {v.label for v in base.variant_policy.eligible}
        for label, name in (("fp16", "digits_cnn_fp16"), ("bf16", "digits_cnn_bf16")):
            accuracy = json.loads((built / name / "accuracy.json").read_text())["accuracy"]
            # A half-precision model is a variant exactly when it is within the floor of the FP32 accuracy.
            assert (label in usable) == (accuracy >= 0.99 * fp32)
    finally:
        repo.stop()
