"""Deployment defaults: a secret key of its own for every installation (never the published one with DEBUG
off), TLS and proxy settings from the environment, login throttling per user and client address, and the
allowed hosts applied to /v2 as to Django."""

from __future__ import annotations

import asyncio
import json
import os
import stat
import subprocess
import sys
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from django.core.exceptions import ImproperlyConfigured
from django.test import Client, RequestFactory
from django.utils import timezone

from tenancy.services import organization_create, user_create

ROOT = Path(__file__).resolve().parents[2]
PUBLISHED_DEV_KEY = "carbonledger-dev-only-not-secret"
PASSWORD = "a-long-test-password-42"
# Every variable these tests set, removed from the inherited environment first.
OURS = (
    "SECRET_KEY",
    "DEBUG",
    "SESSION_COOKIE_SECURE",
    "CSRF_COOKIE_SECURE",
    "SECURE_HSTS_SECONDS",
    "SECURE_PROXY_SSL_HEADER",
    "CSRF_TRUSTED_ORIGINS",
    "TRUSTED_PROXIES",
)
PRINT_SETTINGS = (
    "import json; from django.conf import settings as s; print(json.dumps({k: getattr(s, k) for k in ("
    "'SECRET_KEY', 'SESSION_COOKIE_SECURE', 'CSRF_COOKIE_SECURE', 'SECURE_HSTS_SECONDS', "
    "'SECURE_PROXY_SSL_HEADER', 'CSRF_TRUSTED_ORIGINS', 'TRUSTED_PROXIES')}))"
)


def _manage(var_dir: Path, *args: str, **env: str) -> subprocess.CompletedProcess[str]:
    environ = {k: v for k, v in os.environ.items() if k not in OURS}
    environ.update(CARBONLEDGER_VAR_DIR=str(var_dir), **env)
    return subprocess.run(
        [sys.executable, "manage.py", *args],
        cwd=ROOT,
        env=environ,
        capture_output=True,
        text=True,
        timeout=120,
    )


def _settings(var_dir: Path, **env: str) -> dict[str, Any]:
    done = _manage(var_dir, "shell", "-c", PRINT_SETTINGS, **env)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.strip().splitlines()[-1])  # type: ignore[no-any-return]


# -- (a) the secret key ----------------------------------------------------------------------------


def test_a_fresh_installation_makes_a_private_secret_key_and_keeps_it(tmp_path: Path) -> None:
    first = _settings(tmp_path)["SECRET_KEY"]
    key_file = tmp_path / "secret-key"
    assert key_file.read_text().strip() == first
    assert stat.S_IMODE(key_file.stat().st_mode) == 0o600
    assert first != PUBLISHED_DEV_KEY and len(first) >= 50
    assert _settings(tmp_path)["SECRET_KEY"] == first  # the next start reuses it
    assert _settings(tmp_path / "other")["SECRET_KEY"] != first  # another installation has its own


def test_a_secret_key_from_the_environment_wins_so_replicas_can_share_one(tmp_path: Path) -> None:
    shared = "r" * 30 + "eplica-shared-key-0123456789abcdef"
    assert _settings(tmp_path, SECRET_KEY=shared)["SECRET_KEY"] == shared
    assert not (tmp_path / "secret-key").exists()


@pytest.mark.parametrize("key", [PUBLISHED_DEV_KEY, "short-key", "django-insecure-" + "x" * 60])
def test_with_debug_off_start_up_refuses_a_published_or_weak_secret_key_naming_the_variable(
    tmp_path: Path, key: str
) -> None:
    done = _manage(tmp_path, "check", SECRET_KEY=key, DEBUG="false")
    assert done.returncode != 0
    assert "SECRET_KEY" in done.stderr and "Traceback" not in done.stderr.split("ImproperlyConfigured")[-1]
    assert _manage(tmp_path, "check", SECRET_KEY=key, DEBUG="true").returncode == 0


# -- (b) TLS and proxies from the environment ------------------------------------------------------


