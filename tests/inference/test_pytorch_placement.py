"""The PyTorch backend's configuration, and its refusal where PyTorch is missing: none of these needs torch.

``instance_group`` placement (Triton's: ``count`` instances on each listed GPU), the ``precision`` parameter,
the registry entry for ``pytorch_libtorch``, and a repository where ``import torch`` fails: the PyTorch model
is not ready with the reason and the model beside it serves.
"""

from __future__ import annotations

import sys
import textwrap
import threading
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from inference.backends import BACKENDS, backend_name, load_backend_class
from inference.backends.pytorch import precision_of, tensor_dtype_names
from inference.batcher import Pending
from inference.config import ConfigError, InstancePlacement, default_model_filename, parse_config_text
from inference.repository import GatewayOptions, ModelRepository

TORCH_MODEL = """
name: "{name}"
platform: "pytorch_libtorch"
max_batch_size: 8
input [ {{ name: "x", data_type: TYPE_FP32, dims: [ 2 ] }} ]
output [ {{ name: "y", data_type: TYPE_FP32, dims: [ 2 ] }} ]
"""

PYTHON_MODEL = """
import numpy as np


class Model:
    def execute(self, inputs):
        return {"y": (inputs["x"] * 2).astype(np.float32)}
"""


def spec_of(extra: str = "", name: str = "m") -> Any:
    return parse_config_text(
        TORCH_MODEL.format(name=name) + textwrap.dedent(extra), Path("config.pbtxt"), name
    )


def test_pytorch_libtorch_is_served_by_the_pytorch_backend_from_model_pt() -> None:
    spec = spec_of()
    assert spec.backend == "pytorch"  # Triton fills it in for the platform
    assert backend_name(spec) == "pytorch"
    assert spec.config_dict["default_model_filename"] == "model.pt"
    assert default_model_filename("", "pytorch") == "model.pt"
    assert BACKENDS["pytorch"] == "inference.backends.pytorch.PyTorchBackend"
    # The registry entry imports without torch: torch is imported when a model loads.
    assert load_backend_class("pytorch").__name__ == "PyTorchBackend"


def test_a_gpu_group_places_count_instances_on_each_listed_gpu_as_triton_does() -> None:
    spec = spec_of(
        """
        instance_group [ { count: 2, kind: KIND_GPU, gpus: [ 1, 3 ] }, { count: 1, kind: KIND_CPU } ]
        """
    )
    assert spec.instances == (
        InstancePlacement("KIND_GPU", 1),
        InstancePlacement("KIND_GPU", 1),
        InstancePlacement("KIND_GPU", 3),
        InstancePlacement("KIND_GPU", 3),
        InstancePlacement("KIND_CPU"),
    )
    assert spec.instance_count == 5
    assert [p.device for p in spec.instances] == ["cuda:1", "cuda:1", "cuda:3", "cuda:3", "cpu"]


def test_a_gpu_group_without_gpus_takes_gpu_0_and_the_default_group_is_one_cpu_instance() -> None:
    assert spec_of("instance_group [ { count: 2, kind: KIND_GPU } ]").instances == (
        InstancePlacement("KIND_GPU", 0),
        InstancePlacement("KIND_GPU", 0),
    )
    assert spec_of().instances == (InstancePlacement("KIND_CPU"),)


def test_a_cpu_group_that_lists_gpus_is_refused_naming_the_group() -> None:
    with pytest.raises(ConfigError, match=r"instance_group 'm_0' is KIND_CPU but lists gpus \[0\]"):
        spec_of("instance_group [ { count: 1, kind: KIND_CPU, gpus: [ 0 ] } ]")


def test_precision_is_fp32_by_default_and_one_of_fp32_fp16_bf16() -> None:
    assert precision_of(spec_of()) == "fp32"
    for value in ("fp16", "BF16", " fp32 "):
        spec = spec_of(f'parameters {{ key: "precision" value {{ string_value: "{value}" }} }}')
        assert precision_of(spec) == value.strip().lower()
    bad = spec_of('parameters { key: "precision" value { string_value: "int4" } }')
    with pytest.raises(ConfigError, match="model 'm': parameter 'precision' must be one of fp32, fp16, bf16"):
        precision_of(bad)


def test_a_datatype_pytorch_cannot_hold_is_refused_naming_the_tensor() -> None:
    text = TORCH_MODEL.format(name="m").replace(
        'name: "y", data_type: TYPE_FP32', 'name: "y", data_type: TYPE_STRING'
    )
    spec = parse_config_text(text, Path("config.pbtxt"), "m")
    with pytest.raises(ConfigError, match="tensor 'y' has datatype BYTES"):
        tensor_dtype_names(spec)


class Call:
    def __init__(self, x: np.ndarray[Any, Any]) -> None:
        self.inputs = {"x": x}
        self.received_ns = 0
        self.done = threading.Event()
        self.result: Any = None


def deliver(items: list[tuple[Pending, Any]]) -> None:
    for pending, result in items:
        pending.payload.result = result
        pending.payload.done.set()


def test_without_torch_the_pytorch_model_is_not_ready_with_the_reason_and_the_others_serve(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # None in sys.modules makes `import torch` raise ImportError, as on a host without PyTorch.
    monkeypatch.setitem(sys.modules, "torch", None)
    (tmp_path / "net" / "1").mkdir(parents=True)
    (tmp_path / "net" / "config.pbtxt").write_text(TORCH_MODEL.format(name="net"))
    (tmp_path / "net" / "1" / "model.pt").write_bytes(b"not read: torch is missing first")
    (tmp_path / "other" / "1").mkdir(parents=True)
    (tmp_path / "other" / "config.pbtxt").write_text(
        TORCH_MODEL.format(name="other").replace('platform: "pytorch_libtorch"', 'backend: "python"')
    )
    (tmp_path / "other" / "1" / "model.py").write_text(PYTHON_MODEL)
    repo = ModelRepository(tmp_path, GatewayOptions(), deliver)
    repo.load()
    try:
        net = repo.entry("net").versions["1"]
        assert net.ready is False
        assert net.reason.startswith(
            "failed to load: RuntimeMissing: model 'net' needs PyTorch (backend pytorch), which is not installed"
        )
        assert "pip install -r requirements-torch.txt" in net.reason
        assert {"name": "net", "version": "1", "state": "UNAVAILABLE", "reason": net.reason} in repo.index()
        other = repo.version("other", None)
        call = Call(np.ones((1, 2), np.float32))
        assert other.batcher is not None
        other.batcher.enqueue(Pending(call, rows=1))
        assert call.done.wait(10)
        np.testing.assert_array_equal(call.result["y"], [[2.0, 2.0]])
    finally:
        repo.stop()
