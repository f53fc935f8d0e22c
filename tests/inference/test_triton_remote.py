"""The remote-Triton backend against a real Triton server (the shared reference install)."""

from __future__ import annotations

import contextlib
import textwrap
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import tritonclient.http as httpclient

from inference.gateway import Gateway
from inference.keys import Principal
from inference.repository import GatewayOptions
from tests.support.models import linear_reference
from tests.support.servers import free_port_block, serve_asgi
from tests.support.triton import REFERENCE, running_triton, triton_available

ok, why = triton_available()
pytestmark = [pytest.mark.triton, pytest.mark.skipif(not ok, reason=why)]

KEY = "remote-test-key"
AUTH = {"Authorization": f"Bearer {KEY}"}


async def resolver(token: str) -> Principal | None:
    return Principal(1, "acme", 1, frozenset({"infer"})) if token == KEY else None


def remote_model(root: Path, name: str, protocol: str, url: str = "") -> None:
    """A gateway model forwarding to Triton's `linear`; without `url` it uses TRITON_URL."""
    url_param = f'parameters {{ key: "remote_url" value: {{ string_value: "{url}" }} }}' if url else ""
    (root / name / "1").mkdir(parents=True)
    (root / name / "config.pbtxt").write_text(
        textwrap.dedent(
            f"""
            name: "{name}"
            backend: "python"
            max_batch_size: 32
            input [ {{ name: "x", data_type: TYPE_FP32, dims: [ 256 ] }} ]
            output [ {{ name: "y", data_type: TYPE_FP32, dims: [ 256 ] }} ]
            dynamic_batching {{ preferred_batch_size: [ 8, 16, 32 ] max_queue_delay_microseconds: 2000 }}
            parameters {{ key: "remote" value: {{ string_value: "triton" }} }}
            parameters {{ key: "remote_model" value: {{ string_value: "linear" }} }}
            parameters {{ key: "remote_protocol" value: {{ string_value: "{protocol}" }} }}
            {url_param}
            """
        )
    )


@pytest.fixture(scope="module")
def gateway_on_triton(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    with contextlib.ExitStack() as stack:
        for attempt in range(3):
            port = free_port_block(3)  # HTTP, gRPC (port+1) and metrics (port+2)
            try:
                triton = stack.enter_context(running_triton(REFERENCE / "models", port))
                break
            except RuntimeError:
                # Another process may take one of the ports between our check and Triton's bind.
                if attempt == 2:
                    raise
        repo = tmp_path_factory.mktemp("remote-models")
        remote_model(repo, "linear_http", "http")  # URL from the gateway's settings (TRITON_URL)
        remote_model(repo, "linear_grpc", "grpc", f"127.0.0.1:{port + 1}")
        options = GatewayOptions(triton_url=triton, remote_timeout_s=10.0)
        yield stack.enter_context(serve_asgi(Gateway(repo, options, resolver)))


@pytest.mark.parametrize("model", ["linear_http", "linear_grpc"])
def test_remote_backend_forwards_batches_to_a_real_triton(gateway_on_triton: str, model: str) -> None:
    client = httpclient.InferenceServerClient(gateway_on_triton)
    x = np.random.default_rng(9).standard_normal((4, 256), dtype=np.float32)
    inp = httpclient.InferInput("x", [4, 256], "FP32")
    inp.set_data_from_numpy(x)
    result = client.infer(model, [inp], headers=dict(AUTH))
    np.testing.assert_allclose(result.as_numpy("y"), linear_reference(x), rtol=1e-5, atol=1e-5)
    stats = client.get_inference_statistics(model, headers=dict(AUTH))["model_stats"][0]
    assert stats["execution_count"] >= 1
    client.close()
