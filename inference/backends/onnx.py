"""ONNX models in process on onnxruntime (platform ``onnxruntime_onnx``)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from inference.backends import BackendContext, model_file
from inference.config import ModelSpec


class OnnxBackend:
    def __init__(
        self, spec: ModelSpec, version: str, version_dir: Path, instance_index: int, context: BackendContext
    ) -> None:
        import onnxruntime as ort  # heavy import, only for models that need it

        path = model_file(spec, version_dir, "model.onnx")
        options = ort.SessionOptions()
        # One model instance is one thread: more intra-op threads would fight the batcher's
        # other instances and the event loop for the same cores.
        options.intra_op_num_threads = max(1, context.onnx_threads)
        options.inter_op_num_threads = 1
        self._session = ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
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
        values = self._session.run(self._output_names, inputs)
        return dict(zip(self._output_names, values, strict=True))

    def close(self) -> None:
        del self._session
