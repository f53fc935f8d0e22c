"""The ledger writer's preparer process: parses, chains and formats the COPY streams of the chunks ahead while
the writer's own process feeds PostgreSQL, so that the thread feeding it never waits for this work's GIL.

This module imports nothing of Django at import time: a spawned process unpickles references to these
functions before Django is set up (``init`` sets it up).
"""

from __future__ import annotations

import gc
import os
import threading
import time
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from carbonledger.ledger_writer import PreparedChunk
    from inference.spool import SpoolPosition

_cursor: Any = None


def init(dsn: str, password: str | None) -> None:
    """Runs once in the preparer process: Django (for the record kinds), and a connection of its own that only
    lends psycopg's adapters to the COPY formatting and never executes."""
    import django
    import psycopg

    _exit_with_parent()
    django.setup()
    # Preparing creates no reference cycles (parsed JSON, tuples, bytes), and the collector's passes over
    # a chunk's hundreds of thousands of young objects are pure overhead here.
    gc.disable()
    global _cursor
    conn = psycopg.connect(dsn, password=password) if password else psycopg.connect(dsn)
    _cursor = conn.cursor()


def _exit_with_parent() -> None:
    """A writer killed outright (SIGKILL) cannot stop its preparer, which would then wait for work forever,
    holding a database connection: it leaves once its parent is gone."""
    parent = os.getppid()

    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(1.0)
        os._exit(0)

    threading.Thread(target=watch, name="preparer-parent-watch", daemon=True).start()


def prepare(
    lines: list[bytes], start: SpoolPosition, end: SpoolPosition, head: tuple[int, int, str]
) -> PreparedChunk:
    """``prepare_chunk`` here; only what the commit needs goes back (the COPY streams, the chain head reached,
    the device records), not the parsed records or rows: the writer keeps the lines to parse them again in
    the rare case the chunk must be re-chained."""
    from carbonledger.ledger_writer import prepare_chunk

    chunk = prepare_chunk(lines, start, end, head, _cursor)
    chunk.records = None
    chunk.rows = None
    return chunk
