"""A real gateway process serving KServe v2 over gRPC for the gRPC tests: ``manage.py serve`` with the ledger on
(its own SQLite database, or a fresh PostgreSQL one when the suite runs there), an organization with an infer key
and a read-only key, and the edge tests' models (``linear``, ``echo_bytes``, ``nonfinite``) plus ``queued``, a
slow model whose queue holds one request."""

from __future__ import annotations

import contextlib
import struct
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import grpc
import numpy as np
from tritonclient.grpc import service_pb2 as pb

from tests.inference.edge_gateway import build_repository
from tests.support.gateway_process import (
    GatewayProcess,
    LedgerDatabase,
    fresh_postgres_database,
    gateway_env,
    manage,
    postgres_url_from_env,
    prepare_gateway,
)
from tests.support.models import python_model
from tests.support.servers import free_port

MAX_MESSAGE_BYTES = 1024 * 1024  # GATEWAY_MAX_BODY_BYTES of the test gateway: the gRPC receive limit

INFER = "/inference.GRPCInferenceService/ModelInfer"


@dataclass
class GrpcGateway:
    process: GatewayProcess
    url: str  # host:port of the gRPC server
    key: str  # scopes infer, read
    read_key: str  # scope read only
    db: LedgerDatabase

    def auth(self, key: str | None = None) -> dict[str, str]:
        return {"authorization": f"Bearer {key or self.key}"}

    def metadata(self, key: str | None = None) -> tuple[tuple[str, str], ...]:
        return (("authorization", f"Bearer {key or self.key}"),)


def _add_queued_model(root: Path) -> None:
    python_model(
        root,
        "queued",
        """
        name: "queued"
        backend: "python"
        max_batch_size: 1
        input [ { name: "x", data_type: TYPE_FP32, dims: [ 1 ] } ]
        output [ { name: "y", data_type: TYPE_FP32, dims: [ 1 ] } ]
        dynamic_batching { default_queue_policy { max_queue_size: 1 } }
        """,
        """
        import time

        class Model:
            def execute(self, inputs):
                time.sleep(1.0)
                return {"y": inputs["x"]}
        """,
    )


@contextlib.contextmanager
def running_grpc_gateway(tmp: Path) -> Iterator[GrpcGateway]:
    var_dir = tmp / "var"
    root = build_repository(var_dir / "models")
    _add_queued_model(root)
    admin = postgres_url_from_env()
    with contextlib.ExitStack() as stack:
        if admin is None:
            database_url = None
            db = LedgerDatabase(sqlite_path=var_dir / "carbonledger.sqlite3")
        else:
            database_url = stack.enter_context(fresh_postgres_database(admin))
            db = LedgerDatabase(postgres_url=database_url)
        env = gateway_env(var_dir, database_url, GATEWAY_MAX_BODY_BYTES=str(MAX_MESSAGE_BYTES))
        key = prepare_gateway(env)
        done = manage(env, "create_api_key", "acme", "--scopes", "read")
        assert done.returncode == 0, done.stderr
        read_key = done.stdout.strip().splitlines()[-1]
        for attempt in range(3):
            port = free_port()
            env["CARBONLEDGER_GRPC_PORT"] = str(port)
            process = GatewayProcess(env, tmp / "gateway.log")
            try:
                process.start(timeout_s=60)
                break
            except RuntimeError as exc:  # another process took the free port meanwhile
                if attempt == 2 or "CARBONLEDGER_GRPC_PORT" not in str(exc):
                    raise
        stack.callback(process.kill)
        yield GrpcGateway(process, f"127.0.0.1:{port}", key, read_key, db)
        assert process.terminate(), process.log_tail()


def linear_request(rows: int = 1, request_id: str = "", typed: bool = False) -> pb.ModelInferRequest:
    x = (np.arange(rows * 256, dtype=np.float32) % 7) / 8
    req = pb.ModelInferRequest(model_name="linear", id=request_id)
    tensor = req.inputs.add(name="x", datatype="FP32", shape=[rows, 256])
    if typed:
        tensor.contents.fp32_contents.extend(x.tolist())
    else:
        req.raw_input_contents.append(x.tobytes())
    return req


def bytes_blob(items: list[bytes]) -> bytes:
    return b"".join(struct.pack("<I", len(b)) + b for b in items)


def raw_infer(
    channel: grpc.Channel, body: bytes, metadata: tuple[tuple[str, str], ...], timeout_s: float = 10.0
) -> tuple[grpc.StatusCode, bytes | str]:
    """One ModelInfer call with ``body`` as the request's bytes: (status, the response's bytes or the error's
    details)."""
    call = channel.unary_unary(INFER, request_serializer=None, response_deserializer=None)
    try:
        return grpc.StatusCode.OK, call(body, metadata=metadata, timeout=timeout_s)
    except grpc.RpcError as exc:
        return exc.code(), exc.details() or ""


def assert_still_serving(channel: grpc.Channel, metadata: tuple[tuple[str, str], ...]) -> None:
    started = time.monotonic()
    status, answer = raw_infer(channel, linear_request(request_id="good").SerializeToString(), metadata, 5.0)
    assert status == grpc.StatusCode.OK, answer
    assert isinstance(answer, bytes)
    assert pb.ModelInferResponse.FromString(answer).id == "good"
    assert time.monotonic() - started < 5.0
