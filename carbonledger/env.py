"""Settings from environment variables, with embedded defaults, failing loudly on bad values.

Every error names the variable, so a bad deployment says what to fix at start-up.
"""

from __future__ import annotations

import contextlib
import ipaddress
import os
import secrets
import sys
from collections.abc import Mapping
from pathlib import Path

from django.core.exceptions import ImproperlyConfigured

from inference.meters.host import check_host_id
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
        # No persistent connections: under ASGI every request runs on a thread of its own, and a connection
        # kept past its request outlives that thread, so a busy server piled them up to PostgreSQL's limit
        # (Django's docs: persistent connections must be off under ASGI). The pool below is the bounded reuse.
        config: dict[str, object] = dict(dj_database_url.parse(url, conn_max_age=0))
    except Exception as exc:
        raise ImproperlyConfigured(f"{name} is not a valid database URL: {exc}") from None
    if config["ENGINE"] == "django.db.backends.postgresql":
        given = config.get("OPTIONS")
        options: dict[str, object] = dict(given) if isinstance(given, dict) else {}
        options.setdefault("application_name", process_label())  # pg_stat_activity says who holds what
        pool_max = env_int("CARBONLEDGER_DB_POOL_MAX_SIZE", 0, minimum=0, maximum=1000, environ=environ)
        if pool_max:
            # Django's psycopg pool: at most pool_max connections in this process, whatever its threads do; a
            # thread that finds them all taken waits up to the timeout. None open before the first use.
            options["pool"] = {
                "min_size": 0,
                "max_size": pool_max,
                "timeout": env_float(
                    "CARBONLEDGER_DB_POOL_TIMEOUT_S", 30.0, minimum=0.1, maximum=600.0, environ=environ
                ),
            }
            # A pooled connection the server dropped is replaced, not handed out.
            config["CONN_HEALTH_CHECKS"] = True
        config["OPTIONS"] = options
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


def process_label(argv: list[str] | None = None) -> str:
    """``carbonledger <command>``: the manage.py command (serve, drain_ledger, setup, beat) or Celery's
    sub-command (worker, beat) this process runs, as PostgreSQL shows it in pg_stat_activity.application_name."""
    argv = sys.argv if argv is None else argv
    program = Path(argv[0]).name if argv else ""
    command = ""
    if program.endswith("manage.py"):
        command = next((a for a in argv[1:] if not a.startswith("-")), "")
    elif argv and "celery" in argv[0]:  # the celery script, or celery/__main__.py under python -m celery
        command = "celery " + next((a for a in argv if a in {"worker", "beat", "call", "inspect"}), "")
    label = f"carbonledger {command}".strip()
    return "".join(c if c.isprintable() and c.isascii() else "?" for c in label)[:63]


def env_list(name: str, environ: Mapping[str, str] = os.environ) -> list[str]:
    """A comma-separated list; spaces around items and empty items are dropped."""
    return [item.strip() for item in environ.get(name, "").split(",") if item.strip()]


def env_origins(name: str, environ: Mapping[str, str] = os.environ) -> list[str]:
    """Origins (scheme://host[:port], a host may start with '*.'), as CSRF_TRUSTED_ORIGINS takes them."""
    origins = env_list(name, environ)
    for origin in origins:
        if not origin.startswith(("https://", "http://")) or "/" in origin.split("://", 1)[1]:
            raise ImproperlyConfigured(
                f"{name}: {origin!r} must start with https:// or http:// and name a host only"
                " (https://ledger.example.com)"
            )
    return origins


def env_networks(name: str, environ: Mapping[str, str] = os.environ) -> list[str]:
    """IP addresses and networks (10.0.0.0/8, 192.168.1.7, ::1), each as a network in CIDR form."""
    networks = []
    for item in env_list(name, environ):
        try:
            networks.append(str(ipaddress.ip_network(item, strict=False)))
        except ValueError:
            raise ImproperlyConfigured(f"{name}: {item!r} is not an IP address or network") from None
    return networks


def env_host_id(name: str, environ: Mapping[str, str] = os.environ) -> str:
    """A host id for device ids (inference/meters/host.py); empty when unset (then detected at start-up)."""
    raw = environ.get(name, "").strip()
    if raw:
        try:
            check_host_id(raw)
        except ValueError as exc:
            raise ImproperlyConfigured(f"{name}: {exc}") from None
    return raw


def env_proxy_header(name: str, environ: Mapping[str, str] = os.environ) -> tuple[str, str] | None:
    """``Header-Name: value`` (X-Forwarded-Proto: https) as Django's SECURE_PROXY_SSL_HEADER pair
    ("HTTP_X_FORWARDED_PROTO", "https"); None when unset."""
    raw = environ.get(name, "").strip()
    if not raw:
        return None
    header, sep, value = raw.partition(":")
    header, value = header.strip(), value.strip()
    if not sep or not value or not header or not all(c.isalnum() or c in "-_" for c in header):
        raise ImproperlyConfigured(
            f"{name} must be 'Header-Name: value' (X-Forwarded-Proto: https), got {raw!r}"
        )
    return "HTTP_" + header.upper().replace("-", "_"), value


# The key this project once shipped as its default: published, so never a key for a server.
PUBLISHED_SECRET_KEY = "carbonledger-dev-only-not-secret"


def _weak_secret_key(key: str) -> bool:
    # Django's own test (check --deploy, security.W009): short, few distinct characters, or generated as
    # insecure; and the key this project once published.
    return (
        key == PUBLISHED_SECRET_KEY
        or key.startswith("django-insecure-")
        or len(key) < 50
        or len(set(key)) < 5
    )


def secret_key(name: str, key_file: Path, *, debug: bool, environ: Mapping[str, str] = os.environ) -> str:
    """The secret key: ``name`` from the environment (replicas share one that way), else the one kept in
    ``key_file``, made on the first start (random, mode 0600) so a single machine needs no set-up. With
    ``debug`` off a published or weak key is refused, naming the variable."""
    raw = environ.get(name, "")
    if raw:
        if not debug and _weak_secret_key(raw):
            raise ImproperlyConfigured(
                f"{name} is the published development key or too weak (under 50 characters, or under 5 distinct"
                f" ones, or django-insecure-); with DEBUG off set {name} to a long random value, e.g. the output"
                " of: python -c 'import secrets; print(secrets.token_urlsafe(64))'"
            )
        return raw
    try:
        key = _kept_secret_key(key_file)
    except OSError as exc:
        raise ImproperlyConfigured(
            f"{name} is not set and {key_file} cannot be read or made ({exc.strerror or exc}); set {name}"
        ) from None
    if not debug and _weak_secret_key(key):
        raise ImproperlyConfigured(
            f"{name} is not set and {key_file} holds a weak key; delete the file (a new one is made) or set {name}"
        )
    return key


def _kept_secret_key(key_file: Path) -> str:
    """The key in ``key_file``; a new random one (mode 0600) when there is none. Processes starting together
    (the server and the worker of `make run`) agree: the file appears whole, by a hard link, or not at all."""
    if not key_file.exists():
        key_file.parent.mkdir(parents=True, exist_ok=True)
        temporary = key_file.with_name(f".{key_file.name}.{os.getpid()}.{secrets.token_hex(4)}")
        fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        try:
            with os.fdopen(fd, "w") as out:
                out.write(secrets.token_urlsafe(64) + "\n")
                out.flush()
                os.fsync(out.fileno())
            with contextlib.suppress(FileExistsError):  # another process made it first: use theirs
                os.link(temporary, key_file)
        finally:
            temporary.unlink(missing_ok=True)
    return key_file.read_text(encoding="utf-8").strip()
