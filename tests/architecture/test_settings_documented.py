"""Every setting the code reads from the environment is named in docs/settings.md (the one place operators look),
and every role command of docs/operations.md exists."""

from __future__ import annotations

import re
from pathlib import Path

from django.core.management import get_commands

ROOT = Path(__file__).resolve().parents[2]


def _settings_read() -> set[str]:
    names: set[str] = set()
    for path in (ROOT / "carbonledger").glob("*.py"):
        names |= set(
            re.findall(
                r"\b(?:env_\w+|secret_key|database_from_url)\(\s*\"([A-Z][A-Z0-9_]+)\"", path.read_text()
            )
        )
    return names


def test_every_environment_setting_is_documented() -> None:
    names = _settings_read()
    assert len(names) > 50  # the pattern still finds them
    documented = (ROOT / "docs" / "settings.md").read_text()
    missing = sorted(name for name in names if f"`{name}`" not in documented)
    assert not missing, f"not in docs/settings.md: {missing}"


def test_every_manage_command_the_operations_guide_names_exists() -> None:
    guide = (ROOT / "docs" / "operations.md").read_text()
    named = set(re.findall(r"manage\.py (\w+)", guide))
    assert {"serve", "setup", "beat"} <= named
    assert not named - set(get_commands()), named - set(get_commands())
