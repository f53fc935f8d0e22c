"""Writes of the jobs domain: submit (check, plan, queue), run (the Celery task's body), dispatch the due
jobs whose message was lost, give up on jobs whose worker was lost, retry a failed job.

How a job reaches the gateway: the worker POSTs each request of the file to the gateway's own KServe
endpoint (``GATEWAY_URL``), like any client, so the job is batched, metered and recorded exactly like live
traffic. It authenticates with a key made for that run only: scope ``infer``, of the job's organization,
stored hashed like every key (``api_key_create``), held in the worker's memory for the run and revoked when
the run ends. The submitting key is never stored, and no secret sits in the database or the broker.
"""

from __future__ import annotations

import hashlib
import json
import logging
import threading
import time
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

import orjson
from django.conf import settings
from django.db import transaction
from django.db.models import F, QuerySet
from django.utils import timezone

from carbon.provider_config import configured_providers
from jobs import planning, selectors
from jobs.gateway_client import GatewayClient, InferAnswer, infer_path
from jobs.inputs import JobInputError, JobLine, model_spec, parse_job_file, split_job_file
from jobs.models import Job, JobOutput
from ledger.writer import default_site
from tenancy.models import Organization
from tenancy.queue import task_named
from tenancy.services import ServiceError, api_key_create, api_key_revoke

log = logging.getLogger(__name__)

WAITING = (Job.Status.QUEUED, Job.Status.SCHEDULED)
_FLUSH_EVERY = 100
_FLUSH_INTERVAL_S = 1.0


def _aware(value: datetime, name: str) -> datetime:
    if value.tzinfo is None or value.utcoffset() is None:
        raise ServiceError(f"{name} must carry a time zone (ISO 8601 with Z or an offset)")
    return value.astimezone(UTC)


def _dispatch(job_id: int, eta: datetime | None = None) -> None:
    run_job = task_named("jobs.run")
    try:
        if eta is None:
            run_job.delay(job_id)
        else:
            run_job.apply_async((job_id,), eta=eta)
    except Exception:  # the broker is down: jobs.dispatch_due sends it once it is due
        log.exception("job %s could not be sent to the broker; the dispatcher will send it", job_id)


def _queue(job: Job) -> None:
    job_id, eta = job.pk, job.planned_start
    transaction.on_commit(lambda: _dispatch(job_id, eta))


def _providers() -> list[Any]:
    if not settings.INTENSITY_PROVIDERS:
        return []
    try:
        return list(configured_providers())
    except Exception as exc:  # a misconfigured provider must not stop submissions; the series is used
        log.warning("intensity providers unavailable for job planning: %s", exc)
        return []


@dataclass(frozen=True)
class Plan:
    start: datetime
    document: dict[str, Any]


def plan_job(*, organization_id: int, zone: str, now: datetime, latest_start: datetime) -> Plan:
    """The start with the lowest expected intensity of ``zone`` in [now, latest_start], and why."""
    outlook = selectors.intensity_outlook(
        zone,
        organization_id,
        planning.floor_hour(now),
        planning.floor_hour(latest_start),
        profile_days=settings.JOBS_PROFILE_DAYS,
        providers=_providers(),
    )
    window = planning.choose_window(now, latest_start, outlook.at)

    def value(v: Any) -> str | None:
        return None if v is None else str(v)

    return Plan(
        start=window.start,
        document={
            "zone": zone,
            "start": window.start.isoformat(),
            "hour": window.outlook.hour.isoformat(),
            "intensity_g_per_kwh": value(window.outlook.intensity_g_per_kwh),
            "source": window.outlook.source,
            "source_note": window.outlook.note,
            "reason": window.reason,
            "latest_start": latest_start.isoformat(),
            "notes": list(outlook.notes),
            "candidates": [
                {
                    "start": c.start.isoformat(),
                    "intensity_g_per_kwh": value(c.outlook.intensity_g_per_kwh),
                    "source": c.outlook.source,
                }
                for c in window.candidates
            ],
        },
    )


