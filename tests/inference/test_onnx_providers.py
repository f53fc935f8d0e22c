"""onnxruntime's execution providers: which ones a model instance gets, and the refusals.

The choice is a pure function of the model's config, the instance's placement and the providers the installed
onnxruntime has; it is checked against this host's real list (``onnxruntime.get_available_providers()``) and,
for the GPU cases this host cannot have, against the lists onnxruntime-gpu builds report.
"""

from __future__ import annotations

import shutil
import textwrap
from pathlib import Path
from typing import Any

import numpy as np
import onnxruntime as ort
import pytest

from inference.backends import RuntimeMissing
from inference.backends.onnx import OnnxBackend, choose_providers
from inference.config import ConfigError, InstancePlacement, load_config, parse_config_text
from inference.repository import GatewayOptions, ModelRepository

DEMO = Path(__file__).resolve().parents[2] / "inference" / "demo_repository"
INSTALLED = ort.get_available_providers()
GPU_BUILD = ["CUDAExecutionProvider", "CPUExecutionProvider"]
TENSORRT_BUILD = ["TensorrtExecutionProvider", "CUDAExecutionProvider", "CPUExecutionProvider"]
GPU0, GPU1 = InstancePlacement("KIND_GPU", 0), InstancePlacement("KIND_GPU", 1)
CPU = InstancePlacement("KIND_CPU")


def spec_of(extra: str = "") -> Any:
    text = textwrap.dedent(
        """
        name: "m"
        platform: "onnxruntime_onnx"
        max_batch_size: 8
        input [ { name: "x", data_type: TYPE_FP32, dims: [ 2 ] } ]
        output [ { name: "y", data_type: TYPE_FP32, dims: [ 2 ] } ]
        """
    )
    return parse_config_text(text + textwrap.dedent(extra), Path("config.pbtxt"), "m")


TENSORRT = """
optimization { execution_accelerators { gpu_execution_accelerator: [ {
  name: "tensorrt"
  parameters { key: "precision_mode" value: "FP16" }
  parameters { key: "max_workspace_size_bytes" value: "1073741824" }
} ] } }
"""


def test_a_cpu_instance_runs_on_the_cpu_provider_of_the_installed_onnxruntime() -> None:
    assert "CPUExecutionProvider" in INSTALLED
    assert choose_providers(spec_of(), CPU, INSTALLED) == [("CPUExecutionProvider", {})]
    # Even where CUDA is there: KIND_CPU means the CPU, as in Triton.
    assert choose_providers(spec_of(), CPU, TENSORRT_BUILD) == [("CPUExecutionProvider", {})]


def test_a_gpu_instance_on_the_installed_onnxruntime_without_cuda_is_refused_naming_its_providers() -> None:
    if "CUDAExecutionProvider" in INSTALLED:
        pytest.skip("onnxruntime-gpu is installed here")
    with pytest.raises(RuntimeMissing) as info:
        choose_providers(spec_of(), GPU0, INSTALLED)
    assert str(info.value) == (
        "model 'm' is KIND_GPU on GPU 0, but the installed onnxruntime has no CUDAExecutionProvider "
        f"(it has {', '.join(INSTALLED)}): install onnxruntime-gpu in place of onnxruntime, or declare the "
        "instance KIND_CPU"
    )


def test_a_gpu_instance_runs_on_cuda_on_its_own_gpu_then_the_cpu_for_nodes_cuda_lacks() -> None:
    assert choose_providers(spec_of(), GPU1, GPU_BUILD) == [
        ("CUDAExecutionProvider", {"device_id": "1"}),
        ("CPUExecutionProvider", {}),
    ]
    # A TensorRT build is not used unless the config asks for it.
    assert choose_providers(spec_of(), GPU0, TENSORRT_BUILD)[0] == (
        "CUDAExecutionProvider",
        {"device_id": "0"},
    )


def test_tritons_tensorrt_accelerator_puts_tensorrt_first_with_its_parameters() -> None:
    assert choose_providers(spec_of(TENSORRT), GPU1, TENSORRT_BUILD) == [
        (
            "TensorrtExecutionProvider",
            {"device_id": "1", "trt_fp16_enable": "True", "trt_max_workspace_size": "1073741824"},
        ),
        ("CUDAExecutionProvider", {"device_id": "1"}),
        ("CPUExecutionProvider", {}),
    ]


def test_tensorrt_asked_for_on_a_build_without_it_is_refused() -> None:
    with pytest.raises(
        RuntimeMissing, match="with the tensorrt accelerator, but onnxruntime has no Tensorrt"
    ):
        choose_providers(spec_of(TENSORRT), GPU0, GPU_BUILD)


def test_an_unknown_accelerator_or_tensorrt_parameter_is_a_config_error() -> None:
    openvino = (
        'optimization { execution_accelerators { gpu_execution_accelerator: [ { name: "openvino" } ] } }'
    )
    with pytest.raises(ConfigError, match="gpu_execution_accelerator 'openvino' is not supported"):
        choose_providers(spec_of(openvino), GPU0, TENSORRT_BUILD)
    odd = TENSORRT.replace("precision_mode", "int8_mode")
    with pytest.raises(ConfigError, match="tensorrt parameter 'int8_mode' is not supported"):
        choose_providers(spec_of(odd), GPU0, TENSORRT_BUILD)


def _deliver(items: list[Any]) -> None:
    for pending, result in items:
        pending.payload.result = result


def test_a_gpu_onnx_model_without_cuda_is_not_ready_and_the_cpu_model_beside_it_loads(tmp_path: Path) -> None:
    if "CUDAExecutionProvider" in INSTALLED:
        pytest.skip("onnxruntime-gpu is installed here")
    shutil.copytree(DEMO / "digits", tmp_path / "digits")
    gpu = Path(shutil.copytree(DEMO / "digits", tmp_path / "digits_gpu"))
    text = (gpu / "config.pbtxt").read_text().replace('name: "digits"', 'name: "digits_gpu"')
    (gpu / "config.pbtxt").write_text(text.replace("kind: KIND_CPU", "kind: KIND_GPU"))
    repo = ModelRepository(tmp_path, GatewayOptions(), _deliver)
    repo.load()
    try:
        failed = repo.entry("digits_gpu").versions["1"]
        assert failed.ready is False
        assert failed.reason.startswith(
            "failed to load: RuntimeMissing: model 'digits_gpu' is KIND_GPU on GPU 0, but the installed "
            "onnxruntime has no CUDAExecutionProvider"
        )
        assert repo.version("digits", None).ready
    finally:
        repo.stop()


def test_io_binding_answers_what_run_answers(tmp_path: Path) -> None:
    # The GPU path binds inputs and outputs; the binding itself works on the CPU provider too, so it is
    # checked here against session.run on the demo digits model.
    model_dir = Path(shutil.copytree(DEMO / "digits", tmp_path / "digits"))
    spec = load_config(model_dir)
    backend = OnnxBackend(spec, "1", model_dir / "1", 0, GatewayOptions())
    try:
        x = np.random.default_rng(0).uniform(0, 16, size=(5, 64)).astype(np.float32)
        plain = backend.execute({"input": x})
        backend._bind_io = True
        bound = backend.execute({"input": x})
        assert list(bound) == ["probabilities", "label"]
        np.testing.assert_array_equal(bound["probabilities"], plain["probabilities"])
        np.testing.assert_array_equal(bound["label"], plain["label"])
        assert bound["label"].dtype == np.int64 and bound["label"].shape == (5, 1)
    finally:
        backend.close()
