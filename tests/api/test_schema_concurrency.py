"""The OpenAPI schema answers when several requests ask for it at once in a fresh process.

Django's ASGI handler runs each request in a thread of its own, and drf-spectacular keeps state in globals: it
imports the targets of its contrib extensions (dj_rest_auth, rest_framework_recursive, ...) on first use,
unsynchronised, so a second thread finds a half-loaded extension and the request ends in a 500 whose log shows
"ModuleNotFoundError: No module named 'rest_framework_recursive'" (or 'dj_rest_auth': the import that fails, as it
should, for a package this project does not install) and then the AttributeError it really died of. Only a process that has
not built a schema yet can show it, hence a fresh interpreter per round."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

from tests.support.gateway_process import PYTHON, REPO_ROOT

# Eight threads start together: half fetch /api/schema/, half build the /api/v1/ index from the same schema.
FIRST_REQUESTS_AT_ONCE = """
import json, threading, traceback
import django
django.setup()
from django.test import Client
from api.index import endpoints

THREADS = 8
start = threading.Barrier(THREADS)
outcomes = []

def fetch_schema():
    start.wait()
    try:
        outcomes.append(Client(raise_request_exception=False).get("/api/schema/?format=json").status_code)
    except Exception as e:
        outcomes.append("".join(traceback.format_exception_only(e)).strip())

def build_index():
    start.wait()
    try:
        outcomes.append(200 if endpoints() else "empty index")
    except Exception as e:
        outcomes.append("".join(traceback.format_exception_only(e)).strip())

threads = [threading.Thread(target=fetch_schema if i % 2 else build_index) for i in range(THREADS)]
for t in threads:
    t.start()
for t in threads:
    t.join()
print(json.dumps(outcomes))
"""


def test_the_schema_answers_every_one_of_several_first_requests_made_at_once(tmp_path: Path) -> None:
    env = {
        **os.environ,
        "DJANGO_SETTINGS_MODULE": "carbonledger.settings",
        "DATABASE_URL": f"sqlite:///{tmp_path / 'db.sqlite3'}",  # the schema reads no table
    }
    for _ in range(3):  # each round a fresh process; one round failed nearly always before the fix
        done = subprocess.run(
            [PYTHON, "-c", FIRST_REQUESTS_AT_ONCE],
            cwd=REPO_ROOT,
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert done.returncode == 0, done.stderr[-3000:]
        outcomes = json.loads(done.stdout.strip().splitlines()[-1])
        assert outcomes == [200] * 8, outcomes
