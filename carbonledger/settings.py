"""Django settings. Everything comes from the environment, with embedded defaults that run with no services."""

from __future__ import annotations

import os
from datetime import timedelta
from pathlib import Path

from carbonledger.env import (
    database_from_url,
    env_bool,
    env_choice,
    env_float,
    env_host_id,
    env_int,
    env_networks,
    env_origins,
    env_proxy_header,
    env_str,
    secret_key,
)

BASE_DIR = Path(__file__).resolve().parent.parent
VAR_DIR = Path(env_str("CARBONLEDGER_VAR_DIR", str(BASE_DIR / "var")))
VAR_DIR.mkdir(parents=True, exist_ok=True)  # the embedded SQLite database, spool and broker live here

DEBUG = env_bool("DEBUG", False)
# From the environment (replicas share one that way), else var/secret-key, made on the first start (mode 0600);
# with DEBUG off a published or weak key stops the start naming SECRET_KEY (docs/settings.md).
SECRET_KEY = secret_key("SECRET_KEY", VAR_DIR / "secret-key", debug=DEBUG)
ALLOWED_HOSTS = [
    h.strip()
    for h in env_str("ALLOWED_HOSTS", "127.0.0.1,localhost,[::1],testserver").split(",")
    if h.strip()
]
# TLS and proxies: secure cookies and HSTS once served over HTTPS; the header a TLS-terminating proxy sets;
# origins allowed to POST forms from elsewhere; the proxies whose X-Forwarded-For names the client
# (carbonledger/login_security.py). Off by default: `make run` serves plain HTTP on this machine.
SESSION_COOKIE_SECURE = env_bool("SESSION_COOKIE_SECURE", False)
CSRF_COOKIE_SECURE = env_bool("CSRF_COOKIE_SECURE", False)
SECURE_HSTS_SECONDS = env_int("SECURE_HSTS_SECONDS", 0, minimum=0)
SECURE_PROXY_SSL_HEADER = env_proxy_header("SECURE_PROXY_SSL_HEADER")
CSRF_TRUSTED_ORIGINS = env_origins("CSRF_TRUSTED_ORIGINS")
TRUSTED_PROXIES = env_networks("TRUSTED_PROXIES")

INSTALLED_APPS = [
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "rest_framework",
    "drf_spectacular",
    "drf_spectacular_sidecar",
    "axes",
    # The project package: wiring, and the schema history of the models that now live in the apps below.
    "carbonledger",
    "tenancy",
    "ledger",
    "carbon",
    "reports",
    "jobs",
    "dashboard",
    "demo",
]

MIDDLEWARE = [
    "django.middleware.security.SecurityMiddleware",
    "carbonledger.middleware.RejectNulCharacters",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
    "axes.middleware.AxesMiddleware",  # last, as django-axes asks: turns a lock-out into its answer
]

# Sign-in throttling (django-axes): LOGIN_FAILURE_LIMIT wrong passwords for one user name from one client
# address lock that pair out for LOGIN_LOCKOUT_MINUTES; the same user elsewhere and other users at the same
# address (a shared proxy) still sign in. The address comes from carbonledger/login_security.py.
AUTHENTICATION_BACKENDS = [
    "carbonledger.login_security.LoginThrottle",
    "django.contrib.auth.backends.ModelBackend",
]
AXES_FAILURE_LIMIT = env_int("LOGIN_FAILURE_LIMIT", 10, minimum=1)
AXES_COOLOFF_TIME = timedelta(minutes=env_float("LOGIN_LOCKOUT_MINUTES", 15.0, minimum=0.1))
AXES_LOCKOUT_PARAMETERS = [["username", "ip_address"]]
AXES_CLIENT_IP_CALLABLE = "carbonledger.login_security.client_ip"
AXES_RESET_ON_SUCCESS = True
AXES_VERBOSE = False  # no banner at every start of every process; lock-outs are still logged

ROOT_URLCONF = "carbonledger.urls"
TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "DIRS": [BASE_DIR / "templates"],
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
            ]
        },
    }
]
ASGI_APPLICATION = "carbonledger.asgi.application"
# What a serving process serves (docs/operations.md): all (one box), gateway (/v2, /metrics) or web (dashboard,
# API); `manage.py serve --role` overrides it.
SERVER_ROLE = env_choice("CARBONLEDGER_ROLE", "all", ("all", "gateway", "web"))

DATABASES = {"default": database_from_url("DATABASE_URL", f"sqlite:///{VAR_DIR / 'carbonledger.sqlite3'}")}
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