def _latest_start(deadline: datetime) -> datetime:
    return deadline - timedelta(seconds=settings.JOBS_MIN_LEAD_S)


def job_submit(
    *,
    organization: Organization,
    data: bytes,
    model: str,
    deadline: datetime,
    version: str = "",
    input_name: str = "",
    submitted_by: str = "",
    now: datetime | None = None,
) -> Job:
    """Accept a job: check the deadline, the model and every request of the file, choose its window, store
    it and queue its run for the window's start (Celery ``eta``). Raises ``ServiceError`` naming what is
    wrong."""
    at = (now or timezone.now()).astimezone(UTC)
    deadline = _aware(deadline, "deadline")
    if deadline <= at:
        raise ServiceError(f"the deadline {deadline.isoformat()} is in the past")
    if _latest_start(deadline) < at:
        raise ServiceError(
            f"the deadline {deadline.isoformat()} is too soon to run the job: it must be at least "
            f"{settings.JOBS_MIN_LEAD_S:.0f} s after submission (JOBS_MIN_LEAD_S)"
        )
    if deadline - at > timedelta(seconds=settings.JOBS_MAX_HORIZON_S):
        raise ServiceError(
            f"the deadline {deadline.isoformat()} is too far ahead: at most {settings.JOBS_MAX_HORIZON_S:.0f} s "
            "after submission (JOBS_MAX_HORIZON_S)"
        )
    try:
        spec = model_spec(settings.MODEL_REPOSITORY, model, version)
        lines = parse_job_file(
            data,
            spec,
            max_requests=settings.JOBS_MAX_REQUESTS,
            max_file_bytes=settings.JOBS_MAX_FILE_BYTES,
            max_body_bytes=settings.GATEWAY_MAX_BODY_BYTES,
        )
    except JobInputError as exc:
        raise ServiceError(str(exc)) from None
    site = default_site()
    latest = _latest_start(deadline)
    plan = plan_job(organization_id=organization.pk, zone=site.zone, now=at, latest_start=latest)
    plan.document["site"] = {"id": site.pk, "name": site.name, "zone": site.zone}
    with transaction.atomic():
        job = Job.objects.create(
            organization=organization,
            model=model,
            version=version,
            status=Job.Status.QUEUED if plan.start <= at else Job.Status.SCHEDULED,
            submitted_at=at,
            submitted_by=submitted_by[:200],
            deadline=deadline,
            planned_start=plan.start,
            site=site,
            plan=plan.document,
            input_name=input_name[:255],
            input_bytes=len(data),
            input_sha256=hashlib.sha256(data).hexdigest(),
            inputs=data,
            request_count=len(lines),
        )
        _queue(job)
    return job


# -- running a job -------------------------------------------------------------------------------------


class _Lost(Exception):
    """The job is no longer this run's (given up for lost and failed, or retried, meanwhile)."""


def _mine(job_id: int, attempt: int) -> QuerySet[Job]:
    """The job while run ``attempt`` still holds it."""
    return Job.objects.filter(pk=job_id, status=Job.Status.RUNNING, attempts=attempt)


def _still_mine(job_id: int, attempt: int, **changes: Any) -> None:
    if not _mine(job_id, attempt).update(**changes):
        raise _Lost()


def _failure(line: JobLine, answer: InferAnswer) -> str:
    where = f"line {line.line} (request {line.index + 1})"
    if answer.status == 0:
        return f"{where}: the gateway did not answer ({answer.error}) at {settings.GATEWAY_URL}"
    text = answer.body.decode("utf-8", "replace")
    try:
        doc = orjson.loads(answer.body)
        text = str(doc.get("error", text)) if isinstance(doc, dict) else text
    except orjson.JSONDecodeError:
        pass
    return f"{where}: the gateway answered HTTP {answer.status}: {text[:500]}"


