"""Reads of the jobs domain: an organization's jobs and outputs, the intensity outlook a plan is chosen from,
and a job's emissions from the ledger (location-based, through the co2e core) with the counterfactual
estimate of running it at submission."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from typing import Any

from django.db.models import Max, Sum

from carbonledger import co2e
from carbonledger.carbon.selectors import PueHistory, factor_owners, factor_set, provider_forecast
from carbonledger.intensity_providers import IntensityProvider
from carbonledger.ledger_selectors import request_energy_parts
from carbonledger.models import (
    Device,
    EmissionFactor,
    FactorImport,
    LedgerAdjustment,
    LedgerRequest,
    Site,
)
from jobs import planning
from jobs.models import Job, JobOutput

_MAX_PK = 2**63 - 1
_HOUR_NS = 3_600_000_000_000
#: CO2e figures of a job are small (a few requests): shown to the microgram, half-even.
CO2E_QUANTUM_G = Decimal("0.000001")
COUNTERFACTUAL_LABEL = (
    "estimate outside the inventory: the same energy had the job run at submission, valued at the "
    "submission hour's factor and PUE; not a reported emission"
)


def jobs_of(organization_id: int, limit: int = 200) -> list[Job]:
    return list(Job.objects.filter(organization_id=organization_id).defer("inputs", "plan")[:limit])


def job_of(organization_id: int, pk: int) -> Job | None:
    if not 0 < pk <= _MAX_PK:
        return None
    return Job.objects.filter(organization_id=organization_id, pk=pk).select_related("site").first()


def progress_percent(job: Job) -> int:
    """The share of the job's requests answered, in whole percent."""
    return round(100 * job.done_requests / job.request_count) if job.request_count else 0


def output_count(job: Job) -> int:
    return JobOutput.objects.filter(job=job).count()


def output_lines(job: Job, chunk: int = 500) -> Iterator[tuple[int, int, str, str]]:
    """(index, file line, ledger id, response JSON) of every answered request, in the file's order."""
    rows = (
        JobOutput.objects.filter(job=job)
        .order_by("index")
        .values_list("index", "line", "ledger_id", "response")
    )
    yield from rows.iterator(chunk_size=chunk)


def answered_indices(job_id: int) -> set[int]:
    return set(JobOutput.objects.filter(job_id=job_id).values_list("index", flat=True))


# -- the intensity outlook a plan is chosen from ------------------------------------------------------


@dataclass(frozen=True)
class Outlook:
    hours: dict[datetime, planning.HourOutlook]
    notes: tuple[str, ...]

    def at(self, hour: datetime) -> planning.HourOutlook:
        return self.hours[hour]


def intensity_outlook(
    zone: str,
    organization_id: int | None,
    first_hour: datetime,
    last_hour: datetime,
    *,
    profile_days: int,
    providers: Sequence[IntensityProvider] = (),
) -> Outlook:
    """The expected intensity of ``zone`` for every UTC hour in [first_hour, last_hour]: a provider's
    forecast when one answers, else the hourly series, else the expected profile of the series' most recent
    ``profile_days`` days (same hour of day), else the zone's annual factor."""
    end = last_hour + planning.HOUR
    outlook = provider_forecast(zone, first_hour, end, providers)
    notes = list(outlook.notes)
    forecast = outlook.hours
    factors = factor_set([zone], organization_id, first_hour, end)
    last_covered = (
        EmissionFactor.objects.filter(factor_owners(organization_id), zone=zone, granularity="hour")
        .filter(factor_import__status=FactorImport.Status.ACCEPTED)
        .aggregate(last=Max("period_start"))["last"]
    )
    profile: planning.Profile | None = None
    if last_covered is not None:
        last_covered = last_covered.astimezone(UTC)
        since = last_covered.replace(hour=0) - timedelta(days=profile_days - 1)
        recent = factor_set([zone], organization_id, since, last_covered + planning.HOUR)
        profile = planning.expected_profile(
            {hour: f.intensity_g_per_kwh for (_, hour), f in recent.hourly.items()}, profile_days
        )
    hours: dict[datetime, planning.HourOutlook] = {}
    hour = first_hour
    used_profile = False
    while hour <= last_hour:
        if hour in forecast:
            hours[hour] = planning.HourOutlook(hour, forecast[hour], planning.FORECAST)
        elif (zone, hour) in factors.hourly:
            factor = factors.hourly[(zone, hour)]
            hours[hour] = planning.HourOutlook(
                hour, factor.intensity_g_per_kwh, planning.SERIES, f"factor {factor.factor_id}"
            )
        elif profile is not None and hour.hour in profile.by_hour:
            used_profile = True
            hours[hour] = planning.HourOutlook(
                hour,
                profile.by_hour[hour.hour],
                planning.PROFILE,
                f"mean of {hour.hour:02d}:00 UTC over {profile.describe()}",
            )
        else:
            try:
                choice = co2e.select_factor(zone, hour, factors.annual.get(zone, []))
                hours[hour] = planning.HourOutlook(
                    hour,
                    choice.factor.intensity_g_per_kwh,
                    planning.ANNUAL,
                    "; ".join((f"factor {choice.factor.factor_id}", *choice.notes)),
                )
            except (co2e.NoFactor, co2e.AmbiguousFactor) as exc:
                hours[hour] = planning.HourOutlook(hour, None, planning.UNKNOWN, str(exc))
        hour += planning.HOUR
    if used_profile and last_covered is not None and profile is not None:
        notes.append(
            f"the hourly series of {zone} ends at {last_covered.isoformat()}: hours after it are valued at the "
            f"expected profile, the mean of the same UTC hour over the most recent days it covers "
            f"({profile.describe()})"
        )
    return Outlook(hours, tuple(notes))


