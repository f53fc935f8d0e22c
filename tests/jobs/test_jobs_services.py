"""Deferred jobs, services and selectors with the database: the window against hand-made hourly series, the
expected profile past the series' end, a forecast provider, every refusal, the run through the gateway's
HTTP endpoint (a stand-in), claims, dispatch of lost messages, lost workers, retry, and the emissions with
the counterfactual estimate checked by hand."""

from __future__ import annotations

import re
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from typing import Any

import orjson
import pytest

from carbon import services as carbon
from carbon.providers import ProviderReading
from jobs import services, tasks
from jobs.models import Job, JobOutput
from jobs.selectors import job_emissions
from ledger.writer import default_site
from tenancy.models import ApiKey, Device, Organization
from tenancy.services import ServiceError, hash_key
from tests.factories import LedgerBatchEnergyFactory, LedgerRequestFactory
from tests.jobs.conftest import H10, NOW, FakeGateway, import_series, infer_line, job_file
from tests.support.intensity import forecast_reading

pytestmark = pytest.mark.django_db


def submit(org: Organization, deadline: datetime, data: bytes | None = None, **kw: Any) -> Job:
    return services.job_submit(
        organization=org,
        data=job_file(3) if data is None else data,
        model=kw.pop("model", "linear"),
        deadline=deadline,
        now=kw.pop("now", NOW),
        **kw,
    )


# -- the window ---------------------------------------------------------------------------------------


def test_the_lowest_intensity_hour_before_the_deadline_is_chosen(org: Organization, series: None) -> None:
    job = submit(org, deadline=H10 + timedelta(hours=4))
    assert job.status == Job.Status.SCHEDULED
    assert job.planned_start == H10 + timedelta(hours=2)  # the 50 g/kWh hour
    assert job.plan["intensity_g_per_kwh"] == "50.000000"
    assert job.plan["source"] == "hourly series"
    assert "lowest expected intensity" in job.plan["reason"] and "300" in job.plan["reason"]
    assert [c["intensity_g_per_kwh"] for c in job.plan["candidates"]] == [
        "300.000000",
        "200.000000",
        "50.000000",
        "400.000000",
    ]
    assert job.plan["candidates"][0]["start"] == NOW.isoformat()


def test_a_deadline_before_the_low_hour_gets_the_best_hour_before_the_deadline(
    org: Organization, series: None
) -> None:
    job = submit(org, deadline=H10 + timedelta(hours=1, minutes=30))
    assert job.planned_start == H10 + timedelta(hours=1)  # 200 g/kWh, the 50 hour is past the deadline
    assert job.plan["intensity_g_per_kwh"] == "200.000000"


def test_the_latest_start_leaves_the_lead_time_before_the_deadline(org: Organization, series: None) -> None:
    # Deadline 12:00:30: the 12:00 start (50 g/kWh) leaves less than JOBS_MIN_LEAD_S to run, so 11:00 wins.
    job = submit(org, deadline=H10 + timedelta(hours=2, seconds=30))
    assert job.planned_start == H10 + timedelta(hours=1)


def test_when_now_is_the_lowest_the_job_is_queued_to_run_at_once(org: Organization) -> None:
    import_series("FR", H10, [20, 200, 50, 400])
    job = submit(org, deadline=H10 + timedelta(hours=4))
    assert job.status == Job.Status.QUEUED and job.planned_start == NOW
    assert "runs at once" in job.plan["reason"]


def test_with_annual_factors_only_every_hour_is_equal_and_the_job_runs_at_once(org: Organization) -> None:
    carbon.load_shipped_factors()
    job = submit(org, deadline=NOW + timedelta(hours=5))
    assert job.status == Job.Status.QUEUED and job.planned_start == NOW
    assert job.plan["source"] == "annual factor"
    assert "same expected intensity" in job.plan["reason"]


