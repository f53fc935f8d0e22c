"""Exactly one beat: `manage.py beat` runs Celery beat only while it holds the database's beat lock; a second one
waits (and says so) and takes over when the first dies. Real beat processes, a real Redis broker queue whose
messages are counted, and no worker (nothing consumes them)."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis

from tenancy.locks import _NAMESPACE, KEYS
from tests.support.gateway_process import (
    PYTHON,
    REPO_ROOT,
    LedgerDatabase,
    gateway_env,
    manage,
    postgres_url_from_env,
    wait_until,
)

REDIS_URL = "redis://127.0.0.1:6379/0"
INTERVAL_S = 2.0
WINDOW_S = 10.0


class BeatProcess:
    def __init__(self, env: dict[str, str], log_path: Path) -> None:
        self.log_path = log_path
        with open(log_path, "ab") as log:
            self.proc = subprocess.Popen(
                [PYTHON, "manage.py", "beat", "--loglevel", "INFO"],
                cwd=REPO_ROOT,
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def kill(self) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.wait(10)


class RollupMessages:
    """The rollup task messages waiting in one Redis queue (kombu keeps a queue as a list, one per priority)."""

    def __init__(self, queue: str) -> None:
        self.queue = queue
        self.client = redis.Redis.from_url(REDIS_URL)
        self.client.ping()  # the local Redis must be up (.ci/run starts it)

    def count(self) -> int:
        n = 0
        for key in self.client.scan_iter(match=f"{self.queue}*"):
            if self.client.type(key) != b"list":
                continue
            for raw in self.client.lrange(key, 0, -1):
                if json.loads(raw)["headers"]["task"] == "carbonledger.rollups_update":
                    n += 1
        return n

    def over(self, seconds: float) -> int:
        first = self.count()
        time.sleep(seconds)
        return self.count() - first

    def delete(self) -> None:
        for key in list(self.client.scan_iter(match=f"{self.queue}*")):
            self.client.delete(key)
        for key in list(self.client.scan_iter(match=f"_kombu.binding.{self.queue}*")):
            self.client.delete(key)


@pytest.fixture
def messages() -> Iterator[RollupMessages]:
    box = RollupMessages(f"test-beat-{uuid.uuid4().hex[:12]}")
    try:
        yield box
    finally:
        box.delete()


def test_one_beat_sends_the_rollup_once_per_interval_while_a_second_waits_then_takes_over(
    tmp_path: Path, database_url: str, messages: RollupMessages
) -> None:
    settings = {
        "CELERY_BROKER_URL": REDIS_URL,
        "CELERY_QUEUE": messages.queue,
        "ROLLUP_INTERVAL_S": str(INTERVAL_S),
    }
    # Two replicas: one database and one broker, each its own var folder (and so its own schedule file).
    first_env = gateway_env(tmp_path / "first", database_url, **settings)
    second_env = gateway_env(tmp_path / "second", database_url, **settings)
    done = manage(first_env, "migrate", "--noinput")
    assert done.returncode == 0, done.stderr[-3000:]

    first = BeatProcess(first_env, tmp_path / "first-beat.log")
    second: BeatProcess | None = None
    try:
        assert wait_until(lambda: "holds the beat lock" in first.log(), 60), first.log()[-3000:]
        second = BeatProcess(second_env, tmp_path / "second-beat.log")
        assert wait_until(lambda: "waiting for the beat lock" in second.log(), 60), second.log()[-3000:]
        assert wait_until(lambda: messages.count() >= 1, 30), first.log()[-3000:]

        sent = messages.over(WINDOW_S)
        expected = WINDOW_S / INTERVAL_S
        assert expected - 1 <= sent <= expected + 1, (
            f"{sent} rollups sent in {WINDOW_S} s\n{first.log()[-2000:]}"
        )
        assert second.proc.poll() is None, second.log()[-3000:]
        assert "Sending due task" not in second.log(), "the waiting beat sent tasks"

        first.kill()
        assert wait_until(lambda: "holds the beat lock" in second.log(), 30), second.log()[-3000:]
        assert wait_until(lambda: "Sending due task rollups-update" in second.log(), 30), second.log()[-3000:]
        sent = messages.over(WINDOW_S)
        assert expected - 1 <= sent <= expected + 1, (
            f"{sent} rollups sent in {WINDOW_S} s\n{second.log()[-2000:]}"
        )
    finally:
        first.kill()
        if second is not None:
            second.kill()


@pytest.mark.skipif(
    postgres_url_from_env() is None, reason="a lock's session ended under it: PostgreSQL only"
)
def test_a_beat_whose_lock_session_is_ended_stops_sending_and_waits_again(
    tmp_path: Path, database_url: str, messages: RollupMessages
) -> None:
    settings = {
        "CELERY_BROKER_URL": REDIS_URL,
        "CELERY_QUEUE": messages.queue,
        "ROLLUP_INTERVAL_S": str(INTERVAL_S),
    }
    first_env = gateway_env(tmp_path / "first", database_url, **settings)
    second_env = gateway_env(tmp_path / "second", database_url, **settings)
    done = manage(first_env, "migrate", "--noinput")
    assert done.returncode == 0, done.stderr[-3000:]
    first = BeatProcess(first_env, tmp_path / "first-beat.log")
    second: BeatProcess | None = None
    try:
        assert wait_until(lambda: "holds the beat lock" in first.log(), 60), first.log()[-3000:]
        second = BeatProcess(second_env, tmp_path / "second-beat.log")
        assert wait_until(lambda: "waiting for the beat lock" in second.log(), 60), second.log()[-3000:]

        # The database ends the holder's session (a restart, an operator's pg_terminate_backend).
        ended = LedgerDatabase(postgres_url=database_url).query(
            "SELECT pg_terminate_backend(pid) FROM pg_locks WHERE locktype = 'advisory' AND granted"
            f" AND classid = {_NAMESPACE} AND objid = {KEYS['beat']}"
        )
        assert ended == [(True,)]
        waiting = second
        assert wait_until(lambda: "holds the beat lock" in waiting.log(), 30), waiting.log()[-3000:]
        # The first notices within its check interval, starts afresh and waits behind the second.
        assert wait_until(lambda: first.log().count("waiting for the beat lock") >= 1, 30), first.log()[
            -3000:
        ]
        assert "starts again, waiting for the lock" in first.log()
        assert first.proc.poll() is None, first.log()[-3000:]
        assert wait_until(lambda: "Sending due task rollups-update" in waiting.log(), 30), waiting.log()[
            -3000:
        ]
        sent = messages.over(WINDOW_S)
        expected = WINDOW_S / INTERVAL_S
        assert expected - 1 <= sent <= expected + 1, f"{sent} rollups sent in {WINDOW_S} s"
    finally:
        first.kill()
        if second is not None:
            second.kill()
