"""Two replicas on one PostgreSQL database, end to end (issue 23's acceptance): `setup` from both at once; 1,000
management API ledger reads at concurrency 8 across both, no 5xx, the connections within the documented bound; a
third process started on a copy of one replica's spool refuses to start while the two keep serving; one beat
sends the rollup task once per interval while a second beat waits."""

from __future__ import annotations

import http.client
import shutil
import subprocess
import threading
import time
import uuid
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from tests.carbonledger.test_beat import INTERVAL_S, REDIS_URL, WINDOW_S, BeatProcess, RollupMessages
from tests.fleet.test_fleet import Process
from tests.support.gateway_process import (
    DEMO_LINEAR,
    PYTHON,
    REPO_ROOT,
    LedgerDatabase,
    gateway_env,
    infer_once,
    manage,
    postgres_url_from_env,
    wait_until,
)
from tests.support.servers import free_port

pytestmark = [
    pytest.mark.django_db(False),
    pytest.mark.skipif(postgres_url_from_env() is None, reason="replicas share one PostgreSQL database"),
]

POOL_N = 2
READS = 1000


def _get(port: int, path: str, key: str) -> int:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    try:
        conn.request("GET", path, headers={"Authorization": f"Bearer {key}"})
        resp = conn.getresponse()
        resp.read()
        return resp.status
    finally:
        conn.close()


def _ready(port: int, key: str) -> bool:
    try:
        return _get(port, "/readyz", key) == 200
    except OSError:
        return False


def test_two_replicas_share_one_database_without_losing_doubling_or_jamming_anything(
    tmp_path: Path,
    fleet_database: str,
) -> None:
    database = fleet_database.rsplit("/", 1)[1]
    db = LedgerDatabase(postgres_url=fleet_database)
    queue = f"replicas-{uuid.uuid4().hex[:12]}"
    shared = {
        "CELERY_BROKER_URL": REDIS_URL,
        "CELERY_QUEUE": queue,
        "ROLLUP_INTERVAL_S": str(INTERVAL_S),
        "CARBONLEDGER_GRPC_PORT": "0",
        "CARBONLEDGER_DB_POOL_MAX_SIZE": str(POOL_N),
        "LEDGER_CHAIN_LEASE_TTL_S": "10",
    }

    def env_for(name: str) -> dict[str, str]:
        var = tmp_path / name
        (var / "models").mkdir(parents=True)
        shutil.copytree(DEMO_LINEAR, var / "models" / "linear")
        return gateway_env(var, fleet_database, **shared)

    envs = [env_for("a"), env_for("b")]
    # 1. setup from both replicas at once, on the empty database.
    setups = [
        subprocess.Popen([PYTHON, "manage.py", "setup"], cwd=REPO_ROOT, env=env, stdout=subprocess.PIPE,
                         stderr=subprocess.STDOUT)
        for env in envs
    ]  # fmt: skip
    for proc in setups:
        out, _ = proc.communicate(timeout=300)
        assert proc.returncode == 0, out.decode(errors="replace")[-3000:]
    assert manage(envs[0], "create_organization", "acme").returncode == 0
    made = manage(envs[0], "create_api_key", "acme", "--scopes", "infer,read")
    assert made.returncode == 0, made.stderr
    key = made.stdout.strip().splitlines()[-1]

    logs = tmp_path / "logs"
    logs.mkdir()
    ports = [free_port(), free_port()]
    replicas = [
        Process(f"replica-{name}", [PYTHON, "manage.py", "serve", "--port", str(port)], env, logs).start()
        for name, port, env in zip("ab", ports, envs, strict=True)
    ]
    messages = RollupMessages(queue)
    beats: list[BeatProcess] = []
    try:
        for port, replica in zip(ports, replicas, strict=True):
            assert wait_until(lambda p=port: _ready(p, key), 90), replica.log_tail()
        for port in ports:  # something to read
            for _ in range(20):
                assert infer_once(("127.0.0.1", port), key)[0] == 200

        # 2. 1,000 ledger reads at concurrency 8 across both, the connections sampled meanwhile.
        samples: list[int] = []
        stop = threading.Event()

        def sample() -> None:
            while not stop.is_set():
                rows = db.query(f"SELECT count(*) FROM pg_stat_activity WHERE datname = '{database}'")
                samples.append(int(rows[0][0]))
                stop.wait(0.1)

        sampler = threading.Thread(target=sample, daemon=True)
        sampler.start()
        with ThreadPoolExecutor(8) as pool:
            statuses = Counter(
                pool.map(lambda i: _get(ports[i % 2], "/api/v1/ledger/requests?limit=20", key), range(READS))
            )
        stop.set()
        sampler.join(5)
        assert statuses == Counter({200: READS}), statuses
        # Each replica (serve and its ledger writer) at most 2 N + 1 (docs/operations.md), and the sampler's own.
        bound = 2 * (2 * POOL_N + 1) + 1
        assert samples and max(samples) <= bound, (max(samples), bound)

        # 3. A third process on a copy of replica a's spool is refused; a and b keep serving.
        copy = env_for("copy")
        shutil.copytree(
            Path(envs[0]["CARBONLEDGER_VAR_DIR"]) / "spool", Path(copy["CARBONLEDGER_VAR_DIR"]) / "spool"
        )
        third = Process(
            "third", [PYTHON, "manage.py", "serve", "--port", str(free_port())], copy, logs
        ).start()
        assert third.proc is not None
        third.proc.wait(120)
        assert third.proc.returncode != 0
        assert "held by" in third.log_tail() or "holds" in third.log_tail(), third.log_tail()
        for port in ports:
            assert infer_once(("127.0.0.1", port), key)[0] == 200

        # 4. One beat sends the rollup once per interval while a second waits.
        beats.append(BeatProcess(env_for("beat-1"), tmp_path / "beat-1.log"))
        assert wait_until(lambda: "holds the beat lock" in beats[0].log(), 60), beats[0].log()[-3000:]
        beats.append(BeatProcess(env_for("beat-2"), tmp_path / "beat-2.log"))
        assert wait_until(lambda: "waiting for the beat lock" in beats[1].log(), 60), beats[1].log()[-3000:]
        assert wait_until(lambda: messages.count() >= 1, 30), beats[0].log()[-3000:]
        sent = messages.over(WINDOW_S)
        expected = WINDOW_S / INTERVAL_S
        assert expected - 1 <= sent <= expected + 1, f"{sent} rollups in {WINDOW_S} s"
        assert "Sending due task" not in beats[1].log()
    finally:
        for beat in beats:
            beat.kill()
        for replica in replicas:
            replica.stop()
        messages.delete()
        time.sleep(0.1)
