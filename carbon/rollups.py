"""Writes: the hourly rollups, built incrementally from the raw ledger and rebuildable from it.

The ledger stays the source of truth; rollups are a cache of sums per organization, site, model, metering
method and UTC hour, with their CO2e (location- and market-based). Rules, so that a rollup total always
equals the raw total:

* A request's energy and its count go to the hour its batch started (``started_ns``), whichever intervals
  its energy parts came from: parts of one request never straddle two rollup rows.
* An idle line goes to the hour its interval started (intervals last about a second), to the operator
  organization of the device's site.
* Adjusting entries are folded in like the records they adjust (an interval's correction is booked as idle).
* Each run reads, per chain and table, the records after the last ``seq`` it read up to the chain's head,
  and moves its cursors in the same transaction as the sums: a run is exactly-once, and two runs at the same
  time serialize on a lock row.
"""

from __future__ import annotations

import logging
import time
from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from typing import Any

from django.db import connection, transaction

from carbon import co2e
from carbon.inputs import rollup_consumption
from carbon.models import HourlyRollup, RollupCursor
from carbon.selectors import MARKET_ERROR_PREFIX, PueHistory, factor_set, instruments_of, residual_mixes_of
from carbon.services import site_ensure_pue_record
from ledger.models import ChainOrganization, LedgerArchive, LedgerChain, period_of
from tenancy.models import Device, Site

log = logging.getLogger(__name__)

HOUR_NS = 3_600_000_000_000
_HOUR = timedelta(hours=1)
# Seq span per aggregation query. Large: PostgreSQL hashes the requests of the chunk's months once per query
# for the energy join, so small chunks of a big backlog would repeat that work; live updates read small spans.
_CHUNK_SEQ = 20_000_000
_STORE = Decimal("0.000000001")  # the rollup columns' precision (9 decimals of a gram)
_LOCK_TABLE = "lock"

# (organization_id, site_id, model, kind, method, measured, hour, synthetic, device_id)
Key = tuple[int | None, int | None, str, str, str, bool, datetime, bool, str]


@dataclass
class RollupRun:
    records: dict[str, int] = field(default_factory=lambda: defaultdict(int))
    rows_created: int = 0
    rows_updated: int = 0
    seconds: float = 0.0


@dataclass
class _DeviceFacts:
    site_id: int | None
    organization_id: int | None  # the site's operator
    method: str
    measured: bool
    relative_uncertainty: Decimal
    synthetic: bool


class _Devices:
    def __init__(self) -> None:
        sites = {s.pk: s for s in Site.objects.all()}
        self.facts: dict[str, _DeviceFacts] = {}
        for d in Device.objects.all():
            site = sites.get(d.site_id) if d.site_id is not None else None
            self.facts[d.device_id] = _DeviceFacts(
                site_id=d.site_id,
                organization_id=site.organization_id if site is not None else None,
                method=d.method,
                measured=d.measured,
                relative_uncertainty=Decimal(str(round(d.relative_uncertainty, 4))),
                synthetic=bool((d.info or {}).get("synthetic", False)),
            )

    def get(self, device_id: str) -> _DeviceFacts:
        facts = self.facts.get(device_id)
        if facts is None:
            return _DeviceFacts(None, None, "unknown", False, Decimal(0), False)
        return facts


def _hour(hour_index: int) -> datetime:
    return datetime.fromtimestamp(hour_index * 3600, UTC)


class _Deltas:
    def __init__(self, devices: _Devices) -> None:
        self.devices = devices
        self.sums: dict[Key, list[int]] = defaultdict(lambda: [0, 0, 0])  # requests, work units, µJ
        self.uncertainty: dict[Key, Decimal] = {}
        # (chain pk, organization id) seen -> [first, last] month (yyyymm) of the hours read
        self.chain_organizations: dict[tuple[int, int], list[int]] = {}
        self.chain_pk = 0  # the chain being read

    def _key(self, key: Key, device: _DeviceFacts) -> Key:
        self.uncertainty[key] = device.relative_uncertainty
        if key[0] is not None:
            period = period_of(key[6])
            months = self.chain_organizations.get((self.chain_pk, key[0]))
            if months is None:
                self.chain_organizations[(self.chain_pk, key[0])] = [period, period]
            elif period < months[0]:
                months[0] = period
            elif period > months[1]:
                months[1] = period
        return key

    def request_key(self, org: int | None, device_id: str, model: str, hour: int, synthetic: bool) -> Key:
        d = self.devices.get(device_id)
        key: Key = (
            org,
            d.site_id,
            model,
            "request",
            d.method,
            d.measured,
            _hour(hour),
            bool(synthetic),
            device_id,
        )
        return self._key(key, d)

    def idle_key(self, device_id: str, hour: int) -> Key:
        d = self.devices.get(device_id)
        key: Key = (
            d.organization_id,
            d.site_id,
            "",
            "idle",
            d.method,
            d.measured,
            _hour(hour),
            d.synthetic,
            device_id,
        )
        return self._key(key, d)