LANGUAGE_CODE = "en-us"
TIME_ZONE = "UTC"
USE_I18N = True
USE_TZ = True
STATIC_URL = "static/"
STATIC_ROOT = VAR_DIR / "static"

REST_FRAMEWORK = {
    "DEFAULT_AUTHENTICATION_CLASSES": [
        "api.auth.ApiKeyAuthentication",
        "rest_framework.authentication.SessionAuthentication",
    ],
    "DEFAULT_PERMISSION_CLASSES": ["rest_framework.permissions.IsAuthenticated"],
    # DRF's JSON parser with a bounded nesting depth (api/parsers.py); forms and files as DRF parses them.
    "DEFAULT_PARSER_CLASSES": [
        "api.parsers.JSONParser",
        "rest_framework.parsers.FormParser",
        "rest_framework.parsers.MultiPartParser",
    ],
    "DEFAULT_SCHEMA_CLASS": "drf_spectacular.openapi.AutoSchema",
}
SPECTACULAR_SETTINGS = {
    "TITLE": "CarbonLedger management API",
    "DESCRIPTION": (
        "Organizations, API keys, sites, devices, models, the hash-chained ledger, hourly rollups, emission "
        "factors and their imports, contractual instruments and GHG reports. Authenticate with "
        # A code span: the docs page reads the description as Markdown, where a bare <API key> is an HTML tag.
        "`Authorization: Bearer <API key>` (or a dashboard session). The inference API (KServe v2) is "
        "under /v2 and documented by KServe."
    ),
    "VERSION": "1",
    "SERVE_INCLUDE_SCHEMA": False,
    "SWAGGER_UI_DIST": "SIDECAR",  # served from this server: no CDN
    "SWAGGER_UI_FAVICON_HREF": "SIDECAR",
    "REDOC_DIST": "SIDECAR",
    # No deep links: Swagger UI puts each operation's link inside the button that opens it, a link no keyboard
    # or screen reader reaches (axe-core's nested-interactive; tests/dashboard/test_browser_admin.py).
    "SWAGGER_UI_SETTINGS": {"deepLinking": False},
    "COMPONENT_SPLIT_REQUEST": True,
    # One schema build at a time per process: drf-spectacular's generation state is global (api/schema.py).
    "DEFAULT_GENERATOR_CLASS": "api.schema.SchemaGenerator",
}

# -- inference gateway --------------------------------------------------------------------
MODEL_REPOSITORY = Path(env_str("MODEL_REPOSITORY", str(VAR_DIR / "models")))
TRITON_URL = env_str("TRITON_URL", "")
TRITON_PROTOCOL = env_choice("TRITON_PROTOCOL", "http", ("http", "grpc"))
TRITON_TIMEOUT_S = env_float("TRITON_TIMEOUT_S", 5.0, minimum=0.1)
GATEWAY_MAX_BODY_BYTES = env_int("GATEWAY_MAX_BODY_BYTES", 64 * 1024 * 1024, minimum=1024)
GATEWAY_ADAPTIVE_DELAY = env_bool("GATEWAY_ADAPTIVE_DELAY", True)
GATEWAY_ONNX_THREADS = env_int("GATEWAY_ONNX_THREADS", 1, minimum=1)
API_KEY_CACHE_SECONDS = env_float("API_KEY_CACHE_SECONDS", 5.0, minimum=0.0)
GATEWAY_SWITCH_INTERVAL_S = env_float("GATEWAY_SWITCH_INTERVAL_S", 0.001, minimum=0.0001)
GATEWAY_GC_FREEZE = env_bool("GATEWAY_GC_FREEZE", True)  # gc.freeze() once the models are loaded
# Slow and greedy clients (inference/http_protocol.py): read time-outs, header caps, connections per process.
GATEWAY_HEADER_TIMEOUT_S = env_float("GATEWAY_HEADER_TIMEOUT_S", 10.0, minimum=0.1, maximum=3600.0)
GATEWAY_BODY_TIMEOUT_S = env_float("GATEWAY_BODY_TIMEOUT_S", 60.0, minimum=0.1, maximum=3600.0)
GATEWAY_MAX_HEADERS = env_int("GATEWAY_MAX_HEADERS", 100, minimum=8)
GATEWAY_MAX_HEADER_BYTES = env_int("GATEWAY_MAX_HEADER_BYTES", 16384, minimum=1024)
GATEWAY_MAX_CONNECTIONS = env_int("GATEWAY_MAX_CONNECTIONS", 1000, minimum=1)
# KServe v2 over gRPC (inference/grpc_server.py), started with the gateway: Triton's port by default, 0 = off.
GRPC_PORT = env_int("CARBONLEDGER_GRPC_PORT", 8001, minimum=0, maximum=65535)
GRPC_HOST = env_str("CARBONLEDGER_GRPC_HOST", "") or env_str("HOST", "") or "127.0.0.1"

