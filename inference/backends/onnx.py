"""ONNX models in process on onnxruntime (platform ``onnxruntime_onnx``).

A KIND_CPU instance runs on ``CPUExecutionProvider``. A KIND_GPU instance runs on ``CUDAExecutionProvider``
(on its GPU, ``device_id``), which only ``onnxruntime-gpu`` has; with Triton's ``optimization {
execution_accelerators { gpu_execution_accelerator: [ { name: "tensorrt" } ] } }`` TensorRT comes first
(``parameters`` ``precision_mode: "FP16"`` and ``max_workspace_size_bytes`` as in Triton). A KIND_GPU model
whose onnxruntime lacks the provider it asks for is not ready with the reason: it is never run on the CPU
instead, since its batches would be charged to the GPU's meter. On the GPU each batch goes through IO binding:
every input is copied to the device once, every output is bound to host memory and copied back once.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from inference.backends import BackendContext, RuntimeMissing, model_file
from inference.config import ConfigError, InstancePlacement, ModelSpec

CPU_PROVIDER = "CPUExecutionProvider"
CUDA_PROVIDER = "CUDAExecutionProvider"
TENSORRT_PROVIDER = "TensorrtExecutionProvider"

Provider = tuple[str, dict[str, str]]


def gpu_accelerators(spec: ModelSpec) -> list[tuple[str, dict[str, str]]]:
    """Triton's ``optimization.execution_accelerators.gpu_execution_accelerator``: (name, parameters)."""
    accelerators = (
        spec.config_dict.get("optimization", {})
        .get("execution_accelerators", {})
        .get("gpu_execution_accelerator", [])
    )
    return [
        (str(a.get("name", "")).strip().lower(), {str(k): str(v) for k, v in a.get("parameters", {}).items()})
        for a in accelerators
    ]


def _tensorrt_options(spec: ModelSpec, gpu: int, params: dict[str, str]) -> dict[str, str]:
    options = {"device_id": str(gpu)}
    for key, value in params.items():
        if key == "precision_mode":
            if value.upper() not in {"FP32", "FP16"}:
                raise ConfigError(
                    f"model '{spec.name}': tensorrt precision_mode must be FP32 or FP16, got {value!r}"
                )
            options["trt_fp16_enable"] = "True" if value.upper() == "FP16" else "False"
        elif key == "max_workspace_size_bytes":
            options["trt_max_workspace_size"] = value
        else:
            raise ConfigError(
                f"model '{spec.name}': tensorrt parameter {key!r} is not supported "
                "(precision_mode, max_workspace_size_bytes)"
            )
    return options


def choose_providers(
    spec: ModelSpec, placement: InstancePlacement, available: Sequence[str]
) -> list[Provider]:
    """The execution providers, with their options, for one instance of ``spec`` given the providers the
    installed onnxruntime has (``onnxruntime.get_available_providers()``), best first. RuntimeMissing when a
    KIND_GPU instance asks for one that is not there; ConfigError for an accelerator it does not know."""
    if placement.gpu is None:
        return [(CPU_PROVIDER, {})]
    where = f"model '{spec.name}' is KIND_GPU on GPU {placement.gpu}"
    have = ", ".join(available) or "none"
    if CUDA_PROVIDER not in available:
        raise RuntimeMissing(
            f"{where}, but the installed onnxruntime has no {CUDA_PROVIDER} (it has {have}): install "
            "onnxruntime-gpu in place of onnxruntime, or declare the instance KIND_CPU"
        )
    chain: list[Provider] = []
    for name, params in gpu_accelerators(spec):
        if name != "tensorrt":
            raise ConfigError(
                f"model '{spec.name}': gpu_execution_accelerator {name!r} is not supported (tensorrt)"
            )
        if TENSORRT_PROVIDER not in available:
            raise RuntimeMissing(
                f"{where} with the tensorrt accelerator, but onnxruntime has no {TENSORRT_PROVIDER} (it has {have})"
            )
        chain.append((TENSORRT_PROVIDER, _tensorrt_options(spec, placement.gpu, params)))
    chain.append((CUDA_PROVIDER, {"device_id": str(placement.gpu)}))
    # Nodes the CUDA provider has no kernel for run on the CPU, as onnxruntime assigns them.
    chain.append((CPU_PROVIDER, {}))
    return chain


class OnnxBackend:
    def __init__(
        self, spec: ModelSpec, version: str, version_dir: Path, instance_index: int, context: BackendContext
    ) -> None:
        import onnxruntime as ort  # heavy import, only for models that need it

        placement = (
            spec.instances[instance_index]
            if instance_index < len(spec.instances)
            else InstancePlacement("KIND_CPU")
        )
        providers = choose_providers(spec, placement, ort.get_available_providers())
        path = model_file(spec, version_dir, "model.onnx")
        options = ort.SessionOptions()
        # One model instance is one thread: more intra-op threads would fight the batcher's
        # other instances and the event loop for the same cores.
        options.intra_op_num_threads = max(1, context.onnx_threads)
        options.inter_op_num_threads = 1
        self._session = ort.InferenceSession(
            str(path),
            options,
            providers=[name for name, _ in providers],
            provider_options=[opts for _, opts in providers],
        )
        wanted = providers[0][0]
        if wanted not in self._session.get_providers():
            # onnxruntime falls back to the CPU by itself when a provider's libraries (CUDA, cuDNN, TensorRT)
            # fail to load; a GPU model must not.
            raise RuntimeMissing(
                f"model '{spec.name}': onnxruntime could not start {wanted} (session providers: "
                f"{', '.join(self._session.get_providers())}); its log above says which library is missing"
            )
        self._bind_io = placement.gpu is not None
        declared_in = {t.name for t in spec.inputs}
        actual_in = {i.name for i in self._session.get_inputs()}
        if declared_in != actual_in:
            raise ValueError(
                f"{path}: config inputs {sorted(declared_in)} but the ONNX graph has {sorted(actual_in)}"
            )
        actual_out = {o.name for o in self._session.get_outputs()}
        missing = [t.name for t in spec.outputs if t.name not in actual_out]
        if missing:
            raise ValueError(f"{path}: config outputs {missing} are not outputs of the ONNX graph")
        self._output_names = [t.name for t in spec.outputs]

    def execute(self, inputs: dict[str, np.ndarray[Any, Any]]) -> dict[str, np.ndarray[Any, Any]]:
        if self._bind_io:
            return self._execute_bound(inputs)
        values = self._session.run(self._output_names, inputs)
        return dict(zip(self._output_names, values, strict=True))

    def _execute_bound(self, inputs: dict[str, np.ndarray[Any, Any]]) -> dict[str, np.ndarray[Any, Any]]:
        binding = self._session.io_binding()
        for name, value in inputs.items():
            binding.bind_cpu_input(name, np.ascontiguousarray(value))
        for name in self._output_names:
            binding.bind_output(name, "cpu")
        self._session.run_with_iobinding(binding)
        values = binding.copy_outputs_to_cpu()
        return dict(zip(self._output_names, values, strict=True))

    def close(self) -> None:
        del self._session