def _fetch(sql: str, params: Iterable[Any]) -> list[tuple[Any, ...]]:
    with connection.cursor() as cursor:
        cursor.execute(sql, list(params))
        return list(cursor.fetchall())


_SQL = {
    "ledger_request": (
        "SELECT organization_id, device_id, model, started_ns / %s, synthetic, COUNT(*), SUM(work_units) "
        "FROM ledger_request WHERE chain_id = %s AND seq > %s AND seq <= %s GROUP BY 1, 2, 3, 4, 5"
    ),
    # The energy joins read the requests of some periods only ({periods}, see _read_energy) and count the
    # shares they matched.
    "ledger_request_energy": (
        "SELECT r.organization_id, r.device_id, r.model, r.started_ns / %s, r.synthetic, SUM(e.energy_uj), "
        "COUNT(*) FROM ledger_request_energy e JOIN ledger_request r ON r.request_id = e.request_id "
        "WHERE e.chain_id = %s AND e.seq > %s AND e.seq <= %s AND {periods} GROUP BY 1, 2, 3, 4, 5"
    ),
    # A batch's row per interval, unnested into its requests' shares (two JSON arrays in step).
    "ledger_batch_energy_postgresql": (
        "SELECT r.organization_id, r.device_id, r.model, r.started_ns / %s, r.synthetic, SUM(s.uj::bigint), "
        "COUNT(*) FROM ledger_batch_energy e CROSS JOIN LATERAL ROWS FROM ("
        "jsonb_array_elements_text(e.request_ids::jsonb), jsonb_array_elements_text(e.shares_uj::jsonb)"
        ") AS s(request_id, uj) "
        'JOIN ledger_request r ON r.request_id = s.request_id COLLATE "C" '
        "WHERE e.chain_id = %s AND e.seq > %s AND e.seq <= %s AND {periods} GROUP BY 1, 2, 3, 4, 5"
    ),
    "ledger_batch_energy_sqlite": (
        # Each id's share read by its index: two json_each joined on the index would pair every id with
        # every share first (n² rows for a batch of n).
        "SELECT r.organization_id, r.device_id, r.model, r.started_ns / %s, r.synthetic, "
        "SUM(json_extract(e.shares_uj, '$[' || q.key || ']')), COUNT(*) "
        "FROM ledger_batch_energy e, json_each(e.request_ids) q "
        "JOIN ledger_request r ON r.request_id = q.value "
        "WHERE e.chain_id = %s AND e.seq > %s AND e.seq <= %s AND {periods} GROUP BY 1, 2, 3, 4, 5"
    ),
    "ledger_idle": (
        "SELECT device_id, t0_ns / %s, SUM(energy_uj) FROM ledger_idle "
        "WHERE chain_id = %s AND seq > %s AND seq <= %s GROUP BY 1, 2"
    ),
    "ledger_adjustment_request": (
        "SELECT r.organization_id, r.device_id, r.model, r.started_ns / %s, r.synthetic, SUM(a.energy_delta_uj) "
        "FROM ledger_adjustment a JOIN ledger_request r ON r.request_id = a.target_id "
        "WHERE a.target_kind = 'request' AND a.chain_id = %s AND a.seq > %s AND a.seq <= %s "
        "GROUP BY 1, 2, 3, 4, 5"
    ),
    "ledger_adjustment_idle": (
        "SELECT i.device_id, i.t0_ns / %s, SUM(a.energy_delta_uj) "
        "FROM ledger_adjustment a JOIN ledger_idle i ON i.interval_id = a.target_id "
        "WHERE a.target_kind = 'idle' AND a.chain_id = %s AND a.seq > %s AND a.seq <= %s GROUP BY 1, 2"
    ),
    "ledger_adjustment_interval": (
        "SELECT i.device_id, i.t0_ns / %s, SUM(a.energy_delta_uj) "
        "FROM ledger_adjustment a JOIN ledger_interval i ON i.interval_id = a.target_id "
        "WHERE a.target_kind = 'interval' AND a.chain_id = %s AND a.seq > %s AND a.seq <= %s GROUP BY 1, 2"
    ),
}
# A chunk's energy records: their earliest and latest periods, and how many request shares they hold.
_SPAN_SQL = {
    "ledger_request_energy": "SELECT MIN(period), MAX(period), COUNT(*) FROM ledger_request_energy",
    "ledger_batch_energy_postgresql": (
        "SELECT MIN(period), MAX(period), SUM(jsonb_array_length(request_ids::jsonb)) FROM ledger_batch_energy"
    ),
    "ledger_batch_energy_sqlite": (
        "SELECT MIN(period), MAX(period), SUM(json_array_length(request_ids)) FROM ledger_batch_energy"
    ),
}
_TABLES = (
    "ledger_request",
    "ledger_request_energy",
    "ledger_batch_energy",
    "ledger_idle",
    "ledger_adjustment",
)


