"""Database-wide locks for work that one process at a time may do across every replica sharing the database:
the set-up (migrate, the shipped factors, the demo data) and the beat scheduler.

On PostgreSQL a lock is a session advisory lock (``pg_advisory_lock``) on a fixed key, taken on a connection of
its own: it needs no table (the set-up takes it on an empty database), and it is released when that connection
ends, so a process that dies, however it dies, lets the next one in. On SQLite, whose database is a file on one
machine, it is an exclusive ``flock`` on a file beside the database, with the same release on death; an
in-memory database has one process, and takes none.

A process that asks again for a lock it holds gets it at once (``manage.py setup --demo`` holds the set-up lock
and runs ``bootstrap_demo``, which takes it too).
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psycopg
from django.db import connection

# Fixed advisory keys: 0x434C ("CL") in the high 32 bits, the lock's number in the low ones (pg_locks shows
# them as classid and objid).
_NAMESPACE = 0x434C
KEYS = {"setup": 1, "beat": 2}

# The lock connection's own TCP keepalives: a server that went away is noticed in seconds, not hours.
_KEEPALIVE = {"keepalives": 1, "keepalives_idle": 5, "keepalives_interval": 2, "keepalives_count": 3}


class LockLost(Exception):
    """The connection that held a PostgreSQL lock is gone: the lock is no longer this process's."""


@dataclass
class HeldLock:
    name: str
    connection: Any = None  # the psycopg connection whose session holds the advisory lock (PostgreSQL)
    fd: int | None = None  # the flocked file (SQLite)
    depth: int = 1
    lock: threading.Lock = field(default_factory=threading.Lock)

    def check(self) -> None:
        """Raise LockLost unless the lock is still held (a round trip on the lock's connection)."""
        if self.connection is None:
            return  # a flock lasts as long as this process
        with self.lock:
            try:
                row = self.connection.execute(
                    "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND pid = pg_backend_pid()"
                    " AND classid = %s AND objid = %s AND granted",
                    (_NAMESPACE, KEYS[self.name]),
                ).fetchone()
            except psycopg.Error as exc:
                raise LockLost(f"the {self.name} lock's database connection failed: {exc}") from exc
        if not (row and row[0]):
            raise LockLost(f"the {self.name} lock is no longer held by this process's session")


_held: dict[str, HeldLock] = {}
_held_lock = threading.Lock()


@contextlib.contextmanager
def database_lock(name: str, *, on_wait: Callable[[str], None] | None = None) -> Iterator[HeldLock]:
    """Hold the database-wide lock ``name`` (a key of KEYS) for the block; wait for it while another process
    holds it, first calling ``on_wait`` with a line that says who holds it."""
    if name not in KEYS:
        raise ValueError(f"unknown lock {name!r}; one of {', '.join(KEYS)}")
    with _held_lock:
        held = _held.get(name)
        if held is not None:
            held.depth += 1
    if held is not None:
        try:
            yield held
        finally:
            with _held_lock:
                held.depth -= 1
        return
    taken = _take(name, on_wait or (lambda _line: None))
    with _held_lock:
        _held[name] = taken
    try:
        yield taken
    finally:
        with _held_lock:
            _held.pop(name, None)
        _release(taken)


def _take(name: str, on_wait: Callable[[str], None]) -> HeldLock:
    if connection.vendor == "postgresql":
        return _take_advisory(name, on_wait)
    path = _sqlite_lock_path(name)
    if path is None:
        return HeldLock(name)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            on_wait(f"waiting for the {name} lock: another process on this machine holds {path}")
            fcntl.flock(fd, fcntl.LOCK_EX)
    except BaseException:
        os.close(fd)
        raise
    return HeldLock(name, fd=fd)


def _sqlite_lock_path(name: str) -> Path | None:
    database = str(connection.settings_dict["NAME"])
    if not database or database == ":memory:" or database.startswith("file:") or "mode=memory" in database:
        return None
    path = Path(database)
    return path.with_name(f"{path.name}.{name}.lock")


def _take_advisory(name: str, on_wait: Callable[[str], None]) -> HeldLock:
    key = (_NAMESPACE << 32) | KEYS[name]
    params = {**connection.get_connection_params(), **_KEEPALIVE}
    conn = psycopg.connect(**params, autocommit=True)
    try:
        row = conn.execute("SELECT pg_try_advisory_lock(%s)", (key,)).fetchone()
        if not (row and row[0]):
            holder = conn.execute(
                "SELECT a.pid, a.application_name, coalesce(host(a.client_addr), 'local') FROM pg_locks l"
                " JOIN pg_stat_activity a ON a.pid = l.pid WHERE l.locktype = 'advisory' AND l.granted"
                " AND l.classid = %s AND l.objid = %s",
                (_NAMESPACE, KEYS[name]),
            ).fetchone()
            who = (
                f"PostgreSQL session {holder[0]} ({holder[1] or 'no application name'}, from {holder[2]})"
                if holder
                else "another session"
            )
            on_wait(f"waiting for the {name} lock (advisory key {key}): {who} holds it")
            conn.execute("SELECT pg_advisory_lock(%s)", (key,))
    except BaseException:
        conn.close()
        raise
    return HeldLock(name, connection=conn)


def _release(held: HeldLock) -> None:
    if held.connection is not None:
        with contextlib.suppress(Exception):  # a connection already gone has released it with itself
            held.connection.close()
    if held.fd is not None:
        os.close(held.fd)  # closing the only descriptor releases the flock
