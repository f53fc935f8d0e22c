"""Parse CSV files of grid carbon-intensity figures into validated rows, all or nothing.

The layout is recognised from the header row (a UTF-8 BOM, surrounding spaces and letter case of the
header names do not matter; columns are found by name, so their order does not matter either):

``plain``
    ``zone,datetime,g_co2e_per_kwh`` with an optional fourth column ``basis`` (``direct`` or
    ``lifecycle``; an empty cell or a missing column means ``default_basis``). ``datetime`` is an ISO
    8601 instant with a timezone (``2024-03-01T13:00:00Z``, ``2024-03-01T14:00:00+01:00``) on a whole
    UTC hour; the row is the factor for the hour [t, t+1h).

``electricitymaps``
    The hourly CSV of the Electricity Maps data portal: ``Datetime (UTC)``, ``Country``, ``Zone Name``,
    ``Zone Id``, ``Carbon Intensity gCO₂eq/kWh (direct)``, ``Carbon Intensity gCO₂eq/kWh (LCA)``, ...,
    ``Data Source``, ``Data Estimated``, ``Data Estimation Method``. Older files spell ``gCO2eq``, newer
    ones write ``(Life cycle)`` instead of ``(LCA)`` and ``Zone id`` / ``Data source``; all are
    accepted. A naive datetime (``2023-01-01 00:00:00``) is UTC. Each row gives up to two factors for
    its zone and hour: basis ``direct`` from the direct column and ``lifecycle`` from the LCA column
    (an empty cell means that basis is absent). Only hourly exports are meant: the portal's daily,
    monthly and yearly exports have the same columns and cannot be told apart from the header.

``annual``
    ``zone,zone_name,year,gco2e_per_kwh,basis,gases,mix,source,license,url,published``, the layout of
    the public figures shipped in ``shared/data/grid-intensity``. Each row is the factor for the UTC
    calendar year [year-01-01, year+1-01-01). ``mix`` is checked for presence only and not kept.

:func:`parse_intensity_csv` either returns every row of the file or raises
:class:`IntensityImportError` listing every problem found, each with the 1-based physical line number
in the file (the header is line 1), so that a user can fix the whole file in one go.

The module imports nothing from Django so that it can be used, and tested, without settings or a
database.
"""

from __future__ import annotations

import csv
import io
from collections.abc import Callable, Collection, Iterable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from decimal import Decimal, InvalidOperation
from typing import Literal

__all__ = [
    "DEFAULT_MAX_G_PER_KWH",
    "DEFAULT_YEARS",
    "ELECTRICITYMAPS_LICENCE",
    "ELECTRICITYMAPS_SOURCE",
    "ELECTRICITYMAPS_URL",
    "MAX_ERRORS_KEPT",
    "PLAIN_SOURCE",
    "Basis",
    "Granularity",
    "IntensityImportError",
    "IntensityRow",
    "Layout",
    "ParsedFile",
    "RowError",
    "parse_intensity_bytes",
    "parse_intensity_csv",
]

Basis = Literal["direct", "lifecycle"]
Granularity = Literal["hour", "year"]
Layout = Literal["plain", "electricitymaps", "annual"]

DEFAULT_MAX_G_PER_KWH = Decimal("2000")
PLAIN_SOURCE = "user import"
ELECTRICITYMAPS_SOURCE = "Electricity Maps"
# The data portal publishes its hourly files under the Open Database License; a caller with other terms
# (a commercial API export) passes its own licence.
ELECTRICITYMAPS_LICENCE = "ODbL 1.0 (Electricity Maps data portal, https://www.electricitymaps.com)"
ELECTRICITYMAPS_URL = "https://www.electricitymaps.com"
DEFAULT_GASES = "CO2e"

