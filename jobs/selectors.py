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

from django.db.models import Max, QuerySet, Sum

from carbon import co2e
from carbon.inputs import hour_consumption
from carbon.models import EmissionFactor, FactorImport
from carbon.providers import IntensityProvider
from carbon.selectors import PueHistory, factor_owners, factor_set, provider_forecast
from jobs import planning
from jobs.emissions import JobEmissions, JobFigures
from jobs.models import Job, JobOutput
from ledger.models import LedgerAdjustment, LedgerRequest
from ledger.selectors import request_energy_parts
from tenancy.models import Device, Site

_MAX_PK = 2**63 - 1
_HOUR_NS = 3_600_000_000_000


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


@dataclass(frozen=True)
class _RequestEnergy:
    device_id: str
    started_ns: int
    energy_uj: int  # its parts and adjusting entries


# (site pk, UTC hour, relative uncertainty of the meter): the requests valued together.
_Group = tuple[int, datetime, Decimal]


def _note(notes: list[str], note: str) -> None:
    if note not in notes:
        notes.append(note)


def job_emissions(job: Job) -> JobEmissions:
    """The job's emissions from the ledger: each request's energy (its parts, once a final part says its
    batch is fully allocated, plus adjusting entries) in the hour its batch started, times the PUE of the
    serving device's site at that hour, times the factor of the site's zone and hour (location-based, via
    :func:`carbon.co2e.location_based`). With it, the counterfactual estimate at the submission hour."""
    if job.status in (Job.Status.QUEUED, Job.Status.SCHEDULED):
        return JobEmissions.pending("the job has not run yet")
    if job.status == Job.Status.RUNNING:
        return JobEmissions.pending("the job is running")
    outputs = JobOutput.objects.filter(job=job)
    answered = outputs.count()
    if answered == 0:
        return JobEmissions.not_available("no request of the job was answered")
    without_id = outputs.filter(ledger_id="").count()
    if without_id:
        return JobEmissions.not_available(
            f"{without_id} answer(s) carry no parameters.ledger_id (was the ledger off?)"
        )
    failed_note = (
        f"the job failed: {answered} of {job.request_count} requests were answered"
        if job.status == Job.Status.FAILED
        else ""
    )
    energy = _request_energy(outputs.values("ledger_id"), answered, failed_note)
    if isinstance(energy, JobEmissions):
        return energy
    notes: list[str] = []
    return _valued(job, answered, _groups(job, energy, notes), notes, failed_note)


def _request_energy(
    ids: QuerySet[JobOutput, dict[str, Any]], answered: int, failed_note: str
) -> list[_RequestEnergy] | JobEmissions:
    """Each answered request's energy, or why it is still pending: the ledger's writer has not drained every
    request yet, or a request's batch has no final energy part (its metering intervals are open)."""
    requests = list(
        LedgerRequest.objects.filter(request_id__in=ids).values_list(
            "request_id", "device_id", "started_ns", "batch_id"
        )
    )
    if len(requests) < answered:
        return JobEmissions.pending(
            f"{answered - len(requests)} of {answered} requests are not in the ledger yet (its writer drains the "
            "gateway's spool)",
            failed_note,
        )
    parts = {
        rid: (sum(p.energy_uj for p in ps), sum(1 for p in ps if p.final))
        for rid, ps in request_energy_parts({r[0]: r[3] for r in requests}).items()
    }
    open_requests = sum(1 for r in requests if parts.get(r[0], (0, 0))[1] == 0)
    if open_requests:
        return JobEmissions.pending(
            f"energy pending: the metering intervals of {open_requests} of {answered} requests have not closed yet",
            failed_note,
        )
    adjustments = dict(
        LedgerAdjustment.objects.filter(target_kind="request", target_id__in=ids)
        .values("target_id")
        .annotate(delta=Sum("energy_delta_uj"))
        .values_list("target_id", "delta")
    )
    return [
        _RequestEnergy(device_id, started_ns, parts[rid][0] + adjustments.get(rid, 0))
        for rid, device_id, started_ns, _batch_id in requests
    ]


