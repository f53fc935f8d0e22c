"""KServe v2 over gRPC (issue 27): a real gateway process (`manage.py serve`, ledger on) driven with Triton's own
clients, `tritonclient.grpc` and `tritonclient.grpc.aio`, the raw protobuf service, and perf_analyzer -i grpc."""

from __future__ import annotations

import asyncio
import json
import os
import socket
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.grpc.aio as aioclient
from tritonclient.grpc import service_pb2 as pb
from tritonclient.grpc import service_pb2_grpc as pb_grpc
from tritonclient.utils import InferenceServerException, deserialize_bytes_tensor

from tests.inference.grpc_gateway import (
    INFER,
    MAX_MESSAGE_BYTES,
    GrpcGateway,
    assert_still_serving,
    bytes_blob,
    linear_request,
    raw_infer,
    running_grpc_gateway,
)
from tests.support.gateway_process import REPO_ROOT, GatewayProcess, gateway_env, manage, prepare_gateway
from tests.support.models import linear_reference
from tests.support.servers import free_port

pytestmark = pytest.mark.django_db(False)

PERF_ANALYZER = Path(os.environ.get("TRITON_HOME", REPO_ROOT / "var" / "triton")) / "perf_analyzer"


@pytest.fixture(scope="module")
def gateway(tmp_path_factory: pytest.TempPathFactory) -> Iterator[GrpcGateway]:
    with running_grpc_gateway(tmp_path_factory.mktemp("grpc-gateway")) as running:
        yield running


@pytest.fixture
def client(gateway: GrpcGateway) -> Iterator[grpcclient.InferenceServerClient]:
    with grpcclient.InferenceServerClient(gateway.url) as made:
        yield made


@pytest.fixture
def stub(gateway: GrpcGateway) -> Iterator[Any]:
    with grpc.insecure_channel(gateway.url) as channel:
        yield pb_grpc.GRPCInferenceServiceStub(channel)


@pytest.fixture
def channel(gateway: GrpcGateway) -> Iterator[grpc.Channel]:
    with grpc.insecure_channel(gateway.url) as made:
        yield made


def _x(rows: int) -> np.ndarray:
    return np.random.default_rng(rows).standard_normal((rows, 256), dtype=np.float32)


def _linear_input(x: np.ndarray, module: Any = grpcclient) -> Any:
    tensor = module.InferInput("x", list(x.shape), "FP32")
    tensor.set_data_from_numpy(x)
    return tensor


def _ledger_row(gateway: GrpcGateway, ledger_id: str, timeout_s: float = 30.0) -> tuple[Any, ...]:
    """The ledger's record of ``ledger_id`` once the drainer has written it."""
    deadline = time.monotonic() + timeout_s
    while True:
        rows = gateway.db.query(
            "SELECT request_id, client_request_id, model, version, organization_id, api_key_id FROM ledger_request "
            f"WHERE request_id = '{ledger_id}'"
        )
        if rows:
            return rows[0]
        assert time.monotonic() < deadline, f"{ledger_id} not in the ledger after {timeout_s} s"
        time.sleep(0.3)


# -- every RPC --------------------------------------------------------------------------------


def test_every_rpc_answers_tritonclient_grpc(gateway: GrpcGateway, client: Any) -> None:
    auth = gateway.auth()
    assert client.is_server_live()
    assert client.is_server_ready()
    assert client.is_model_ready("linear", headers=auth)
    assert client.is_model_ready("linear", "1", headers=auth)
    assert not client.is_model_ready("no_such_model", headers=auth)
    assert not client.is_model_ready("linear", "9", headers=auth)

    server = client.get_server_metadata(headers=auth)
    assert server.name == "carbonledger"
    assert {"binary_tensor_data", "statistics", "model_repository"} <= set(server.extensions)

    model = client.get_model_metadata("linear", headers=auth)
    assert (model.name, list(model.versions), model.platform) == ("linear", ["1"], "python")
    assert [(t.name, t.datatype, list(t.shape)) for t in model.inputs] == [("x", "FP32", [-1, 256])]
    assert [(t.name, t.datatype, list(t.shape)) for t in model.outputs] == [("y", "FP32", [-1, 256])]

    config = client.get_model_config("linear", headers=auth).config
    assert config.name == "linear"
    assert config.max_batch_size == 32
    assert [(t.name, list(t.dims)) for t in config.input] == [("x", [256])]
    assert config.HasField("dynamic_batching")

    client.infer("linear", [_linear_input(_x(1))], headers=auth)
    stats = client.get_inference_statistics("linear", headers=auth)
    (linear,) = stats.model_stats
    assert (linear.name, linear.version) == ("linear", "1")
    assert linear.inference_stats.success.count >= 1
    assert linear.inference_count >= 1
    every = client.get_inference_statistics(headers=auth)
    assert {s.name for s in every.model_stats} == {"linear", "echo_bytes", "nonfinite", "queued"}

    index = client.get_model_repository_index(headers=auth)
    assert {(m.name, m.version, m.state) for m in index.models} >= {("linear", "1", "READY")}
    assert {m.name for m in index.models} == {"linear", "echo_bytes", "nonfinite", "queued"}