def test_past_the_end_of_the_series_the_same_hour_of_the_most_recent_days_is_the_expected_profile(
    org: Organization,
) -> None:
    # Two days of series ending the day before submission; 03:00 is low on both days (30 and 10 g/kWh).
    day1 = datetime(2025, 2, 27, tzinfo=UTC)
    values: list[str | int] = []
    for day in range(2):
        values += [300 if h != 3 else (30 if day == 0 else 10) for h in range(24)]
    import_series("FR", day1, values)
    now = datetime(2025, 3, 1, 0, 20, tzinfo=UTC)
    job = submit(org, deadline=now + timedelta(hours=6), now=now)
    assert job.planned_start == datetime(2025, 3, 1, 3, tzinfo=UTC)
    assert job.plan["source"] == "expected profile"
    assert job.plan["intensity_g_per_kwh"] == "20.000000"  # mean of 30 and 10
    assert "2 day(s), 2025-02-27..2025-02-28" in job.plan["source_note"]
    assert any(
        "expected profile" in note and "ends at 2025-02-28T23:00:00+00:00" in note
        for note in job.plan["notes"]
    )


class FakeForecast:
    """A forecast provider (a remote service): 500 g/kWh every hour but 13:00 (5 g/kWh)."""

    name = "fake"

    def history(self, zone: str, start: datetime, end: datetime) -> list[ProviderReading]:
        return []

    def forecast(self, zone: str, start: datetime, end: datetime) -> list[ProviderReading]:
        out = []
        hour = start
        while hour < end:
            out.append(forecast_reading(zone, hour, 5 if hour.hour == 13 else 500, "fake forecast"))
            hour += timedelta(hours=1)
        return out


class BrokenForecast(FakeForecast):
    def forecast(self, zone: str, start: datetime, end: datetime) -> list[ProviderReading]:
        raise RuntimeError("provider down")


def test_a_configured_forecast_provider_is_used_before_the_hourly_series(
    org: Organization, series: None, settings: Any
) -> None:
    settings.INTENSITY_PROVIDERS = [f"{__name__}.FakeForecast"]
    job = submit(org, deadline=H10 + timedelta(hours=5))
    assert job.planned_start == H10 + timedelta(hours=3) and job.plan["source"] == "forecast"


def test_a_failing_forecast_provider_falls_back_to_the_hourly_series_and_says_so(
    org: Organization, series: None, settings: Any
) -> None:
    settings.INTENSITY_PROVIDERS = [f"{__name__}.BrokenForecast"]
    job = submit(org, deadline=H10 + timedelta(hours=4))
    assert job.planned_start == H10 + timedelta(hours=2) and job.plan["source"] == "hourly series"
    assert any("provider down" in note for note in job.plan["notes"])


# -- refusals -------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("deadline", "message"),
    [
        (NOW - timedelta(minutes=1), "is in the past"),
        (NOW, "is in the past"),
        (NOW + timedelta(seconds=30), "too soon to run the job"),
        (NOW + timedelta(days=8), "too far ahead"),
    ],
)
def test_a_bad_deadline_is_refused_with_the_reason(
    org: Organization, series: None, deadline: datetime, message: str
) -> None:
    with pytest.raises(ServiceError, match=message):
        submit(org, deadline=deadline)
    assert not Job.objects.exists()


def test_a_naive_deadline_is_refused(org: Organization) -> None:
    with pytest.raises(ServiceError, match="time zone"):
        submit(org, deadline=datetime(2025, 3, 1, 12))


@pytest.mark.parametrize(
    ("model", "version", "message"),
    [
        ("nosuchmodel", "", "unknown model 'nosuchmodel'.*linear"),
        ("../linear", "", "unknown model"),
        ("linear", "7", "has no version '7'.*versions served: 1"),
        ("linear", "x1", "has no version 'x1'"),
    ],
)
def test_an_unknown_model_or_version_is_refused(
    org: Organization, model: str, version: str, message: str
) -> None:
    with pytest.raises(ServiceError, match=message):
        submit(org, deadline=NOW + timedelta(hours=2), model=model, version=version)


