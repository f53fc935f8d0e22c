"""Checks the ``digits`` / ``digits_int8`` demo models in inference/demo_repository.

The artifacts are produced by inference/demo_repository/build_digits.py; these tests only read them
(no Django, no database).
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from google.protobuf import text_format
from numpy.typing import NDArray
from tritonclient.grpc import model_config_pb2

REPOSITORY = Path(__file__).resolve().parents[2] / "inference" / "demo_repository"
BUILD_SCRIPT = REPOSITORY / "build_digits.py"
MODELS = ["digits", "digits_int8"]
VARIANTS = {"digits": "fp32", "digits_int8": "int8"}


def _load_build_module() -> ModuleType:
    name = "carbonledger_demo_build_digits"
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, BUILD_SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # dataclasses resolve annotations through sys.modules
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def build_digits() -> ModuleType:
    return _load_build_module()


@pytest.fixture(scope="module")
def split(build_digits: ModuleType) -> Any:
    return build_digits.load_split()


def _config(model: str) -> model_config_pb2.ModelConfig:
    config = model_config_pb2.ModelConfig()
    text_format.Parse((REPOSITORY / model / "config.pbtxt").read_text(), config)
    return config


def _report(model: str) -> dict[str, Any]:
    data: dict[str, Any] = json.loads((REPOSITORY / model / "accuracy.json").read_text())
    return data


def _model_path(model: str) -> Path:
    return REPOSITORY / model / "1" / "model.onnx"


def _session(model: str) -> ort.InferenceSession:
    options = ort.SessionOptions()
    options.intra_op_num_threads = 1
    return ort.InferenceSession(str(_model_path(model)), options, providers=["CPUExecutionProvider"])


def _predict(session: ort.InferenceSession, x: NDArray[np.float32]) -> NDArray[np.int64]:
    labels = [session.run(["label"], {"input": x[i : i + 64]})[0].reshape(-1) for i in range(0, len(x), 64)]
    return np.concatenate(labels).astype(np.int64)


@pytest.mark.parametrize("model", MODELS)
def test_config_pbtxt_parses_as_triton_onnx_model_config(model: str) -> None:
    config = _config(model)
    assert config.name == model
    assert config.platform == "onnxruntime_onnx"
    assert config.max_batch_size == 64

    assert [(i.name, i.data_type, list(i.dims)) for i in config.input] == [
        ("input", model_config_pb2.TYPE_FP32, [64])
    ]
    assert [(o.name, o.data_type, list(o.dims)) for o in config.output] == [
        ("probabilities", model_config_pb2.TYPE_FP32, [10]),
        ("label", model_config_pb2.TYPE_INT64, [1]),
    ]
    assert list(config.dynamic_batching.preferred_batch_size) == [16, 64]
    assert config.dynamic_batching.max_queue_delay_microseconds == 1000
    assert [(g.count, g.kind) for g in config.instance_group] == [
        (1, model_config_pb2.ModelInstanceGroup.KIND_CPU)
    ]


@pytest.mark.parametrize("model", MODELS)
def test_config_parameters_describe_variant_and_accuracy(model: str) -> None:
    params = {key: value.string_value for key, value in _config(model).parameters.items()}
    report = _report(model)
    assert params["variant"] == VARIANTS[model]
    assert params["variant_of"] == "digits"
    assert float(params["accuracy"]) == report["accuracy"]
    assert params["accuracy_dataset"] == f"sklearn digits, held-out 25 %, n={report['n_test']}"
    assert params["accuracy_dataset"] == report["dataset"]


@pytest.mark.parametrize("model", MODELS)
def test_onnx_model_inputs_and_outputs_match_config(model: str) -> None:
    session = _session(model)
    inputs = [(i.name, i.type) for i in session.get_inputs()]
    outputs = {o.name: o.type for o in session.get_outputs()}
    assert inputs == [("input", "tensor(float)")]
    assert outputs == {"probabilities": "tensor(float)", "label": "tensor(int64)"}

    graph = onnx.load(str(_model_path(model))).graph
    shapes = {
        v.name: [d.dim_value if d.HasField("dim_value") else None for d in v.type.tensor_type.shape.dim]
        for v in [*graph.input, *graph.output]
    }
    assert shapes == {"input": [None, 64], "probabilities": [None, 10], "label": [None, 1]}


@pytest.mark.parametrize("n", [1, 7, 64])
@pytest.mark.parametrize("model", MODELS)
def test_batch_of_n_rows_gives_n_by_10_probabilities_and_n_by_1_labels(
    model: str, n: int, split: Any
) -> None:
    x = split.x_test[:n]
    probabilities, label = _session(model).run(["probabilities", "label"], {"input": x})
    assert probabilities.shape == (n, 10)
    assert probabilities.dtype == np.float32
    assert label.shape == (n, 1)
    assert label.dtype == np.int64
    np.testing.assert_allclose(probabilities.sum(axis=1), 1.0, atol=1e-4)
    np.testing.assert_array_equal(label[:, 0], probabilities.argmax(axis=1))


@pytest.mark.parametrize("model", MODELS)
def test_recomputed_test_accuracy_equals_accuracy_json(
    model: str, split: Any, build_digits: ModuleType
) -> None:
    report = _report(model)
    predicted = _predict(_session(model), split.x_test)
    correct = int(np.sum(predicted == split.y_test))
    n_test = len(split.y_test)

    assert report["model"] == model
    assert report["variant"] == VARIANTS[model]
    assert report["split_seed"] == build_digits.SPLIT_SEED
    assert report["n_test"] == n_test == 450
    assert report["correct"] == correct
    assert report["accuracy"] == correct / n_test


@pytest.mark.parametrize("model", MODELS)
def test_accuracy_json_sha256_matches_model_file(model: str) -> None:
    digest = hashlib.sha256(_model_path(model).read_bytes()).hexdigest()
    assert _report(model)["sha256"] == digest


@pytest.mark.parametrize("model", MODELS)
def test_model_files_are_small(model: str) -> None:
    assert _model_path(model).stat().st_size < 1_000_000


def test_int8_accuracy_is_within_one_point_of_fp32() -> None:
    assert _report("digits_int8")["accuracy"] >= _report("digits")["accuracy"] - 0.01


def test_int8_model_stores_int8_weights_and_quantizes_activations() -> None:
    graph = onnx.load(str(_model_path("digits_int8"))).graph
    int8_weights = [t for t in graph.initializer if t.data_type == onnx.TensorProto.INT8]
    # only biases ([1, k]) and quantization scales may stay float; weight matrices are int8
    float_matrices = [
        t.name
        for t in graph.initializer
        if t.data_type == onnx.TensorProto.FLOAT and len(t.dims) == 2 and min(t.dims) > 1
    ]
    assert int8_weights
    assert not float_matrices
    assert any(node.op_type == "QuantizeLinear" for node in graph.node)