async def test_every_rpc_answers_tritonclient_grpc_aio(gateway: GrpcGateway) -> None:
    auth = gateway.auth()
    async with aioclient.InferenceServerClient(gateway.url) as client:
        assert await client.is_server_live()
        assert await client.is_server_ready()
        assert await client.is_model_ready("echo_bytes", headers=auth)
        assert not await client.is_model_ready("no_such_model", headers=auth)
        assert (await client.get_server_metadata(headers=auth)).name == "carbonledger"
        model = await client.get_model_metadata("echo_bytes", headers=auth)
        assert [(t.name, t.datatype) for t in model.inputs] == [("text", "BYTES")]
        config = await client.get_model_config("echo_bytes", headers=auth)
        assert config.config.max_batch_size == 8
        stats = await client.get_inference_statistics("echo_bytes", headers=auth)
        assert [s.name for s in stats.model_stats] == ["echo_bytes"]
        index = await client.get_model_repository_index(headers=auth)
        assert "echo_bytes" in {m.name for m in index.models}
        x = _x(3)
        result = await client.infer("linear", [_linear_input(x, aioclient)], headers=auth, request_id="aio-1")
        np.testing.assert_allclose(result.as_numpy("y"), linear_reference(x), rtol=1e-5, atol=1e-5)
        response = result.get_response()
        assert response.id == "aio-1"
        assert response.parameters["ledger_id"].string_param


# -- infer ------------------------------------------------------------------------------------


def test_infer_with_raw_contents_answers_the_reference_and_its_ledger_id_reaches_the_ledger(
    gateway: GrpcGateway, client: Any
) -> None:
    x = _x(2)
    result = client.infer("linear", [_linear_input(x)], headers=gateway.auth(), request_id="raw-1")
    np.testing.assert_allclose(result.as_numpy("y"), linear_reference(x), rtol=1e-5, atol=1e-5)
    response = result.get_response()
    assert (response.model_name, response.model_version, response.id) == ("linear", "1", "raw-1")
    assert len(response.raw_output_contents) == 1  # outputs travel raw, as Triton sends them
    ledger_id = response.parameters["ledger_id"].string_param
    assert ledger_id
    request_id, client_request_id, model, version, organization, api_key = _ledger_row(gateway, ledger_id)
    assert (request_id, client_request_id, model, version) == (ledger_id, "raw-1", "linear", "1")
    assert organization is not None and api_key is not None


def test_infer_with_typed_contents_answers_as_raw_contents_do(gateway: GrpcGateway, stub: Any) -> None:
    typed = stub.ModelInfer(linear_request(2, "typed", typed=True), metadata=gateway.metadata())
    raw = stub.ModelInfer(linear_request(2, "raw", typed=False), metadata=gateway.metadata())
    assert typed.raw_output_contents[0] == raw.raw_output_contents[0]
    x = (np.arange(512, dtype=np.float32) % 7 / 8).reshape(2, 256)
    y = np.frombuffer(typed.raw_output_contents[0], np.float32).reshape(2, 256)
    np.testing.assert_allclose(y, linear_reference(x), rtol=1e-5, atol=1e-5)
    assert typed.parameters["ledger_id"].string_param != raw.parameters["ledger_id"].string_param
    _ledger_row(gateway, typed.parameters["ledger_id"].string_param)