@pytest.mark.parametrize(
    ("data", "message"),
    [
        (b"", "holds no request"),
        (b"\n\n", "holds no request"),
        (infer_line(0) + b"\n{not json\n", "line 2: failed to parse the request JSON"),
        (b"[1, 2]\n", "line 1: the request JSON must be an object"),
        (b'{"inputs": [{"name": "x", "shape": [1, 256], "datatype": "FP32", "data": [1]}]}', "line 1: .*x"),
        (
            b'{"inputs": [{"name": "z", "shape": [1, 2], "datatype": "FP32", "data": [1, 2]}]}',
            "line 1: .*unexpected inference input 'z' for model 'linear'",
        ),
        (
            b'{"inputs": [{"name": "x", "shape": [1, 256], "datatype": "INT32", "data": ['
            + b",".join([b"1"] * 256)
            + b"]}]}",
            "line 1: .*data-type is 'INT32', but model 'linear' expects 'FP32'",
        ),
        (b"\xff\xfe\n", "line 1: the file is not UTF-8"),
    ],
)
def test_a_malformed_file_is_refused_naming_the_line(org: Organization, data: bytes, message: str) -> None:
    with pytest.raises(ServiceError, match=message):
        submit(org, deadline=NOW + timedelta(hours=2), data=data)


def test_binary_outputs_are_refused(org: Organization) -> None:
    doc = orjson.loads(infer_line(0))
    doc["parameters"] = {"binary_data_output": True}
    with pytest.raises(ServiceError, match="line 1: binary outputs are not supported"):
        submit(org, deadline=NOW + timedelta(hours=2), data=orjson.dumps(doc))


def test_the_number_of_requests_and_the_file_size_are_bounded_by_settings(
    org: Organization, settings: Any
) -> None:
    settings.JOBS_MAX_REQUESTS = 2
    with pytest.raises(ServiceError, match=r"more than 2 requests \(JOBS_MAX_REQUESTS\)"):
        submit(org, deadline=NOW + timedelta(hours=2), data=job_file(3))
    settings.JOBS_MAX_REQUESTS = 50
    settings.JOBS_MAX_FILE_BYTES = 1024
    with pytest.raises(ServiceError, match=r"at most 1024 \(JOBS_MAX_FILE_BYTES\)"):
        submit(org, deadline=NOW + timedelta(hours=2), data=job_file(3))


def test_blank_lines_are_skipped_and_line_numbers_count_every_line(org: Organization) -> None:
    data = infer_line(0) + b"\n\n" + infer_line(1) + b"\n"
    job = submit(org, deadline=NOW + timedelta(hours=2), data=data)
    assert job.request_count == 2
    with pytest.raises(ServiceError, match=r"line 5: .*'inputs' must be a list"):
        submit(org, deadline=NOW + timedelta(hours=2), data=data + b"\n{}\n")


# -- running ---------------------------------------------------------------------------------------------


def _queued_job(org: Organization, n: int = 3) -> Job:
    """A job whose window is now (annual factors only), submitted at the real current time."""
    carbon.load_shipped_factors()
    job = services.job_submit(
        organization=org, data=job_file(n), model="linear", deadline=datetime.now(UTC) + timedelta(hours=1)
    )
    assert job.status == Job.Status.QUEUED
    return job


def test_a_run_sends_every_request_to_the_gateway_with_an_infer_only_key_and_records_the_ledger_ids(
    org: Organization, fake_gateway: FakeGateway
) -> None:
    job = _queued_job(org, 5)
    done = services.job_run(job.pk)
    assert done is not None and done.status == Job.Status.DONE, done and done.failure_reason
    assert done.done_requests == 5 and done.attempts == 1
    assert {r["path"] for r in fake_gateway.received} == {"/v2/models/linear/infer"}
    outputs = list(JobOutput.objects.filter(job=job).order_by("index"))
    assert [o.index for o in outputs] == [0, 1, 2, 3, 4]
    assert all(o.ledger_id.startswith("fake.") for o in outputs)
    assert [orjson.loads(o.response)["id"] for o in outputs] == [f"r{i}" for i in range(5)]
    # The key: made for this run, of the job's organization, infer only, stored hashed, revoked after the run.
    raw = {r["authorization"].removeprefix("Bearer ") for r in fake_gateway.received}
    assert len(raw) == 1
    key = ApiKey.objects.get(key_sha256=hash_key(raw.pop()))
    assert key.organization_id == org.pk and key.scope_set == frozenset({"infer"})
    assert key.revoked_at is not None and done.api_key_id == key.pk