def _previous_period(period: int) -> int:
    year, month = divmod(period, 100)
    return period - 1 if month > 1 else (year - 1) * 100 + 12


def _read_energy(deltas: _Deltas, name: str, chain_pk: int, after: int, upto: int) -> None:
    """Add the energy of a chunk's energy records to their requests' rollups.

    The join first reads the requests of the periods from the month before the chunk's earliest to its
    latest: a request is chained before its energy (period never decreases along a chain) and its interval
    closes within seconds, so that is where they lie, and PostgreSQL then hashes a month or two of requests
    instead of the whole request table (whose size would make each chunk's cost grow with the ledger's age).
    Exact whatever the data: a request is in the ledger once, so if the shares matched fall short of the
    shares the chunk holds, the requests of every other period are joined too.
    """
    span = _fetch(
        f"{_SPAN_SQL[name]} WHERE chain_id = %s AND seq > %s AND seq <= %s", (chain_pk, after, upto)
    )
    first_period, last_period, shares = span[0]
    if not shares:
        return
    bounds = (_previous_period(int(first_period)), int(last_period))
    matched = 0
    for periods in ("r.period BETWEEN %s AND %s", "NOT (r.period BETWEEN %s AND %s)"):
        sql = _SQL[name].format(periods=periods)
        for org, device, model, hour, synthetic, energy, count in _fetch(
            sql, (HOUR_NS, chain_pk, after, upto, *bounds)
        ):
            deltas.sums[deltas.request_key(org, device, model, hour, synthetic)][2] += int(energy or 0)
            matched += count
        if matched >= int(shares):
            return


def _read(deltas: _Deltas, table: str, chain_pk: int, after: int, upto: int) -> None:
    deltas.chain_pk = chain_pk

    def rows(name: str) -> list[tuple[Any, ...]]:
        return _fetch(_SQL[name], (HOUR_NS, chain_pk, after, upto))

    if table == "ledger_request":
        for org, device, model, hour, synthetic, count, units in rows(table):
            sums = deltas.sums[deltas.request_key(org, device, model, hour, synthetic)]
            sums[0] += count
            sums[1] += int(units or 0)
    elif table in ("ledger_request_energy", "ledger_batch_energy"):
        _read_energy(deltas, table if table == "ledger_request_energy" else f"{table}_{connection.vendor}",
                     chain_pk, after, upto)  # fmt: skip
    elif table == "ledger_idle":
        for device, hour, energy in rows(table):
            deltas.sums[deltas.idle_key(device, hour)][2] += int(energy or 0)
    else:
        for org, device, model, hour, synthetic, energy in rows("ledger_adjustment_request"):
            deltas.sums[deltas.request_key(org, device, model, hour, synthetic)][2] += int(energy or 0)
        for name in ("ledger_adjustment_idle", "ledger_adjustment_interval"):
            for device, hour, energy in rows(name):
                deltas.sums[deltas.idle_key(device, hour)][2] += int(energy or 0)


