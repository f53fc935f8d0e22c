from __future__ import annotations

import logging
import os
import signal
import sys
import threading
from pathlib import Path
from typing import Any

from django.conf import settings
from django.core.management.base import BaseCommand, CommandParser
from django.db import DatabaseError, connection

from inference.spool import SpoolReader
from ledger.writer import DRAINER_SWITCH_INTERVAL_S, LedgerWriter

log = logging.getLogger(__name__)


class Command(BaseCommand):
    help = (
        "Drain a gateway's ledger spool into the database until stopped (SIGTERM/SIGINT) or until the "
        "parent gateway process is gone; then drain what is left and exit. The gateway starts one itself."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--spool", default="", help="spool directory (default SPOOL_DIR)")
        parser.add_argument("--parent-pid", type=int, default=0, help="exit when this process is gone")
        parser.add_argument("--once", action="store_true", help="drain what is there now and exit")

    def handle(self, *args: Any, **opts: Any) -> None:
        # Background work: the gateway and its clients come first on a busy machine (draining
        # otherwise shows up in the gateway's throughput and p99). SCHED_IDLE runs it only on
        # otherwise idle CPU; the spool absorbs what waits, within SPOOL_MAX_BYTES.
        if settings.LEDGER_WRITER_NICE:
            os.nice(settings.LEDGER_WRITER_NICE)
        if settings.LEDGER_WRITER_SCHED_IDLE and hasattr(os, "SCHED_IDLE"):
            try:
                os.sched_setscheduler(0, os.SCHED_IDLE, os.sched_param(0))
            except OSError as exc:
                log.warning("could not put the ledger writer on SCHED_IDLE: %s", exc)
        sys.setswitchinterval(DRAINER_SWITCH_INTERVAL_S)  # this process does nothing but drain
        reader = SpoolReader(Path(opts["spool"] or settings.SPOOL_DIR))
        writer = LedgerWriter(reader, interval_s=settings.LEDGER_WRITE_INTERVAL_S)
        if opts["once"]:
            writer.recover()
            writer.drain_all()
            self.stdout.write(f"drained: {writer.records_written} records")
            return
        stop = threading.Event()
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, lambda *_: stop.set())
        parent = opts["parent_pid"]

        def orphaned() -> bool:
            return bool(parent) and os.getppid() != parent

        # The database may be down when the gateway starts: keep trying, the spool holds on.
        backoff = 0.5
        while True:
            try:
                writer.recover()
                break
            except DatabaseError as exc:
                log.warning(
                    "ledger writer: cannot read the checkpoint (%s); retrying in %.1f s", exc, backoff
                )
                connection.close()
                if stop.wait(backoff) or orphaned():
                    return
                backoff = min(5.0, backoff * 2)
        writer.start()
        while not stop.wait(0.5):
            if orphaned():
                break  # the gateway died (SIGKILL): drain what it spooled, then go
        writer.stop(timeout_s=60)
