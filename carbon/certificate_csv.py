"""Parse a CSV of granular (time-stamped) energy attribute certificates into validated rows, all or nothing.

Granular certificate schemes (the EnergyTag GC Scheme Standard, Energy Track & Trace) issue one certificate per
production interval of at most one hour, with a unique id and a volume in whole Wh. A registry's export of the
certificates cancelled for one instrument becomes this layout (columns found by name, in any order; a UTF-8
BOM, spaces and letter case of the header names do not matter; unknown columns are ignored)::

    certificate_id,production_start,production_end,energy_wh[,energy_source]

``production_start`` and ``production_end`` are ISO 8601 instants with a time zone; the interval must be at
most an hour long and lie inside one UTC hour (the hour its volume is matched in). ``energy_wh`` is a whole
number of Wh >= 0. ``energy_source`` (optional) is the scheme's source label (``solar``, ``wind``...).

Every value that reaches a column is checked here, at the edge, against the limits table
(:mod:`inference.limits`); the size of the file and its number of rows are checked before anything is parsed,
and a rejected file lists its first problems (line and reason) and counts the rest.

Framework-free, like :mod:`carbon.intensity_csv` (which it shares the error types with).
"""

from __future__ import annotations

import csv
import io
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any, Final

from carbon.co2e import FIRST_YEAR, LAST_YEAR
from carbon.intensity_csv import MAX_ERRORS_KEPT, IntensityImportError, RowError
from inference.limits import CERTIFICATE_ID_MAX_LENGTH, ENERGY_SOURCE_MAX_LENGTH

__all__ = [
    "MAX_BYTES",
    "MAX_ENERGY_WH",
    "MAX_ROWS",
    "REQUIRED_COLUMNS",
    "CertificateRow",
    "parse_certificates",
]

#: A year of hourly certificates of a few dozen production devices; a larger file is refused unread.
MAX_BYTES: Final = 32 * 1024 * 1024
MAX_ROWS: Final = 400_000
#: One certificate's volume: 1 TWh, far above any device's hour and far below what a column or a sum holds.
MAX_ENERGY_WH: Final = 10**12
REQUIRED_COLUMNS: Final = ("certificate_id", "production_start", "production_end", "energy_wh")
_OPTIONAL: Final = ("energy_source",)
_HOUR: Final = timedelta(hours=1)
_SHOWN: Final = 60  # characters of a bad value quoted back


@dataclass(frozen=True, slots=True)
class CertificateRow:
    line: int
    certificate_id: str
    production_start: datetime
    production_end: datetime
    hour: datetime  # the UTC hour the interval lies in
    energy_wh: int
    energy_source: str


def _show(text: str) -> str:
    return repr(text if len(text) <= _SHOWN else text[:_SHOWN] + "...")


class _Problems:
    def __init__(self) -> None:
        self.kept: list[RowError] = []
        self.count = 0
        self.lines: set[int] = set()

    def add(self, line: int, reason: str) -> None:
        self.count += 1
        self.lines.add(line)
        if len(self.kept) < MAX_ERRORS_KEPT:
            self.kept.append(RowError(line, reason))

    def rejected(self) -> IntensityImportError:
        return IntensityImportError(self.kept, self.count, len(self.lines))


def _rejected(line: int, reason: str) -> IntensityImportError:
    return IntensityImportError([RowError(line, reason)])


def parse_certificates(data: bytes) -> list[CertificateRow]:
    """Every certificate of the file, or :class:`carbon.intensity_csv.IntensityImportError` listing its
    problems (1-based physical lines, the header is line 1). Sizes first: a file over :data:`MAX_BYTES` is
    refused before it is decoded, one over :data:`MAX_ROWS` rows before its rows are checked."""
    if len(data) > MAX_BYTES:
        raise _rejected(
            1, f"the file is {len(data)} bytes; at most {MAX_BYTES} bytes are accepted per import"
        )
    try:
        text = data.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        line = data.count(b"\n", 0, exc.start) + 1
        raise _rejected(line, "the file is not UTF-8 text; save it as CSV UTF-8") from None
    lines = text.count("\n") + (not text.endswith("\n"))
    if lines > MAX_ROWS + 1:
        raise _rejected(MAX_ROWS + 2, f"more than {MAX_ROWS} certificates; split the file")
    if "\x00" in text:
        raise _rejected(
            text.count("\n", 0, text.index("\x00")) + 1, "the file holds a NUL character (U+0000)"
        )
    reader = csv.reader(io.StringIO(text, newline=""))
    try:
        header = next(reader)
    except StopIteration:
        raise _rejected(1, "the file is empty: a header row is required") from None
    except csv.Error as exc:
        raise _rejected(1, f"the header is not valid CSV ({exc})") from None
    columns = {name.strip().lower(): index for index, name in enumerate(header)}
    missing = [c for c in REQUIRED_COLUMNS if c not in columns]
    if missing:
        raise _rejected(
            1,
            f"missing column(s) {', '.join(missing)}; the header must name {', '.join(REQUIRED_COLUMNS)}"
            f" (and may name {', '.join(_OPTIONAL)})",
        )
    problems = _Problems()
    rows: list[CertificateRow] = []
    seen: dict[str, int] = {}
    for line, cells in _records(reader, problems):
        row = _row(line, cells, columns, problems)
        if row is None:
            continue
        earlier = seen.get(row.certificate_id)
        if earlier is not None:
            problems.add(line, f"certificate_id {_show(row.certificate_id)} already on line {earlier}")
            continue
        seen[row.certificate_id] = line
        rows.append(row)
    if problems.count:
        raise problems.rejected()
    return rows