def test_an_answer_with_nan_and_infinite_outputs_keeps_its_ledger_id(
    org: Organization, fake_gateway: FakeGateway
) -> None:
    # Triton (and our gateway) write non-finite floats as the bare tokens NaN, Infinity and -Infinity, which
    # strict JSON parsers refuse; the request was served and metered all the same.
    fake_gateway.non_finite_ids.add("r1")
    job = _queued_job(org, 3)
    done = services.job_run(job.pk)
    assert done is not None and done.status == Job.Status.DONE, done and done.failure_reason
    outputs = {o.index: o for o in JobOutput.objects.filter(job=job)}
    assert b"Infinity" in outputs[1].response.encode()
    assert all(o.ledger_id.startswith("fake.") for o in outputs.values())


def test_a_job_is_not_run_twice(org: Organization, fake_gateway: FakeGateway) -> None:
    job = _queued_job(org)
    services.job_run(job.pk)
    again = services.job_run(job.pk)
    assert again is not None and again.status == Job.Status.DONE and again.attempts == 1
    assert len(fake_gateway.received) == 3


def test_a_job_is_not_run_before_its_planned_start(
    org: Organization, series: None, fake_gateway: FakeGateway
) -> None:
    job = submit(org, deadline=H10 + timedelta(hours=4))
    early = services.job_run(job.pk, now=job.planned_start - timedelta(seconds=1))
    assert early is not None and early.status == Job.Status.SCHEDULED and not fake_gateway.received


def test_a_job_whose_gateway_does_not_answer_fails_with_the_reason(org: Organization, settings: Any) -> None:
    job = _queued_job(org)
    settings.GATEWAY_URL = "http://127.0.0.1:9"  # nothing listens there
    failed = services.job_run(job.pk)
    assert failed is not None and failed.status == Job.Status.FAILED
    # Requests go out concurrently: the first that found no gateway is named.
    assert re.match(
        r"line \d \(request \d\): the gateway did not answer \(ConnectionRefusedError", failed.failure_reason
    )
    assert "http://127.0.0.1:9" in failed.failure_reason
    assert failed.api_key is not None and failed.api_key.revoked_at is not None


def test_a_refused_request_fails_the_job_and_a_retry_sends_only_the_rest(
    org: Organization, fake_gateway: FakeGateway, django_capture_on_commit_callbacks: Any, monkeypatch: Any
) -> None:
    job = _queued_job(org, 4)
    fake_gateway.fail_ids["r2"] = (400, b'{"error": "model exploded"}')
    failed = services.job_run(job.pk)
    assert failed is not None and failed.status == Job.Status.FAILED
    assert failed.failure_reason.startswith(
        "line 3 (request 3): the gateway answered HTTP 400: model exploded"
    )
    answered_before = set(JobOutput.objects.filter(job=job).values_list("index", flat=True))
    assert 2 not in answered_before
    fake_gateway.fail_ids.clear()
    fake_gateway.received.clear()
    sent: list[tuple[Any, ...]] = []
    monkeypatch.setattr(tasks.run_job, "apply_async", lambda args, eta: sent.append((args, eta)))
    with django_capture_on_commit_callbacks(execute=True):
        retried = services.job_retry(job=failed)
    assert retried.status == Job.Status.QUEUED and retried.failure_reason == ""
    assert sent == [((job.pk,), retried.planned_start)]
    done = services.job_run(job.pk)
    assert done is not None and done.status == Job.Status.DONE and done.attempts == 2
    assert sorted(r["id"] for r in fake_gateway.received) == sorted(
        f"r{i}" for i in range(4) if i not in answered_before
    )
    assert list(JobOutput.objects.filter(job=job).order_by("index").values_list("index", flat=True)) == [
        0,
        1,
        2,
        3,
    ]
    assert done.done_requests == 4


