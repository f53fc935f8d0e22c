"""End to end: the product's server (gateway + API) and a real Celery worker on the local Redis. A job of three
requests is submitted over the API with its window now; the worker sends its requests to the gateway's own
KServe endpoint; the outputs match the linear model's reference arithmetic, the ledger holds every request,
and the emissions become final once the metering intervals have closed."""

from __future__ import annotations

import time
import uuid
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import numpy as np
import orjson
import redis
import requests

from tests.jobs.conftest import infer_line
from tests.support.gateway_process import (
    CeleryWorker,
    GatewayProcess,
    gateway_env,
    manage,
    prepare_gateway,
)
from tests.support.models import linear_reference

REDIS_URL = "redis://127.0.0.1:6379/0"


def _poll(get: Any, done: Any, timeout_s: float) -> dict[str, Any]:
    deadline = time.monotonic() + timeout_s
    body: dict[str, Any] = {}
    while time.monotonic() < deadline:
        body = get()
        if done(body):
            return body
        time.sleep(0.25)
    return body


def _next_hour_deadline() -> datetime:
    """The next whole UTC hour, so that the only start considered is now (waits out an hour's last 90 s)."""
    now = datetime.now(UTC)
    next_hour = now.replace(minute=0, second=0, microsecond=0) + timedelta(hours=1)
    if (next_hour - now).total_seconds() < 90:
        time.sleep((next_hour - now).total_seconds() + 1)
        next_hour += timedelta(hours=1)
    return next_hour


def test_a_job_runs_through_the_gateway_with_a_real_worker_and_its_emissions_become_final(
    tmp_path: Path, database_url: str
) -> None:
    redis.Redis.from_url(REDIS_URL).ping()  # the local Redis must be up (.ci/run starts it)
    queue = f"e2e-jobs-{uuid.uuid4().hex[:8]}"
    env = gateway_env(
        tmp_path,
        database_url,
        CELERY_BROKER_URL=REDIS_URL,
        CELERY_RESULT_BACKEND=REDIS_URL,
        CELERY_QUEUE=queue,
        LEDGER_WRITER="thread",
        METER_INTERVAL_S="0.2",  # intervals close quickly, so energy becomes final within seconds
        LEDGER_WRITE_INTERVAL_S="0.2",
    )
    key = prepare_gateway(env)  # an 'acme' key with infer,read
    loaded = manage(env, "load_factors")
    assert loaded.returncode == 0, loaded.stderr[-2000:]
    server = GatewayProcess(env, tmp_path / "server.log").start()
    worker_env = {**env, "GATEWAY_URL": f"http://127.0.0.1:{server.port}"}
    worker = CeleryWorker(worker_env, tmp_path / "worker.log").start()
    base = f"http://127.0.0.1:{server.port}"
    headers = {"Authorization": f"Bearer {key}"}

    def logs() -> str:
        return f"worker:\n{worker.log_tail()}\nserver:\n{server.log_tail()}"

    try:
        lines = [infer_line(i) for i in range(3)]
        deadline = _next_hour_deadline()
        created = requests.post(
            f"{base}/api/v1/jobs",
            files={"file": ("three.jsonl", b"\n".join(lines) + b"\n")},
            data={"model": "linear", "deadline": deadline.isoformat()},
            headers=headers,
            timeout=30,
        )
        assert created.status_code == 202, created.text
        job = created.json()
        assert job["status"] == "queued" and job["window"]["start"] == job["submitted_at"]
        url = f"{base}/api/v1/jobs/{job['id']}"

        def get() -> dict[str, Any]:
            return dict(requests.get(url, headers=headers, timeout=30).json())

        done = _poll(get, lambda b: b["status"] in ("done", "failed"), 120)
        assert done.get("status") == "done", (done, logs())
        assert done["progress"] == {"requests": 3, "answered": 3, "percent": 100}
        outputs = requests.get(f"{url}/outputs", headers=headers, timeout=30)
        assert outputs.status_code == 200
        answers = [orjson.loads(line) for line in outputs.content.splitlines()]
        assert [a["index"] for a in answers] == [0, 1, 2]
        for answer, line in zip(answers, lines, strict=True):
            sent = orjson.loads(line)["inputs"][0]
            x = np.asarray(sent["data"], dtype=np.float32).reshape(sent["shape"])
            y = answer["response"]["outputs"][0]
            got = np.asarray(y["data"], dtype=np.float32).reshape(y["shape"])
            np.testing.assert_allclose(got, linear_reference(x), rtol=1e-5, atol=1e-5)
            assert answer["ledger_id"] == answer["response"]["parameters"]["ledger_id"]
        # The ledger holds every request of the job, as the organization's own.
        for answer in answers:
            record = _poll(
                lambda a=answer: dict(
                    requests.get(
                        f"{base}/api/v1/requests/{a['ledger_id']}", headers=headers, timeout=30
                    ).json()
                ),
                lambda b: b.get("request_id") is not None,
                30,
            )
            assert record.get("model") == "linear", (record, logs())
        # The emissions become final once the metering intervals have closed.
        final = _poll(get, lambda b: b["emissions"]["status"] == "final", 60)
        emissions = final["emissions"]
        assert emissions["status"] == "final", (emissions, logs())
        assert float(emissions["energy_j"]) > 0 and emissions["requests"] == 3
        assert emissions["co2e_g"] is not None and emissions["hours"][0]["zone"] == "FR"
        counterfactual = final["counterfactual"]
        assert counterfactual["in_inventory"] is False and counterfactual["estimate"] is True
        assert counterfactual["label"].startswith("estimate outside the inventory")
    finally:
        worker.stop()
        server.terminate()
        redis.Redis.from_url(REDIS_URL).delete(queue)
