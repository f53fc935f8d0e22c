"""Backends behind a small registry of dotted paths.

A backend instance is created per model instance (``instance_group`` count) and runs on that
instance's thread; ``execute`` takes the whole batch, inputs stacked along the batch axis.
"""

from __future__ import annotations

import importlib
from pathlib import Path
from typing import Any, Protocol

import numpy as np

from inference.config import ModelSpec

BACKENDS: dict[str, str] = {
    "python": "inference.backends.python_model.PythonBackend",
    "onnxruntime": "inference.backends.onnx.OnnxBackend",
    "triton": "inference.backends.triton_remote.TritonRemoteBackend",
    "pytorch": "inference.backends.pytorch.PyTorchBackend",
}


class RuntimeMissing(RuntimeError):
    """What a model needs is not on this host: a library (PyTorch), an execution provider or a device (CUDA).
    Raised while loading, so the model is not ready with the message as its reason and the others load."""


class Backend(Protocol):
    def execute(self, inputs: dict[str, np.ndarray[Any, Any]]) -> dict[str, np.ndarray[Any, Any]]: ...

    def close(self) -> None: ...


class BackendContext(Protocol):
    """What a backend may ask of the gateway's settings, without importing them."""

    triton_url: str
    triton_protocol: str
    remote_timeout_s: float
    onnx_threads: int


def backend_name(spec: ModelSpec) -> str:
    """Which registry entry serves a model: remote Triton if marked, else its backend/platform."""
    remote = spec.parameters.get("remote", "").strip().lower()
    if remote:
        if remote != "triton":
            raise ValueError(f"model '{spec.name}': parameter remote={remote!r}; only 'triton' is supported")
        return "triton"
    if spec.backend == "python":
        return "python"
    if spec.backend == "onnxruntime" or spec.platform == "onnxruntime_onnx":
        return "onnxruntime"
    if spec.backend == "pytorch" or spec.platform == "pytorch_libtorch":
        return "pytorch"
    raise ValueError(
        f"model '{spec.name}': no backend for backend={spec.backend!r} platform={spec.platform!r} "
        f"(known: {', '.join(sorted(BACKENDS))})"
    )


def load_backend_class(name_or_path: str) -> Any:
    dotted = BACKENDS.get(name_or_path, name_or_path)
    module_name, _, attr = dotted.rpartition(".")
    if not module_name:
        raise ValueError(f"backend {name_or_path!r} is neither a registered name nor a dotted path")
    return getattr(importlib.import_module(module_name), attr)


def model_file(spec: ModelSpec, version_dir: Path, default: str) -> Path:
    """The version's model file (config's default_model_filename, else ``default``); it must exist."""
    path = version_dir / (spec.config_dict.get("default_model_filename") or default)
    if not path.is_file():
        raise FileNotFoundError(f"{path} is missing")
    return path


def create_backend(
    spec: ModelSpec, version: str, version_dir: Path, instance_index: int, context: BackendContext
) -> Backend:
    cls = load_backend_class(backend_name(spec))
    backend: Backend = cls(spec, version, version_dir, instance_index, context)
    return backend