def test_tls_and_proxy_settings_come_from_the_environment(tmp_path: Path) -> None:
    defaults = _settings(tmp_path)
    assert defaults["SESSION_COOKIE_SECURE"] is False and defaults["SECURE_HSTS_SECONDS"] == 0
    assert defaults["SECURE_PROXY_SSL_HEADER"] is None and defaults["TRUSTED_PROXIES"] == []
    chosen = _settings(
        tmp_path,
        SESSION_COOKIE_SECURE="true",
        CSRF_COOKIE_SECURE="true",
        SECURE_HSTS_SECONDS="31536000",
        SECURE_PROXY_SSL_HEADER="X-Forwarded-Proto: https",
        CSRF_TRUSTED_ORIGINS="https://ledger.example.com, https://*.example.org",
        TRUSTED_PROXIES="10.0.0.0/8, 192.168.1.7",
    )
    assert chosen["SESSION_COOKIE_SECURE"] is True and chosen["CSRF_COOKIE_SECURE"] is True
    assert chosen["SECURE_HSTS_SECONDS"] == 31536000
    assert chosen["SECURE_PROXY_SSL_HEADER"] == ["HTTP_X_FORWARDED_PROTO", "https"]
    assert chosen["CSRF_TRUSTED_ORIGINS"] == ["https://ledger.example.com", "https://*.example.org"]
    assert chosen["TRUSTED_PROXIES"] == ["10.0.0.0/8", "192.168.1.7/32"]


@pytest.mark.parametrize(
    ("call", "message"),
    [
        ("env_proxy_header", "X_FORWARDED_PROTO must be 'Header-Name: value'"),
        ("env_origins", "CSRF_TRUSTED_ORIGINS: 'ledger.example.com' must start with https:// or http://"),
        ("env_networks", "TRUSTED_PROXIES: 'the-proxy' is not an IP address or network"),
    ],
)
def test_a_bad_tls_or_proxy_value_fails_naming_the_variable(call: str, message: str) -> None:
    from carbonledger import env

    bad = {
        "env_proxy_header": ("X_FORWARDED_PROTO", {"X_FORWARDED_PROTO": "https"}),
        "env_origins": ("CSRF_TRUSTED_ORIGINS", {"CSRF_TRUSTED_ORIGINS": "ledger.example.com"}),
        "env_networks": ("TRUSTED_PROXIES", {"TRUSTED_PROXIES": "10.0.0.1,the-proxy"}),
    }[call]
    with pytest.raises(ImproperlyConfigured, match=message):
        getattr(env, call)(bad[0], environ=bad[1])


@pytest.mark.parametrize(
    ("remote", "forwarded", "client"),
    [
        ("203.0.113.9", "198.51.100.1", "203.0.113.9"),  # an untrusted peer's header is not believed
        ("10.0.0.2", "198.51.100.1", "198.51.100.1"),  # a trusted proxy names the client
        ("10.0.0.2", "6.6.6.6, 198.51.100.1, 10.0.0.3", "198.51.100.1"),  # the client wrote the leftmost part
        ("10.0.0.2", "", "10.0.0.2"),
        ("10.0.0.2", "not-an-address", "10.0.0.2"),
        ("10.0.0.2", "10.0.0.4, 10.0.0.3", "10.0.0.4"),  # only proxies: the farthest one
    ],
)
def test_the_client_address_counts_x_forwarded_for_only_from_trusted_proxies(
    settings: Any, remote: str, forwarded: str, client: str
) -> None:
    from carbonledger.login_security import client_ip

    settings.TRUSTED_PROXIES = ["10.0.0.0/8"]
    request = RequestFactory().get("/", REMOTE_ADDR=remote, HTTP_X_FORWARDED_FOR=forwarded)
    assert client_ip(request) == client


# -- (c) login throttling --------------------------------------------------------------------------


def _login(client: Client, username: str, password: str) -> Any:
    return client.post("/accounts/login/", {"username": username, "password": password})


@pytest.mark.django_db
def test_thirty_wrong_passwords_lock_that_user_at_that_address_only_for_a_while() -> None:
    org = organization_create(slug="throttled", name="Throttled")
    user_create(organization=org, username="target", password=PASSWORD, role="viewer")
    user_create(organization=org, username="colleague", password=PASSWORD, role="viewer")
    attacker = Client(REMOTE_ADDR="198.51.100.66")
    for _ in range(30):
        assert _login(attacker, "target", "wrong-password").status_code in (200, 429)
    refused = _login(attacker, "target", PASSWORD)
    assert refused.status_code == 429
    assert "_auth_user_id" not in attacker.session
    # Another user behind the same address (a shared proxy, an office) still signs in...
    colleague = Client(REMOTE_ADDR="198.51.100.66")
    assert _login(colleague, "colleague", PASSWORD).status_code == 302
    # ...and so does the targeted user from their own address.
    owner = Client(REMOTE_ADDR="203.0.113.20")
    assert _login(owner, "target", PASSWORD).status_code == 302
    # Once the lock-out has passed, the right password works from that address again.
    from axes.models import AccessAttempt

    AccessAttempt.objects.update(attempt_time=timezone.now() - timedelta(days=1))
    assert _login(Client(REMOTE_ADDR="198.51.100.66"), "target", PASSWORD).status_code == 302


