"""A real Triton server, installed with the Triton reference's setup.sh (cached under var/triton).

The reference (setup.sh, start_triton.sh, models/) is not part of the product: CARBONLEDGER_TRITON_REFERENCE
names its folder (default: triton-reference in a shared/ folder beside the checkout); the tests that need
it are skipped without it."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import requests

ROOT = Path(__file__).resolve().parents[2]
REFERENCE = Path(os.environ.get("CARBONLEDGER_TRITON_REFERENCE", ROOT.parent / "shared" / "triton-reference"))
TRITON_DIR = Path(os.environ.get("TRITON_HOME", ROOT / "var" / "triton"))


def triton_available() -> tuple[bool, str]:
    if not (REFERENCE / "setup.sh").is_file():
        return (
            False,
            f"{REFERENCE}/setup.sh not found (set CARBONLEDGER_TRITON_REFERENCE to the Triton reference folder)",
        )
    return True, ""


def ensure_installed() -> Path:
    marker = TRITON_DIR / "perf_analyzer"
    if not marker.exists() or not (TRITON_DIR / "venv" / "bin" / "python").exists():
        subprocess.run(["bash", str(REFERENCE / "setup.sh"), str(TRITON_DIR)], check=True, timeout=900)
    return TRITON_DIR


@contextmanager
def running_triton(model_repo: Path, port: int, timeout_s: float = 60.0) -> Iterator[str]:
    directory = ensure_installed()
    log_path = directory / f"triton-{port}.log"
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(
            ["bash", str(REFERENCE / "start_triton.sh"), str(directory), str(model_repo), str(port)],
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    try:
        deadline = time.monotonic() + timeout_s
        while True:
            if proc.poll() is not None:
                raise RuntimeError(f"tritonserver exited with {proc.returncode}; see {log_path}")
            try:
                if requests.get(f"http://127.0.0.1:{port}/v2/health/ready", timeout=1).status_code == 200:
                    break
            except requests.RequestException:
                pass
            if time.monotonic() > deadline:
                raise RuntimeError(f"tritonserver not ready after {timeout_s} s; see {log_path}")
            time.sleep(0.2)
        yield f"127.0.0.1:{port}"
    finally:
        stop_group(proc)


def stop_group(proc: subprocess.Popen[bytes]) -> None:
    """SIGTERM the server's process group (Triton stops in about 4 s), SIGKILL if it lingers."""
    if proc.poll() is not None:
        return
    try:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(15)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(5)
    except ProcessLookupError:
        pass