_BASES: dict[str, Basis] = {"direct": "direct", "lifecycle": "lifecycle"}
_FLAGS: dict[str, bool] = {"true": True, "false": False, "1": True, "0": False, "yes": True, "no": False}
_ONE_HOUR = timedelta(hours=1)
# The years a factor may fall in, by default those every stored date keeps to (carbon.co2e.FIRST_YEAR and
# LAST_YEAR, which the services pass; this module imports only the standard library): outside them a date is
# a typo (2204, 0202) rather than data, and year + 1 and t + 1h stay away from datetime's limits.
DEFAULT_YEARS = (1970, 2100)
_SHOWN_ERRORS = 5
# How many problems a rejected file reports (with the count of all of them).
MAX_ERRORS_KEPT = 100
_SHOWN_CHARS = 60

_PLAIN_COLUMNS = ("zone", "datetime", "g_co2e_per_kwh")
_PLAIN_OPTIONAL = "basis"
_ANNUAL_COLUMNS = (
    "zone",
    "zone_name",
    "year",
    "gco2e_per_kwh",
    "basis",
    "gases",
    "mix",
    "source",
    "license",
    "url",
    "published",
)
# Electricity Maps header names, normalised by _em_key, mapped to the role the parser gives them. The
# portal has renamed columns between releases; every spelling seen in its files is listed.
_EM_ROLES: dict[str, str] = {
    "datetime (utc)": "datetime",
    "zone id": "zone",
    "zone name": "zone_name",
    "carbon intensity gco2eq/kwh (direct)": "direct",
    "carbon intensity gco2eq/kwh (lca)": "lifecycle",
    "carbon intensity gco2eq/kwh (life cycle)": "lifecycle",
    "carbon intensity gco2eq/kwh (lifecycle)": "lifecycle",
    "carbon intensity gco2eq/kwh (life cycle assessment)": "lifecycle",
    "data source": "source",
    "data estimated": "estimated",
}

_EXPECTED_LAYOUTS = (
    "expected one of these layouts: "
    "plain 'zone,datetime,g_co2e_per_kwh' (optionally ',basis'); "
    "electricitymaps, the hourly Electricity Maps export 'Datetime (UTC),Country,Zone Name,Zone Id,"
    "Carbon Intensity gCO₂eq/kWh (direct),Carbon Intensity gCO₂eq/kWh (LCA),...'; "
    "annual '" + ",".join(_ANNUAL_COLUMNS) + "'"
)


@dataclass(frozen=True, slots=True, kw_only=True)
class IntensityRow:
    """One carbon-intensity factor: ``intensity_g_per_kwh`` for ``zone`` over [period_start, period_end).

    ``period_start`` and ``period_end`` are UTC-aware. ``line`` is the line of the file the factor came
    from; an Electricity Maps row gives two factors (direct and lifecycle) with the same line.
    ``published`` is the publication date or year as the file writes it (annual layout only).
    """

    line: int
    zone: str
    period_start: datetime
    period_end: datetime
    granularity: Granularity
    intensity_g_per_kwh: Decimal
    basis: Basis
    gases: str = DEFAULT_GASES
    zone_name: str = ""
    source: str
    licence: str
    url: str
    published: str
    estimated: bool = False


@dataclass(frozen=True, slots=True)
class RowError:
    """Why the row starting at ``line`` (1-based, header = 1) was rejected."""

    line: int
    reason: str

    def __str__(self) -> str:
        return f"line {self.line}: {self.reason}"


@dataclass(frozen=True, slots=True)
class ParsedFile:
    layout: Layout
    rows: tuple[IntensityRow, ...]


