from __future__ import annotations

from celery import shared_task

from jobs.services import job_run, jobs_dispatch_due


@shared_task(name="jobs.run")
def run_job(job_id: int) -> str | None:
    """Run one job whose window has come (a second run finds it no longer waiting and does nothing)."""
    job = job_run(job_id)
    return None if job is None else str(job.status)


@shared_task(name="jobs.dispatch_due")
def dispatch_due_jobs() -> list[int]:
    """Every minute: send the jobs that are due but still waiting (lost messages); fail lost runs."""
    return jobs_dispatch_due()
