"""The embedded default: a real Celery worker on kombu's filesystem broker, no external service."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

from tests.support.gateway_process import CeleryWorker

ROOT = Path(__file__).resolve().parents[2]


def test_worker_on_the_filesystem_broker_runs_a_task(tmp_path: Path) -> None:
    env = {
        **os.environ,
        "CARBONLEDGER_VAR_DIR": str(tmp_path),
        "CELERY_BROKER_URL": "filesystem://",
        "DJANGO_SETTINGS_MODULE": "carbonledger.settings",
    }
    env.pop("DATABASE_URL", None)
    env.pop("CELERY_RESULT_BACKEND", None)
    subprocess.run(
        [sys.executable, "manage.py", "migrate", "--noinput"],
        cwd=ROOT,
        env=env,
        check=True,
        capture_output=True,
        timeout=120,
    )
    worker = CeleryWorker(env, tmp_path / "worker.log").start()
    try:
        client = textwrap.dedent(
            """
            import django
            django.setup()
            from carbonledger.tasks import ping
            print("RESULT", ping.delay().get(timeout=60))
            """
        )
        done = subprocess.run(
            [sys.executable, "-c", client], cwd=ROOT, env=env, capture_output=True, text=True, timeout=90
        )
        assert done.returncode == 0, done.stderr[-2000:]
        assert "RESULT {'organizations': 0}" in done.stdout
    finally:
        worker.stop()


def test_the_scheduled_rollup_task_folds_new_ledger_records_in_by_itself(tmp_path: Path) -> None:
    """A worker with its embedded beat (as `make run` starts it) rolls up a ledger nobody asked it to."""
    env = {
        **os.environ,
        "CARBONLEDGER_VAR_DIR": str(tmp_path),
        "CELERY_BROKER_URL": "filesystem://",
        "DJANGO_SETTINGS_MODULE": "carbonledger.settings",
        "ROLLUP_INTERVAL_S": "1",
    }
    env.pop("DATABASE_URL", None)
    env.pop("CELERY_RESULT_BACKEND", None)

    def manage(*args: str) -> str:
        done = subprocess.run(
            [sys.executable, "manage.py", *args],
            cwd=ROOT,
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert done.returncode == 0, done.stderr[-2000:]
        return done.stdout

    manage("migrate", "--noinput")
    manage("create_organization", "acme")
    manage("load_demo_ledger", "--org", "acme", "--requests", "300", "--days", "1", "--no-rollup")
    count = textwrap.dedent(
        """
        import django
        django.setup()
        from django.db.models import Sum
        from carbon.models import HourlyRollup
        print("ROLLED", HourlyRollup.objects.aggregate(s=Sum("requests"))["s"])
        """
    )

    def rolled() -> str:
        done = subprocess.run(
            [sys.executable, "-c", count], cwd=ROOT, env=env, capture_output=True, text=True, timeout=60
        )
        return done.stdout.strip()

    assert rolled() == "ROLLED None"
    worker = CeleryWorker(env, tmp_path / "worker.log", beat=True).start()
    try:
        deadline = time.monotonic() + 90
        while time.monotonic() < deadline and rolled() != "ROLLED 300":
            time.sleep(1)
        assert rolled() == "ROLLED 300"
    finally:
        worker.stop()
