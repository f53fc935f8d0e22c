"""PyTorch models in process, as Triton's PyTorch backend serves them (platform ``pytorch_libtorch``, or
``backend: "pytorch"``).

The version's file is a TorchScript module (``<version>/model.pt``, written by ``torch.jit.save``); a
``default_model_filename`` ending in ``.pt2`` is a ``torch.export`` program (``torch.export.save``, exported
with a dynamic batch dimension), run as its module. Inputs are passed positionally in the config's order
(Triton's ``INPUT__0``, ``INPUT__1``... convention, whatever their names); the module returns one tensor (one
output), a tuple or list in the config's output order, or a dict keyed by output name.

Placement follows ``instance_group`` (``ModelSpec.instances``): a KIND_GPU instance runs on ``cuda:N`` with a
CUDA stream of its own, a KIND_CPU (or KIND_AUTO) one on the CPU, with ``GATEWAY_ONNX_THREADS`` intra-op
threads (PyTorch's pool is process-wide). Per batch, each input moves to the device once and each output
comes back once (cast there to the config's datatype first), with one synchronisation.

Precision is the model parameter ``precision``: ``fp32`` (default), ``fp16`` or ``bf16``; floating weights and
floating inputs are cast to it on the device, so clients send the config's datatypes whatever it is.

PyTorch is optional (``requirements-torch.txt``): without it, or without CUDA for a KIND_GPU instance, the
model is not ready with the reason and the others load. A GPU model never runs on the CPU instead: its
batches would be charged to the GPU's meter.
"""

from __future__ import annotations

import contextlib
import importlib
import warnings
from pathlib import Path
from typing import Any

import numpy as np

from inference.backends import BackendContext, RuntimeMissing, model_file
from inference.config import ConfigError, InstancePlacement, ModelSpec, TensorSpec
from inference.kserve import DTYPES

PRECISIONS: dict[str, str] = {"fp32": "float32", "fp16": "float16", "bf16": "bfloat16"}
# KServe datatype -> torch dtype name; BYTES and the unsigned types PyTorch cannot hold are refused at load.
TORCH_DTYPES: dict[str, str] = {
    "BOOL": "bool",
    "UINT8": "uint8",
    "INT8": "int8",
    "INT16": "int16",
    "INT32": "int32",
    "INT64": "int64",
    "FP16": "float16",
    "FP32": "float32",
    "FP64": "float64",
    "BF16": "bfloat16",
}
INSTALL_HINT = "install it with `.venv/bin/pip install -r requirements-torch.txt`"


def precision_of(spec: ModelSpec) -> str:
    """The model's ``precision`` parameter (fp32 when absent); ConfigError naming the model otherwise."""
    raw = spec.parameters.get("precision", "").strip().lower() or "fp32"
    if raw not in PRECISIONS:
        raise ConfigError(
            f"model '{spec.name}': parameter 'precision' must be one of {', '.join(PRECISIONS)}, "
            f"got {spec.parameters['precision']!r}"
        )
    return raw


def placement_of(spec: ModelSpec, instance_index: int) -> InstancePlacement:
    """Where instance ``instance_index`` runs; KIND_AUTO runs on the CPU (the recorder meters it there)."""
    placement = (
        spec.instances[instance_index]
        if instance_index < len(spec.instances)
        else InstancePlacement("KIND_CPU")
    )
    if placement.kind not in {"KIND_CPU", "KIND_GPU", "KIND_AUTO"}:
        raise ConfigError(
            f"model '{spec.name}': instance_group kind {placement.kind} is not supported by the pytorch "
            "backend (KIND_CPU or KIND_GPU)"
        )
    return placement


def tensor_dtype_names(spec: ModelSpec) -> dict[str, str]:
    """Each input's and output's torch dtype name; ConfigError for a datatype PyTorch cannot hold."""
    out = {}
    for t in (*spec.inputs, *spec.outputs):
        name = TORCH_DTYPES.get(t.datatype)
        if name is None:
            raise ConfigError(
                f"model '{spec.name}': tensor '{t.name}' has datatype {t.datatype}, which the pytorch "
                f"backend does not support ({', '.join(TORCH_DTYPES)})"
            )
        out[t.name] = name
    return out


def import_torch(spec: ModelSpec) -> Any:
    """The ``torch`` module, or RuntimeMissing saying the model needs it (and how to install it)."""
    try:
        return importlib.import_module("torch")
    except ImportError as exc:
        raise RuntimeMissing(
            f"model '{spec.name}' needs PyTorch (backend pytorch), which is not installed here ({exc}); "
            + INSTALL_HINT
        ) from None


def check_cuda(torch: Any, spec: ModelSpec, placement: InstancePlacement, instance_index: int) -> None:
    """RuntimeMissing unless PyTorch sees the CUDA device a KIND_GPU instance is placed on."""
    if placement.gpu is None:
        return
    where = f"model '{spec.name}' instance {instance_index} is KIND_GPU on GPU {placement.gpu}"
    if not torch.cuda.is_available():
        raise RuntimeMissing(
            f"{where}, but PyTorch {torch.__version__} sees no CUDA device (built for CUDA "
            f"{torch.version.cuda or 'none: a CPU-only build'}); it is not run on the CPU instead"
        )
    count = int(torch.cuda.device_count())
    if placement.gpu >= count:
        raise RuntimeMissing(f"{where}, but PyTorch sees {count} CUDA device(s)")


