from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

from django.conf import settings
from django.core.management.base import BaseCommand, CommandError, CommandParser

DEMO_REPOSITORY = Path(__file__).resolve().parents[3] / "inference" / "demo_repository"


class Command(BaseCommand):
    help = (
        "Copy the demo models (digits, digits_int8, linear) into MODEL_REPOSITORY; existing models are kept."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--target", default="", help="defaults to MODEL_REPOSITORY")
        parser.add_argument("--force", action="store_true", help="replace demo models already there")

    def handle(self, *args: Any, **opts: Any) -> None:
        target = Path(opts["target"] or settings.MODEL_REPOSITORY)
        try:
            self._install(target, force=opts["force"])
        except OSError as exc:
            raise CommandError(
                f"cannot install the demo models into {target}: {exc.strerror or exc}"
            ) from None

    def _install(self, target: Path, *, force: bool) -> None:
        target.mkdir(parents=True, exist_ok=True)
        for model_dir in sorted(DEMO_REPOSITORY.iterdir()):
            if not (model_dir / "config.pbtxt").is_file():
                continue
            dest = target / model_dir.name
            if dest.exists():
                if not force:
                    self.stdout.write(f"kept {dest}")
                    continue
                shutil.rmtree(dest)
            shutil.copytree(model_dir, dest, ignore=shutil.ignore_patterns("__pycache__"))
            self.stdout.write(f"installed {dest}")