@pytest.mark.django_db
def test_a_forged_forwarded_for_does_not_escape_the_lock(settings: Any) -> None:
    settings.TRUSTED_PROXIES = ["10.0.0.0/8"]
    org = organization_create(slug="forged", name="Forged")
    user_create(organization=org, username="target2", password=PASSWORD, role="viewer")
    for i in range(30):
        attacker = Client(REMOTE_ADDR="198.51.100.77", HTTP_X_FORWARDED_FOR=f"192.0.2.{i}")
        _login(attacker, "target2", "wrong-password")
    again = Client(REMOTE_ADDR="198.51.100.77", HTTP_X_FORWARDED_FOR="192.0.2.200")
    assert _login(again, "target2", PASSWORD).status_code == 429


# -- (d) allowed hosts on /v2 ----------------------------------------------------------------------


class _StubGateway:
    def __init__(self) -> None:
        self.paths: list[str] = []
        self.direct: list[str] = []

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        self.paths.append(scope["path"])
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"ok"})

    def direct_infer(self, method: str, path: str, headers: dict[bytes, bytes], received_ns: int) -> Any:
        self.direct.append(path)
        return "ticket"


def _call(router: Any, path: str, host: bytes | None) -> tuple[int, bytes]:
    headers = [] if host is None else [(b"host", host)]
    scope = {
        "type": "http",
        "method": "GET",
        "path": path,
        "raw_path": path.encode(),
        "query_string": b"",
        "headers": headers,
        "server": ("127.0.0.1", 8000),
        "client": ("127.0.0.1", 50000),
        "scheme": "http",
        "http_version": "1.1",
        "asgi": {"version": "3.0"},
    }
    sent: list[dict[str, Any]] = []

    async def receive() -> dict[str, Any]:
        return {"type": "http.request", "body": b"", "more_body": False}

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    asyncio.run(router(scope, receive, send))
    status = next(m["status"] for m in sent if m["type"] == "http.response.start")
    body = b"".join(m.get("body", b"") for m in sent if m["type"] == "http.response.body")
    return status, body


@pytest.fixture
def router(settings: Any) -> Any:
    from carbonledger.asgi import Router

    settings.ALLOWED_HOSTS = ["ledger.example.com", "127.0.0.1"]
    settings.DEBUG = False
    made = Router()
    made._gateway = _StubGateway()
    return made


def test_a_v2_request_with_a_host_not_allowed_is_a_400(router: Any) -> None:
    status, body = _call(router, "/v2/models/linear/infer", b"evil.example")
    assert status == 400
    assert "evil.example" in json.loads(body)["error"]
    assert router._gateway.paths == []


@pytest.mark.parametrize("host", [b"ledger.example.com", b"ledger.example.com:8443", b"127.0.0.1:8000", None])
def test_a_v2_request_to_an_allowed_host_reaches_the_gateway(router: Any, host: bytes | None) -> None:
    assert _call(router, "/v2/models/linear/infer", host) == (200, b"ok")


@pytest.mark.parametrize("path", ["/v2/health/live", "/v2/health/ready", "/metrics"])
def test_probes_and_metrics_are_answered_whatever_the_host(router: Any, path: str) -> None:
    assert _call(router, path, b"10.1.2.3:8000") == (200, b"ok")


def test_the_direct_infer_path_checks_the_host_too(router: Any) -> None:
    assert router.direct_infer("POST", "/v2/models/linear/infer", {b"host": b"evil.example"}, 0) is None
    assert router._gateway.direct == []
    ticket = router.direct_infer("POST", "/v2/models/linear/infer", {b"host": b"ledger.example.com"}, 0)
    assert ticket == "ticket"