def _records(reader: Any, problems: _Problems) -> Iterator[tuple[int, list[str]]]:
    """(line the record starts on, cells) for each non-empty record of a ``csv.reader``; a record that is
    not valid CSV ends the file (the reader cannot resync) with its problem recorded."""
    while True:
        start = int(reader.line_num) + 1
        try:
            cells: list[str] = next(reader)
        except StopIteration:
            return
        except csv.Error as exc:
            problems.add(start, f"not valid CSV ({exc})")
            return
        if any(cell.strip() for cell in cells):
            yield start, cells


def _cell(cells: list[str], columns: dict[str, int], name: str) -> str:
    index = columns.get(name)
    return cells[index].strip() if index is not None and index < len(cells) else ""


def _row(line: int, cells: list[str], columns: dict[str, int], problems: _Problems) -> CertificateRow | None:
    before = problems.count
    certificate_id = _cell(cells, columns, "certificate_id")
    if not certificate_id:
        problems.add(line, "certificate_id is empty")
    elif len(certificate_id) > CERTIFICATE_ID_MAX_LENGTH:
        problems.add(
            line, f"certificate_id is {len(certificate_id)} characters; at most {CERTIFICATE_ID_MAX_LENGTH}"
        )
    elif not certificate_id.isprintable():
        problems.add(line, f"certificate_id {_show(certificate_id)} holds a control character")
    start = _instant(line, _cell(cells, columns, "production_start"), "production_start", problems)
    end = _instant(line, _cell(cells, columns, "production_end"), "production_end", problems)
    energy = _energy(line, _cell(cells, columns, "energy_wh"), problems)
    source = _cell(cells, columns, "energy_source")
    if len(source) > ENERGY_SOURCE_MAX_LENGTH:
        problems.add(line, f"energy_source is {len(source)} characters; at most {ENERGY_SOURCE_MAX_LENGTH}")
    elif not source.isprintable():
        problems.add(line, f"energy_source {_show(source)} holds a control character")
    hour = None
    if start is not None and end is not None:
        hour = start.replace(minute=0, second=0, microsecond=0)
        if end <= start:
            problems.add(line, "production_end is not after production_start")
        elif end - start > _HOUR:
            problems.add(line, "the production interval is longer than one hour")
        elif end > hour + _HOUR:
            problems.add(
                line,
                f"the production interval crosses the hour {(hour + _HOUR).isoformat()}: a certificate is"
                " matched in one UTC hour",
            )
    if problems.count > before or start is None or end is None or hour is None or energy is None:
        return None
    return CertificateRow(line, certificate_id, start, end, hour, energy, source)


def _instant(line: int, text: str, column: str, problems: _Problems) -> datetime | None:
    if not text:
        problems.add(line, f"{column} is empty")
        return None
    try:
        value = datetime.fromisoformat(text)
    except ValueError:
        problems.add(line, f"bad date {_show(text)} in {column}: not an ISO 8601 date and time")
        return None
    if len(text) <= 10:
        problems.add(line, f"bad date {_show(text)} in {column}: no time of day")
        return None
    if value.tzinfo is None or value.utcoffset() is None:
        problems.add(line, f"bad date {_show(text)} in {column}: no time zone; write Z or the offset")
        return None
    try:
        value = value.astimezone(UTC)
    except OverflowError:  # an offset that moves year 1 or 9999 past datetime's range
        problems.add(line, f"bad date {_show(text)} in {column}: year outside {FIRST_YEAR}-{LAST_YEAR}")
        return None
    if not FIRST_YEAR <= value.year <= LAST_YEAR:
        problems.add(line, f"bad date {_show(text)} in {column}: year outside {FIRST_YEAR}-{LAST_YEAR}")
        return None
    return value


def _energy(line: int, text: str, problems: _Problems) -> int | None:
    # Digits only: no sign, no exponent, no fraction (certificates carry whole Wh, rounded down at issue).
    if not text.isascii() or not text.isdigit():
        problems.add(line, f"energy_wh {_show(text)} is not a whole number of Wh >= 0")
        return None
    if len(text) > 13 or int(text) > MAX_ENERGY_WH:
        problems.add(line, f"energy_wh {_show(text)} is above {MAX_ENERGY_WH} Wh for one certificate")
        return None
    return int(text)