def test_only_a_failed_job_can_be_retried(org: Organization) -> None:
    job = _queued_job(org)
    with pytest.raises(ServiceError, match="only a failed job can be retried"):
        services.job_retry(job=job)


def test_a_retry_after_the_deadline_runs_at_once_and_says_so(org: Organization, series: None) -> None:
    job = submit(org, deadline=H10 + timedelta(hours=4))
    Job.objects.filter(pk=job.pk).update(status=Job.Status.FAILED, failure_reason="boom")
    job.refresh_from_db()
    later = H10 + timedelta(hours=5)
    retried = services.job_retry(job=job, now=later)
    assert retried.status == Job.Status.QUEUED and retried.planned_start == later
    assert "after the deadline" in retried.plan["reason"]


def test_the_submission_queues_the_run_for_the_window_with_an_eta(
    org: Organization, series: None, django_capture_on_commit_callbacks: Any, monkeypatch: Any
) -> None:
    sent: list[tuple[Any, ...]] = []
    monkeypatch.setattr(tasks.run_job, "apply_async", lambda args, eta: sent.append((args, eta)))
    with django_capture_on_commit_callbacks(execute=True):
        job = submit(org, deadline=H10 + timedelta(hours=4))
    assert sent == [((job.pk,), H10 + timedelta(hours=2))]


def test_the_dispatcher_sends_due_jobs_whose_message_was_lost_and_fails_lost_runs(
    org: Organization, series: None, monkeypatch: Any, settings: Any
) -> None:
    sent: list[int] = []
    monkeypatch.setattr(tasks.run_job, "delay", sent.append)
    settings.JOBS_DISPATCH_GRACE_S = 30.0
    settings.JOBS_RUNNING_STALE_S = 600.0
    job = submit(org, deadline=H10 + timedelta(hours=4))  # planned at 12:00
    assert (
        services.jobs_dispatch_due(now=job.planned_start + timedelta(seconds=10)) == []
    )  # eta may still come
    assert services.jobs_dispatch_due(now=job.planned_start + timedelta(seconds=40)) == [job.pk]
    assert sent == [job.pk]
    # A running job with no progress for JOBS_RUNNING_STALE_S lost its worker.
    at = job.planned_start + timedelta(minutes=1)
    assert services.job_run(job.pk, now=at) is not None  # claims it; nothing listens at GATEWAY_URL...
    Job.objects.filter(pk=job.pk).update(status=Job.Status.RUNNING, heartbeat_at=at, failure_reason="")
    services.jobs_dispatch_due(now=at + timedelta(seconds=599))
    assert Job.objects.get(pk=job.pk).status == Job.Status.RUNNING
    services.jobs_dispatch_due(now=at + timedelta(seconds=601))
    lost = Job.objects.get(pk=job.pk)
    assert lost.status == Job.Status.FAILED and "its worker was lost" in lost.failure_reason


def test_the_dispatch_task_and_run_task_have_explicit_names() -> None:
    assert tasks.run_job.name == "jobs.run"
    assert tasks.dispatch_due_jobs.name == "jobs.dispatch_due"


# -- emissions ----------------------------------------------------------------------------------------


