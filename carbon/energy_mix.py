"""The generation mix of a grid zone by source: the shares of fossil, nuclear and renewable electricity in what
the zone generates (a location-based mix), for ESRS E1-5's split of energy consumption by source.

Reads the layout of the public figures shipped in ``carbon/data/grid-intensity/owid_electricity_mix_*.csv``
(Ember; Energy Institute; processed by Our World in Data, CC BY 4.0: whoever prints a share prints that
attribution): ``zone, zone_name, year, fossil_twh, nuclear_twh, renewables_twh, total_twh, fossil_share,
nuclear_share, renewable_share, source, license, url, published``. Framework-free: text in, rows out.
"""

from __future__ import annotations

import csv
import io
from dataclasses import dataclass
from decimal import ROUND_HALF_EVEN, Context, Decimal, InvalidOperation
from typing import Final

__all__ = ["GenerationMix", "MixChoice", "choose_mix", "parse_mix_csv"]

_DIV: Final = Context(prec=50, rounding=ROUND_HALF_EVEN)
_COLUMNS: Final = (
    "zone",
    "zone_name",
    "year",
    "fossil_share",
    "nuclear_share",
    "renewable_share",
    "source",
    "license",
    "url",
    "published",
)


@dataclass(frozen=True)
class GenerationMix:
    """A zone's published shares of generation by source, as published (they add up to 1 within rounding)."""

    zone: str
    zone_name: str
    year: int
    fossil_share: Decimal
    nuclear_share: Decimal
    renewable_share: Decimal
    source: str
    licence: str
    url: str
    published: str

    def fractions(self) -> tuple[Decimal, Decimal, Decimal]:
        """(fossil, nuclear, renewable) scaled to add up to exactly 1: the published shares are rounded, and
        an energy split by them must add back to the energy. Fossil and nuclear are divided by the shares'
        sum (50 digits); renewable is the remainder."""
        total = self.fossil_share + self.nuclear_share + self.renewable_share
        fossil = _DIV.divide(self.fossil_share, total)
        nuclear = _DIV.divide(self.nuclear_share, total)
        return fossil, nuclear, 1 - fossil - nuclear


@dataclass(frozen=True)
class MixChoice:
    """The mix used for a zone (None: the file has none) and how it was found."""

    zone: str
    mix: GenerationMix | None
    note: str


def parse_mix_csv(text: str) -> dict[str, GenerationMix]:
    """The mixes of the file by zone; a malformed file (a column missing, a share that is not a number in
    [0, 1], a zone twice, shares that do not add up to 1 within 0.001) raises ``ValueError`` naming the line."""
    reader = csv.DictReader(io.StringIO(text.lstrip("\ufeff"), newline=""))
    missing = [c for c in _COLUMNS if c not in (reader.fieldnames or ())]
    if missing:
        raise ValueError(f"generation-mix file: missing column(s) {', '.join(missing)}")
    mixes: dict[str, GenerationMix] = {}
    for line, row in enumerate(reader, start=2):
        try:
            shares = [Decimal(row[f"{k}_share"]) for k in ("fossil", "nuclear", "renewable")]
            year = int(row["year"])
        except (InvalidOperation, ValueError, TypeError):
            raise ValueError(
                f"generation-mix file, line {line}: a share or the year is not a number"
            ) from None
        total = shares[0] + shares[1] + shares[2]
        if any(not (s.is_finite() and 0 <= s <= 1) for s in shares) or abs(total - 1) > Decimal("0.001"):
            raise ValueError(f"generation-mix file, line {line}: shares must lie in [0, 1] and add up to 1")
        zone = row["zone"].strip()
        if zone in mixes:
            raise ValueError(f"generation-mix file, line {line}: zone {zone} twice")
        mixes[zone] = GenerationMix(
            zone=zone,
            zone_name=row["zone_name"],
            year=year,
            fossil_share=shares[0],
            nuclear_share=shares[1],
            renewable_share=shares[2],
            source=row["source"],
            licence=row["license"],
            url=row["url"],
            published=row["published"],
        )
    return mixes


def choose_mix(zone: str, mixes: dict[str, GenerationMix]) -> MixChoice:
    """The zone's own mix; for a sub-national zone (``US-VA``) without one, its country's (``US``), noted;
    else none, noted."""
    own = mixes.get(zone)
    if own is not None:
        return MixChoice(zone, own, "")
    country = zone.split("-", 1)[0]
    if country != zone and country in mixes:
        return MixChoice(
            zone,
            mixes[country],
            f"no generation mix for {zone}: the mix of {country} ({mixes[country].year}) was used",
        )
    return MixChoice(zone, None, f"no generation mix for {zone}")
