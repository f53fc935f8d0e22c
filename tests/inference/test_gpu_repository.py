"""bench/gpu_repository serves the demo's linear and digits on a GPU: the same models, only elsewhere.

Its PyTorch code needs CUDA and runs on a GPU machine only (bench/README.md); here, the configurations and
the weights it ships are checked against the demo's, so a GPU benchmark compares like with like.
"""

from __future__ import annotations

import ast
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
from onnx import helper, numpy_helper

from inference.config import load_config

ROOT = Path(__file__).resolve().parents[2]
DEMO = ROOT / "inference" / "demo_repository"
GPU = ROOT / "bench" / "gpu_repository"


def test_the_gpu_models_have_the_demos_inputs_outputs_and_batching_on_a_gpu_instance() -> None:
    for model in ("linear", "digits"):
        demo, gpu = load_config(DEMO / model), load_config(GPU / model)
        assert (gpu.inputs, gpu.outputs, gpu.max_batch_size) == (
            demo.inputs,
            demo.outputs,
            demo.max_batch_size,
        )
        assert gpu.dynamic_batching == demo.dynamic_batching
        assert gpu.backend == "python"
        assert [g["kind"] for g in gpu.config_dict["instance_group"]] == ["KIND_GPU"]
        assert not {"energy_efficiency", "latency_slo_ms"} & gpu.parameters.keys()  # the benchmark sets them


def test_the_gpu_digits_weights_are_the_demos_onnx_file_byte_for_byte() -> None:
    shipped = (GPU / "digits" / "1" / "weights.onnx").read_bytes()
    assert shipped == (DEMO / "digits" / "1" / "model.onnx").read_bytes()
    assert (
        load_config(GPU / "digits").parameters["accuracy"]
        == load_config(DEMO / "digits").parameters["accuracy"]
    )


def test_the_operations_the_gpu_digits_model_runs_give_onnxruntimes_answers() -> None:
    # The GPU model.py runs these steps in PyTorch; the same steps in numpy must match onnxruntime's output,
    # which pins the reading of the graph (Scaler is (x - offset) * scale, both dense layers, softmax).
    path = GPU / "digits" / "1" / "weights.onnx"
    graph = onnx.load(str(path)).graph
    init = {t.name: numpy_helper.to_array(t) for t in graph.initializer}
    scaler = {a.name: helper.get_attribute_value(a) for a in graph.node[0].attribute}
    x = np.random.default_rng(3).uniform(0, 16, size=(200, 64)).astype(np.float32)

    scaled = (x - np.asarray(scaler["offset"], np.float32)) * np.asarray(scaler["scale"], np.float32)
    hidden = np.maximum(scaled @ init["coefficient"] + init["intercepts"].reshape(-1), 0)
    logits = hidden @ init["coefficient1"] + init["intercepts1"].reshape(-1)
    exp = np.exp(logits - logits.max(axis=1, keepdims=True))
    probabilities = exp / exp.sum(axis=1, keepdims=True)
    labels = init["classes"][probabilities.argmax(axis=1)]

    want_p, want_label = ort.InferenceSession(str(path)).run(None, {"input": x})
    np.testing.assert_allclose(probabilities, want_p, atol=1e-5)
    assert (labels.reshape(-1, 1) == want_label).all()


def test_the_gpu_digits_model_accepts_exactly_the_operators_of_the_shipped_graph() -> None:
    # model.py imports torch, which is not installed here: read its EXPECTED_OPS from the source.
    source = (GPU / "digits" / "1" / "model.py").read_text()
    (node,) = [
        n
        for n in ast.parse(source).body
        if isinstance(n, ast.Assign)
        and [t.id for t in n.targets if isinstance(t, ast.Name)] == ["EXPECTED_OPS"]
    ]
    expected = ast.literal_eval(node.value)
    graph = onnx.load(str(GPU / "digits" / "1" / "weights.onnx")).graph
    assert expected == [n.op_type for n in graph.node]