def _lock() -> None:
    RollupCursor.objects.get_or_create(table=_LOCK_TABLE, chain_id=0)
    RollupCursor.objects.select_for_update().get(table=_LOCK_TABLE, chain_id=0)


def rollups_update(*, max_records: int | None = None) -> RollupRun:
    """Fold the ledger records written since the last run into the hourly rollups, with their CO2e."""
    started = time.perf_counter()
    run = RollupRun()
    with transaction.atomic():
        _lock()
        if connection.vendor == "postgresql":
            with connection.cursor() as cursor:  # the energy join's hash table stays in memory
                cursor.execute("SET LOCAL work_mem = '256MB'")
        deltas = _Deltas(_Devices())
        cursors = {(c.table, c.chain_id): c for c in RollupCursor.objects.exclude(table=_LOCK_TABLE)}
        moved: list[RollupCursor] = []
        budget = max_records
        for chain in LedgerChain.objects.all():
            for table in _TABLES:
                cursor = cursors.get((table, chain.pk)) or RollupCursor(table=table, chain_id=chain.pk, seq=0)
                head = chain.head_seq
                if budget is not None:
                    head = min(head, cursor.seq + budget)
                after = cursor.seq
                while after < head:
                    upto = min(head, after + _CHUNK_SEQ)
                    _read(deltas, table, chain.pk, after, upto)
                    after = upto
                if after != cursor.seq:
                    run.records[table] += after - cursor.seq  # seq span read (other kinds included)
                    cursor.seq = after
                    moved.append(cursor)
        for cursor in moved:
            cursor.save()
        _chain_organizations(deltas.chain_organizations)
        touched = _merge(deltas, run)
        _carbon(touched)
        _market(touched)
    run.seconds = time.perf_counter() - started
    return run


def _chain_organizations(seen: dict[tuple[int, int], list[int]]) -> None:
    """Record which organizations have records in which chains, and widen the months they span. The months only
    widen (each update is conditional), so runs that overlap leave the widest; NULL months (unknown) stay."""
    ChainOrganization.objects.bulk_create(
        [
            ChainOrganization(chain_id=c, organization_id=o, first_period=first, last_period=last)
            for (c, o), (first, last) in sorted(seen.items())
        ],
        ignore_conflicts=True,
    )
    for (c, o), (first, last) in sorted(seen.items()):
        ChainOrganization.objects.filter(chain_id=c, organization_id=o, first_period__gt=first).update(
            first_period=first
        )
        ChainOrganization.objects.filter(chain_id=c, organization_id=o, last_period__lt=last).update(
            last_period=last
        )


def _merge(deltas: _Deltas, run: RollupRun) -> list[HourlyRollup]:
    if not deltas.sums:
        return []
    hours = sorted({key[6] for key in deltas.sums})
    existing: dict[Key, HourlyRollup] = {}
    for i in range(0, len(hours), 500):
        for row in HourlyRollup.objects.filter(hour__in=hours[i : i + 500]):
            existing[_key_of(row)] = row
    new: list[HourlyRollup] = []
    changed: list[HourlyRollup] = []
    for key, (requests, units, energy) in deltas.sums.items():
        row = existing.get(key)
        if row is None:
            org, site, model, kind, method, measured, hour, synthetic, device_id = key
            row = HourlyRollup(
                organization_id=org,
                site_id=site,
                device_id=device_id,
                model=model,
                kind=kind,
                method=method,
                measured=measured,
                hour=hour,
                synthetic=synthetic,
                meter_relative_uncertainty=deltas.uncertainty.get(key, Decimal(0)),
            )
            new.append(row)
        else:
            changed.append(row)
        row.requests += requests
        row.work_units += units
        row.energy_uj += energy
    HourlyRollup.objects.bulk_create(new, batch_size=1000)
    _save_columns(changed, ["requests", "work_units", "energy_uj"])
    run.rows_created, run.rows_updated = len(new), len(changed)
    return new + changed