# -- Celery: an embedded filesystem broker by default, Redis or RabbitMQ from the environment --
CELERY_BROKER_URL = env_str("CELERY_BROKER_URL", "filesystem://")
if CELERY_BROKER_URL.split(":", 1)[0] not in {"filesystem", "redis", "rediss", "amqp", "pyamqp", "memory"}:
    from django.core.exceptions import ImproperlyConfigured

    raise ImproperlyConfigured(
        f"CELERY_BROKER_URL must be filesystem://, redis://, amqp:// or memory://, got {CELERY_BROKER_URL!r}"
    )
CELERY_BROKER_DIR = VAR_DIR / "celery" / "broker"
CELERY_RESULT_BACKEND = env_str("CELERY_RESULT_BACKEND", f"file://{VAR_DIR / 'celery' / 'results'}")
CELERY_TASK_ALWAYS_EAGER = env_bool("CELERY_TASK_ALWAYS_EAGER", False)
# The queue tasks go to and workers read (several deployments, or test runs, can share one broker).
CELERY_TASK_DEFAULT_QUEUE = env_str("CELERY_QUEUE", "celery")

LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "formatters": {"plain": {"format": "%(asctime)s %(levelname)s %(name)s: %(message)s"}},
    "handlers": {"console": {"class": "logging.StreamHandler", "formatter": "plain"}},
    "root": {
        "handlers": ["console"],
        "level": env_choice("LOG_LEVEL", "INFO", ("DEBUG", "INFO", "WARNING", "ERROR")),
    },
}

