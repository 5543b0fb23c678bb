"""The one owner of a job's life in a process: claim it, run its steps, settle it, and say how
it ended as a typed :data:`Outcome`.

A one-off command (``provision``, ``suspend``...) calls :func:`claim_and_run` with the job's id;
a worker's engine process calls :func:`claim_next_and_run` for each job it claims. The
engine settles every outcome it can (complete, retry or fail, release) in the same place; what
it could not settle (:class:`Unsettled`: the database was down when a step failed) and what a
dead engine process left are settled by the worker's parent, and only those.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import assert_never
from uuid import UUID

from provisioner import db, queue
from provisioner.engine.engine import Engine
from provisioner.engine.events import ProgressCallback, StopRequested, describe
from provisioner.errors import (
    ConnectionLost,
    LeaseLost,
    ProvisionerError,
    TenantBusy,
    is_permanent,
)
from provisioner.models import Job, JobStatus


@dataclass(frozen=True)
class Settled:
    """The engine recorded the outcome: succeeded, failed, queued again (backoff), or released
    (``stopped``: a stop request arrived between steps, progress kept)."""

    job: Job
    stopped: bool = False


@dataclass(frozen=True)
class Busy:
    """The job (or another job of its tenant) is held by a live process: nothing ran."""

    job: Job


@dataclass(frozen=True)
class LostLease:
    """Another holder took the job over (recovery, a take-over, a cancel): nothing recorded."""

    job_id: UUID
    detail: str


@dataclass(frozen=True)
class Unsettled:
    """The engine could not record the outcome (the database failed with the step): whoever
    supervises the process settles the job with ``detail`` once the database answers."""

    job: Job
    detail: str
    permanent: bool
    #: hand the job back untouched (a stop request) instead of counting a failed attempt
    release: bool = False
    #: the database cut the attempt short (its session was lost): retry it at once
    cut: bool = False


@dataclass(frozen=True)
class NothingQueued:
    """No job of the asked kinds could be claimed."""


@dataclass(frozen=True)
class ClaimFailed:
    """The database failed the claim: nothing was claimed."""

    detail: str


Outcome = Settled | Busy | LostLease | Unsettled | NothingQueued | ClaimFailed


def run_claimed(
    engine: Engine,
    claimed: queue.Claim,
    *,
    on_progress: ProgressCallback,
    should_stop: StopRequested,
    claim_next: tuple[str, ...] = (),
) -> Outcome:
    """Run a job this process claimed (with its tenant's state, as the claim read it), and
    settle it; never raises for a job's failure. ``claim_next`` has the job's last step claim
    this holder's next job (see :meth:`Engine.run`).
    """
    job = claimed.job
    try:
        done = engine.run(
            job,
            on_progress=on_progress,
            should_stop=should_stop,
            tenant_state=claimed.tenant_state,
            tenant_server=claimed.tenant_server,
            claim_next=claim_next,
        )
    except LeaseLost as exc:
        return LostLease(job.id, describe(exc))
    except Exception as exc:
        # The outcome could not be recorded: the database went away with the step (cut) or
        # failed it (see Engine.run), and the supervisor settles the job once it answers.
        cut = isinstance(exc, ConnectionLost)
        return Unsettled(job, describe(exc), is_permanent(exc), cut=cut)
    return Settled(done, stopped=done.status is JobStatus.QUEUED and should_stop())


def claim_next_and_run(
    engine: Engine,
    job_types: tuple[str, ...],
    *,
    on_claimed: Callable[[queue.Claim], None],
    on_progress: ProgressCallback,
    should_stop: StopRequested,
) -> Outcome:
    """Claim the oldest ready job of ``job_types`` for this engine's holder id (a worker's
    engine process), tell ``on_claimed`` (the job, and whether more were queued), run it and
    settle it.

    The job's last step claims the next job with its own commit, so a child draining the
    queue pays for a claim only when that one found nothing (or the job failed): per job, no
    liveness round trip (see :meth:`Engine.refresh_sessions`), no claim of its own, and the
    tenant's state comes with the claim.
    """
    try:
        engine.refresh_sessions()
        claimed = engine.claim(job_types)
    except ProvisionerError as exc:
        return ClaimFailed(describe(exc))
    if claimed is None:
        return NothingQueued()
    on_claimed(claimed)
    return run_claimed(
        engine, claimed, on_progress=on_progress, should_stop=should_stop, claim_next=job_types
    )


def release(engine: Engine, job: Job, detail: str) -> Outcome:
    """Hand back a job whose step was cut short (the drain timeout), progress kept."""
    try:
        return Settled(engine.release(job), stopped=True)
    except LeaseLost as exc:
        return LostLease(job.id, describe(exc))
    except Exception as exc:
        return Unsettled(job, f"{detail}; then {describe(exc)}", permanent=False, release=True)


#: How often a one-off run looks again at a job another live process holds.
BUSY_POLL_SECONDS = 0.2


def claim_and_run(
    engine: Engine,
    job_id: UUID,
    *,
    on_progress: ProgressCallback,
    should_stop: StopRequested,
    busy_wait: float | None = None,
) -> Outcome:
    """Claim one job now and run it, or wait while a live process holds it (or another job of
    its tenant runs), then claim it. A job that another process finished meanwhile is returned
    as that process left it (a second ``provision T`` reports the first one's outcome);
    :class:`Busy` when ``should_stop`` ends the wait, or once it has lasted ``busy_wait``
    seconds (None: no bound; the run itself is never bounded by it). A dead holder's job is
    taken over.
    """
    conn = engine.control
    deadline = None if busy_wait is None else time.monotonic() + busy_wait
    while True:
        with db.translated():
            claimed = queue.claim_job_with_state(conn, job_id, engine.holder)
            if claimed is not None:
                break
            current = queue.get_job(conn, job_id)
        if current.status.terminal:
            return Settled(current)
        if should_stop() or (deadline is not None and time.monotonic() >= deadline):
            return Busy(current)
        time.sleep(BUSY_POLL_SECONDS)
    return run_claimed(engine, claimed, on_progress=on_progress, should_stop=should_stop)


def settled_job(outcome: Outcome) -> Job:
    """The job of a one-off run's outcome; the other outcomes raise the one-line error the
    command reports."""
    match outcome:
        case Settled(job=job):
            return job
        case Busy(job=job):
            raise TenantBusy(
                f"tenant {job.tenant_id} is busy: its {job.job_type} job {job.id} is "
                f"{job.status.value}"
                + (f" under {job.locked_by}" if job.locked_by else ", behind another of its jobs")
                + f"; follow it with `provisioner status {job.tenant_id} --watch`"
            )
        case LostLease(detail=detail):
            raise LeaseLost(detail)
        case Unsettled(detail=detail):
            # This process's sessions end with it: the next run takes the job over.
            raise ProvisionerError(f"the outcome could not be recorded ({detail}); run it again")
        case NothingQueued() | ClaimFailed():
            raise ProvisionerError("no job was claimed")
        case _:
            assert_never(outcome)
