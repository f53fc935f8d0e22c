"""Choosing when a deferred job runs: the start time with the lowest expected grid intensity before its
deadline. Framework-free; the caller loads the intensities (``jobs.selectors.intensity_outlook``).

Start times considered: the submission instant itself, then every whole UTC hour after it up to the latest
start (the deadline minus ``JOBS_MIN_LEAD_S``, the time left to run the job). Each start is valued at the
intensity expected for its UTC hour; the lowest wins, and on a tie the earliest (no waiting for nothing).

Where an hour has no intensity of its own in the hourly series (it lies in the future, past the end of the
series), it is valued at the *expected profile*: the mean of the same UTC hour of day over the most recent
days the series covers (:func:`expected_profile`). A provider's forecast, when one is configured and
answers, comes first; the zone's annual factor last (then every hour is equal and the job runs at once).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import UTC, date, datetime, timedelta
from decimal import Decimal

HOUR = timedelta(hours=1)
_PROFILE_QUANTUM = Decimal("0.000001")

# Where the intensity of an hour came from, best first.
FORECAST = "forecast"
SERIES = "hourly series"
PROFILE = "expected profile"
ANNUAL = "annual factor"
UNKNOWN = "unknown"


def floor_hour(at: datetime) -> datetime:
    return at.astimezone(UTC).replace(minute=0, second=0, microsecond=0)


@dataclass(frozen=True)
class HourOutlook:
    """The intensity expected for one UTC hour, and where it came from."""

    hour: datetime
    intensity_g_per_kwh: Decimal | None  # None: no figure at all for the zone
    source: str
    note: str = ""


@dataclass(frozen=True)
class Candidate:
    start: datetime
    outlook: HourOutlook


@dataclass(frozen=True)
class Window:
    start: datetime
    outlook: HourOutlook
    candidates: tuple[Candidate, ...]
    reason: str


@dataclass(frozen=True)
class Profile:
    """Mean intensity per UTC hour of day over the days it was made from."""

    by_hour: dict[int, Decimal]
    days: tuple[date, ...]

    def describe(self) -> str:
        if not self.days:
            return "no day"
        first, last = self.days[0], self.days[-1]
        span = first.isoformat() if first == last else f"{first.isoformat()}..{last.isoformat()}"
        return f"{len(self.days)} day(s), {span}"


def candidate_starts(now: datetime, latest_start: datetime) -> list[datetime]:
    """``now``, then every whole UTC hour after it up to ``latest_start`` included."""
    now = now.astimezone(UTC)
    starts = [now]
    hour = floor_hour(now) + HOUR
    while hour <= latest_start:
        starts.append(hour)
        hour += HOUR
    return starts


def expected_profile(series: Mapping[datetime, Decimal], days: int) -> Profile:
    """Mean of each UTC hour of day over the ``days`` most recent days that ``series`` (hour -> g/kWh)
    covers, counted back from its last hour; hours of day with no value in those days are absent."""
    if not series:
        return Profile({}, ())
    last_day = max(series).astimezone(UTC).date()
    first_day = last_day - timedelta(days=days - 1)
    sums: dict[int, Decimal] = {}
    counts: dict[int, int] = {}
    used: set[date] = set()
    for hour, value in series.items():
        day = hour.astimezone(UTC).date()
        if first_day <= day <= last_day:
            h = hour.astimezone(UTC).hour
            sums[h] = sums.get(h, Decimal(0)) + value
            counts[h] = counts.get(h, 0) + 1
            used.add(day)
    by_hour = {h: (sums[h] / counts[h]).quantize(_PROFILE_QUANTUM) for h in sums}
    return Profile(by_hour, tuple(sorted(used)))


def _key(candidate: Candidate) -> tuple[int, Decimal, datetime]:
    value = candidate.outlook.intensity_g_per_kwh
    # Unknown intensities compare equal to each other and after any known one.
    return (1, Decimal(0), candidate.start) if value is None else (0, value, candidate.start)


def choose_window(
    now: datetime, latest_start: datetime, outlook: Callable[[datetime], HourOutlook]
) -> Window:
    """The start with the lowest expected intensity in [now, latest_start] (the earliest on a tie)."""
    if latest_start < now:
        raise ValueError("the latest start is before now")
    candidates = tuple(
        Candidate(start, outlook(floor_hour(start))) for start in candidate_starts(now, latest_start)
    )
    best = min(candidates, key=_key)
    first = candidates[0]
    value = best.outlook.intensity_g_per_kwh
    if value is None:
        reason = (
            f"no carbon intensity is known for the zone ({best.outlook.note or 'no factor'}): "
            "the job runs at once"
        )
    else:
        sources = sorted({c.outlook.source for c in candidates})
        considered = (
            f"{len(candidates)} start time(s) considered, from submission to the latest start "
            f"{latest_start.astimezone(UTC).isoformat()} (the deadline minus JOBS_MIN_LEAD_S); "
            f"intensities from: {', '.join(sources)}"
        )
        if best is first:
            tie = all(c.outlook.intensity_g_per_kwh == value for c in candidates)
            lead = (
                "every start considered has the same expected intensity, so the job runs at once"
                if tie
                else "no later start has a lower expected intensity, so the job runs at once"
            )
            reason = f"{lead}: {value} g CO2e/kWh ({best.outlook.source}); {considered}"
        else:
            at_submission = first.outlook.intensity_g_per_kwh
            reason = (
                f"lowest expected intensity before the deadline: {value} g CO2e/kWh in the hour "
                f"{best.outlook.hour.isoformat()} ({best.outlook.source}), against {at_submission} g CO2e/kWh "
                f"at submission; {considered}"
            )
    return Window(start=best.start, outlook=best.outlook, candidates=candidates, reason=reason)