def _groups(job: Job, requests: list[_RequestEnergy], notes: list[str]) -> dict[_Group, int]:
    """The requests' energy summed per site of the serving device (the job's site for a device placed in
    none), UTC hour their batch started, and meter uncertainty."""
    devices = {
        d["device_id"]: d
        for d in Device.objects.filter(device_id__in={r.device_id for r in requests}).values(
            "device_id", "site_id", "relative_uncertainty"
        )
    }
    groups: dict[_Group, int] = defaultdict(int)
    for request in requests:
        device = devices.get(request.device_id)
        site_id = device["site_id"] if device is not None and device["site_id"] is not None else job.site_id
        if device is None or device["site_id"] is None:
            _note(
                notes,
                f"device {request.device_id} is placed in no site: the job's site {job.site_id} was used",
            )
        meter = Decimal(str(device["relative_uncertainty"])) if device is not None else Decimal(0)
        hour = datetime.fromtimestamp((request.started_ns // _HOUR_NS) * 3600, UTC)
        groups[(site_id, hour, meter)] += request.energy_uj
    return groups


def _consumption(
    site: Site, hour: datetime, energy_uj: int, meter: Decimal, pue: PueHistory, notes: list[str]
) -> co2e.Consumption:
    """Energy of the job's requests at ``site`` in ``hour``. Not :func:`carbon.inputs.rollup_consumption`:
    it starts from the ledger's energy per site, hour and meter rather than a rollup row, falls back on the
    site's current PUE where no record exists (the rollups create one first), and is tagged by site; the
    conversion of the hour's energy itself is the rollups' (:func:`carbon.inputs.hour_consumption`)."""
    record = pue.at(site.pk, hour)
    if record is None:
        _note(notes, f"site {site.name} has no PUE record: its current PUE {site.pue} was used")
        factor_pue, pue_uncertainty = Decimal(site.pue), Decimal(0)
    else:
        factor_pue, pue_uncertainty = Decimal(record.pue), Decimal(record.relative_uncertainty)
    return hour_consumption(
        site,
        hour,
        energy_uj,
        pue=factor_pue,
        pue_relative_uncertainty=pue_uncertainty,
        meter_relative_uncertainty=meter,
        tag=str(site.pk),
    )


def _valued(
    job: Job, answered: int, groups: dict[_Group, int], notes: list[str], failed_note: str
) -> JobEmissions:
    """The groups valued in their hours (the inventory) and, together per site, at the submission hour (the
    counterfactual estimate)."""
    sites = {s.pk: s for s in Site.objects.filter(pk__in={k[0] for k in groups} | {job.site_id})}
    pue = PueHistory(sites)
    submission_hour = planning.floor_hour(job.submitted_at)
    consumptions: list[co2e.Consumption] = []
    energy_by_site: dict[int, int] = defaultdict(int)
    for (site_id, hour, meter), energy_uj in sorted(groups.items(), key=lambda kv: (kv[0][1], kv[0][0])):
        energy_by_site[site_id] += energy_uj
        if energy_uj < 0:
            return JobEmissions.not_available(f"negative energy after adjustments ({energy_uj} µJ)")
        consumptions.append(_consumption(sites[site_id], hour, energy_uj, meter, pue, notes))
    counterfactual_consumptions = [
        _consumption(sites[site_id], submission_hour, energy_uj, Decimal(0), pue, notes)
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
        return JobEmissions.not_available(str(exc), failed_note)
    figures = JobFigures(
        requests=answered,
        energy_uj=sum(energy_by_site.values()),
        actual=actual,
        counterfactual=counterfactual,
        submission_hour=submission_hour,
        site_names={str(pk): s.name for pk, s in sites.items()},
        notes=tuple(notes),
    )
    return JobEmissions("final", failed_note=failed_note, figures=figures)
