from __future__ import annotations

from pathlib import Path
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from ledger.archive import ArchiveError, archive_manifest, verify_archive
from ledger.verify import verify_all


class Command(BaseCommand):
    help = (
        "Verify every ledger hash chain (from genesis, or from its archive checkpoint); exit 0 when intact, "
        "otherwise name the first broken link. --archive PATH verifies an archive file instead."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument(
            "--workers",
            type=int,
            default=None,
            help="processes to verify in (default LEDGER_VERIFY_WORKERS); chains and segments of one chain "
            "are checked side by side",
        )
        parser.add_argument(
            "--archive",
            metavar="PATH",
            help="verify an archive file (its .jsonl.gz or its .manifest.json) offline: its sha256, every link "
            "inside it, and its links to the archives and records around it",
        )

    def handle(self, *args: Any, **opts: Any) -> None:
        if opts["archive"]:
            self._archive(Path(opts["archive"]))
            return
        if opts["workers"] is not None and opts["workers"] < 1:
            raise CommandError("--workers must be 1 or more")
        reports = verify_all(workers=opts["workers"])
        broken = [r for r in reports if r.broken is not None]
        for r in reports:
            state = "BROKEN" if r.broken is not None else "intact"
            start = f" from the archive checkpoint at seq {r.from_seq}" if r.from_seq else ""
            self.stdout.write(
                f"chain {r.chain_id}: {r.records} records{start}, head seq {r.head_seq}: {state}"
            )
        if broken:
            raise CommandError("\n".join(str(r.broken) for r in broken))
        self.stdout.write(
            f"ledger intact: {len(reports)} chain(s), {sum(r.records for r in reports)} records"
        )

    def _archive(self, path: Path) -> None:
        try:
            problems = verify_archive(path)
        except ArchiveError as exc:
            raise CommandError(str(exc)) from None
        if problems:
            raise CommandError(f"archive {path.name} does not verify:\n" + "\n".join(problems))
        manifest = archive_manifest(path)
        self.stdout.write(
            f"archive {path.name}: seq {manifest['from_seq'] + 1}..{manifest['to_seq']} of chain "
            f"{manifest['chain']}, {manifest['records']} records: intact"
        )
