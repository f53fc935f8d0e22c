#!/usr/bin/env bash
# Starts the Celery worker (embedded filesystem broker unless CELERY_BROKER_URL says otherwise)
# in the background and the ASGI server (gateway + Django) in the foreground; Ctrl-C stops both.
set -euo pipefail
cd "$(dirname "$0")/.."
export OPENBLAS_NUM_THREADS=${OPENBLAS_NUM_THREADS:-1}
# -B: the embedded beat scheduler (rollups every ROLLUP_INTERVAL_S, monthly reports).
.venv/bin/celery -A carbonledger worker -B --pool=threads --concurrency=2 --loglevel=INFO &
WORKER=$!
trap 'kill "$WORKER" 2>/dev/null || true; wait "$WORKER" 2>/dev/null || true' EXIT INT TERM
.venv/bin/python manage.py serve --host "${HOST:-127.0.0.1}" --port "${PORT:-8000}"