class IntensityImportError(Exception):
    """The file was rejected as a whole. ``errors`` lists its first ``MAX_ERRORS_KEPT`` problems in line
    order; ``count`` is how many it has in all, on ``lines`` lines (a file of a million bad rows must not
    become a million messages held, stored and sent back)."""

    def __init__(
        self, errors: Iterable[RowError], count: int | None = None, lines: int | None = None
    ) -> None:
        kept = sorted(errors, key=lambda e: e.line)
        self.errors: tuple[RowError, ...] = tuple(kept[:MAX_ERRORS_KEPT])
        self.count = len(kept) if count is None else count
        self.lines = len({e.line for e in kept}) if lines is None else lines
        super().__init__(self._summary())

    def _summary(self) -> str:
        count, lines = self.count, self.lines
        head = (
            f"intensity CSV rejected, nothing imported: {count} problem{'' if count == 1 else 's'}"
            f" on {lines} line{'' if lines == 1 else 's'}"
        )
        shown = "; ".join(str(e) for e in self.errors[:_SHOWN_ERRORS])
        more = f"; and {count - _SHOWN_ERRORS} more" if count > _SHOWN_ERRORS else ""
        return f"{head}: {shown}{more}"

    def __str__(self) -> str:
        return self._summary()

    # The default pickling would call __init__ with the summary string; Celery and multiprocessing
    # pickle exceptions, so rebuild from the errors instead.
    def __reduce__(
        self,
    ) -> tuple[type[IntensityImportError], tuple[tuple[RowError, ...], int, int]]:
        return (type(self), (self.errors, self.count, self.lines))


class _Errors:
    """The problems of a file as the parser finds them (in line order): the first ``MAX_ERRORS_KEPT`` kept,
    all of them counted. ``len()`` is the count, so a builder still sees whether its row added one."""

    __slots__ = ("count", "kept", "last_line", "lines")

    def __init__(self) -> None:
        self.kept: list[RowError] = []
        self.count = 0
        self.lines = 0
        self.last_line = -1

    def append(self, error: RowError) -> None:
        self.count += 1
        if error.line != self.last_line:
            self.lines += 1
            self.last_line = error.line
        if len(self.kept) < MAX_ERRORS_KEPT:
            self.kept.append(error)

    def extend(self, errors: Iterable[RowError]) -> None:
        for error in errors:
            self.append(error)

    def __len__(self) -> int:
        return self.count

    def rejected(self) -> IntensityImportError:
        return IntensityImportError(self.kept, self.count, self.lines)