# -- energy metering and the ledger ---------------------------------------------------------------
LEDGER_ENABLED = env_bool("LEDGER_ENABLED", True)
SPOOL_DIR = Path(env_str("SPOOL_DIR", str(VAR_DIR / "spool")))
SPOOL_MAX_BYTES = env_int("SPOOL_MAX_BYTES", 1 << 30, minimum=1 << 16)
# Measured (bench/ledger_overhead.py): one transaction a second, from a process at nice 19,
# keeps the gateway above 90 % of its ledger-off throughput on this 2-core machine; 0.2 s and
# nice 10 cost it a third.
LEDGER_WRITE_INTERVAL_S = env_float("LEDGER_WRITE_INTERVAL_S", 1.0, minimum=0.01)
# How often the gateway counts the quarantined spool lines for /metrics (off the event loop; one indexed count).
LEDGER_STATUS_INTERVAL_S = env_float("LEDGER_STATUS_INTERVAL_S", 15.0, minimum=0.1)
# /readyz (docs/gateway.md): 503 once the oldest spooled record has waited this long for the database, or the spool
# holds this fraction of SPOOL_MAX_BYTES; its database checks get READY_DB_TIMEOUT_S, its answer is kept READY_CACHE_S.
READY_MAX_DRAIN_LAG_S = env_float("READY_MAX_DRAIN_LAG_S", 60.0, minimum=0.5)
READY_SPOOL_MAX_FRACTION = env_float("READY_SPOOL_MAX_FRACTION", 0.8, minimum=0.01, maximum=1.0)
READY_DB_TIMEOUT_S = env_float("READY_DB_TIMEOUT_S", 2.0, minimum=0.1, maximum=60.0)
READY_CACHE_S = env_float("READY_CACHE_S", 1.0, minimum=0.0, maximum=60.0)
# A Celery worker renews its heartbeat lease this often; it shows down in /metrics after three missed beats.
WORKER_HEARTBEAT_INTERVAL_S = env_float("WORKER_HEARTBEAT_INTERVAL_S", 15.0, minimum=0.1, maximum=3600.0)
# "process": a drain_ledger process of its own, started by the gateway (off the event loop's
# GIL); "thread": inside the gateway process (tests that share the test database).
LEDGER_WRITER = env_choice("LEDGER_WRITER", "process", ("process", "thread"))
# A ledger chain (one per spool directory) is leased in the database by one live process, renewed every third of
# this; a process that died holds it this long at most, and a second process on a copy of the spool is refused.
LEDGER_CHAIN_LEASE_TTL_S = env_float("LEDGER_CHAIN_LEASE_TTL_S", 30.0, minimum=1.0, maximum=3600.0)
# On PostgreSQL, a writer with a large backlog prepares the next chunks (parse, chain, COPY format) in a process
# of its own instead of a helper thread (bench/ledger_ingest.py).
LEDGER_PREPARE_PROCESS = env_bool("LEDGER_PREPARE_PROCESS", True)
LEDGER_WRITER_NICE = env_int("LEDGER_WRITER_NICE", 19, minimum=0)
LEDGER_WRITER_SCHED_IDLE = env_bool("LEDGER_WRITER_SCHED_IDLE", False)  # tried: no measured gain over nice 19
METERS = env_str("METERS", "auto")  # auto, or a comma list of nvml, rapl, triton, cpu-model
METER_INTERVAL_S = env_float("METER_INTERVAL_S", 1.0, minimum=0.05)
METER_TRITON_URL = env_str(
    "METER_TRITON_URL", ""
)  # a remote Triton's metrics endpoint, e.g. http://host:8002/metrics
# Linux powercap root the RAPL meter reads (a container may mount the host's /sys/class/powercap elsewhere).
METER_RAPL_ROOT = Path(env_str("METER_RAPL_ROOT", "/sys/class/powercap"))
# Names this host in device ids (RAPL packages, each gateway's modelled CPU): empty reads /etc/machine-id, else
# the host name. In a container, name the node (Kubernetes: the downward API's spec.nodeName).
HOST_ID = env_host_id("CARBONLEDGER_HOST_ID")
# Each metered device is leased in the database by one gateway, renewed every third of this (docs/energy-and-
# ledger.md); a gateway that died holds its devices this long at most.
DEVICE_LEASE_TTL_S = env_float("DEVICE_LEASE_TTL_S", 30.0, minimum=1.0, maximum=3600.0)
# Declared idle power of every metered device; empty: measured from intervals with no batch.
DEVICE_IDLE_POWER_W = (
    env_float("DEVICE_IDLE_POWER_W", 0.0, minimum=0.0) if env_str("DEVICE_IDLE_POWER_W", "") else None
)
# Idle energy that intervals left uncharged (a counter updating every 20-100 ms reads a little early or late), or
# charged beyond their estimates, is evened out by the following ones, up to idle power x this many seconds
# either way (inference/allocation.py); 0: each interval alone.
DEVICE_IDLE_CARRY_S = env_float("DEVICE_IDLE_CARRY_S", 0.25, minimum=0.0, maximum=60.0)
# The modelled CPU meter (no NVML or RAPL): watts per core from a declared TDP and core count,
# plus a memory term. 65 W is a common desktop/server TDP class; 0.375 W/GB is the figure the
# Green Algorithms calculator uses for memory.
CPU_TDP_W = env_float("CPU_TDP_W", 65.0, minimum=1.0)
CPU_CORES = env_int("CPU_CORES", 0, minimum=0)  # 0: os.cpu_count()
MEMORY_W_PER_GB = env_float("MEMORY_W_PER_GB", 0.375, minimum=0.0)
SITE_NAME = env_str("SITE_NAME", "local")
SITE_ZONE = env_str("SITE_ZONE", "FR")
SITE_PUE = env_float("SITE_PUE", 1.0, minimum=1.0)
SITE_ELECTRICITY = env_choice("SITE_ELECTRICITY", "owned", ("owned", "colocated", "cloud"))
# Carbon-aware serving: while the grid of the gateway's site is above its threshold, models with a latency
# objective batch with at least CARBON_AWARE_EFFICIENCY and base models pick their cheaper variants. The
# threshold is the site's own, else this percentile of the zone's last 30 days of hourly figures.
CARBON_AWARE = env_bool("CARBON_AWARE", True)
CARBON_AWARE_EFFICIENCY = env_float("CARBON_AWARE_EFFICIENCY", 1.0, minimum=0.0, maximum=1.0)
CARBON_AWARE_PERCENTILE = env_int("CARBON_AWARE_PERCENTILE", 75, minimum=1, maximum=99)
CARBON_SIGNAL_INTERVAL_S = env_float("CARBON_SIGNAL_INTERVAL_S", 300.0, minimum=1.0)
# How long a provider's forecast (INTENSITY_PROVIDERS) is reused by the carbon-aware signal before it is asked again.
CARBON_FORECAST_REFRESH_S = env_float("CARBON_FORECAST_REFRESH_S", 900.0, minimum=1.0)

