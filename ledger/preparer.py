"""The ledger writer's preparer process: parses, chains and formats the COPY streams of the chunks ahead while
the writer's own process feeds PostgreSQL, so that the thread feeding it neither waits for this work's GIL nor
shares a core's time with it (bench/ledger_ingest.py, 60 s on PostgreSQL, same machine and afternoon:
29.2k and 33.8k request records/s with a helper thread, 38.4k and 42.2k with this process).

An explicit child (``python -m ledger.preparer_child``) rather than a ``multiprocessing`` pool, whose
spawned workers re-import the parent's ``__main__``: a script without a main guard would run again in it.
The protocol on the child's standard input and output is a stream of pickles, one request and one answer at
a time: first ``(dsn, password)``, then ``(lines joined by newlines, start, end, head)`` (head: chain pk, seq, hash, period) answered by ``("ok", PreparedChunk)``
or ``("error", exception)``. The child leaves when its standard input closes, so a writer killed outright
(SIGKILL) leaves no preparer behind.
"""

from __future__ import annotations

import contextlib
import os
import pickle
import subprocess
import sys
from pathlib import Path
from typing import Any

from inference.spool import SpoolPosition

_ROOT = Path(__file__).resolve().parents[1]


class PreparerFailed(Exception):
    """The preparer process is gone (killed, out of memory, or it could not start)."""


class PreparerProcess:
    """The writer's side of one preparer process: ``send`` a chunk's lines, then ``receive`` it prepared."""

    def __init__(self, dsn: str, password: str | None) -> None:
        env = {
            **os.environ,
            "PYTHONPATH": os.pathsep.join(filter(None, [str(_ROOT), os.environ.get("PYTHONPATH")])),
        }
        self._proc = subprocess.Popen(
            [sys.executable, "-m", "ledger.preparer_child"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            cwd=_ROOT,
            env=env,
        )
        self._pending = False
        self._write((dsn, password))

    @property
    def pid(self) -> int:
        return self._proc.pid

    def _write(self, message: object) -> None:
        assert self._proc.stdin is not None
        try:
            pickle.dump(message, self._proc.stdin, protocol=pickle.HIGHEST_PROTOCOL)
            self._proc.stdin.flush()
        except (BrokenPipeError, OSError) as exc:
            raise PreparerFailed(f"the preparer process {self._proc.pid} is gone ({exc})") from None

    def send(
        self, lines: list[bytes], start: SpoolPosition, end: SpoolPosition, head: tuple[int, int, str, int]
    ) -> None:
        if self._pending:
            raise RuntimeError("the preparer already holds a chunk: receive it first")
        # One bytes object pickles as one copy; a list of tens of thousands of lines costs a pickle opcode each.
        self._write((b"\n".join(lines), start, end, head))
        self._pending = True

    def receive(self) -> Any:
        """The chunk sent last, prepared (a ``ledger.writer.PreparedChunk``, which this side only hands on:
        naming its type here would make the writer and this module import each other); raises what preparing
        it raised, or ``PreparerFailed``."""
        assert self._proc.stdout is not None
        self._pending = False
        try:
            tag, value = pickle.load(self._proc.stdout)
        except (EOFError, OSError, pickle.UnpicklingError) as exc:
            raise PreparerFailed(
                f"the preparer process {self._proc.pid} is gone (exit status {self._proc.poll()}; {exc!r})"
            ) from None
        if tag == "error":
            raise value
        return value

    def discard(self) -> None:
        """Forget a chunk sent but not received (the drain stopped before it)."""
        if self._pending:
            with contextlib.suppress(Exception):
                self.receive()

    def close(self) -> None:
        if self._proc.stdin is not None:
            with contextlib.suppress(OSError):
                self._proc.stdin.close()
        try:
            self._proc.wait(10)
        except subprocess.TimeoutExpired:
            self._proc.kill()
            self._proc.wait(10)
        if self._proc.stdout is not None:
            self._proc.stdout.close()