@pytest.mark.parametrize("typed", [True, False])
def test_bytes_tensors_travel_typed_and_raw(gateway: GrpcGateway, stub: Any, typed: bool) -> None:
    words = [b"carbon", b"", b"\x00\xffbin"]
    req = pb.ModelInferRequest(model_name="echo_bytes")
    tensor = req.inputs.add(name="text", datatype="BYTES", shape=[1, 3])
    if typed:
        tensor.contents.bytes_contents.extend(words)
    else:
        req.raw_input_contents.append(bytes_blob(words))
    answer = stub.ModelInfer(req, metadata=gateway.metadata())
    (output,) = answer.outputs
    assert (output.name, output.datatype, list(output.shape)) == ("text", "BYTES", [1, 3])
    assert list(deserialize_bytes_tensor(answer.raw_output_contents[0])) == words


def test_nonfinite_outputs_travel_bit_for_bit(gateway: GrpcGateway, client: Any) -> None:
    x = grpcclient.InferInput("x", [1, 1], "FP32")
    x.set_data_from_numpy(np.array([[2.5]], np.float32))
    y = client.infer("nonfinite", [x], headers=gateway.auth()).as_numpy("y")
    assert y[0, 0] == np.inf and y[0, 1] == -np.inf and np.isnan(y[0, 2]) and y[0, 3] == 2.5


def test_stream_infer_answers_every_request_on_the_stream_and_a_refused_one_with_its_error(
    gateway: GrpcGateway, client: Any
) -> None:
    answers: list[tuple[Any, Any]] = []
    client.start_stream(
        callback=lambda result, error: answers.append((result, error)), headers=gateway.auth()
    )
    try:
        for i in range(6):
            client.async_stream_infer("linear", [_linear_input(_x(1))], request_id=f"s{i}")
        bad = grpcclient.InferInput("x", [1, 255], "FP32")
        bad.set_data_from_numpy(np.zeros((1, 255), np.float32))
        client.async_stream_infer("linear", [bad], request_id="bad")
        client.async_stream_infer("linear", [_linear_input(_x(1))], request_id="after")
    finally:
        client.stop_stream()  # waits for the answers
    errors = [error for result, error in answers if error is not None]
    results = {result.get_response().id: result for result, error in answers if error is None}
    assert set(results) == {"s0", "s1", "s2", "s3", "s4", "s5", "after"}
    assert len(errors) == 1 and "unexpected shape" in errors[0].message()
    for result in results.values():
        np.testing.assert_allclose(result.as_numpy("y"), linear_reference(_x(1)), rtol=1e-5, atol=1e-5)
        assert result.get_response().parameters["ledger_id"].string_param


async def test_stream_infer_with_the_aio_client(gateway: GrpcGateway) -> None:
    async def requests() -> Any:
        for i in range(5):
            yield {"model_name": "linear", "inputs": [_linear_input(_x(2), aioclient)], "request_id": f"a{i}"}

    async with aioclient.InferenceServerClient(gateway.url) as client:
        seen = []
        async for result, error in client.stream_infer(requests(), headers=gateway.auth()):
            assert error is None
            seen.append(result.get_response().id)
            np.testing.assert_allclose(result.as_numpy("y"), linear_reference(_x(2)), rtol=1e-5, atol=1e-5)
    assert sorted(seen) == [f"a{i}" for i in range(5)]


# -- keys and scopes ---------------------------------------------------------------------------

KEYED_CALLS = {
    "ModelInfer": lambda c, h: c.infer("linear", [_linear_input(_x(1))], headers=h),
    "ModelReady": lambda c, h: c.is_model_ready("linear", headers=h),
    "ServerMetadata": lambda c, h: c.get_server_metadata(headers=h),
    "ModelMetadata": lambda c, h: c.get_model_metadata("linear", headers=h),
    "ModelConfig": lambda c, h: c.get_model_config("linear", headers=h),
    "ModelStatistics": lambda c, h: c.get_inference_statistics(headers=h),
    "RepositoryIndex": lambda c, h: c.get_model_repository_index(headers=h),
}


def _status(call: Any) -> tuple[Any, str]:
    with pytest.raises(InferenceServerException) as caught:
        call()
    return caught.value.status(), caught.value.message()


