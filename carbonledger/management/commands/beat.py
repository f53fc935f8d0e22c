from __future__ import annotations

import logging
import os
import sys
import threading
import time
from pathlib import Path
from typing import Any

import psycopg
from celery.apps.beat import Beat
from django.conf import settings
from django.core.management.base import BaseCommand, CommandParser
from django.db import DatabaseError, connection

from carbonledger.celery import app
from tenancy.locks import HeldLock, LockLost, database_lock

log = logging.getLogger(__name__)

# How often the beat checks that its lock's database session is still there. Were the session ended under it
# (the database restarted, an operator's pg_terminate_backend), a waiting beat could take the lock while this
# one still sends: this bounds that overlap.
LOCK_CHECK_INTERVAL_S = 2.0
RETRY_S = 5.0  # while the database cannot be reached


class Command(BaseCommand):
    help = (
        "Run Celery beat (rollups, ledger verification, monthly reports, due jobs) while holding the database's "
        "beat lock: start one per replica if you like, exactly one sends; the others wait, say so, and the next "
        "takes over when the holder dies (docs/operations.md)."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--loglevel", default="INFO", choices=("DEBUG", "INFO", "WARNING", "ERROR"))

    def handle(self, *args: Any, **opts: Any) -> None:
        lock = database_lock("beat", on_wait=self._say)
        while True:
            try:
                held = lock.__enter__()  # held for this process's life: released when its connection ends
                break
            except (DatabaseError, OSError, psycopg.Error) as exc:
                self._say(
                    f"cannot take the beat lock, the database is unreachable ({exc}); again in {RETRY_S:g} s"
                )
                time.sleep(RETRY_S)
        connection.close()  # Django's own connection: beat only sends messages
        self._say(f"this process (pid {os.getpid()}) holds the beat lock; starting Celery beat")
        threading.Thread(target=_watch, args=(held,), name="beat-lock-watch", daemon=True).start()
        Path(settings.CELERY_BEAT_SCHEDULE_FILENAME).parent.mkdir(parents=True, exist_ok=True)
        Beat(app=app, loglevel=opts["loglevel"], schedule=settings.CELERY_BEAT_SCHEDULE_FILENAME).run()

    def _say(self, line: str) -> None:
        self.stderr.write(line)
        self.stderr.flush()


def _watch(held: HeldLock) -> None:
    """Start this process afresh (it then waits for the lock like any other beat) once the lock is lost, rather
    than go on sending beside the beat that took it over."""
    while True:
        time.sleep(LOCK_CHECK_INTERVAL_S)
        try:
            held.check()
        except LockLost as exc:
            sys.stderr.write(f"{exc}; this beat stops sending and starts again, waiting for the lock\n")
            sys.stderr.flush()
            os.execv(sys.executable, [sys.executable, *sys.argv])
        except Exception as exc:  # a failed check is not a lost lock; the next one decides
            log.warning("the beat lock could not be checked (%s); checking again", exc)
