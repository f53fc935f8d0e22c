"""Settings from environment variables, with embedded defaults, failing loudly on bad values.

Every error names the variable, so a bad deployment says what to fix at start-up.
"""

from __future__ import annotations

import os
from collections.abc import Mapping

from django.core.exceptions import ImproperlyConfigured

from inference.values import parse_bool


def env_str(name: str, default: str, environ: Mapping[str, str] = os.environ) -> str:
    return environ.get(name, default)


def env_int(
    name: str,
    default: int,
    minimum: int | None = None,
    environ: Mapping[str, str] = os.environ,
    maximum: int | None = None,
) -> int:
    raw = environ.get(name)
    if raw is None or raw == "":
        return default
    try:
        value = int(raw)
    except ValueError:
        raise ImproperlyConfigured(f"{name} must be an integer, got {raw!r}") from None
    if minimum is not None and value < minimum:
        raise ImproperlyConfigured(f"{name} must be >= {minimum}, got {value}")
    if maximum is not None and value > maximum:
        raise ImproperlyConfigured(f"{name} must be <= {maximum}, got {value}")
    return value


def env_float(
    name: str,
    default: float,
    minimum: float | None = None,
    environ: Mapping[str, str] = os.environ,
    maximum: float | None = None,
) -> float:
    raw = environ.get(name)
    if raw is None or raw == "":
        return default
    try:
        value = float(raw)
    except ValueError:
        raise ImproperlyConfigured(f"{name} must be a number, got {raw!r}") from None
    if value != value or (minimum is not None and value < minimum):
        raise ImproperlyConfigured(f"{name} must be a number >= {minimum}, got {raw!r}")
    if maximum is not None and value > maximum:
        raise ImproperlyConfigured(f"{name} must be a number <= {maximum}, got {raw!r}")
    return value


def env_bool(name: str, default: bool, environ: Mapping[str, str] = os.environ) -> bool:
    raw = environ.get(name)
    if raw is None or raw == "":
        return default
    value = parse_bool(raw)
    if value is None:
        raise ImproperlyConfigured(f"{name} must be true or false, got {raw!r}")
    return value


def env_choice(
    name: str, default: str, choices: tuple[str, ...], environ: Mapping[str, str] = os.environ
) -> str:
    value = environ.get(name) or default
    if value not in choices:
        raise ImproperlyConfigured(f"{name} must be one of {', '.join(choices)}, got {value!r}")
    return value


def database_from_url(name: str, default: str, environ: Mapping[str, str] = os.environ) -> dict[str, object]:
    import dj_database_url

    url = environ.get(name) or default
    scheme = url.split(":", 1)[0]
    if scheme not in {"sqlite", "postgres", "postgresql", "pgsql"}:
        raise ImproperlyConfigured(f"{name} must be a sqlite:// or postgres:// URL, got scheme {scheme!r}")
    try:
        config: dict[str, object] = dict(dj_database_url.parse(url, conn_max_age=60))
    except Exception as exc:
        raise ImproperlyConfigured(f"{name} is not a valid database URL: {exc}") from None
    if config["ENGINE"] == "django.db.backends.sqlite3":
        # WAL lets the gateway's writer and the dashboard read at the same time; the busy
        # timeout makes a concurrent writer wait instead of failing with "database is locked".
        config["OPTIONS"] = {
            "timeout": 20,
            "transaction_mode": "IMMEDIATE",
            "init_command": "PRAGMA journal_mode=WAL; PRAGMA synchronous=NORMAL; PRAGMA busy_timeout=20000;",
        }
        config["CONN_MAX_AGE"] = 0
    return config
