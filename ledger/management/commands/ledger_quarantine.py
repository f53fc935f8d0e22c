from __future__ import annotations

import getpass
import os
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from ledger.models import LedgerQuarantine
from ledger.selectors import quarantine_rows
from ledger.services import QuarantineOutcome, quarantine_dismiss, quarantine_retry
from tenancy.services import ServiceError

PREVIEW_CHARS = 160  # of a quarantined line, in the listing (--show prints it whole)


def _printable(text: str, limit: int | None = None) -> str:
    """``text`` safe for an operator's terminal: what a client sent may hold control characters (escapes)."""
    text = "".join(c if c.isprintable() else repr(c)[1:-1] for c in text)
    return text if limit is None or len(text) <= limit else text[: limit - 1] + "\u2026"


def _preview(line: bytes, limit: int | None) -> str:
    return _printable(line.decode("utf-8", "backslashreplace"), limit)


class Command(BaseCommand):
    help = (
        "List the spool lines the ledger writer quarantined (the database refused them for their data; the "
        "records around them were written). --retry writes them into their chains after a fix (a column "
        "widened, say); --dismiss gives up those that can never be written. Both are safe to run twice."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument(
            "ids", nargs="*", type=int, help="only these quarantined lines (ids from the listing)"
        )
        parser.add_argument("--all", action="store_true", help="list the retried and dismissed lines too")
        parser.add_argument("--show", action="store_true", help="print each line whole, not a preview")
        action = parser.add_mutually_exclusive_group()
        action.add_argument(
            "--retry", action="store_true", help="write the quarantined lines into the ledger"
        )
        action.add_argument("--dismiss", action="store_true", help="give up the lines named (needs --reason)")
        parser.add_argument("--reason", default="", help="why the lines are dismissed (kept in the chain)")
        parser.add_argument("--actor", default="", help="who dismisses them (default: the system user)")

    def handle(self, *args: Any, **opts: Any) -> None:
        ids: list[int] | None = opts["ids"] or None
        if opts["retry"]:
            self._report(quarantine_retry(ids), "retried")
        elif opts["dismiss"]:
            try:
                outcomes = quarantine_dismiss(
                    ids or [], reason=opts["reason"], actor=opts["actor"] or _user()
                )
            except ServiceError as exc:
                raise CommandError(str(exc)) from exc
            self._report(outcomes, "dismissed")
        else:
            self._list(ids, include_resolved=opts["all"], whole=opts["show"])

    def _list(self, ids: list[int] | None, *, include_resolved: bool, whole: bool) -> None:
        rows = list(quarantine_rows(include_resolved=include_resolved, ids=ids))
        if not rows:
            self.stdout.write("no quarantined records" if not include_resolved else "the quarantine is empty")
            return
        for row in rows:
            self.stdout.write(
                f"#{row.pk} {row.state}: {_printable(row.record_kind) or 'unreadable line'} "
                f"'{_printable(row.record_id, PREVIEW_CHARS)}' chain {row.chain.chain_id} marker seq "
                f"{row.marker_seq} spool {row.spool_position} at {row.created_at.isoformat(timespec='seconds')}"
            )
            self.stdout.write(f"    error: {_printable(_first_line(row.error))}")
            if row.attempts:
                self.stdout.write(
                    f"    retried {row.attempts} time(s) in vain: {_printable(_first_line(row.last_error))}"
                )
            if row.state != LedgerQuarantine.QUARANTINED:
                note = f": {_printable(row.note)}" if row.note else ""
                self.stdout.write(f"    {row.state} at seq {row.resolved_seq}{note}")
            self.stdout.write(f"    line: {_preview(bytes(row.line), None if whole else PREVIEW_CHARS)}")
        waiting = sum(row.state == LedgerQuarantine.QUARANTINED for row in rows)
        self.stdout.write(f"{waiting} quarantined record(s) waiting")

    def _report(self, outcomes: list[QuarantineOutcome], done: str) -> None:
        failed = [o for o in outcomes if o.state == LedgerQuarantine.QUARANTINED]
        for o in outcomes:
            if o.seq is not None:
                self.stdout.write(
                    f"#{o.quarantine_id}: {o.state} (marker seq {o.seq}){': ' + _printable(o.detail) if o.detail else ''}"
                )
            elif o.state == LedgerQuarantine.QUARANTINED:
                self.stdout.write(f"#{o.quarantine_id}: still refused: {_printable(_first_line(o.detail))}")
            else:
                self.stdout.write(f"#{o.quarantine_id}: skipped, {o.detail}")
        resolved = sum(o.seq is not None for o in outcomes)
        self.stdout.write(f"{resolved} record(s) {done}, {len(failed)} still quarantined")
        if failed:
            raise CommandError(
                f"{len(failed)} quarantined record(s) were refused again; see the errors above"
            )


def _first_line(text: str) -> str:
    return text.splitlines()[0] if text else ""


def _user() -> str:
    try:
        user = getpass.getuser()
    except (KeyError, OSError):  # a container's uid with no name
        user = f"uid {os.getuid()}"
    return f"{user} (manage.py ledger_quarantine)"