def parse_intensity_csv(
    text: str,
    *,
    known_zones: Collection[str] | None = None,
    default_basis: Basis = "lifecycle",
    source: str | None = None,
    licence: str | None = None,
    url: str | None = None,
    max_g_per_kwh: Decimal = DEFAULT_MAX_G_PER_KWH,
    years: tuple[int, int] = DEFAULT_YEARS,
) -> ParsedFile:
    """Parse a whole CSV file; return every row, or raise :class:`IntensityImportError`.

    ``known_zones``: when given, a zone not in it (compared case-sensitively, after stripping spaces)
    rejects its row. ``default_basis`` applies to the plain layout only. ``source``, ``licence`` and
    ``url`` say where a plain or Electricity Maps file comes from (defaults: ``PLAIN_SOURCE`` and empty
    strings for plain; ``ELECTRICITYMAPS_SOURCE``/``_LICENCE``/``_URL`` for Electricity Maps, whose
    ``Data Source`` cell is appended to the source in brackets). Annual files carry their own source,
    licence and url per row; the parameters only fill cells left empty there. A value above
    ``max_g_per_kwh`` is rejected as implausible, and so is a date outside ``years`` (first and last).

    Raises ``ValueError`` (not :class:`IntensityImportError`) for a ``default_basis`` that is neither
    ``direct`` nor ``lifecycle``, since that is a mistake of the caller, not of the file.
    """
    if default_basis not in _BASES:
        raise ValueError(f"default_basis must be 'direct' or 'lifecycle', not {default_basis!r}")
    given = [
        problem
        for name, value in (("licence", licence), ("url", url))
        if value and (problem := _text_problem(name, value.strip()))
    ]
    if given:
        raise IntensityImportError([RowError(0, problem) for problem in given])
    checker = _Checker(known_zones, max_g_per_kwh, years)
    errors = checker.errors
    rows: list[IntensityRow] = []
    # (zone, basis, period_start, period_end) -> line of its first occurrence
    seen: dict[tuple[str, str, datetime, datetime], int] = {}
    layout: Layout | None = None
    build: _Builder | None = None
    width = 0
    header_line = 0
    data_rows = 0
    blank_lines: list[int] = []

    reader = csv.reader(io.StringIO(text.removeprefix("\ufeff"), newline=""))
    next_line = 1
    while True:
        try:
            cells = next(reader)
        except StopIteration:
            break
        except csv.Error as exc:
            errors.append(RowError(next_line, f"unreadable CSV from here on: {exc}"))
            break
        # csv.reader reads quoted fields across newlines, so a record can span several physical
        # lines; report the line it starts on.
        line = next_line
        next_line = reader.line_num + 1

        # Whitespace-only lines and rows of empty cells (",,,", as spreadsheets export) are blank.
        if not "".join(cells).strip():
            if build is not None:
                blank_lines.append(line)
            continue
        if build is None:
            header_line = line
            detected = _detect_layout(cells, checker, default_basis, source, licence, url)
            if detected is None:
                shown = ",".join(c.strip() for c in cells)
                raise IntensityImportError(
                    [RowError(line, f"unrecognised header {_show(shown, 300)}; {_EXPECTED_LAYOUTS}")]
                )
            layout, build = detected
            width = len(cells)
            continue
        # Trailing blank lines are harmless, but a blank line between data rows often means two files
        # were pasted together; make the user look.
        for blank in blank_lines:
            errors.append(RowError(blank, "blank line between data rows"))
        blank_lines.clear()
        data_rows += 1
        if len(cells) != width:
            errors.append(
                RowError(line, f"wrong number of columns: {len(cells)} instead of {width} as in the header")
            )
            continue
        for row in build(cells, line):
            problems = [
                problem for name in TEXT_LIMITS if (problem := _text_problem(name, getattr(row, name)))
            ]
            if problems:
                errors.extend(RowError(line, problem) for problem in problems)
                continue
            key = (row.zone, row.basis, row.period_start, row.period_end)
            first = seen.setdefault(key, line)
            if first != line:
                errors.append(
                    RowError(
                        line,
                        f"duplicate: zone {row.zone!r}, {row.basis} basis, {_period(row)} already given on line {first}",
                    )
                )
            else:
                rows.append(row)

    if layout is None:
        errors.append(RowError(1, "the file is empty; expected a header row and data rows"))
        raise errors.rejected()
    if data_rows == 0:
        errors.append(RowError(header_line + 1, "the file has a header but no data rows"))
    if errors:
        raise errors.rejected()
    return ParsedFile(layout=layout, rows=tuple(rows))


def parse_intensity_bytes(
    data: bytes,
    *,
    known_zones: Collection[str] | None = None,
    default_basis: Basis = "lifecycle",
    source: str | None = None,
    licence: str | None = None,
    url: str | None = None,
    max_g_per_kwh: Decimal = DEFAULT_MAX_G_PER_KWH,
    years: tuple[int, int] = DEFAULT_YEARS,
) -> ParsedFile:
    """Decode ``data`` as UTF-8 (a BOM is allowed) and parse it as :func:`parse_intensity_csv` does.

    A file that is not UTF-8 is rejected with an :class:`IntensityImportError` naming the line of the
    first bad byte.
    """
    try:
        text = data.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        line = data.count(b"\n", 0, exc.start) + 1
        if data.startswith((b"\xff\xfe", b"\xfe\xff")):
            reason = "the file is UTF-16 text; save it as CSV UTF-8"
        else:
            reason = (
                f"the file is not UTF-8 text (byte 0x{data[exc.start]:02x} cannot be decoded);"
                " save it as CSV UTF-8"
            )
        raise IntensityImportError([RowError(line, reason)]) from None
    return parse_intensity_csv(
        text,
        known_zones=known_zones,
        default_basis=default_basis,
        source=source,
        licence=licence,
        url=url,
        max_g_per_kwh=max_g_per_kwh,
        years=years,
    )


# A builder turns the cells of one data row into its factors (none when the row has a problem, which
# it records in the checker's error list).
_Builder = Callable[[list[str], int], tuple[IntensityRow, ...]]


# The longest text each stored field takes (the factor table's columns): longer is refused by name.
TEXT_LIMITS = {"zone": 32, "zone_name": 200, "gases": 64, "licence": 200, "url": 500, "published": 32}


