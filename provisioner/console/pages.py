"""What each page of the console shows: one function per page reads it through the library
(:mod:`provisioner.service`) and returns its template's context. They run in Starlette's
thread pool (the library is synchronous); none writes.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from provisioner import service
from provisioner.models import Job, JobStatus
from provisioner.queue.journal import JobRunRecord, StepRunRecord
from provisioner.servers.directory import Placement
from provisioner.settings import Settings
from provisioner.tenant.state import TenantState

#: How many jobs of each status the queue page lists.
QUEUE_ROWS = 50


def fleet(settings: Settings) -> dict[str, Any]:
    overview = service.overview(settings)
    queue_totals: dict[str, int] = {}
    for figure in overview.queue:
        queue_totals[figure.status.value] = queue_totals.get(figure.status.value, 0) + figure.jobs
    return {
        "overview": overview,
        "queue_totals": queue_totals,
        "heads": service.tenants_per_head(settings),
        "failed": service.list_jobs(settings, status=JobStatus.FAILED.value, limit=20),
        "progress": service.upgrade_progress(settings),
        "server_statuses": _by_status(overview.servers),
    }


def _by_status(placed: Placement) -> dict[str, int]:
    """How many tenant servers are in each status (the fleet page's card: empty, no card)."""
    return dict(Counter(server.status.value for server in placed.servers))


def rollouts(settings: Settings) -> dict[str, Any]:
    progress = service.upgrade_progress(settings)
    done = progress.phases.get("done", 0)
    total = sum(progress.phases.values())
    return {
        "progress": progress,
        "done": done,
        "total": total,
        "percent": round(100 * done / total) if total else 0,
        "history": service.rollout_history(settings),
    }


@dataclass(frozen=True)
class Attempt:
    """One attempt of one run of a job, with its step runs in order."""

    job_id: str
    job_type: str
    run: int
    attempt: int
    started_by: str
    steps: list[StepRunRecord]
    #: what ended the run by hand (a cancel), if anything
    ended_by: str | None = None


def _attempts(runs: list[JobRunRecord], step_runs: list[StepRunRecord]) -> list[Attempt]:
    started = {(str(r.job_id), r.run): r for r in runs}
    grouped: dict[tuple[str, int, int], list[StepRunRecord]] = {}
    for step in step_runs:
        grouped.setdefault((str(step.job_id), step.run, step.attempt), []).append(step)
    attempts = []
    for (job_id, run, attempt), steps in grouped.items():
        record = started.get((job_id, run))
        started_by, ended_by = (record.started_by, record.ended_by) if record else ("", None)
        kind = steps[0].job_type or ""
        attempts.append(Attempt(job_id, kind, run, attempt, started_by, steps, ended_by))
    # Runs that never reached a step (queued, cancelled before a claim) show with none.
    seen = {(a.job_id, a.run) for a in attempts}
    attempts += [
        Attempt(str(r.job_id), r.job_type, r.run, 0, r.started_by, [], r.ended_by)
        for r in runs
        if (str(r.job_id), r.run) not in seen
    ]
    return sorted(attempts, key=lambda a: a.steps[0].started_at if a.steps else _start(runs, a))


def _start(runs: list[JobRunRecord], attempt: Attempt) -> datetime:
    return next(
        r.started_at for r in runs if (str(r.job_id), r.run) == (attempt.job_id, attempt.run)
    )


def tenant(settings: Settings, tenant_id: str) -> dict[str, Any]:
    status = service.status(settings, tenant_id)
    state = status.tenant.state if status.tenant else None
    return {
        "tenant_id": tenant_id,
        "status": status,
        "state": state,
        "can_suspend": state in (TenantState.ACTIVE, TenantState.ONBOARDING),
        "can_restore": state in (TenantState.SUSPENDED, TenantState.ARCHIVED),
        "attempts": list(reversed(_attempts(status.runs, status.step_runs))),
        "runs": status.runs,
    }


def queue(settings: Settings) -> dict[str, Any]:
    def of(status: JobStatus) -> list[Job]:
        return service.list_jobs(settings, status=status.value, limit=QUEUE_ROWS)

    return {
        "running": of(JobStatus.RUNNING),
        "queued": of(JobStatus.QUEUED),
        "failed": of(JobStatus.FAILED),
        "figures": service.overview(settings).queue,
    }


def pool(settings: Settings) -> dict[str, Any]:
    overview = service.overview(settings)
    return {"pool": overview.pool, "heartbeats": overview.heartbeats, "size": settings.pool_size}


def servers(settings: Settings) -> dict[str, Any]:
    """The control database and every tenant server, with their references and their tenants'
    jobs, in one snapshot, read as the owner like ``servers list``."""
    rows = service.server_rows(settings)
    return {"rows": rows, "registered": len(rows) > 1}
