"""bench/profile_gateway.py's summary of py-spy's collapsed stacks, on a small hand-written profile."""

from __future__ import annotations

import importlib
import sys
from pathlib import Path

BENCH = Path(__file__).resolve().parents[2] / "bench"
sys.path.insert(0, str(BENCH))
try:
    profile_gateway = importlib.import_module("profile_gateway")
finally:
    sys.path.remove(str(BENCH))

LOOP = 'process 10:"python manage.py serve";thread (10): MainThread'
DRAINER = 'process 10:"python manage.py serve";process 11:"python manage.py drain_ledger"'


def test_summary_counts_samples_per_thread_self_frames_and_areas(tmp_path: Path) -> None:
    stacks = tmp_path / "stacks.txt"
    stacks.write_text(
        f"{LOOP};run (asyncio/base_events.py:640);Handle._run (asyncio/events.py:80) 50\n"
        f"{LOOP};run (asyncio/base_events.py:640);GrpcFrontEnd._model_infer (inference/grpc_server.py:315) 30\n"
        f"{DRAINER};LedgerWriter.run (ledger/writer.py:900);_parse (ledger/writer.py:277) 20\n"
    )
    summary = profile_gateway.summarize(stacks)
    assert summary["samples"] == 100
    threads = {t["thread"]: t["percent"] for t in summary["per_thread"]}
    assert threads == {
        f"{LOOP.split(';')[0]} / thread (10): MainThread": 80.0,
        DRAINER.replace(";", " / "): 20.0,
    }
    assert summary["self_by_area_percent"] == {
        "C code under event-loop callbacks": 50.0,
        "our gRPC front end": 30.0,
        "ledger": 20.0,
    }
    assert summary["top_self"][0] == {"frame": "Handle._run (asyncio/events.py:80)", "percent": 50.0}
    inclusive = {f["frame"]: f["percent"] for f in summary["top_inclusive"]}
    assert inclusive["run (asyncio/base_events.py:640)"] == 80.0


def test_lines_that_are_not_stacks_are_skipped(tmp_path: Path) -> None:
    stacks = tmp_path / "stacks.txt"
    stacks.write_text(f"\nnot a stack\n{LOOP};f (inference/core.py:1) 4\n")
    summary = profile_gateway.summarize(stacks)
    assert summary["samples"] == 4
    assert summary["self_by_area_percent"] == {"our inference core": 100.0}