def _ran(
    org: Organization, job: Job, energy_uj: list[int], *, final: bool = True, hour: datetime
) -> list[str]:
    """The job done, with one ledger request per output started in ``hour``, all in one batch, and the batch's
    energy rows."""
    ids = []
    started_ns = int(hour.timestamp()) * 1_000_000_000 + 5_000_000_000
    batch_id = f"t.job-batch.{job.pk}"
    for i in range(len(energy_uj)):
        request = LedgerRequestFactory(
            organization=org, started_ns=started_ns, received_ns=started_ns - 10, batch_id=batch_id
        )
        JobOutput.objects.create(
            job=job, index=i, line=i + 1, ledger_id=request.request_id, response="{}", answered_at=hour
        )
        ids.append(request.request_id)
    # Two rows (the batch ran across two intervals), the last one final.
    first = [uj // 2 for uj in energy_uj]
    second = [uj - part for uj, part in zip(energy_uj, first, strict=True)]
    for shares, is_final in ((first, False), (second, final)):
        LedgerBatchEnergyFactory(
            batch_id=batch_id,
            request_ids=orjson.dumps(ids).decode(),
            shares_uj=orjson.dumps(shares).decode(),
            energy_uj=sum(shares),
            final=is_final,
        )
    Job.objects.filter(pk=job.pk).update(status=Job.Status.DONE, done_requests=len(energy_uj))
    job.refresh_from_db()
    return ids


def test_emissions_and_the_counterfactual_estimate_by_hand(org: Organization, series: None) -> None:
    job = submit(org, deadline=H10 + timedelta(hours=4))  # runs at 12:00 (50 g/kWh); submitted at 10:10 (300)
    site = default_site()
    Device.objects.create(
        device_id="cpu-model", kind="cpu", method="modelled", relative_uncertainty=0.3, site=site
    )
    carbon.site_set_pue(site=site, pue="1.5", source="declared", valid_from=datetime(2020, 1, 1, tzinfo=UTC))
    _ran(org, job, [1_200_000, 1_200_000, 1_200_000], hour=H10 + timedelta(hours=2))
    result = job_emissions(job).as_dict()
    # 3 x 1.2 J = 3.6 J IT = 1e-6 kWh; x PUE 1.5 = 1.5e-6 kWh facility.
    assert result["status"] == "final" and result["energy_j"] == "3.600000"
    assert Decimal(result["facility_energy_kwh"]) == Decimal("0.0000015")
    # x 50 g/kWh = 0.000075 g in the inventory...
    assert Decimal(result["co2e_g"]) == Decimal("0.000075")
    assert result["hours"][0]["hour"] == (H10 + timedelta(hours=2)).isoformat()
    assert result["hours"][0]["intensity_g_per_kwh"] == "50.000000" and result["hours"][0]["pue"] == "1.500"
    # ...and at submission (10:00, 300 g/kWh) it would have been 0.00045 g: an estimate outside the inventory.
    counter = result["counterfactual"]
    assert counter["estimate"] is True and counter["in_inventory"] is False
    assert counter["label"].startswith("estimate outside the inventory")
    assert Decimal(counter["co2e_g"]) == Decimal("0.000450")
    assert Decimal(counter["avoided_co2e_g"]) == Decimal("0.000375")
    assert counter["hour"] == H10.isoformat()
    assert [(c["intensity_g_per_kwh"], c["pue"], c["energy_j"]) for c in counter["lines"]] == [
        ("300.000000", "1.500", "3.600000")
    ]


def test_emissions_are_pending_until_the_intervals_close_and_the_ledger_holds_every_request(
    org: Organization, series: None
) -> None:
    job = submit(org, deadline=H10 + timedelta(hours=4))
    assert job_emissions(job).as_dict() == {
        "status": "pending",
        "energy": "pending",
        "reason": "the job has not run yet",
    }
    ids = _ran(org, job, [1_000, 2_000], final=False, hour=H10 + timedelta(hours=2))
    pending = job_emissions(job).as_dict()
    assert (
        pending["status"] == "pending" and "intervals of 2 of 2 requests have not closed" in pending["reason"]
    )
    JobOutput.objects.create(
        job=job, index=2, line=3, ledger_id="not-drained-yet", response="{}", answered_at=NOW
    )
    assert "1 of 3 requests are not in the ledger yet" in job_emissions(job).as_dict()["reason"]
    assert ids
