"""Every management command answers a bad argument or an impossible state with one clear line and a non-zero
exit (a CommandError), never a traceback."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError

from tenancy.services import api_key_create, organization_create

pytestmark = pytest.mark.django_db

ROOT = Path(__file__).resolve().parents[2]


def _org(slug: str = "cmd-org") -> Any:
    return organization_create(slug=slug, name=f"{slug} inc")


def _nothing() -> None:
    return None


def _demo_ledger_loaded() -> None:
    _org()
    call_command("load_demo_ledger", "--org", "cmd-org", "--requests", "20", "--days", "0.05", "--no-rollup")


def _key_revoked() -> None:
    created = api_key_create(organization=_org(), scopes="read")
    call_command("revoke_api_key", created.api_key.prefix)


def _organization_exists() -> None:
    _org()


def _user_exists() -> None:
    _org()
    call_command("create_user", "cmd-org", "someone")


def _report(org: str, start: str, end: str, out: str = "/tmp") -> tuple[str, ...]:
    return ("generate_report", "--org", org, "--start", start, "--end", end, "--out", out)


# (set-up, command and arguments, words the one-line message must hold)
CASES: list[tuple[Callable[[], None], tuple[str, ...], str]] = [
    # tenancy
    (_nothing, ("create_api_key", "no-such-org"), "no-such-org"),
    (_organization_exists, ("create_api_key", "cmd-org", "--scopes", "root"), "scope"),
    (_organization_exists, ("create_api_key", "cmd-org", "--name", "k" * 101), "100"),
    (_organization_exists, ("create_organization", "other", "--name", "n" * 201), "name"),
    (_organization_exists, ("create_user", "cmd-org", "u" * 151), "username"),
    (_organization_exists, ("create_user", "cmd-org", "two words"), "username"),
    (_nothing, ("create_organization", "Not A Slug!"), "slug"),
    (_organization_exists, ("create_organization", "cmd-org"), "cmd-org"),
    (_nothing, ("create_user", "no-such-org", "someone"), "no-such-org"),
    (_organization_exists, ("create_user", "cmd-org", "someone", "--role", "god"), "role"),
    (_user_exists, ("create_user", "cmd-org", "someone"), "someone"),
    (_nothing, ("revoke_api_key", "nosuchprefix"), "nosuchprefix"),
    (_nothing, ("drain_ledger", "--once", "--spool", "/nonexistent/spool"), "/nonexistent/spool"),
    (_key_revoked, ("revoke_api_key", "__PREFIX__"), "revoked"),
    # carbon
    (_nothing, ("carbon_threshold", "--site", "x1"), "--site"),
    (_nothing, ("carbon_threshold", "--site", "999999"), "999999"),
    (_nothing, ("carbon_threshold", "--percentile", "150"), "percentile"),
    (_nothing, ("carbon_threshold", "--threshold", "lots"), "threshold"),
    (_nothing, ("carbon_threshold", "--percentile", "ten"), "percentile"),
    (_nothing, ("import_intensity", "/no/such/file.csv"), "/no/such/file.csv"),
    (_nothing, ("import_intensity", str(ROOT / "README.md"), "--org", "no-such-org"), "no-such-org"),
    (_nothing, ("rollups", "--rebuild", "--carbon"), "--carbon"),
    # demo
    (_nothing, ("load_demo_ledger", "--org", "no-such-org"), "no-such-org"),
    (_organization_exists, ("load_demo_ledger", "--org", "cmd-org", "--requests", "-5"), "requests"),
    (_organization_exists, ("load_demo_ledger", "--org", "cmd-org", "--days", "0"), "days"),
    (_organization_exists, ("load_demo_ledger", "--org", "cmd-org", "--days", "1e9"), "days"),
    (_organization_exists, ("load_demo_ledger", "--org", "cmd-org", "--requests", "many"), "requests"),
    (
        _demo_ledger_loaded,
        ("load_demo_ledger", "--org", "cmd-org", "--requests", "20", "--days", "0.05"),
        "already",
    ),
    (_nothing, ("install_demo_models", "--target", "/proc/no-such-place"), "/proc/no-such-place"),
    # reports
    (_nothing, _report("no-such-org", "2025-01-01", "2025-02-01"), "no-such-org"),
    (_organization_exists, _report("cmd-org", "first", "2025-02-01"), "--start"),
    (_organization_exists, _report("cmd-org", "2025-02-01", "2025-01-01"), "start"),
    (_organization_exists, _report("cmd-org", "0001-01-01", "0001-02-01"), "1970"),
    (
        _organization_exists,
        _report("cmd-org", "2025-01-01", "2025-02-01", out="/proc/no-such-folder"),
        "--out",
    ),
    # carbonledger
    (_nothing, ("serve", "--port", "http"), "port"),
    (_nothing, ("serve", "--port", "70000"), "port"),
]


@pytest.mark.parametrize(("setup", "argv", "words"), CASES, ids=[" ".join(c[1]) for c in CASES])
def test_a_bad_argument_or_an_impossible_state_is_one_line_and_a_command_error(
    setup: Callable[[], None], argv: tuple[str, ...], words: str, tmp_path: Path
) -> None:
    setup()
    if "__PREFIX__" in argv:
        from tenancy.models import ApiKey

        argv = tuple(ApiKey.objects.get().prefix if a == "__PREFIX__" else a for a in argv)
    with pytest.raises(CommandError) as caught:
        call_command(*argv)
    message = str(caught.value)
    assert message.strip() and "\n" not in message.strip(), message
    assert words.lower() in message.lower(), message


def test_load_demo_ledger_twice_on_the_same_database_exits_with_one_line_and_no_traceback(
    tmp_path: Path,
) -> None:
    env = {
        **os.environ,
        "CARBONLEDGER_VAR_DIR": str(tmp_path),
        "DATABASE_URL": f"sqlite:///{tmp_path / 'db.sqlite3'}",
    }

    def manage(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "manage.py", *args],
            cwd=ROOT,
            env=env,
            capture_output=True,
            text=True,
            timeout=300,
        )

    assert manage("migrate", "--noinput").returncode == 0
    assert manage("create_organization", "twice").returncode == 0
    load = ("load_demo_ledger", "--org", "twice", "--requests", "50", "--days", "0.1", "--no-rollup")
    first = manage(*load)
    assert first.returncode == 0, first.stderr
    second = manage(*load)
    assert second.returncode != 0
    assert "Traceback" not in second.stderr
    lines = [line for line in second.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("CommandError:"), second.stderr