def _ledger_id(answer: InferAnswer) -> str:
    try:
        doc = orjson.loads(answer.body)
    except orjson.JSONDecodeError:
        # Non-finite outputs come as the bare tokens NaN, Infinity and -Infinity, as Triton writes them: the
        # standard library reads those; orjson does not.
        try:
            doc = json.loads(answer.body)
        except ValueError:
            return ""
    params = doc.get("parameters") if isinstance(doc, dict) else None
    value = params.get("ledger_id") if isinstance(params, dict) else None
    return value if isinstance(value, str) else ""


def _send(job: Job, attempt: int, raw_key: str) -> str:
    """Send every request of the job not answered yet; store answers as they come. Returns the failure
    reason, or "" when every request was answered."""
    answered = selectors.answered_indices(job.pk)
    todo = [line for line in split_job_file(bytes(job.inputs)) if line.index not in answered]
    if not todo:
        return ""
    client = GatewayClient(
        settings.GATEWAY_URL,
        raw_key,
        timeout_s=settings.JOBS_REQUEST_TIMEOUT_S,
        attempts=settings.JOBS_REQUEST_ATTEMPTS,
    )
    path = infer_path(job.model, job.version)
    stop = threading.Event()

    def call(line: JobLine) -> tuple[JobLine, InferAnswer | None]:
        if stop.is_set():
            return line, None
        return line, client.infer(path, line.body)

    buffer: list[JobOutput] = []
    failure = ""
    last_flush = time.monotonic()

    def flush() -> None:
        nonlocal last_flush
        with transaction.atomic():  # nothing is stored by a run the job was taken from
            _still_mine(
                job.pk, attempt, done_requests=F("done_requests") + len(buffer), heartbeat_at=timezone.now()
            )
            if buffer:
                JobOutput.objects.bulk_create(buffer)
        buffer.clear()
        last_flush = time.monotonic()

    workers = max(1, min(settings.JOBS_CONCURRENCY, len(todo)))
    pending: set[Future[tuple[JobLine, InferAnswer | None]]] = set()
    queue = iter(todo)
    try:
        with ThreadPoolExecutor(max_workers=workers, thread_name_prefix=f"job-{job.pk}") as pool:
            try:
                # At most two requests per worker in flight: a failure stops the rest from being sent.
                for line in queue:
                    pending.add(pool.submit(call, line))
                    if len(pending) >= 2 * workers:
                        break
                while pending:
                    done, pending = wait(pending, timeout=_FLUSH_INTERVAL_S, return_when=FIRST_COMPLETED)
                    for future in done:
                        line, answer = future.result()
                        if answer is None:
                            continue
                        if answer.ok:
                            buffer.append(
                                JobOutput(
                                    job_id=job.pk,
                                    index=line.index,
                                    line=line.line,
                                    ledger_id=_ledger_id(answer),
                                    response=answer.body.decode("utf-8", "replace"),
                                    answered_at=timezone.now(),
                                )
                            )
                        elif not failure:
                            failure = _failure(line, answer)
                            stop.set()
                        if not stop.is_set():
                            nxt = next(queue, None)
                            if nxt is not None:
                                pending.add(pool.submit(call, nxt))
                    if len(buffer) >= _FLUSH_EVERY or time.monotonic() - last_flush >= _FLUSH_INTERVAL_S:
                        flush()
                flush()
            except BaseException:
                # The run lost the job (or failed): nothing queued is sent any more; only requests already
                # on the wire finish, and their answers are not stored.
                stop.set()
                for future in pending:
                    future.cancel()
                raise
    finally:
        client.close()
    return failure