def _text_problem(name: str, value: str) -> str:
    if len(value) > TEXT_LIMITS[name]:
        return f"{name} is {len(value)} characters long; at most {TEXT_LIMITS[name]} are kept"
    if name == "url" and value and not value.lower().startswith(("https://", "http://")):
        return f"url {_show(value)} is not an http(s) address"
    return ""


def _show(value: str, limit: int = _SHOWN_CHARS) -> str:
    """Quote an offending value for a message, shortened so a huge cell cannot flood it."""
    if len(value) > limit:
        value = value[: limit - 3] + "..."
    return repr(value)


def _period(row: IntensityRow) -> str:
    if row.granularity == "year":
        return f"year {row.period_start.year}"
    return f"hour {row.period_start:%Y-%m-%dT%H:%M}Z"


def _em_key(name: str) -> str:
    return " ".join(name.replace("\u2082", "2").lower().split())


class _Checker:
    """Validates single cells; each failed check appends a RowError and returns None."""

    __slots__ = ("errors", "known_zones", "max_g", "max_year", "min_year")

    def __init__(self, known_zones: Collection[str] | None, max_g: Decimal, years: tuple[int, int]) -> None:
        self.errors = _Errors()
        self.known_zones = None if known_zones is None else frozenset(z.strip() for z in known_zones)
        self.max_g = max_g
        self.min_year, self.max_year = years

    def zone(self, line: int, text: str, column: str) -> str | None:
        zone = text.strip()
        if not zone:
            self.errors.append(RowError(line, f"{column} is empty"))
            return None
        if self.known_zones is not None and zone not in self.known_zones:
            self.errors.append(RowError(line, f"unknown zone {_show(zone)}"))
            return None
        return zone

    def intensity(self, line: int, text: str, column: str) -> Decimal | None:
        text = text.strip()
        if not text:
            self.errors.append(RowError(line, f"{column} is empty"))
            return None
        try:
            # Underscores are legal in Decimal() but never in a figure someone meant to write.
            value = Decimal(text) if "_" not in text else None
        except InvalidOperation:
            value = None
        if value is None or not value.is_finite():
            self.errors.append(RowError(line, f"{column} {_show(text)} is not a number"))
            return None
        if value < 0:
            self.errors.append(RowError(line, f"{column} {_show(text)} is negative"))
            return None
        if value > self.max_g:
            self.errors.append(
                RowError(
                    line,
                    f"{column} {_show(text)} is above {self.max_g} gCO2e/kWh, which no grid reaches;"
                    " check the unit (grams per kWh expected)",
                )
            )
            return None
        return value

    def basis(self, line: int, text: str, default: Basis | None) -> Basis | None:
        key = text.strip().lower()
        if not key and default is not None:
            return default
        basis = _BASES.get(key)
        if basis is None:
            self.errors.append(
                RowError(
                    line,
                    f"basis {_show(text.strip())} is not 'direct' or 'lifecycle'"
                    if key
                    else "basis is empty; it must be 'direct' or 'lifecycle'",
                )
            )
        return basis

    def hour(self, line: int, text: str, column: str, *, naive_is_utc: bool) -> datetime | None:
        text = text.strip()
        try:
            value = datetime.fromisoformat(text)
        except ValueError:
            self.errors.append(
                RowError(line, f"bad date {_show(text)} in {column}: not an ISO 8601 date and time")
            )
            return None
        # fromisoformat takes a bare date as midnight, but a factor row must name its hour.
        if len(text) <= 10:
            self.errors.append(RowError(line, f"bad date {_show(text)} in {column}: no time of day"))
            return None
        if value.tzinfo is None:
            if not naive_is_utc:
                self.errors.append(
                    RowError(
                        line,
                        f"bad date {_show(text)} in {column}: no timezone; write the UTC time with Z"
                        " (2024-03-01T13:00:00Z) or give the offset (2024-03-01T14:00:00+01:00)",
                    )
                )
                return None
            value = value.replace(tzinfo=UTC)
        else:
            value = value.astimezone(UTC)
        if not self.min_year <= value.year <= self.max_year:
            self.errors.append(
                RowError(
                    line, f"bad date {_show(text)} in {column}: year outside {self.min_year}-{self.max_year}"
                )
            )
            return None
        if value.minute or value.second or value.microsecond:
            self.errors.append(
                RowError(
                    line,
                    f"bad date {_show(text)} in {column}: {value:%Y-%m-%dT%H:%M:%S}Z is not on a whole UTC hour;"
                    " each row is one hour starting at minute 0",
                )
            )
            return None
        return value

    def year(self, line: int, text: str) -> int | None:
        text = text.strip()
        # isdigit() alone would let through non-ASCII digits and int() would accept "+2023" or "2_023".
        if (
            len(text) == 4
            and text.isascii()
            and text.isdigit()
            and self.min_year <= int(text) <= self.max_year
        ):
            return int(text)
        self.errors.append(
            RowError(line, f"bad year {_show(text)}: expected a year from {self.min_year} to {self.max_year}")
        )
        return None

    def flag(self, line: int, text: str, column: str) -> bool | None:
        key = text.strip().lower()
        if not key:
            return False
        flag = _FLAGS.get(key)
        if flag is None:
            self.errors.append(RowError(line, f"{column} {_show(text.strip())} is not true or false"))
        return flag


