#!/usr/bin/env bash
# Every role on one box (docs/operations.md): the set-up (migrations, the shipped factors, the demo; under the
# database's set-up lock), a Celery worker (embedded filesystem broker unless CELERY_BROKER_URL says otherwise),
# the one beat (behind the database's beat lock), and in the foreground the ASGI server with the role `all`
# (gateway + dashboard and API). Ctrl-C stops them all.
set -euo pipefail
cd "$(dirname "$0")/.."
export OPENBLAS_NUM_THREADS=${OPENBLAS_NUM_THREADS:-1}
# The set-up's lines are shown as they come and kept (in memory only) for the summary printed last.
SETUP_OUTPUT=$(.venv/bin/python manage.py setup --demo | tee /dev/stderr)
PIDS=()
stop() {
    for pid in "${PIDS[@]}"; do kill "$pid" 2>/dev/null || true; done
    for pid in "${PIDS[@]}"; do wait "$pid" 2>/dev/null || true; done
}
trap stop EXIT INT TERM
# No -B: the scheduler is `manage.py beat` (rollups every ROLLUP_INTERVAL_S, ledger verification, monthly
# reports), one per database however many replicas start it.
.venv/bin/celery -A carbonledger worker --pool=threads --concurrency=2 --loglevel=INFO &
PIDS+=($!)
.venv/bin/python manage.py beat &
PIDS+=($!)
.venv/bin/python manage.py serve --role all --host "${HOST:-127.0.0.1}" --port "${PORT:-8000}" &
SERVER=$!
PIDS+=($SERVER)
# Once the server answers and a worker's heartbeat is live (/metrics), print where to go and who to log in
# as, last, so the worker's and the server's start-up lines never scroll them away.
case "${HOST:-127.0.0.1}" in 0.0.0.0 | :: | "[::]") PROBE=127.0.0.1 ;; *) PROBE=${HOST:-127.0.0.1} ;; esac
.venv/bin/python - "http://$PROBE:${PORT:-8000}/metrics" <<'PY' || true
import re, sys, time, urllib.request
deadline = time.monotonic() + 180
while time.monotonic() < deadline:
    try:
        page = urllib.request.urlopen(sys.argv[1], timeout=2).read().decode()
        up = re.search(r"^carbonledger_celery_workers_up (\d+)", page, re.M)
        if up and int(up.group(1)) >= 1:
            sys.exit(0)
    except OSError:
        pass
    time.sleep(0.5)
sys.exit(1)
PY
{
    echo
    echo "================================================================================"
    echo "CarbonLedger is running at http://${HOST:-127.0.0.1}:${PORT:-8000}/"
    if USER_LINE=$(grep -m1 '^dashboard user: ' <<<"$SETUP_OUTPUT"); then
        echo "${USER_LINE}"
    else
        echo "dashboard user: demo (password shown on the first run only)"
    fi
    grep -m1 '^demo API key' <<<"$SETUP_OUTPUT" || true
    echo "forgot the password? .venv/bin/python manage.py changepassword demo"
    echo "API: http://${HOST:-127.0.0.1}:${PORT:-8000}/api/docs/ · stop: Ctrl-C"
    echo "================================================================================"
}
wait "$SERVER"