def _save_columns(rows: list[HourlyRollup], names: list[str]) -> None:
    """Write some columns of many rows: one prepared UPDATE run for every row (Django's bulk_update builds
    a CASE expression per row and column, which cost seconds for a few thousand rows)."""
    if not rows:
        return
    fields = [HourlyRollup._meta.get_field(name) for name in names]
    columns = ", ".join(f"{connection.ops.quote_name(f.column)} = %s" for f in fields)  # type: ignore[union-attr]
    sql = f"UPDATE {HourlyRollup._meta.db_table} SET {columns} WHERE id = %s"
    params = [
        [f.get_db_prep_save(getattr(row, f.attname), connection) for f in fields] + [row.pk]  # type: ignore[union-attr]
        for row in rows
    ]
    with connection.cursor() as cursor:
        cursor.executemany(sql, params)


def _key_of(row: HourlyRollup) -> Key:
    return (
        row.organization_id,
        row.site_id,
        row.model,
        row.kind,
        row.method,
        row.measured,
        row.hour.astimezone(UTC),
        row.synthetic,
        row.device_id,
    )


_CARBON_FIELDS = ["pue", "pue_record", "location_factor", "factor_match", "location_co2e_g", "carbon_error"]


def _carbon(rows: list[HourlyRollup]) -> None:
    """Location-based CO2e of each row: IT energy x PUE record of the hour x factor of the zone and hour."""
    if not rows:
        return
    sites = {s.pk: s for s in Site.objects.filter(pk__in={r.site_id for r in rows if r.site_id})}
    for site in sites.values():
        site_ensure_pue_record(site)
    pue = PueHistory(sites)
    by_org: dict[int | None, list[HourlyRollup]] = defaultdict(list)
    for row in rows:
        by_org[row.organization_id].append(row)
    for org, org_rows in by_org.items():
        hours = [r.hour for r in org_rows]
        factors = factor_set(
            {sites[r.site_id].zone for r in org_rows if r.site_id in sites},
            org,
            min(hours),
            max(hours) + _HOUR,
        )
        for row in org_rows:
            row.location_co2e_g = None
            row.location_factor_id = None
            row.factor_match = ""
            row.carbon_error = ""
            site = sites.get(row.site_id) if row.site_id is not None else None
            if site is None:
                row.carbon_error = "the device is not placed in a site"
                continue
            record = pue.at(site.pk, row.hour)
            assert record is not None  # every site has a first record (ensured above)
            row.pue, row.pue_record_id = record.pue, record.pk
            if row.energy_uj < 0:
                row.carbon_error = f"negative energy after adjustments ({row.energy_uj} µJ)"
                continue
            try:
                hour = row.hour.astimezone(UTC)
                choice = co2e.select_factor(site.zone, hour, factors.candidates(site.zone, hour))
                result = co2e.location_based([rollup_consumption(row, site, record)], [choice.factor])
            except (co2e.NoFactor, co2e.AmbiguousFactor, ValueError) as exc:
                row.carbon_error = str(exc)
                continue
            row.location_factor_id = int(choice.factor.factor_id)
            row.factor_match = choice.match
            row.location_co2e_g = result.total.co2e_g.quantize(_STORE)
    _save_columns(rows, _CARBON_FIELDS)


def _market_start(instruments: list[co2e.Instrument], start: datetime) -> datetime:
    # Instruments are used up in chronological order: recomputing from ``start`` must begin where every
    # instrument valid at that point began, and so on, until no earlier vintage overlaps.
    while True:
        earlier = [i.vintage_start for i in instruments if i.vintage_start < start < i.vintage_end]
        if not earlier:
            return start
        start = min(earlier)


def _market(rows: list[HourlyRollup]) -> None:
    """Market-based CO2e of every row of the touched organizations from the earliest hour that can change."""
    firsts: dict[int | None, datetime] = {}
    for row in rows:
        hour = row.hour.astimezone(UTC)
        if row.organization_id not in firsts or hour < firsts[row.organization_id]:
            firsts[row.organization_id] = hour
    for org, first in firsts.items():
        market_recompute(org, first)


