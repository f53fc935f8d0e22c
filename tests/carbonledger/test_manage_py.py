"""manage.py itself: what every command's process gets before Django or numpy load."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.skipif(not Path("/proc/self/task").is_dir(), reason="counts threads through /proc")
def test_a_manage_py_process_runs_openblas_without_worker_threads(tmp_path: Path) -> None:
    # `serve`'s system checks import numpy (URLconf -> jobs -> inference.config -> tritonclient), so
    # OPENBLAS_NUM_THREADS must be set before any command runs; a worker thread per core spun under load.
    env = {k: v for k, v in os.environ.items() if k != "OPENBLAS_NUM_THREADS"}
    env["CARBONLEDGER_VAR_DIR"] = str(tmp_path)
    code = "import os, numpy; print(os.environ['OPENBLAS_NUM_THREADS'], len(os.listdir('/proc/self/task')))"
    done = subprocess.run(
        [sys.executable, "manage.py", "shell", "-c", code],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.split()[-2:] == ["1", "1"]
