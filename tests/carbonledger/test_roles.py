"""Process roles of `manage.py serve`: a gateway process serves /v2 and /metrics only, a web process the dashboard
and the management API only, and `all` (the one-box default) both. Real server processes."""

from __future__ import annotations

import http.client
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.gateway_process import (
    PYTHON,
    REPO_ROOT,
    GatewayProcess,
    gateway_env,
    manage,
    prepare_gateway,
)


class RoleProcess(GatewayProcess):
    """``manage.py serve --role ROLE``, ready when ``ready_path`` answers 200."""

    def __init__(self, env: dict[str, str], log_path: Path, role: str, ready_path: str) -> None:
        super().__init__(env, log_path)
        self.role = role
        self.ready_path = ready_path

    def _start(self, timeout_s: float) -> GatewayProcess:
        argv = [
            PYTHON,
            "manage.py",
            "serve",
            "--host",
            "127.0.0.1",
            "--port",
            str(self.port),
            "--role",
            self.role,
        ]
        with open(self.log_path, "ab") as log:
            self.proc = subprocess.Popen(
                argv,
                cwd=REPO_ROOT,
                env=self.env,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        deadline = time.monotonic() + timeout_s
        while True:
            if self.proc.poll() is not None:
                raise RuntimeError(
                    f"serve exited during start-up ({self.proc.returncode}):\n{self.log_tail()}"
                )
            if get(self.address, self.ready_path)[0] == 200:
                return self
            if time.monotonic() > deadline:
                self.kill()
                raise RuntimeError(f"serve was not ready within {timeout_s} s:\n{self.log_tail()}")
            time.sleep(0.1)


def get(address: tuple[str, int], path: str, key: str | None = None) -> tuple[int, bytes]:
    conn = http.client.HTTPConnection(*address, timeout=10)
    try:
        conn.request("GET", path, headers={"Authorization": f"Bearer {key}"} if key else {})
        resp = conn.getresponse()
        return resp.status, resp.read()
    except (OSError, http.client.HTTPException):
        return 0, b""
    finally:
        conn.close()


def _serve(env: dict[str, str], log: Path, role: str, ready_path: str) -> GatewayProcess:
    return RoleProcess(env, log, role, ready_path).start(timeout_s=60.0)


@pytest.fixture
def prepared(tmp_path: Path, database_url: str) -> Iterator[tuple[dict[str, str], str]]:
    # No gRPC port: a fixed one could collide with another test's server.
    env = gateway_env(tmp_path / "var", database_url, CARBONLEDGER_GRPC_PORT="0")
    yield env, prepare_gateway(env)


DJANGO_PATHS = ("/accounts/login/", "/dashboard/", "/api/v1/whoami", "/api/docs/", "/admin/login/")


def test_a_gateway_process_serves_v2_and_metrics_only(
    tmp_path: Path, prepared: tuple[dict[str, str], str]
) -> None:
    env, key = prepared
    with _serve(env, tmp_path / "gateway.log", "gateway", "/v2/health/ready") as gateway:
        assert get(gateway.address, "/v2/models/linear", key)[0] == 200
        assert get(gateway.address, "/metrics")[0] == 200
        for path in DJANGO_PATHS:
            status, body = get(gateway.address, path, key)
            assert status == 404, (path, status, body[:300])
            assert b"gateway" in body, body[:300]  # the answer says which role this process has


def test_a_web_process_serves_the_dashboard_and_api_only(
    tmp_path: Path, prepared: tuple[dict[str, str], str]
) -> None:
    env, key = prepared
    with _serve(env, tmp_path / "web.log", "web", "/accounts/login/") as web:
        assert get(web.address, "/api/v1/whoami", key)[0] == 200
        assert get(web.address, "/api/v1/ledger/requests", key)[0] == 200
        for path in ("/v2/health/ready", "/v2/health/live", "/v2/models/linear", "/metrics", "/readyz"):
            status, body = get(web.address, path, key)
            assert status == 404, (path, status, body[:300])
            assert b"web" in body, body[:300]
        # A web process runs no gateway: no spool, no meters, no ledger writer of its own.
        assert not (Path(env["CARBONLEDGER_VAR_DIR"]) / "spool").exists()


def test_the_all_role_is_the_default_and_serves_both(
    tmp_path: Path, prepared: tuple[dict[str, str], str]
) -> None:
    env, key = prepared
    with GatewayProcess(env, tmp_path / "all.log").start() as both:
        assert get(both.address, "/v2/models/linear", key)[0] == 200
        assert get(both.address, "/api/v1/whoami", key)[0] == 200
        assert get(both.address, "/accounts/login/")[0] == 200


def test_an_unknown_role_stops_start_up_naming_the_choices(tmp_path: Path, database_url: str) -> None:
    env = gateway_env(tmp_path / "var", database_url)
    done = manage(env, "serve", "--role", "everything", "--port", "0", timeout_s=60)
    assert done.returncode != 0
    assert "gateway" in done.stderr and "web" in done.stderr and "all" in done.stderr, done.stderr[-1000:]