def _detect_layout(
    header: list[str],
    checker: _Checker,
    default_basis: Basis,
    source: str | None,
    licence: str | None,
    url: str | None,
) -> tuple[Layout, _Builder] | None:
    names = [h.strip() for h in header]
    lower = [n.lower() for n in names]
    if len(set(lower)) != len(lower):
        return None
    index = {name: i for i, name in enumerate(lower)}
    if set(lower) in (set(_PLAIN_COLUMNS), {*_PLAIN_COLUMNS, _PLAIN_OPTIONAL}):
        return "plain", _plain_builder(index, names, checker, default_basis, source, licence, url)
    if set(lower) == set(_ANNUAL_COLUMNS):
        return "annual", _annual_builder(index, names, checker, source, licence, url)
    roles: dict[str, int] = {}
    for i, name in enumerate(names):
        role = _EM_ROLES.get(_em_key(name))
        if role is not None:
            if role in roles:
                return None
            roles[role] = i
    if "datetime" in roles and "zone" in roles and ("direct" in roles or "lifecycle" in roles):
        return "electricitymaps", _em_builder(roles, names, checker, source, licence, url)
    return None


def _plain_builder(
    index: dict[str, int],
    names: list[str],
    checker: _Checker,
    default_basis: Basis,
    source: str | None,
    licence: str | None,
    url: str | None,
) -> _Builder:
    i_zone, i_time, i_value = (index[c] for c in _PLAIN_COLUMNS)
    i_basis = index.get(_PLAIN_OPTIONAL)
    n_zone, n_time, n_value = names[i_zone], names[i_time], names[i_value]
    row_source = PLAIN_SOURCE if source is None else source
    row_licence = licence or ""
    row_url = url or ""
    errors = checker.errors

    def build(cells: list[str], line: int) -> tuple[IntensityRow, ...]:
        before = len(errors)
        zone = checker.zone(line, cells[i_zone], n_zone)
        start = checker.hour(line, cells[i_time], n_time, naive_is_utc=False)
        value = checker.intensity(line, cells[i_value], n_value)
        basis = default_basis if i_basis is None else checker.basis(line, cells[i_basis], default_basis)
        if len(errors) > before or zone is None or start is None or value is None or basis is None:
            return ()
        return (
            IntensityRow(
                line=line,
                zone=zone,
                period_start=start,
                period_end=start + _ONE_HOUR,
                granularity="hour",
                intensity_g_per_kwh=value,
                basis=basis,
                source=row_source,
                licence=row_licence,
                url=row_url,
                published="",
            ),
        )

    return build


