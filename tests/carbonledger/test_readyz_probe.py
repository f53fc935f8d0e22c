"""How /readyz answers, on the gateway alone (no Django): the database-side checks run on a thread of their own
with a time bound, so a stuck database never holds the event loop; one check runs at a time and its answer is
kept about a second, so probes cannot pile up; a check that raises is a failed check, named, not a 500.

The checks here are plain functions standing in for the database (a remote service): the process-level tests
with a real database that goes away, a stopped drainer and a quarantined record are in test_readyz.py."""

from __future__ import annotations

import concurrent.futures
import shutil
import threading
import time
from collections.abc import Sequence
from pathlib import Path

import pytest
import requests

from inference.gateway import Gateway
from inference.readiness import Check, Readiness
from inference.repository import GatewayOptions
from tests.support.models import DEMO
from tests.support.servers import serve_asgi


@pytest.fixture
def models(tmp_path: Path) -> Path:
    shutil.copytree(DEMO / "linear", tmp_path / "models" / "linear")
    return tmp_path / "models"


def probe(address: str) -> tuple[int, dict[str, object], float]:
    began = time.monotonic()
    r = requests.get(f"http://{address}/readyz", timeout=10)
    return r.status_code, r.json(), time.monotonic() - began


def test_readyz_is_200_with_every_check_named_when_all_pass(models: Path) -> None:
    def database() -> Sequence[Check]:
        return [Check("database", True, "answered in 1 ms"), Check("ledger_quarantine", True, "none waiting")]

    gateway = Gateway(models, GatewayOptions(), None)
    gateway.readiness = Readiness(
        blocking=database, inline=lambda: [Check("spool", True, "2 % of its cap")], timeout_s=1.0, cache_s=0.0
    )
    with serve_asgi(gateway) as address:
        status, body, _ = probe(address)
        # The KServe readiness is untouched: it is about the models only.
        assert requests.get(f"http://{address}/v2/health/ready", timeout=5).status_code == 200
    assert status == 200
    assert body["ready"] is True and body["failed"] == []
    checks = body["checks"]
    assert isinstance(checks, dict)
    assert set(checks) == {"models", "database", "ledger_quarantine", "spool"}
    assert checks["spool"] == {"ok": True, "detail": "2 % of its cap"}


def test_a_stuck_database_check_answers_503_in_time_runs_once_and_never_blocks_the_loop(models: Path) -> None:
    release = threading.Event()
    calls: list[float] = []

    def database() -> Sequence[Check]:
        calls.append(time.monotonic())
        release.wait(20)  # a connect that hangs (a database host that went away without a reset)
        return [Check("database", True, "answered"), Check("ledger_quarantine", True, "none waiting")]

    gateway = Gateway(models, GatewayOptions(), None)
    gateway.readiness = Readiness(blocking=database, timeout_s=0.3, cache_s=1.0)
    try:
        with serve_asgi(gateway) as address:
            with concurrent.futures.ThreadPoolExecutor(16) as pool:
                answers = list(pool.map(lambda _: probe(address), range(16)))
                # The event loop is free while the check hangs on its thread.
                began = time.monotonic()
                live = requests.get(f"http://{address}/v2/health/live", timeout=5)
                assert live.status_code == 200 and time.monotonic() - began < 0.25
                more = list(pool.map(lambda _: probe(address), range(16)))
            for status, body, took in answers + more:
                assert status == 503
                assert took < 2.0
                assert "database" in body["failed"]
                checks = body["checks"]
                assert isinstance(checks, dict)
                assert "no answer within 0.3 s" in checks["database"]["detail"]
            # 32 probes, one check: the others waited for it or took its cached answer.
            assert len(calls) == 1
            release.set()
            deadline = time.monotonic() + 5
            while True:
                status, body, _ = probe(address)
                if status == 200 or time.monotonic() > deadline:
                    break
                time.sleep(0.2)
            assert status == 200, body
            assert len(calls) == 2  # the hung check was not reused: a fresh one answered
    finally:
        release.set()


def test_answers_are_kept_about_a_second(models: Path) -> None:
    calls: list[float] = []

    def database() -> Sequence[Check]:
        calls.append(time.monotonic())
        return [Check("database", True, "answered")]

    gateway = Gateway(models, GatewayOptions(), None)
    gateway.readiness = Readiness(blocking=database, timeout_s=1.0, cache_s=1.0)
    with serve_asgi(gateway) as address:
        for _ in range(10):
            assert probe(address)[0] == 200
        assert len(calls) == 1
        time.sleep(1.1)
        assert probe(address)[0] == 200
        assert len(calls) == 2


def test_a_check_that_raises_is_a_named_failure_not_a_500(models: Path) -> None:
    def database() -> Sequence[Check]:
        raise RuntimeError("connection refused")

    def inline() -> Sequence[Check]:
        raise ValueError("spool unreadable")

    gateway = Gateway(models, GatewayOptions(), None)
    gateway.readiness = Readiness(blocking=database, inline=inline, timeout_s=1.0, cache_s=0.0)
    with serve_asgi(gateway) as address:
        status, body, _ = probe(address)
    assert status == 503
    checks = body["checks"]
    assert isinstance(checks, dict)
    assert "connection refused" in checks["database"]["detail"]
    assert set(body["failed"]) >= {"database"}
    assert any("spool unreadable" in c["detail"] for c in checks.values())


def test_readyz_without_configured_checks_follows_the_models(tmp_path: Path, models: Path) -> None:
    (models / "broken").mkdir()
    (models / "broken" / "config.pbtxt").write_text("this is not a config")
    gateway = Gateway(models, GatewayOptions(), None)
    with serve_asgi(gateway) as address:
        status, body, _ = probe(address)
    assert status == 503 and body["failed"] == ["models"]