def job_run(job_id: int, *, now: datetime | None = None) -> Job | None:
    """Run a job whose window has come. Safe to run twice: only a queued or scheduled job whose planned
    start has passed is claimed (a conditional UPDATE), so a second run finds nothing to do."""
    at = now or timezone.now()
    claimed = Job.objects.filter(pk=job_id, status__in=WAITING, planned_start__lte=at).update(
        status=Job.Status.RUNNING,
        started_at=at,
        heartbeat_at=at,
        attempts=F("attempts") + 1,
        failure_reason="",
    )
    job = Job.objects.select_related("organization").filter(pk=job_id).first()
    if job is None or not claimed:
        return job
    attempt = job.attempts
    created = api_key_create(
        organization=job.organization, scopes="infer", name=f"job {job.pk} run {attempt}"
    )
    try:
        _still_mine(job.pk, attempt, api_key=created.api_key)
        failure = _send(job, attempt, created.raw_key)
        finished = timezone.now()
        if failure:
            _still_mine(
                job.pk, attempt, status=Job.Status.FAILED, failure_reason=failure, finished_at=finished
            )
        else:
            _still_mine(job.pk, attempt, status=Job.Status.DONE, finished_at=finished)
    except _Lost:
        log.warning("job %s run %s: the job was taken from this run meanwhile; stopped", job.pk, attempt)
    except Exception as exc:
        log.exception("job %s failed", job.pk)
        _mine(job.pk, attempt).update(
            status=Job.Status.FAILED,
            failure_reason=f"unexpected error: {type(exc).__name__}: {exc}",
            finished_at=timezone.now(),
        )
    finally:
        api_key_revoke(api_key=created.api_key)
    job.refresh_from_db()
    return job


def jobs_dispatch_due(*, now: datetime | None = None) -> list[int]:
    """Send the run of every job due for more than ``JOBS_DISPATCH_GRACE_S`` and still waiting (its broker
    message was lost), and fail the running jobs with no progress for ``JOBS_RUNNING_STALE_S`` (their worker
    was lost; a retry sends the requests not answered yet). Safe any time: runs claim by status."""
    at = now or timezone.now()
    stale_before = at - timedelta(seconds=settings.JOBS_RUNNING_STALE_S)
    stale = Job.objects.filter(status=Job.Status.RUNNING, heartbeat_at__lt=stale_before).select_related(
        "api_key"
    )
    for job in stale:
        given_up = Job.objects.filter(
            pk=job.pk, status=Job.Status.RUNNING, heartbeat_at=job.heartbeat_at
        ).update(
            status=Job.Status.FAILED,
            failure_reason=(
                f"its worker was lost: no progress for {settings.JOBS_RUNNING_STALE_S:.0f} s "
                f"(JOBS_RUNNING_STALE_S) after {job.done_requests} of {job.request_count} requests; "
                "a retry sends the rest"
            ),
            finished_at=at,
        )
        if given_up and job.api_key is not None:
            api_key_revoke(api_key=job.api_key)
    due_before = at - timedelta(seconds=settings.JOBS_DISPATCH_GRACE_S)
    due = list(
        Job.objects.filter(status__in=WAITING, planned_start__lte=due_before)
        .order_by("planned_start", "pk")
        .values_list("pk", flat=True)
    )
    for pk in due:
        _dispatch(pk)
    return due


def job_retry(*, job: Job, now: datetime | None = None) -> Job:
    """Run a failed job again: the requests already answered are kept, the rest are sent. A new window is
    chosen before the deadline; once the deadline has passed, the job runs at once (said in its plan)."""
    at = (now or timezone.now()).astimezone(UTC)
    if job.status != Job.Status.FAILED:
        raise ServiceError(f"job {job.pk} is {job.status}; only a failed job can be retried")
    latest = _latest_start(job.deadline)
    if latest >= at:
        plan = plan_job(organization_id=job.organization_id, zone=job.site.zone, now=at, latest_start=latest)
        document, start = plan.document, plan.start
    else:
        document = dict(job.plan)
        document.update(
            start=at.isoformat(),
            reason=f"retried after the deadline {job.deadline.isoformat()} had passed: runs at once",
        )
        start = at
    document["site"] = {"id": job.site.pk, "name": job.site.name, "zone": job.site.zone}
    document["retried_at"] = at.isoformat()
    with transaction.atomic():
        changed = Job.objects.filter(pk=job.pk, status=Job.Status.FAILED).update(
            status=Job.Status.QUEUED if start <= at else Job.Status.SCHEDULED,
            planned_start=start,
            plan=document,
            failure_reason="",
            finished_at=None,
        )
        if not changed:
            raise ServiceError(f"job {job.pk} is no longer failed")
        job.refresh_from_db()
        _queue(job)
    return job
