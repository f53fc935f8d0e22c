"""Our own simple Python model interface.

``<version>/model.py`` defines a class ``Model``. It is built with no arguments; if it has
``initialize(args: dict)`` that is called with ``model_name``, ``model_version``,
``model_config`` (Triton's JSON form), ``model_dir`` and ``instance_index``. Then
``execute(inputs: dict[str, ndarray]) -> dict[str, ndarray]`` takes the whole batch, and an
optional ``finalize()`` runs at unload.
"""

from __future__ import annotations

import importlib.util
import itertools
from pathlib import Path
from typing import Any

import numpy as np

from inference.backends import BackendContext, model_file
from inference.config import ModelSpec

_counter = itertools.count()


class PythonBackend:
    def __init__(
        self, spec: ModelSpec, version: str, version_dir: Path, instance_index: int, context: BackendContext
    ) -> None:
        path = model_file(spec, version_dir, "model.py")
        module_name = f"carbonledger_model_{spec.name}_{version}_{next(_counter)}"
        module_spec = importlib.util.spec_from_file_location(module_name, path)
        if module_spec is None or module_spec.loader is None:
            raise ImportError(f"cannot import {path}")
        module = importlib.util.module_from_spec(module_spec)
        module_spec.loader.exec_module(module)
        cls = getattr(module, "Model", None)
        if cls is None:
            raise AttributeError(f"{path} defines no class 'Model'")
        self._model = cls()
        init = getattr(self._model, "initialize", None)
        if init is not None:
            init(
                {
                    "model_name": spec.name,
                    "model_version": version,
                    "model_config": spec.config_dict,
                    "model_dir": str(version_dir.parent),
                    "instance_index": instance_index,
                }
            )
        self._execute = self._model.execute

    def execute(self, inputs: dict[str, np.ndarray[Any, Any]]) -> dict[str, np.ndarray[Any, Any]]:
        result: dict[str, np.ndarray[Any, Any]] = self._execute(inputs)
        return result

    def close(self) -> None:
        fin = getattr(self._model, "finalize", None)
        if fin is not None:
            fin()