def _annual_builder(
    index: dict[str, int],
    names: list[str],
    checker: _Checker,
    source: str | None,
    licence: str | None,
    url: str | None,
) -> _Builder:
    i_zone, i_zone_name, i_year, i_value, i_basis, i_gases, _, i_source, i_licence, i_url, i_published = (
        index[c] for c in _ANNUAL_COLUMNS
    )
    n_zone, n_value = names[i_zone], names[i_value]
    errors = checker.errors

    def build(cells: list[str], line: int) -> tuple[IntensityRow, ...]:
        before = len(errors)
        zone = checker.zone(line, cells[i_zone], n_zone)
        year = checker.year(line, cells[i_year])
        value = checker.intensity(line, cells[i_value], n_value)
        basis = checker.basis(line, cells[i_basis], None)
        if len(errors) > before or zone is None or year is None or value is None or basis is None:
            return ()
        return (
            IntensityRow(
                line=line,
                zone=zone,
                period_start=datetime(year, 1, 1, tzinfo=UTC),
                period_end=datetime(year + 1, 1, 1, tzinfo=UTC),
                granularity="year",
                intensity_g_per_kwh=value,
                basis=basis,
                source=cells[i_source].strip() or source or "",
                licence=cells[i_licence].strip() or licence or "",
                url=cells[i_url].strip() or url or "",
                published=cells[i_published].strip(),
                gases=cells[i_gases].strip() or DEFAULT_GASES,
                zone_name=cells[i_zone_name].strip(),
            ),
        )

    return build


def _em_builder(
    roles: dict[str, int],
    names: list[str],
    checker: _Checker,
    source: str | None,
    licence: str | None,
    url: str | None,
) -> _Builder:
    i_time, i_zone = roles["datetime"], roles["zone"]
    n_time, n_zone = names[i_time], names[i_zone]
    # (basis, column index, column name) for each intensity column the file has.
    columns: list[tuple[Basis, int, str]] = [
        (basis, roles[basis], names[roles[basis]]) for basis in _BASES.values() if basis in roles
    ]
    i_zone_name = roles.get("zone_name")
    i_source = roles.get("source")
    i_estimated = roles.get("estimated")
    n_estimated = "" if i_estimated is None else names[i_estimated]
    base_source = ELECTRICITYMAPS_SOURCE if source is None else source
    row_licence = ELECTRICITYMAPS_LICENCE if licence is None else licence
    row_url = ELECTRICITYMAPS_URL if url is None else url
    both_empty = (
        "both carbon intensity columns (direct and LCA) are empty"
        if len(columns) == 2
        else f"{columns[0][2]} is empty"
    )
    errors = checker.errors

    def build(cells: list[str], line: int) -> tuple[IntensityRow, ...]:
        before = len(errors)
        start = checker.hour(line, cells[i_time], n_time, naive_is_utc=True)
        zone = checker.zone(line, cells[i_zone], n_zone)
        values: list[tuple[Basis, Decimal]] = []
        given = False
        for basis, i_value, n_value in columns:
            # An empty cell means Electricity Maps has no figure of that basis for the hour.
            if cells[i_value].strip():
                given = True
                value = checker.intensity(line, cells[i_value], n_value)
                if value is not None:
                    values.append((basis, value))
        if not given:
            errors.append(RowError(line, both_empty))
        estimated = False if i_estimated is None else checker.flag(line, cells[i_estimated], n_estimated)
        if len(errors) > before or zone is None or start is None or estimated is None:
            return ()
        data_source = "" if i_source is None else cells[i_source].strip()
        row_source = f"{base_source} ({data_source})" if data_source else base_source
        zone_name = "" if i_zone_name is None else cells[i_zone_name].strip()
        end = start + _ONE_HOUR
        return tuple(
            IntensityRow(
                line=line,
                zone=zone,
                period_start=start,
                period_end=end,
                granularity="hour",
                intensity_g_per_kwh=value,
                basis=basis,
                source=row_source,
                licence=row_licence,
                url=row_url,
                published="",
                zone_name=zone_name,
                estimated=estimated,
            )
            for basis, value in values
        )

    return build
