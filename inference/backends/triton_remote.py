"""Forward each formed batch to a real Triton server with ``tritonclient`` (HTTP or gRPC).

The gateway's own ``config.pbtxt`` for the model describes its inputs and outputs; the
parameters ``remote: "triton"``, and optionally ``remote_url``, ``remote_model`` and
``remote_protocol`` (``http`` or ``grpc``), say where it runs. A Triton that is down or slow
answers 503 within ``remote_timeout_s``.
"""

from __future__ import annotations

import contextlib
from pathlib import Path
from typing import Any

import numpy as np

from inference.backends import BackendContext
from inference.config import ModelSpec
from inference.errors import BackendUnavailable, InferenceError


class TritonRemoteBackend:
    def __init__(
        self, spec: ModelSpec, version: str, version_dir: Path, instance_index: int, context: BackendContext
    ) -> None:
        self._spec = spec
        self._url = spec.parameters.get("remote_url") or context.triton_url
        if not self._url:
            raise ValueError(
                f"model '{spec.name}' is marked remote but no Triton URL is set (TRITON_URL or parameter remote_url)"
            )
        self._protocol = (spec.parameters.get("remote_protocol") or context.triton_protocol or "http").lower()
        if self._protocol not in {"http", "grpc"}:
            raise ValueError(
                f"model '{spec.name}': remote_protocol must be http or grpc, got {self._protocol!r}"
            )
        self._model = spec.parameters.get("remote_model") or spec.name
        self._version = spec.parameters.get("remote_version", "")
        self._timeout_s = context.remote_timeout_s
        if self._protocol == "http":
            import tritonclient.http as client_mod

            self._client: Any = client_mod.InferenceServerClient(
                self._url, connection_timeout=self._timeout_s, network_timeout=self._timeout_s
            )
        else:
            import tritonclient.grpc as client_mod

            self._client = client_mod.InferenceServerClient(self._url)
        self._mod: Any = client_mod
        self._outputs = [t.name for t in spec.outputs]

    def execute(self, inputs: dict[str, np.ndarray[Any, Any]]) -> dict[str, np.ndarray[Any, Any]]:
        mod = self._mod
        infer_inputs = []
        for tspec in self._spec.inputs:
            arr = inputs.get(tspec.name)
            if arr is None:
                continue
            ii = mod.InferInput(tspec.name, list(arr.shape), tspec.datatype)
            if self._protocol == "http":
                ii.set_data_from_numpy(np.ascontiguousarray(arr), binary_data=True)
            else:
                ii.set_data_from_numpy(np.ascontiguousarray(arr))
            infer_inputs.append(ii)
        if self._protocol == "http":
            outs = [mod.InferRequestedOutput(n, binary_data=True) for n in self._outputs]
        else:
            outs = [mod.InferRequestedOutput(n) for n in self._outputs]
        try:
            if self._protocol == "grpc":
                result = self._client.infer(
                    self._model,
                    infer_inputs,
                    model_version=self._version,
                    outputs=outs,
                    client_timeout=self._timeout_s,
                )
            else:
                result = self._client.infer(
                    self._model, infer_inputs, model_version=self._version, outputs=outs
                )
        except Exception as exc:
            text = str(exc)
            if _is_unreachable(exc, text):
                raise BackendUnavailable(
                    f"remote Triton at {self._url} is unavailable for model '{self._spec.name}': {text}"
                ) from exc
            raise InferenceError(
                f"remote Triton at {self._url} failed for model '{self._spec.name}': {text}"
            ) from exc
        return {n: result.as_numpy(n) for n in self._outputs}

    def close(self) -> None:
        with contextlib.suppress(Exception):  # closing a dead connection is fine
            self._client.close()


def _is_unreachable(exc: BaseException, text: str) -> bool:
    markers = (
        "Connection refused",
        "connection refused",
        "timed out",
        "Timeout",
        "timeout",
        "UNAVAILABLE",
        "DEADLINE_EXCEEDED",
        "Failed to connect",
        "Name or service not known",
        "Connection reset",
    )
    return isinstance(exc, (OSError, TimeoutError)) or any(m in text for m in markers)
