"""`make run` (scripts/run.sh) as a new user starts it: the address and the demo user come last, once the server
answers and the worker is up, so the worker's banner never scrolls them away."""

from __future__ import annotations

import contextlib
import os
import queue
import re
import signal
import subprocess
import threading
import time
from pathlib import Path

import pytest
import requests

from tests.support.gateway_process import REPO_ROOT, gateway_env
from tests.support.servers import free_port

PASSWORD = "a-long-first-run-password-7"


def test_make_run_prints_the_address_and_the_demo_user_last_once_the_services_are_up(
    tmp_path: Path,
) -> None:
    port = free_port()
    env = gateway_env(
        tmp_path,
        f"sqlite:///{tmp_path / 'db.sqlite3'}",
        PORT=str(port),
        HOST="127.0.0.1",
        CARBONLEDGER_PASSWORD=PASSWORD,
    )
    env.pop("CELERY_TASK_ALWAYS_EAGER", None)
    run = subprocess.Popen(
        ["bash", "scripts/run.sh"],
        cwd=REPO_ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    lines: queue.Queue[str] = queue.Queue()
    threading.Thread(target=lambda: [lines.put(line) for line in run.stdout or ()], daemon=True).start()
    seen: list[str] = []
    try:
        deadline = time.monotonic() + 400
        while not any("CarbonLedger is running at" in line for line in seen):
            assert run.poll() is None, "".join(seen[-40:])
            assert time.monotonic() < deadline, "no summary after the services came up:\n" + "".join(
                seen[-40:]
            )
            with contextlib.suppress(queue.Empty):
                seen.append(lines.get(timeout=1))
            if deadline - time.monotonic() > 90 and _answers(port):
                deadline = time.monotonic() + 90  # up: the summary follows within seconds
        # At the moment the summary is printed, the server answers and a worker is up.
        assert requests.get(f"http://127.0.0.1:{port}/accounts/login/", timeout=10).status_code == 200
        metrics = requests.get(f"http://127.0.0.1:{port}/metrics", timeout=10).text
        workers = re.search(r"^carbonledger_celery_workers_up (\d+)", metrics, re.M)
        assert workers and int(workers.group(1)) >= 1
        # The summary block: the address, the demo user with its first-run password, how to reset it.
        time.sleep(2)
        while not lines.empty():
            seen.append(lines.get())
        start = max(i for i, line in enumerate(seen) if "CarbonLedger is running at" in line)
        summary = "".join(seen[start:])
        assert f"http://127.0.0.1:{port}/" in summary
        assert f"demo / {PASSWORD}" in summary
        assert "manage.py changepassword demo" in summary
        before = "".join(seen[:start])
        assert "ready" in before.lower()  # the worker's banner came first
    finally:
        os.killpg(run.pid, signal.SIGINT)
        try:
            run.wait(30)
        except subprocess.TimeoutExpired:
            os.killpg(run.pid, signal.SIGKILL)
            run.wait(10)


def _answers(port: int) -> bool:
    try:
        return requests.get(f"http://127.0.0.1:{port}/readyz", timeout=2).status_code == 200
    except requests.RequestException:
        return False


pytestmark = pytest.mark.skipif(
    not (REPO_ROOT / ".venv" / "bin" / "celery").exists(), reason="needs the venv"
)
