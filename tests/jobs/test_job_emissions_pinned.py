"""The exact emissions of jobs on fixed ledgers, recorded once and compared whole, key order included: what
:func:`job_emissions` gives, what the API's job detail shows under ``emissions`` and ``counterfactual``, and the
dashboard's emissions and counterfactual blocks. Refactors must leave all three equal, byte for byte.

One scenario per outcome: not run, running, nothing answered, answers without ledger ids, requests not yet in
the ledger, intervals still open, final (one site; and several sites, hours, PUE records, adjustments, a
device with no site and a site with no PUE record, for a failed job), negative energy, and no factor.

Database ids differ between runs and engines: factors are named by zone, hour and figure, the job's site by
its name, instead.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import orjson
import pytest

from api.jobs import job_json
from carbon import services as carbon
from carbon.models import EmissionFactor
from jobs import services
from jobs.models import Job, JobOutput
from jobs.selectors import job_emissions
from ledger.services import ledger_adjust
from ledger.writer import default_site
from tenancy.models import Device, Organization, Site
from tests.factories import LedgerBatchEnergyFactory, LedgerRequestFactory
from tests.jobs.conftest import H10, NOW, import_series, job_file
from tests.support.accounts import signed_in

pytestmark = pytest.mark.django_db

PINNED = Path(__file__).resolve().parents[1] / "golden" / "job_emissions.json"


def _submit(org: Organization, requests: int = 3) -> Job:
    return services.job_submit(
        organization=org, data=job_file(requests), model="linear", deadline=H10 + timedelta(hours=4), now=NOW
    )


def _answer(job: Job, requests: list[tuple[str, datetime, int]], *, final: bool = True) -> list[str]:
    """One ledger request and one job output per (device, start, µJ); one batch per device and hour, its energy
    in two rows (two intervals), the last one ``final``."""
    ids: list[str] = []
    batches: dict[tuple[str, datetime], list[tuple[str, int]]] = {}
    for index, (device_id, at, energy_uj) in enumerate(requests):
        hour = at.replace(minute=0, second=0, microsecond=0)
        batch_id = f"pin.{job.pk}.{device_id}.{hour:%H}"
        started_ns = int(at.timestamp()) * 1_000_000_000
        request = LedgerRequestFactory(
            organization=job.organization,
            device_id=device_id,
            started_ns=started_ns,
            received_ns=started_ns - 10,
            batch_id=batch_id,
        )
        JobOutput.objects.create(
            job=job, index=index, line=index + 1, ledger_id=request.request_id, response="{}", answered_at=at
        )
        batches.setdefault((batch_id, hour), []).append((request.request_id, energy_uj))
        ids.append(request.request_id)
    for (batch_id, _), members in batches.items():
        first = [uj // 3 for _, uj in members]
        second = [uj - part for (_, uj), part in zip(members, first, strict=True)]
        for shares, is_final in ((first, False), (second, final)):
            LedgerBatchEnergyFactory(
                batch_id=batch_id,
                request_ids=orjson.dumps([rid for rid, _ in members]).decode(),
                shares_uj=orjson.dumps(shares).decode(),
                energy_uj=sum(shares),
                final=is_final,
            )
    return ids


def _status(job: Job, status: str, done: int | None = None) -> Job:
    Job.objects.filter(pk=job.pk).update(
        status=status, done_requests=done if done is not None else job.done_requests
    )
    job.refresh_from_db()
    return job


def _device(device_id: str, site: Site | None, uncertainty: float) -> Device:
    return Device.objects.create(
        device_id=device_id, kind="gpu", method="nvml-counter", relative_uncertainty=uncertainty, site=site
    )


def _local_pue() -> Site:
    site = default_site()
    carbon.site_set_pue(site=site, pue="1.5", source="declared", valid_from=datetime(2020, 1, 1, tzinfo=UTC))
    return site


def not_run(org: Organization) -> Job:
    return _submit(org)


def running(org: Organization) -> Job:
    return _status(_submit(org), Job.Status.RUNNING)


def nothing_answered(org: Organization) -> Job:
    return _status(_submit(org), Job.Status.FAILED)


def answers_without_ledger_ids(org: Organization) -> Job:
    job = _submit(org)
    JobOutput.objects.create(job=job, index=0, line=1, ledger_id="", response="{}", answered_at=NOW)
    return _status(job, Job.Status.DONE, 1)


def not_in_the_ledger_yet(org: Organization) -> Job:
    job = _submit(org)
    _device("gpu-fr", _local_pue(), 0.05)
    _answer(job, [("gpu-fr", H10 + timedelta(hours=2, minutes=1), 1_000_000)])
    JobOutput.objects.create(
        job=job, index=1, line=2, ledger_id="not-drained", response="{}", answered_at=NOW
    )
    return _status(job, Job.Status.FAILED, 2)


def intervals_open(org: Organization) -> Job:
    job = _submit(org)
    _device("gpu-fr", _local_pue(), 0.05)
    at = H10 + timedelta(hours=2, minutes=5)
    _answer(job, [("gpu-fr", at, 1_000_000), ("gpu-fr", at, 2_000_000)], final=False)
    return _status(job, Job.Status.DONE, 2)


def final_one_site(org: Organization) -> Job:
    job = _submit(org)
    _device("cpu-model", _local_pue(), 0.3)
    at = H10 + timedelta(hours=2, minutes=5)
    _answer(job, [("cpu-model", at, 1_200_000), ("cpu-model", at, 1_200_000), ("cpu-model", at, 1_200_000)])
    return _status(job, Job.Status.DONE, 3)


def final_failed_many_sites(org: Organization) -> Job:
    import_series("DE", H10, [410, 390, 380, 420], name="de.csv")
    job = _submit(org, requests=8)
    local = _local_pue()
    carbon.site_set_pue(
        site=local,
        pue="1.25",
        source="measured",
        valid_from=H10 + timedelta(hours=1),
        relative_uncertainty="0.03",
    )
    berlin = Site.objects.create(name="berlin", zone="DE", pue="1.3")  # no PUE record
    _device("gpu-fr", local, 0.05)
    _device("gpu-de", berlin, 0.1)
    _device("loose", None, 0.2)
    ids = _answer(
        job,
        [
            ("gpu-fr", H10 + timedelta(minutes=20), 2_000_000),
            ("gpu-fr", H10 + timedelta(minutes=25), 3_000_001),
            ("gpu-de", H10 + timedelta(hours=1, minutes=2), 7_777_777),
            ("gpu-fr", H10 + timedelta(hours=2, minutes=59), 123_456),
            # Not in an hour and site of another device: lines of one hour and site are ordered by the
            # ledger query's row order, which differs between database engines.
            ("ghost", H10 + timedelta(hours=1, minutes=10), 555_555),
            ("loose", H10 + timedelta(hours=3, minutes=30), 999_999),
        ],
    )
    ledger_adjust(target_kind="request", target_id=ids[1], energy_delta_uj=500, reason="drift", actor="pin")
    ledger_adjust(target_kind="request", target_id=ids[2], energy_delta_uj=-100, reason="drift", actor="pin")
    ledger_adjust(target_kind="request", target_id=ids[2], energy_delta_uj=-23, reason="again", actor="pin")
    return _status(job, Job.Status.FAILED, 6)


def negative_energy(org: Organization) -> Job:
    job = _submit(org)
    _device("gpu-fr", _local_pue(), 0.05)
    ids = _answer(
        job, [("gpu-fr", H10 + timedelta(hours=1), 1_000), ("gpu-fr", H10 + timedelta(hours=2), 2_000)]
    )
    ledger_adjust(
        target_kind="request", target_id=ids[1], energy_delta_uj=-5_000, reason="drift", actor="pin"
    )
    return _status(job, Job.Status.FAILED, 2)


def no_factor(org: Organization) -> Job:
    job = _submit(org)
    nowhere = Site.objects.create(name="nowhere", zone="ZZ", pue="1.1")
    _device("gpu-zz", nowhere, 0.05)
    _answer(job, [("gpu-zz", H10 + timedelta(hours=2), 1_000_000)])
    return _status(job, Job.Status.FAILED, 1)


SCENARIOS: dict[str, Callable[[Organization], Job]] = {
    f.__name__: f
    for f in (
        not_run,
        running,
        nothing_answered,
        answers_without_ledger_ids,
        not_in_the_ledger_yet,
        intervals_open,
        final_one_site,
        final_failed_many_sites,
        negative_energy,
        no_factor,
    )
}


def _named(text: str, job: Job) -> str:
    """``text`` with database ids replaced by names."""

    def factor(match: re.Match[str]) -> str:
        f = EmissionFactor.objects.get(pk=int(match[2]))
        return f"{match[1]}{f.zone} {f.granularity} {f.period_start.astimezone(UTC):%Y-%m-%dT%H} {f.intensity_g_per_kwh}{match[3]}"

    text = re.sub(r'("factor_id": ")(\d+)(")', factor, text)
    text = re.sub(r"(<td>)(\d+)( \()", factor, text)  # the dashboard's factor column
    text = re.sub(r'(title="emission factor )(\d+)(")', factor, text)  # the factor column's hover text
    # The dashboard escapes the apostrophe of the notes.
    return re.sub(rf"(the job(?:'|&#x27;)s site ){job.site_id} ", rf"\g<1>{job.site.name} ", text)


def _outputs(job: Job, client: Any) -> dict[str, str]:
    detail = job_json(job, detail=True)
    page = client.get(f"/dashboard/jobs/{job.pk}").content.decode()
    block = page[page.index("<h2>Emissions</h2>") : page.index("<h2>Start times considered</h2>")]
    return {
        "job_emissions": _named(json.dumps(job_emissions(job).as_dict(), ensure_ascii=False), job),
        "api": _named(
            json.dumps(
                {"emissions": detail["emissions"], "counterfactual": detail["counterfactual"]},
                ensure_ascii=False,
            ),
            job,
        ),
        "dashboard": _named(block, job),
    }


@pytest.mark.parametrize("scenario", list(SCENARIOS))
def test_job_emissions_equal_the_recorded_outputs(org: Organization, series: None, scenario: str) -> None:
    job = SCENARIOS[scenario](org)
    assert _outputs(job, signed_in(org, "viewer")) == json.loads(PINNED.read_text())[scenario]