def market_recompute(organization_id: int | None, first_hour: datetime | None = None) -> None:
    instruments, _ = instruments_of(organization_id) if organization_id is not None else ([], {})
    qs = HourlyRollup.objects.filter(organization_id=organization_id)
    if first_hour is not None:
        qs = qs.filter(hour__gte=_market_start(instruments, first_hour))
    rows = list(qs.order_by("hour", "id"))
    if not rows:
        return
    sites = {s.pk: s for s in Site.objects.filter(pk__in={r.site_id for r in rows if r.site_id})}
    pue = PueHistory(sites)
    hours = [r.hour for r in rows]
    factors = factor_set({s.zone for s in sites.values()}, organization_id, min(hours), max(hours) + _HOUR)
    consumptions: list[co2e.Consumption] = []
    by_tag: dict[str, HourlyRollup] = {}
    for row in rows:
        row.market_co2e_g = None
        if row.carbon_error.startswith(MARKET_ERROR_PREFIX):
            row.carbon_error = ""  # computed afresh below: an error of an earlier run must not stick
        site = sites.get(row.site_id) if row.site_id is not None else None
        record = pue.at(site.pk, row.hour) if site is not None else None
        if site is None or record is None or row.carbon_error:
            continue
        tag = str(row.pk)
        by_tag[tag] = row
        consumptions.append(rollup_consumption(row, site, record))
    if consumptions:
        try:
            result = co2e.market_based(
                consumptions, instruments, residual_mixes_of(organization_id), factors.all()
            )
        except (co2e.NoFactor, co2e.AmbiguousFactor, ValueError) as exc:
            for row in by_tag.values():
                row.carbon_error = f"{MARKET_ERROR_PREFIX}{exc}"
        else:
            sums: dict[str, Decimal] = defaultdict(Decimal)
            for line in result.lines:
                sums[line.consumption.tag] += line.co2e_g
            for tag, row in by_tag.items():
                row.market_co2e_g = sums[tag].quantize(_STORE)
    _save_columns(rows, ["market_co2e_g", "carbon_error"])


def recompute_carbon(
    organization_id: int | None = None,
    *,
    site_id: int | None = None,
    zone: str | None = None,
    start: datetime | None = None,
    end: datetime | None = None,
) -> int:
    """Recompute the CO2e of the rollups after factors, PUE or instruments changed: of one organization, or
    all; narrowed to one site, one zone's sites, or the hours [start, end) when only those can change.
    Energy sums are untouched. The market-based figures of every organization touched are recomputed from
    the first touched hour on (instruments are used up in order). Returns the rows recomputed."""
    with transaction.atomic():
        _lock()
        qs = HourlyRollup.objects.all()
        if organization_id is not None:
            qs = qs.filter(organization_id=organization_id)
        if site_id is not None:
            qs = qs.filter(site_id=site_id)
        if zone is not None:
            qs = qs.filter(site__zone=zone)
        if start is not None:
            qs = qs.filter(hour__gte=start)
        if end is not None:
            qs = qs.filter(hour__lt=end)
        rows = list(qs)
        _carbon(rows)
        _market(rows)
    return len(rows)


class RebuildRefused(Exception):
    """The raw ledger no longer holds every record the rollups counted."""


def rolled_up_seq(chain: LedgerChain) -> int:
    """How far the rollups have read every table of ``chain``: the ledger's retention archives no further
    (named in the settings' LEDGER_ARCHIVE_LIMITS), so no record leaves the database before its energy is in the rollups."""
    seqs = dict(RollupCursor.objects.filter(chain_id=chain.pk, table__in=_TABLES).values_list("table", "seq"))
    return min(seqs.get(table, 0) for table in _TABLES)


def rollups_rebuild() -> RollupRun:
    """Throw the rollups away and build them again from the raw ledger. Refused once records were archived: the
    rollups are then all that holds those months' sums, and a rebuild would silently drop them."""
    archived = LedgerArchive.objects.order_by("-to_seq").first()
    if archived is not None:
        raise RebuildRefused(
            f"refused: ledger records were archived (chain {archived.chain.chain_id} up to seq {archived.to_seq}, "
            f"before {archived.before_period // 100}-{archived.before_period % 100:02d}) and are no longer in the "
            "database; a rebuild from the raw rows would drop their energy from the rollups. The archived months' "
            "rollups stay as they are; `rollups` (without --rebuild) folds in new records"
        )
    with transaction.atomic():
        _lock()
        HourlyRollup.objects.all().delete()
        RollupCursor.objects.exclude(table=_LOCK_TABLE).delete()
        # Read again from every chain's start: the months of each organization's records come back exact (rows
        # from before those months were kept had none).
        ChainOrganization.objects.all().delete()
        return rollups_update()
