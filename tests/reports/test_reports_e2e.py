"""End to end: the product's server and a real Celery worker on the local Redis; a report requested over
the API, its progress polled, its three files downloaded."""

from __future__ import annotations

import hashlib
import io
import time
import uuid
from pathlib import Path

import pypdf
import redis
import requests

from tests.support.gateway_process import (
    CeleryWorker,
    GatewayProcess,
    gateway_env,
    manage,
    prepare_gateway,
)

REDIS_URL = "redis://127.0.0.1:6379/0"


def test_a_report_requested_over_the_api_is_made_by_a_celery_worker_on_redis(
    tmp_path: Path, database_url: str
) -> None:
    redis.Redis.from_url(REDIS_URL).ping()  # the local Redis must be up (.ci/run starts it)
    queue = f"e2e-{uuid.uuid4().hex[:8]}"
    env = gateway_env(
        tmp_path,
        database_url,
        CELERY_BROKER_URL=REDIS_URL,
        CELERY_RESULT_BACKEND=REDIS_URL,
        CELERY_QUEUE=queue,
        LEDGER_WRITER="thread",
    )
    key = prepare_gateway(env)
    admin_key = (
        manage(env, "create_api_key", "acme", "--scopes", "read,admin").stdout.strip().splitlines()[-1]
    )
    loaded = manage(env, "load_demo_ledger", "--org", "acme", "--requests", "3000", "--days", "3")
    assert loaded.returncode == 0, loaded.stderr[-2000:]
    assert key
    server = GatewayProcess(env, tmp_path / "server.log").start()
    worker = CeleryWorker(env, tmp_path / "worker.log").start()
    base = f"http://127.0.0.1:{server.port}"
    headers = {"Authorization": f"Bearer {admin_key}"}
    try:
        today = time.strftime("%Y-%m-%d", time.gmtime())
        start = time.strftime("%Y-%m-%d", time.gmtime(time.time() - 5 * 86400))
        created = requests.post(
            f"{base}/api/v1/reports", json={"start": start, "end": today}, headers=headers, timeout=10
        )
        assert created.status_code == 202, created.text
        report_id = created.json()["id"]
        seen_progress = set()
        deadline = time.monotonic() + 120
        detail: dict = {}
        while time.monotonic() < deadline:
            detail = requests.get(f"{base}/api/v1/reports/{report_id}", headers=headers, timeout=10).json()
            seen_progress.add(detail["progress"])
            if detail["status"] in ("done", "failed"):
                break
            time.sleep(0.2)
        assert detail.get("status") == "done", (detail, worker.log_tail())
        assert 100 in seen_progress
        files = {f["format"]: f for f in detail["files"]}
        assert set(files) == {"pdf", "csv", "json", "esrs-e1"}
        for fmt, meta in files.items():
            got = requests.get(base + meta["url"], headers=headers, timeout=30)
            assert got.status_code == 200
            assert hashlib.sha256(got.content).hexdigest() == meta["sha256"]
            if fmt == "pdf":
                text = " ".join(p.extract_text() for p in pypdf.PdfReader(io.BytesIO(got.content)).pages)
                assert "Greenhouse gas report" in text
            if fmt == "json":
                assert got.json()["results"]["requests"] > 0
        # Another organization's key sees nothing of it.
        manage(env, "create_organization", "other")
        other = manage(env, "create_api_key", "other", "--scopes", "read").stdout.strip().splitlines()[-1]
        peek = requests.get(
            f"{base}/api/v1/reports/{report_id}/files/pdf",
            headers={"Authorization": f"Bearer {other}"},
            timeout=10,
        )
        assert peek.status_code == 404
    finally:
        worker.stop()
        server.terminate()
        redis.Redis.from_url(REDIS_URL).delete(queue)