@pytest.mark.parametrize("rpc", sorted(KEYED_CALLS))
def test_a_missing_or_unknown_key_is_unauthenticated_and_a_key_without_infer_scope_permission_denied(
    gateway: GrpcGateway, client: Any, rpc: str
) -> None:
    call = KEYED_CALLS[rpc]
    status, message = _status(lambda: call(client, None))
    assert status == "StatusCode.UNAUTHENTICATED"
    assert "authorization: Bearer <key>" in message
    status, message = _status(lambda: call(client, {"authorization": "Bearer cl_not_a_key"}))
    assert (status, message) == ("StatusCode.UNAUTHENTICATED", "invalid or revoked API key")
    status, _ = _status(lambda: call(client, {"authorization": "Basic dXNlcjpwYXNz"}))
    assert status == "StatusCode.UNAUTHENTICATED"
    status, message = _status(lambda: call(client, gateway.auth(gateway.read_key)))
    assert status == "StatusCode.PERMISSION_DENIED"
    assert "'infer' scope" in message


def test_liveness_and_readiness_need_no_key(client: Any) -> None:
    assert client.is_server_live(headers={})
    assert client.is_server_ready(headers={"authorization": "Bearer wrong"})


async def test_a_stream_with_a_bad_key_ends_unauthenticated(gateway: GrpcGateway) -> None:
    async def requests() -> Any:
        yield {"model_name": "linear", "inputs": [_linear_input(_x(1), aioclient)]}

    async with aioclient.InferenceServerClient(gateway.url) as client:
        with pytest.raises(grpc.aio.AioRpcError) as caught:  # the aio client does not wrap a stream's status
            async for _result, _error in client.stream_infer(
                requests(), headers={"authorization": "Bearer x"}
            ):
                pass
    assert caught.value.code() == grpc.StatusCode.UNAUTHENTICATED


# -- errors as Triton's statuses ----------------------------------------------------------------


def test_errors_get_tritons_grpc_statuses_and_the_server_keeps_serving(
    gateway: GrpcGateway, client: Any, channel: grpc.Channel
) -> None:
    auth = gateway.auth()
    status, message = _status(lambda: client.infer("no_such_model", [_linear_input(_x(1))], headers=auth))
    assert status == "StatusCode.NOT_FOUND" and "no_such_model" in message
    status, message = _status(lambda: client.get_model_metadata("linear", "7", headers=auth))
    assert status == "StatusCode.NOT_FOUND"
    wrong = grpcclient.InferInput("x", [1, 256], "FP64")
    wrong.set_data_from_numpy(np.zeros((1, 256), np.float64))
    status, message = _status(lambda: client.infer("linear", [wrong], headers=auth))
    assert status == "StatusCode.INVALID_ARGUMENT" and "FP64" in message

    status, details = raw_infer(channel, b"\xff\xff\xff\xff", gateway.metadata())
    assert status == grpc.StatusCode.INVALID_ARGUMENT and "ModelInferRequest" in str(details)

    huge = linear_request()
    huge.raw_input_contents[0] = bytes(MAX_MESSAGE_BYTES + 1)
    status, _ = raw_infer(channel, huge.SerializeToString(), gateway.metadata())
    assert status == grpc.StatusCode.RESOURCE_EXHAUSTED
    padded = (*gateway.metadata(), ("x-padding", "p" * 17000))  # over GATEWAY_MAX_HEADER_BYTES (16384)
    status, _ = raw_infer(channel, linear_request().SerializeToString(), padded)
    assert status == grpc.StatusCode.RESOURCE_EXHAUSTED

    # A name of a megabyte echoed in an error message is cut: the grpc-message trailer must stay readable.
    long_name = linear_request()
    long_name.model_name = "m" * (MAX_MESSAGE_BYTES - 4096)
    status, details = raw_infer(channel, long_name.SerializeToString(), gateway.metadata())
    assert status == grpc.StatusCode.NOT_FOUND and len(str(details)) <= 2000

    unimplemented = channel.unary_unary("/inference.GRPCInferenceService/SystemSharedMemoryStatus")
    with pytest.raises(grpc.RpcError) as caught:
        unimplemented(b"", metadata=gateway.metadata(), timeout=10)
    assert caught.value.code() == grpc.StatusCode.UNIMPLEMENTED
    assert_still_serving(channel, gateway.metadata())