# -- carbon -------------------------------------------------------------------------------------
# Where an import holds both a direct and a lifecycle factor for the same zone and period, use this
# basis: GHG Protocol Scope 2 / ISO 14064-1 Category 2 ask for direct (combustion) factors.
FACTOR_BASIS_PREFERENCE = env_choice("FACTOR_BASIS_PREFERENCE", "direct", ("direct", "lifecycle"))
# Publishers of grid averages state no uncertainty; this declared 95 % half-width (a fraction) is
# stored on every imported factor, so a report names the figure it used.
FACTOR_DEFAULT_RELATIVE_UNCERTAINTY = env_float("FACTOR_DEFAULT_RELATIVE_UNCERTAINTY", 0.10, minimum=0.0)
# Optional online intensity providers (comma list of names or dotted paths); off by default.
INTENSITY_PROVIDERS = [p.strip() for p in env_str("INTENSITY_PROVIDERS", "").split(",") if p.strip()]
ELECTRICITYMAPS_TOKEN = env_str("ELECTRICITYMAPS_TOKEN", "")
WATTTIME_USERNAME = env_str("WATTTIME_USERNAME", "")
WATTTIME_PASSWORD = env_str("WATTTIME_PASSWORD", "")
# How often the scheduled rollup task folds new ledger records into the hourly rollups.
ROLLUP_INTERVAL_S = env_float("ROLLUP_INTERVAL_S", 60.0, minimum=1.0)
# Ledger verification: the new records every LEDGER_VERIFY_INTERVAL_S, every record once a day.
LEDGER_VERIFY_INTERVAL_S = env_float("LEDGER_VERIFY_INTERVAL_S", 600.0, minimum=1.0)
LEDGER_FULL_VERIFY_INTERVAL_S = env_float("LEDGER_FULL_VERIFY_INTERVAL_S", 86400.0, minimum=60.0)
# Verification runs in this many processes (hashing is CPU-bound Python), across chains and within one.
LEDGER_VERIFY_WORKERS = env_int("LEDGER_VERIFY_WORKERS", min(4, os.cpu_count() or 1), minimum=1, maximum=256)
# Retention (docs/energy-and-ledger.md#retention-archives-of-old-records): the ledger's raw records older than
# this many months (the current one counted) are archived to files in LEDGER_ARCHIVE_DIR, then taken out of the
# database, daily; 0 keeps everything.
LEDGER_RETENTION_MONTHS = env_int("LEDGER_RETENTION_MONTHS", 0, minimum=0)
LEDGER_ARCHIVE_DIR = Path(env_str("LEDGER_ARCHIVE_DIR", str(VAR_DIR / "archive")))
# What bounds the archive besides verification (dotted paths, by name: the ledger imports nothing above it).
LEDGER_ARCHIVE_LIMITS = ["carbon.rollups.rolled_up_seq"]
CELERY_BEAT_SCHEDULE: dict[str, dict[str, object]] = {
    "rollups-update": {"task": "carbonledger.rollups_update", "schedule": ROLLUP_INTERVAL_S},
    "ledger-verify": {"task": "carbonledger.verify_ledger", "schedule": LEDGER_VERIFY_INTERVAL_S},
    "ledger-verify-full": {
        "task": "carbonledger.verify_ledger",
        "schedule": LEDGER_FULL_VERIFY_INTERVAL_S,
        "kwargs": {"full": True},
    },
}
if LEDGER_RETENTION_MONTHS:
    CELERY_BEAT_SCHEDULE["ledger-archive"] = {"task": "carbonledger.ledger_archive", "schedule": 86400.0}
# Reports: last month's report for each organization, on the 1st at 02:00 UTC (off: REPORTS_MONTHLY=false).
REPORTS_MONTHLY = env_bool("REPORTS_MONTHLY", True)
if REPORTS_MONTHLY:
    from celery.schedules import crontab

    CELERY_BEAT_SCHEDULE["reports-monthly"] = {
        "task": "reports.monthly",
        "schedule": crontab(minute=0, hour=2, day_of_month=1),
    }
