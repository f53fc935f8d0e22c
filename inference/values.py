"""Small value parsers shared by the cores and the settings (no heavy imports here)."""

from __future__ import annotations


def parse_bool(raw: str) -> bool | None:
    """true/false, yes/no, on/off, 1/0 (any case); None for anything else."""
    value = raw.strip().lower()
    if value in {"1", "true", "yes", "on"}:
        return True
    if value in {"0", "false", "no", "off"}:
        return False
    return None
