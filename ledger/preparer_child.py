"""The preparer process itself (``python -m ledger.preparer_child``; the writer's side is ledger/preparer.py).

Django is set up before the writer's module is imported, because that module reads the ledger's models.
"""

from __future__ import annotations

import gc
import os
import pickle
import sys
from typing import IO, Any

import django
import psycopg

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "carbonledger.settings")
django.setup()

from ledger.writer import prepare_chunk  # noqa: E402


def _serve(requests: IO[bytes], answers: IO[bytes]) -> None:
    # Preparing creates no reference cycles (parsed JSON, tuples, bytes), and the collector's passes over a
    # chunk's hundreds of thousands of young objects are pure overhead here.
    gc.disable()
    dsn, password = pickle.load(requests)
    # A connection of its own, which only lends psycopg's adapters to the COPY formatting and never executes.
    conn = psycopg.connect(dsn, password=password) if password else psycopg.connect(dsn)
    cursor = conn.cursor()
    while True:
        try:
            blob, start, end, head = pickle.load(requests)
        except EOFError:  # the writer closed the pipe, or died
            return
        lines = blob.split(b"\n") if blob else []
        try:
            chunk = prepare_chunk(lines, start, end, head, cursor)
        except Exception as exc:
            answer: tuple[str, Any] = ("error", exc)
        else:
            # Only what the commit needs goes back (the COPY streams, the chain head reached, the device
            # records); the writer keeps the lines to parse them again if the chunk must be re-chained.
            chunk.records = None
            chunk.rows = None
            chunk.raw = None
            answer = ("ok", chunk)
        pickle.dump(answer, answers, protocol=pickle.HIGHEST_PROTOCOL)
        answers.flush()


if __name__ == "__main__":
    # The answers keep the real standard output; anything printed on the way (a warning, a log handler on
    # stdout) goes to standard error instead of into the pickle stream.
    answers = os.fdopen(os.dup(1), "wb")
    os.dup2(2, 1)
    _serve(sys.stdin.buffer, answers)