# A report still running this long after it started lost its worker: it is queued again (at most
# REPORT_MAX_ATTEMPTS runs, then failed with that reason); one queued this long is sent to the broker again.
REPORT_RUNNING_STALE_S = env_float("REPORT_RUNNING_STALE_S", 1800.0, minimum=60.0)
REPORT_QUEUED_STALE_S = env_float("REPORT_QUEUED_STALE_S", 600.0, minimum=30.0)
REPORT_MAX_ATTEMPTS = env_int("REPORT_MAX_ATTEMPTS", 3, minimum=1)
CELERY_BEAT_SCHEDULE["reports-recover"] = {"task": "reports.recover", "schedule": 300.0}
# The ledger's monthly partitions on PostgreSQL (docs/ledger-partitioning.md): this month's and this many months
# ahead exist at all times (made by `setup` and daily), so the drainer never lacks one.
LEDGER_PARTITION_MONTHS_AHEAD = env_int("LEDGER_PARTITION_MONTHS_AHEAD", 3, minimum=1, maximum=120)
CELERY_BEAT_SCHEDULE["ledger-partitions"] = {"task": "carbonledger.ledger_partitions", "schedule": 86400.0}
# Deferred inference jobs (jobs/): bounds of a job file, how far ahead a deadline may be, how the worker reaches
# the gateway's own KServe endpoint, and when a job is given up for lost.
JOBS_MAX_REQUESTS = env_int("JOBS_MAX_REQUESTS", 10_000, minimum=1)
JOBS_MAX_FILE_BYTES = env_int("JOBS_MAX_FILE_BYTES", 32 * 1024 * 1024, minimum=1024)
JOBS_MIN_LEAD_S = env_float("JOBS_MIN_LEAD_S", 60.0, minimum=0.0)
JOBS_MAX_HORIZON_S = env_float("JOBS_MAX_HORIZON_S", 7 * 86400.0, minimum=3600.0)
JOBS_PROFILE_DAYS = env_int("JOBS_PROFILE_DAYS", 7, minimum=1)
JOBS_CONCURRENCY = env_int("JOBS_CONCURRENCY", 4, minimum=1)
JOBS_REQUEST_TIMEOUT_S = env_float("JOBS_REQUEST_TIMEOUT_S", 60.0, minimum=0.1)
JOBS_REQUEST_ATTEMPTS = env_int("JOBS_REQUEST_ATTEMPTS", 3, minimum=1)
JOBS_DISPATCH_GRACE_S = env_float("JOBS_DISPATCH_GRACE_S", 30.0, minimum=0.0)
JOBS_RUNNING_STALE_S = env_float("JOBS_RUNNING_STALE_S", 900.0, minimum=60.0)
# By default the gateway `make run` starts: scripts/run.sh serves on 127.0.0.1:$PORT (8000 unless set).
GATEWAY_URL = env_str("GATEWAY_URL", f"http://127.0.0.1:{env_int('PORT', 8000, minimum=1)}").rstrip("/")
if GATEWAY_URL.split("://", 1)[0] not in {"http", "https"} or "://" not in GATEWAY_URL:
    from django.core.exceptions import ImproperlyConfigured

    raise ImproperlyConfigured(f"GATEWAY_URL must be an http:// or https:// address, got {GATEWAY_URL!r}")
CELERY_BEAT_SCHEDULE["jobs-dispatch-due"] = {"task": "jobs.dispatch_due", "schedule": 60.0}
CELERY_TIMEZONE = "UTC"
if INTENSITY_PROVIDERS:
    CELERY_BEAT_SCHEDULE["intensity-fetch"] = {"task": "carbonledger.intensity_fetch", "schedule": 3600.0}
CELERY_BEAT_SCHEDULE_FILENAME = str(VAR_DIR / "celery" / "beat-schedule")
LOGIN_URL = "/accounts/login/"
LOGIN_REDIRECT_URL = "/dashboard/"
# Password reset links go by e-mail through EMAIL_HOST when one is set; without one (the demo) the message is
# written to the server's console, so an operator can pass the link on.
EMAIL_HOST = env_str("EMAIL_HOST", "")
EMAIL_BACKEND = (
    "django.core.mail.backends.smtp.EmailBackend"
    if EMAIL_HOST
    else "django.core.mail.backends.console.EmailBackend"
)
EMAIL_PORT = env_int("EMAIL_PORT", 587, minimum=1, maximum=65535)
EMAIL_HOST_USER = env_str("EMAIL_HOST_USER", "")
EMAIL_HOST_PASSWORD = env_str("EMAIL_HOST_PASSWORD", "")
EMAIL_USE_TLS = env_bool("EMAIL_USE_TLS", True)
DEFAULT_FROM_EMAIL = env_str("DEFAULT_FROM_EMAIL", "carbonledger@localhost")