async def test_a_full_queue_is_unavailable_with_retry_after_as_in_triton(gateway: GrpcGateway) -> None:
    req = pb.ModelInferRequest(model_name="queued")
    req.inputs.add(name="x", datatype="FP32", shape=[1, 1])
    req.raw_input_contents.append(np.ones(1, np.float32).tobytes())
    async with grpc.aio.insecure_channel(gateway.url) as channel:
        call = channel.unary_unary(INFER, request_serializer=None, response_deserializer=None)

        async def one() -> tuple[grpc.StatusCode, str, Any]:
            try:
                await call(req.SerializeToString(), metadata=gateway.metadata(), timeout=20)
                return grpc.StatusCode.OK, "", ()
            except grpc.aio.AioRpcError as exc:
                return exc.code(), exc.details() or "", exc.trailing_metadata()

        first = asyncio.ensure_future(one())
        # The instance takes the first out of the queue and runs it for a second; sent all at once, the eight
        # could all reach the queue before it does (seen on a loaded machine), leaving one place for them all.
        await asyncio.sleep(0.3)
        rest = await asyncio.gather(*(one() for _ in range(7)))
        outcomes = [await first, *rest]
    codes = [code for code, _, _ in outcomes]
    assert codes.count(grpc.StatusCode.OK) >= 2  # one running, one queued
    refused = [(details, trailers) for code, details, trailers in outcomes if code != grpc.StatusCode.OK]
    assert refused and all(code in (grpc.StatusCode.OK, grpc.StatusCode.UNAVAILABLE) for code in codes)
    for details, trailers in refused:
        assert "queue" in details
        assert ("retry-after", "1") in tuple(trailers)


# -- perf_analyzer ------------------------------------------------------------------------------


@pytest.mark.skipif(
    not PERF_ANALYZER.exists(), reason=f"{PERF_ANALYZER} not installed (tests/support/triton.py)"
)
def test_perf_analyzer_over_grpc_validates_every_answer(gateway: GrpcGateway, tmp_path: Path) -> None:
    rows, expected = [], []
    for i in range(5):
        x = np.zeros((1, 256), np.float32)
        x[0, i * 40] = 1.0  # one-hot rows: their outputs are exact in float32 whatever the batch
        rows.append({"x": {"content": x.ravel().tolist(), "shape": [256]}})
        expected.append({"y": {"content": linear_reference(x).ravel().tolist(), "shape": [256]}})
    data = tmp_path / "data.json"
    data.write_text(json.dumps({"data": rows, "validation_data": expected}))
    # What is checked is every answer (validation_data), not the timing: on a shared host the windows' latencies
    # vary far beyond any stability test, so 999 % lets any three windows count.
    argv = [
        str(PERF_ANALYZER), "-m", "linear", "-u", gateway.url, "-i", "grpc", "-b", "1",
        "--concurrency-range", "4:4", "--measurement-interval", "1000", "--max-trials", "8",
        "--stability-percentage", "999", "--input-data", str(data),
        "-H", f"authorization: Bearer {gateway.key}",
    ]  # fmt: skip
    env = dict(os.environ, LD_LIBRARY_PATH=str(PERF_ANALYZER.parent / "pa_libs"))
    done = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=120, check=False)
    out = done.stdout + done.stderr
    assert done.returncode == 0, out[-3000:]
    assert "error" not in out.lower(), out[-3000:]
    throughput = float(out.split("Throughput: ")[1].split(" infer/sec")[0])
    assert throughput > 0
    assert "Successful request count" in out  # perf_analyzer read our ModelStatistics


# -- the port setting ---------------------------------------------------------------------------


@pytest.mark.parametrize("value", ["grpc", "-1", "70000"])
def test_a_bad_grpc_port_stops_start_up_naming_the_variable(tmp_path: Path, value: str) -> None:
    env = gateway_env(tmp_path / "var", CARBONLEDGER_GRPC_PORT=value)
    done = manage(env, "check")
    assert done.returncode != 0
    assert "CARBONLEDGER_GRPC_PORT" in done.stderr


def test_a_grpc_port_in_use_stops_the_gateway_naming_the_variable(tmp_path: Path) -> None:
    env = gateway_env(tmp_path / "var")
    prepare_gateway(env)
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        env["CARBONLEDGER_GRPC_PORT"] = str(taken.getsockname()[1])
        process = GatewayProcess(env, tmp_path / "gateway.log", port=free_port())
        try:
            with pytest.raises(RuntimeError, match="CARBONLEDGER_GRPC_PORT"):
                process.start(timeout_s=60)
        finally:
            process.kill()
