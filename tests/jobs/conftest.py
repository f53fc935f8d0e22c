"""Shared set-up of the jobs tests: the demo model repository, a fixed clock, hand-made hourly series, and a
stand-in for the gateway's KServe endpoint over real HTTP (the job runner's remote service)."""

from __future__ import annotations

import threading
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import numpy as np
import orjson
import pytest

from carbon import services as carbon
from carbon.models import FactorImport
from tenancy.models import Organization
from tenancy.services import api_key_create
from tests.factories import OrganizationFactory
from tests.support.models import linear_reference

DEMO_REPOSITORY = Path(__file__).resolve().parents[2] / "inference" / "demo_repository"
NOW = datetime(2025, 3, 1, 10, 10, tzinfo=UTC)  # submission instant of the planning tests
H10 = datetime(2025, 3, 1, 10, tzinfo=UTC)


def infer_line(seed: int) -> bytes:
    x = [((seed * 31 + i) % 97) / 97.0 for i in range(256)]
    return orjson.dumps(
        {"id": f"r{seed}", "inputs": [{"name": "x", "shape": [1, 256], "datatype": "FP32", "data": x}]}
    )


def job_file(n: int) -> bytes:
    return b"\n".join(infer_line(i) for i in range(n)) + b"\n"


def hourly_csv(zone: str, start: datetime, values: list[str | int]) -> bytes:
    rows = ["zone,datetime,g_co2e_per_kwh"]
    for i, value in enumerate(values):
        rows.append(f"{zone},{(start + timedelta(hours=i)).strftime('%Y-%m-%dT%H:%M:%SZ')},{value}")
    return ("\n".join(rows) + "\n").encode()


def import_series(zone: str, start: datetime, values: list[str | int], name: str = "series.csv") -> None:
    record = carbon.factor_import_csv(
        data=hourly_csv(zone, start, values), name=name, allow_new_zones=True, relative_uncertainty=0
    )
    assert record.status == FactorImport.Status.ACCEPTED, record.errors


@pytest.fixture(autouse=True)
def _jobs_settings(settings: Any) -> None:
    settings.MODEL_REPOSITORY = DEMO_REPOSITORY
    settings.JOBS_MIN_LEAD_S = 60.0
    settings.JOBS_MAX_HORIZON_S = 7 * 86400.0
    settings.JOBS_PROFILE_DAYS = 7
    settings.JOBS_MAX_REQUESTS = 50
    settings.JOBS_MAX_FILE_BYTES = 1_000_000
    settings.JOBS_REQUEST_ATTEMPTS = 2
    settings.JOBS_REQUEST_TIMEOUT_S = 10.0
    settings.INTENSITY_PROVIDERS = []
    settings.SITE_NAME = "local"
    settings.SITE_ZONE = "FR"


@pytest.fixture
def org(db: None) -> Organization:
    return OrganizationFactory()


@pytest.fixture
def series(db: None) -> None:
    """FR: 300, 200, 50, 400 g/kWh in the hours 10:00..13:00 of NOW's day."""
    import_series("FR", H10, [300, 200, 50, 400])


@dataclass
class FakeGateway:
    """Answers ``POST /v2/models/linear/infer`` like the gateway (the linear model's arithmetic and a
    ``parameters.ledger_id``), and records what it was sent."""

    url: str = ""
    received: list[dict[str, Any]] = field(default_factory=list)
    fail_ids: dict[str, tuple[int, bytes]] = field(default_factory=dict)  # request id -> (status, body)
    # Request ids answered with NaN and infinite outputs, in the bare tokens Triton writes in JSON.
    non_finite_ids: set[str] = field(default_factory=set)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def answer(self, path: str, headers: dict[str, str], body: bytes) -> tuple[int, bytes]:
        doc = orjson.loads(body)
        with self.lock:
            self.received.append(
                {"path": path, "authorization": headers.get("authorization", ""), "id": doc.get("id")}
            )
            failing = self.fail_ids.get(doc.get("id", ""))
        if failing is not None:
            return failing
        x = np.asarray(doc["inputs"][0]["data"], dtype=np.float32).reshape(doc["inputs"][0]["shape"])
        y = linear_reference(x)
        if doc.get("id") in self.non_finite_ids:
            ledger_id = f"fake.{uuid.uuid4().hex}"
            return 200, (
                b'{"id":"%s","model_name":"linear","model_version":"1","parameters":{"ledger_id":"%s"},'
                b'"outputs":[{"name":"y","datatype":"FP32","shape":[1,3],"data":[NaN,Infinity,-Infinity]}]}'
                % (doc["id"].encode(), ledger_id.encode())
            )
        return 200, orjson.dumps(
            {
                "id": doc.get("id"),
                "model_name": "linear",
                "model_version": "1",
                "parameters": {"ledger_id": f"fake.{uuid.uuid4().hex}"},
                "outputs": [
                    {"name": "y", "datatype": "FP32", "shape": list(y.shape), "data": y.ravel().tolist()}
                ],
            }
        )


@pytest.fixture
def fake_gateway(settings: Any) -> Iterator[FakeGateway]:
    gateway = FakeGateway()

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def do_POST(self) -> None:
            length = int(self.headers.get("Content-Length", "0"))
            body = self.rfile.read(length)
            status, answer = gateway.answer(self.path, {k.lower(): v for k, v in self.headers.items()}, body)
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(answer)))
            self.end_headers()
            self.wfile.write(answer)

        def log_message(self, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    gateway.url = f"http://127.0.0.1:{server.server_address[1]}"
    settings.GATEWAY_URL = gateway.url
    try:
        yield gateway
    finally:
        server.shutdown()
        server.server_close()
        thread.join(5)


def key_for(org: Organization, scopes: str = "infer,read") -> str:
    return api_key_create(organization=org, scopes=scopes).raw_key
