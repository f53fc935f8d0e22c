from __future__ import annotations

import logging
import os
import signal
import sys
import threading
from pathlib import Path
from typing import Any

from django.conf import settings
from django.core.management.base import BaseCommand, CommandError, CommandParser
from django.db import DatabaseError, connection

from inference.errors import THREAD_ERRORS
from inference.spool import SpoolReader
from ledger.ownership import EXIT_CHAIN_HELD, ChainHeld, ChainLost, ChainOwnership
from ledger.writer import DRAINER_SWITCH_INTERVAL_S, LedgerWriter, write_drainer_status

log = logging.getLogger(__name__)


class Command(BaseCommand):
    help = (
        "Drain a gateway's ledger spool into the database until stopped (SIGTERM/SIGINT) or until the "
        "parent gateway process is gone; then drain what is left and exit. The gateway starts one itself. "
        f"The spool's chain is leased in the database: a chain another live process holds (a copy of its spool) "
        f"is refused, exit status {EXIT_CHAIN_HELD}, as is one taken over while draining."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--spool", default="", help="spool directory (default SPOOL_DIR)")
        parser.add_argument("--parent-pid", type=int, default=0, help="exit when this process is gone")
        parser.add_argument("--once", action="store_true", help="drain what is there now and exit")
        parser.add_argument(
            "--lease-owner",
            default="",
            help="claim the chain's lease as this owner (the gateway that started this process passes its own: "
            "the two share one lease, which the gateway keeps and releases); default: this process",
        )

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
        spool_dir = Path(opts["spool"] or settings.SPOOL_DIR)
        if not spool_dir.is_dir():
            raise CommandError(
                f"no spool at {spool_dir}: --spool (or SPOOL_DIR) must name a gateway's spool folder"
            )
        try:
            reader = SpoolReader(spool_dir)
        except (OSError, ValueError) as exc:
            raise CommandError(f"cannot read the spool at {spool_dir}: {exc}") from None
        shared = bool(opts["lease_owner"])
        ownership = ChainOwnership(reader.chain_id, owner=opts["lease_owner"] or None)
        writer = LedgerWriter(reader, interval_s=settings.LEDGER_WRITE_INTERVAL_S, ownership=ownership)
        if opts["once"]:
            self._claim(ownership)
            try:
                writer.recover()
                writer.drain_all()
            except ChainLost as exc:
                raise CommandError(str(exc), returncode=EXIT_CHAIN_HELD) from None
            finally:
                if not shared:
                    ownership.release()
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
                if ownership.grant is None:
                    self._claim(ownership)
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
        ownership.start_keeper()
        writer.start()
        published: dict[str, Any] = {}
        gone = False
        while not stop.wait(0.5):
            published = _publish(spool_dir, published, writer)
            if writer.fenced or not writer.alive:
                break  # the chain was taken over: the writer stopped writing (and said why)
            if orphaned():
                gone = True
                break  # the gateway died (SIGKILL): drain what it spooled, then go
        writer.stop(timeout_s=60)
        _publish(spool_dir, published, writer)
        if writer.fenced:
            ownership.stop_keeper()
            raise CommandError(writer.last_error, returncode=EXIT_CHAIN_HELD)
        if shared and not gone:
            ownership.stop_keeper()  # the gateway keeps the lease and releases it when it stops
        else:
            # Ours alone, or the gateway that shared it is dead: free the chain for the process that comes next.
            ownership.release()

    @staticmethod
    def _claim(ownership: ChainOwnership) -> None:
        try:
            ownership.claim()
        except ChainHeld as exc:
            raise CommandError(str(exc), returncode=EXIT_CHAIN_HELD) from None


def _publish(spool_dir: Path, published: dict[str, Any], writer: LedgerWriter) -> dict[str, Any]:
    """The failures this process's threads survived, the records its writer committed and whether its last
    attempt succeeded, for the gateway's /metrics and readiness, when they changed."""
    counts = THREAD_ERRORS.counts()
    state = {"thread_errors": counts, "records_written": writer.records_written, "healthy": writer.healthy}
    if state == published:
        return published
    try:
        write_drainer_status(
            spool_dir, counts, records_written=writer.records_written, healthy=writer.healthy
        )
    except OSError as exc:
        log.warning("could not publish the ledger writer's status in %s: %s", spool_dir, exc)
        return published
    return state