def _dry_run_shape(spec: ModelSpec, t: TensorSpec) -> list[int]:
    dims = [d if d > 0 else 1 for d in t.dims]
    return [1, *dims] if spec.max_batch_size > 0 else dims


class PyTorchBackend:
    def __init__(
        self, spec: ModelSpec, version: str, version_dir: Path, instance_index: int, context: BackendContext
    ) -> None:
        # Everything that can be refused without PyTorch is checked first, so the reason names it.
        placement = placement_of(spec, instance_index)
        precision = precision_of(spec)
        dtype_names = tensor_dtype_names(spec)
        path = model_file(spec, version_dir, "model.pt")
        torch = import_torch(spec)
        check_cuda(torch, spec, placement, instance_index)
        self._torch = torch
        self._spec = spec
        self._device = torch.device(placement.device)
        self._cuda = placement.gpu is not None
        self._dtype = getattr(torch, PRECISIONS[precision])
        self._half = precision != "fp32"
        self._in_dtypes = {t.name: getattr(torch, dtype_names[t.name]) for t in spec.inputs}
        self._out_dtypes = {t.name: getattr(torch, dtype_names[t.name]) for t in spec.outputs}
        self._inputs = list(spec.inputs)
        self._output_names = [t.name for t in spec.outputs]
        if not self._cuda:
            torch.set_num_threads(max(1, context.onnx_threads))
        self._stream = torch.cuda.Stream(device=self._device) if self._cuda else None
        self._module = self._load(path)
        if self._half:
            self._module.to(self._dtype)
        # One row of zeros through the model: a module whose inputs or outputs do not match the config is not
        # ready with the reason (instead of failing every batch), and the first request does not pay for
        # CUDA's lazy start (context, kernels, cuDNN).
        zeros = {t.name: np.zeros(_dry_run_shape(spec, t), dtype=DTYPES[t.datatype]) for t in spec.inputs}
        try:
            self.execute(zeros)
        except Exception as exc:
            raise ValueError(f"{path}: a one-row dry run failed: {type(exc).__name__}: {exc}") from exc

    def _load(self, path: Path) -> Any:
        torch = self._torch
        if path.suffix == ".pt2":
            program = torch.export.load(str(path))
            # move_to_device_pass, where this PyTorch has it, also moves the constants the graph captured; without it,
            # moving the module's parameters below is enough for most graphs.
            try:
                passes = importlib.import_module("torch.export.passes")
            except ImportError:
                passes = None
            move = getattr(passes, "move_to_device_pass", None)
            if move is not None:
                program = move(program, self._device)
            # An exported program's module is already in inference mode (and refuses eval()).
            return program.module().to(self._device)
        with warnings.catch_warnings():
            # PyTorch 2.13 marks TorchScript deprecated; it is still Triton's pytorch_libtorch format.
            warnings.simplefilter("ignore", DeprecationWarning)
            module = torch.jit.load(str(path), map_location=self._device)
        return module.to(self._device).eval()

    def _to_device(self, name: str, arr: np.ndarray[Any, Any]) -> Any:
        torch = self._torch
        # ml_dtypes' bfloat16 has no numpy kind of its own: it crosses as int16 bits.
        if arr.dtype == DTYPES["BF16"]:
            host = torch.from_numpy(np.ascontiguousarray(arr).view(np.int16)).view(torch.bfloat16)
        else:
            # from_numpy shares the array's memory; a read-only one (a single request, decoded in place) is
            # copied on the host first, since PyTorch tensors are writable.
            host = torch.from_numpy(arr if arr.flags.writeable else arr.copy())
        # A half-precision model computes on half-precision inputs; otherwise each input keeps its datatype.
        dtype = self._dtype if self._half and host.is_floating_point() else self._in_dtypes[name]
        return host.to(device=self._device, dtype=dtype, non_blocking=self._cuda)

    def _output_list(self, out: Any) -> list[Any]:
        names = self._output_names
        if isinstance(out, dict):
            missing = [n for n in names if n not in out]
            if missing:
                raise ValueError(f"the module returned {sorted(out)}, without outputs {missing}")
            return [out[n] for n in names]
        values = list(out) if isinstance(out, (tuple, list)) else [out]
        if len(values) != len(names):
            raise ValueError(f"the module returned {len(values)} tensor(s) for the config's outputs {names}")
        return values

    def execute(self, inputs: dict[str, np.ndarray[Any, Any]]) -> dict[str, np.ndarray[Any, Any]]:
        torch = self._torch
        stream_ctx = torch.cuda.stream(self._stream) if self._stream is not None else contextlib.nullcontext()
        with torch.inference_mode(), stream_ctx:
            args = [
                self._to_device(t.name, inputs[t.name]) if t.name in inputs else None for t in self._inputs
            ]
            results = self._output_list(self._module(*args))
            host = [
                value.to(dtype=self._out_dtypes[name]).contiguous().to("cpu", non_blocking=self._cuda)
                for name, value in zip(self._output_names, results, strict=True)
            ]
            if self._stream is not None:
                # The copies to the host were queued on this instance's stream: one wait for all of them.
                self._stream.synchronize()
        return {name: _to_numpy(torch, value) for name, value in zip(self._output_names, host, strict=True)}

    def close(self) -> None:
        del self._module


def _to_numpy(torch: Any, value: Any) -> np.ndarray[Any, Any]:
    if value.dtype == torch.bfloat16:
        return np.asarray(value.view(torch.int16).numpy().view(DTYPES["BF16"]))
    return np.asarray(value.numpy())