# -- emissions ---------------------------------------------------------------------------------------


def _g(value: Decimal) -> str:
    return str(co2e.report_g(value, CO2E_QUANTUM_G))


def _pending(reason: str, **extra: Any) -> dict[str, Any]:
    return {"status": "pending", "energy": "pending", "reason": reason, **extra}


def job_emissions(job: Job) -> dict[str, Any]:
    """The job's emissions from the ledger: each request's energy (its parts, once a final part says its
    batch is fully allocated, plus adjusting entries) in the hour its batch started, times the PUE of the
    serving device's site at that hour, times the factor of the site's zone and hour (location-based, via
    :func:`carbonledger.co2e.location_based`). With it, the counterfactual estimate at the submission hour."""
    if job.status in (Job.Status.QUEUED, Job.Status.SCHEDULED):
        return _pending("the job has not run yet")
    if job.status == Job.Status.RUNNING:
        return _pending("the job is running")
    outputs = JobOutput.objects.filter(job=job)
    answered = outputs.count()
    if answered == 0:
        return {"status": "not available", "reason": "no request of the job was answered"}
    without_id = outputs.filter(ledger_id="").count()
    if without_id:
        return {
            "status": "not available",
            "reason": f"{without_id} answer(s) carry no parameters.ledger_id (was the ledger off?)",
        }
    ids = outputs.values("ledger_id")
    requests = list(
        LedgerRequest.objects.filter(request_id__in=ids).values_list(
            "request_id", "device_id", "started_ns", "batch_id"
        )
    )
    partial = {
        "partial": True,
        "note": f"the job failed: {answered} of {job.request_count} requests were answered",
    }
    extra = partial if job.status == Job.Status.FAILED else {}
    if len(requests) < answered:
        return _pending(
            f"{answered - len(requests)} of {answered} requests are not in the ledger yet (its writer drains the "
            "gateway's spool)",
            **extra,
        )
    parts = {
        rid: (sum(p.energy_uj for p in ps), sum(1 for p in ps if p.final))
        for rid, ps in request_energy_parts({r[0]: r[3] for r in requests}).items()
    }
    open_requests = sum(1 for r in requests if parts.get(r[0], (0, 0))[1] == 0)
    if open_requests:
        return _pending(
            f"energy pending: the metering intervals of {open_requests} of {answered} requests have not closed yet",
            **extra,
        )
    adjustments = dict(
        LedgerAdjustment.objects.filter(target_kind="request", target_id__in=ids)
        .values("target_id")
        .annotate(delta=Sum("energy_delta_uj"))
        .values_list("target_id", "delta")
    )
    devices = {
        d["device_id"]: d
        for d in Device.objects.filter(device_id__in={r[1] for r in requests}).values(
            "device_id", "site_id", "relative_uncertainty"
        )
    }
    notes: list[str] = []
    groups: dict[tuple[int, datetime, Decimal], int] = defaultdict(int)
    for rid, device_id, started_ns, _batch_id in requests:
        device = devices.get(device_id)
        site_id = device["site_id"] if device is not None and device["site_id"] is not None else job.site_id
        if device is None or device["site_id"] is None:
            note = f"device {device_id} is placed in no site: the job's site {job.site_id} was used"
            if note not in notes:
                notes.append(note)
        meter = Decimal(str(device["relative_uncertainty"])) if device is not None else Decimal(0)
        hour = datetime.fromtimestamp((started_ns // _HOUR_NS) * 3600, UTC)
        groups[(site_id, hour, meter)] += parts[rid][0] + adjustments.get(rid, 0)
    sites = {s.pk: s for s in Site.objects.filter(pk__in={k[0] for k in groups} | {job.site_id})}
    pue = PueHistory(sites)
    submission_hour = planning.floor_hour(job.submitted_at)

    def pue_at(site: Site, hour: datetime) -> tuple[Decimal, Decimal]:
        record = pue.at(site.pk, hour)
        if record is None:
            note = f"site {site.name} has no PUE record: its current PUE {site.pue} was used"
            if note not in notes:
                notes.append(note)
            return Decimal(site.pue), Decimal(0)
        return Decimal(record.pue), Decimal(record.relative_uncertainty)

    def consumption(site: Site, hour: datetime, energy_uj: int, meter: Decimal) -> co2e.Consumption:
        factor_pue, pue_unc = pue_at(site, hour)
        return co2e.Consumption(
            site_id=str(site.pk),
            zone=site.zone,
            start=hour,
            end=hour + planning.HOUR,
            energy_j=Decimal(energy_uj).scaleb(-6),
            pue=factor_pue,
            pue_relative_uncertainty=pue_unc,
            meter_relative_uncertainty=meter,
            scope_category=site.scope_category,  # type: ignore[arg-type]
            tag=f"{site.pk}",
        )

    consumptions: list[co2e.Consumption] = []
    energy_by_site: dict[int, int] = defaultdict(int)
    for (site_id, hour, meter), energy_uj in sorted(groups.items(), key=lambda kv: (kv[0][1], kv[0][0])):
        energy_by_site[site_id] += energy_uj
        if energy_uj < 0:
            return {
                "status": "not available",
                "reason": f"negative energy after adjustments ({energy_uj} µJ)",
            }
        consumptions.append(consumption(sites[site_id], hour, energy_uj, meter))
    counterfactual_consumptions = [
        consumption(sites[site_id], submission_hour, energy_uj, Decimal(0))
        for site_id, energy_uj in sorted(energy_by_site.items())
    ]
    hours = [c.start for c in consumptions] + [submission_hour]
    factors = factor_set(
        {s.zone for s in sites.values()}, job.organization_id, min(hours), max(hours) + planning.HOUR
    )
    try:
        actual = co2e.location_based(consumptions, factors.all())
        counterfactual = co2e.location_based(counterfactual_consumptions, factors.all())
    except (co2e.NoFactor, co2e.AmbiguousFactor, ValueError) as exc:
        return {"status": "not available", "reason": str(exc), **extra}
    total_uj = sum(energy_by_site.values())
    used = {u.factor.factor_id: u.factor for u in (*actual.factors_used, *counterfactual.factors_used)}
    return {
        "status": "final",
        "energy": "final",
        "method": "location-based (GHG Protocol Scope 2): IT energy x PUE of the site at the hour x grid factor "
        "of the zone and hour",
        "requests": answered,
        "energy_j": str(Decimal(total_uj).scaleb(-6)),
        "facility_energy_kwh": str(actual.total.energy_kwh.quantize(Decimal("1E-12"))),
        "co2e_g": _g(actual.total.co2e_g),
        "uncertainty_g": _g(actual.total.uncertainty_g),
        "hours": [
            {
                "hour": line.consumption.start.isoformat(),
                "site": sites[int(line.consumption.site_id)].name,
                "zone": line.consumption.zone,
                "energy_j": str(line.consumption.energy_j),
                "pue": str(line.consumption.pue),
                "intensity_g_per_kwh": str(line.choice.factor.intensity_g_per_kwh),
                "factor_id": line.choice.factor.factor_id,
                "factor_match": line.choice.match,
                "factor_notes": list(line.choice.notes),
                "co2e_g": _g(line.co2e_g),
            }
            for line in actual.lines
        ],
        "factors": [
            {"factor_id": f.factor_id, "source": f.source, "licence": f.licence, "basis": f.basis}
            for f in used.values()
        ],
        "notes": notes,
        "counterfactual": {
            "label": COUNTERFACTUAL_LABEL,
            "estimate": True,
            "in_inventory": False,
            "hour": submission_hour.isoformat(),
            "lines": [
                {
                    "site": sites[int(line.consumption.site_id)].name,
                    "zone": line.consumption.zone,
                    "energy_j": str(line.consumption.energy_j),
                    "pue": str(line.consumption.pue),
                    "intensity_g_per_kwh": str(line.choice.factor.intensity_g_per_kwh),
                    "factor_id": line.choice.factor.factor_id,
                    "factor_match": line.choice.match,
                    "co2e_g": _g(line.co2e_g),
                }
                for line in counterfactual.lines
            ],
            "co2e_g": _g(counterfactual.total.co2e_g),
            "avoided_co2e_g": _g(counterfactual.total.co2e_g - actual.total.co2e_g),
        },
        **extra,
    }
