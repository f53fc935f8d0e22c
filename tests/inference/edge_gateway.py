"""A real gateway for the edge tests (issue 22): the linear demo model, a BYTES echo, a model whose outputs are
inf and NaN, served over HTTP by uvicorn as `manage.py serve` serves it, with a spy on the batch hook that
sees every request that reached a batch (what the ledger recorder would spool)."""

from __future__ import annotations

import shutil
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np
import requests

from inference.batcher import BatchTiming, Pending
from inference.gateway import Gateway
from inference.repository import GatewayOptions, ModelVersion
from tests.support.models import DEMO, python_model
from tests.support.servers import serve_asgi

MAX_BODY = 256 * 1024


class BatchSpy:
    """The ids of the requests that reached a batch, in the order their batches ended."""

    def __init__(self) -> None:
        self.ids: list[str | None] = []
        self._lock = threading.Lock()

    def hook(self, mv: ModelVersion) -> BatchSpy:
        return self

    def begin(self, index: int, batch: list[Pending]) -> None:
        pass

    def end(self, index: int, batch: list[Pending], timing: BatchTiming, error: BaseException | None) -> None:
        with self._lock:
            self.ids.extend(p.payload.request.id for p in batch)


def build_repository(root: Path) -> Path:
    root.mkdir(parents=True, exist_ok=True)
    shutil.copytree(DEMO / "linear", root / "linear")
    python_model(
        root,
        "echo_bytes",
        """
        name: "echo_bytes"
        backend: "python"
        max_batch_size: 8
        input [ { name: "text", data_type: TYPE_STRING, dims: [ -1 ] } ]
        output [ { name: "text", data_type: TYPE_STRING, dims: [ -1 ] } ]
        """,
        """
        class Model:
            def execute(self, inputs):
                return {"text": inputs["text"]}
        """,
    )
    python_model(
        root,
        "nonfinite",
        """
        name: "nonfinite"
        backend: "python"
        max_batch_size: 8
        input [ { name: "x", data_type: TYPE_FP32, dims: [ 1 ] } ]
        output [ { name: "y", data_type: TYPE_FP32, dims: [ 4 ] } ]
        """,
        """
        import numpy as np

        class Model:
            def execute(self, inputs):
                x = inputs["x"]
                row = np.array([np.inf, -np.inf, np.nan, 0.0], dtype=np.float32)
                y = np.tile(row, (x.shape[0], 1))
                y[:, 3] = x[:, 0]
                return {"y": y}
        """,
    )
    return root


@contextmanager
def serve_edge_gateway(root: Path, max_body: int = MAX_BODY) -> Iterator[tuple[str, BatchSpy]]:
    spy = BatchSpy()
    gateway = Gateway(build_repository(root), GatewayOptions(max_body_bytes=max_body), None, hooks=[spy.hook])
    with serve_asgi(gateway) as address:
        yield address, spy


def good_linear_body(request_id: str = "good") -> bytes:
    x = (np.arange(256, dtype=np.float32) / 512).tolist()
    return b'{"id":"%s","inputs":[{"name":"x","shape":[1,256],"datatype":"FP32","data":%s}]}' % (
        request_id.encode(),
        str(x).encode(),
    )


def post(
    session: requests.Session, address: str, model: str, body: bytes, header_length: int | str | None = None
) -> requests.Response:
    headers: dict[str, Any] = {"Content-Type": "application/octet-stream"}
    if header_length is not None:
        headers["Inference-Header-Content-Length"] = str(header_length)
    return session.post(f"http://{address}/v2/models/{model}/infer", data=body, headers=headers, timeout=10)


def assert_still_serving(session: requests.Session, address: str) -> None:
    started = time.monotonic()
    r = post(session, address, "linear", good_linear_body())
    assert r.status_code == 200, r.text
    assert time.monotonic() - started < 5.0
