"""Every write to a claimed job, fenced by its :class:`~provisioner.models.Lease` (``id``,
``locked_by``, ``attempts``): once recovery, a take-over or a cancel changed the row, the old
holder's writes match nothing and raise :class:`~provisioner.errors.LeaseLost`. A step's
checkpoint, the job's end, a retry with backoff, a release.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any
from uuid import UUID

from psycopg.rows import dict_row
from psycopg.sql import Composed
from psycopg.types.json import Jsonb

from provisioner.db.pipelines import pipeline
from provisioner.errors import InvalidInput, LeaseLost
from provisioner.models import (
    Job,
    Lease,
)
from provisioner.queue.claim import CLAIM_NEXT, Claim, as_claim, claim_params
from provisioner.queue.fence import CLAIM_RELEASE, CLAIM_SAVEPOINT
from provisioner.queue.handoff import (
    CLAIM_NEXT_OPENING,
    OpenedRun,
    claim_opening_params,
    opened_run,
)
from provisioner.queue.journal import run_detail
from provisioner.queue.rows import (
    BACKOFF_CAP_SECONDS,
    LOCK_WAIT_CAP_SECONDS,
    Conn,
    bounded_error,
    fetch_all,
    fetch_one,
)

# Record one finished step with the new progress, fenced by the lease. The lease and the
# progress time are renewed with clock_timestamp(): now() is the start of the step's
# transaction, which may be older than the lease itself after a long step (and the stale
# threshold bounds the time between two steps: admin.RECOVER_STALE).
_RECORD_STEP = """
UPDATE control.platform_jobs
   SET steps_completed = %(steps)s, progress = %(progress)s, locked_at = clock_timestamp(),
       lock_waits = 0, updated_at = clock_timestamp()
 WHERE id = %(id)s AND status = 'running' AND locked_by = %(worker)s AND attempts = %(attempts)s
RETURNING *"""


RECORD_STEP = _RECORD_STEP + "\n"


# Finish a job successfully, fenced by the lease. ``finished_at`` is the clock when the job
# ended, not the start of the transaction that ended it: for a job completed with its last step
# (RECORD_LAST_STEP), that step's work is part of the job's time.
COMPLETE = """
UPDATE control.platform_jobs
   SET status = 'succeeded', progress = 100, error_detail = NULL, locked_at = NULL,
       locked_by = NULL, lock_waits = 0, finished_at = clock_timestamp(), updated_at = now()
 WHERE id = %(id)s AND status = 'running' AND locked_by = %(worker)s AND attempts = %(attempts)s
RETURNING *
"""


# Record a job's last step and complete the job in one statement, fenced by the lease (the same
# end state as RECORD_STEP then COMPLETE). A step's transaction begins with asynchronous commit
# (engine.LOCK_ASYNC_COMMIT); the statement that completes the job makes its commit wait for the
# disk again, whichever steps share the transaction: what a caller is told succeeded is durable,
# and that flush makes the job's earlier steps durable with it.
RECORD_LAST_STEP = """
UPDATE control.platform_jobs
   SET steps_completed = %(steps)s, status = 'succeeded', progress = 100, error_detail = NULL,
       locked_at = NULL, locked_by = NULL, lock_waits = 0, finished_at = clock_timestamp(),
       updated_at = now()
 WHERE id = %(id)s AND status = 'running' AND locked_by = %(worker)s AND attempts = %(attempts)s
RETURNING *, set_config('synchronous_commit', 'on', true) AS commit_waits
"""


# A step's end in one statement (close_step): its journal row closed, as STEP_RUN_FINISH does,
# by a data-modifying CTE of the fenced checkpoint (RECORD_STEP / RECORD_LAST_STEP).
_CLOSE_RUN = """
WITH closed_at AS MATERIALIZED (SELECT clock_timestamp() AS at),
closed_run AS (
    UPDATE control.job_step_runs
       SET finished_at = (SELECT at FROM closed_at), outcome = 'succeeded', detail = %(detail)s
     WHERE id = %(run_id)s AND outcome = 'running'
)"""


CLOSE_STEP = _CLOSE_RUN + RECORD_STEP


CLOSE_LAST_STEP = _CLOSE_RUN + RECORD_LAST_STEP


# The same end of a step that is not the job's last, which also opens the journal row of the
# job's next step (STEP_RUN_OPEN's row, started when this one finished): it commits with this
# step, so the next step begins without a start row of its own to write and wait for, and a
# process killed in between leaves that row open for recovery to mark abandoned, as a start row
# would. Its id comes back as ``next_run_id`` beside the job's row.
CLOSE_STEP_OPEN_NEXT = (
    _CLOSE_RUN
    + """, next_run AS (
    INSERT INTO control.job_step_runs (job_id, tenant_id, run, attempt, step, worker, started_at)
    SELECT %(id)s, %(tenant_id)s, %(run)s, %(attempts)s, %(next_step)s, %(worker)s, at
      FROM closed_at
    RETURNING id
)"""
    + _RECORD_STEP
    + ", (SELECT id FROM next_run) AS next_run_id\n"
)


# Fail terminally when attempts are spent (or the error is permanent), else back off. A job
# that gave up waiting for a lock (``contended``: an application's transaction holds it) is
# queued again whatever its attempts, and hands its attempt back (as RELEASE does): waiting
# behind the application is not a failure, spends no attempt and trips no rollout brake.
# ``lock_waits`` counts those in a row, for their own backoff (1 s doubling, capped at
# LOCK_WAIT_CAP_SECONDS); a completed step, or a failure of another kind, resets it. An
# attempt the database cut short (``at_once``: the session was lost, errors.ConnectionLost) is
# retried at once, its attempt counted: no fault of the job, and the backoff would only leave
# it waiting behind the queue once the database is back (a failover's in-flight jobs).
FAIL_OR_RETRY = """
UPDATE control.platform_jobs
   SET status = CASE WHEN %(contended)s THEN 'queued'
                     WHEN %(permanent)s OR attempts >= max_attempts THEN 'failed'
                     ELSE 'queued' END,
       attempts = CASE WHEN %(contended)s THEN greatest(attempts - 1, 0) ELSE attempts END,
       lock_waits = CASE WHEN %(contended)s THEN lock_waits + 1 ELSE 0 END,
       available_at = CASE WHEN %(contended)s THEN now() + make_interval(
                                secs => least(%(lock_cap)s, power(2, least(lock_waits, 8))))
                           WHEN %(permanent)s OR attempts >= max_attempts THEN available_at
                           WHEN %(at_once)s THEN now()
                           ELSE now() + make_interval(
                                    secs => least(%(cap)s, power(2, least(attempts, 8))))
                      END,
       finished_at = CASE WHEN %(contended)s THEN NULL
                          WHEN %(permanent)s OR attempts >= max_attempts THEN clock_timestamp()
                     END,
       error_detail = %(error)s, locked_at = NULL, locked_by = NULL, updated_at = now()
 WHERE id = %(id)s AND status = 'running' AND locked_by = %(worker)s AND attempts = %(attempts)s
RETURNING *
"""


# Hand a claimed job back untouched (graceful shutdown): the attempt is not counted.
RELEASE = """
UPDATE control.platform_jobs
   SET status = 'queued', attempts = greatest(attempts - 1, 0), available_at = now(),
       locked_at = NULL, locked_by = NULL, updated_at = now()
 WHERE id = %(id)s AND status = 'running' AND locked_by = %(worker)s AND attempts = %(attempts)s
RETURNING *
"""


# Hand back the jobs a dead engine process claimed but never reported to its worker (it died
# between its claim and its report): none of their steps started, so the attempt is not counted,
# and the journal row the claim opened for the first step (queue/handoff.py) goes with it.
RELEASE_UNREPORTED = """
WITH released AS (
    UPDATE control.platform_jobs
       SET status = 'queued', attempts = greatest(attempts - 1, 0), available_at = now(),
           locked_at = NULL, locked_by = NULL, updated_at = now()
     WHERE status = 'running' AND locked_by = %(worker)s AND NOT id = ANY(%(reported)s)
    RETURNING *
), unopened AS (
    DELETE FROM control.job_step_runs s USING released r
     WHERE s.job_id = r.id AND s.worker = %(worker)s AND s.outcome = 'running'
)
SELECT * FROM released
"""


# Renew the leases a live worker holds, so long steps are never taken for abandoned. A job row
# locked now is locked by its holder's own open transaction (a move's freeze holds its row
# until the switch): that holder is alive, and the row is skipped, not waited for; waiting
# stalled the worker's whole heartbeat (and so every other child's lease) behind the copy.
RENEW_LEASES = """
UPDATE control.platform_jobs SET locked_at = now()
 WHERE id IN (SELECT id FROM control.platform_jobs
               WHERE status = 'running' AND locked_by = ANY(%(holders)s)
                 FOR UPDATE SKIP LOCKED)
RETURNING id
"""


# A worker's heartbeat for its lease holders (its engine processes), in one statement: each
# holder's row in control.lease_holders beaten with the lease it promises (a dead holder's jobs
# are recovered once it is older than that: RECOVER_STALE), and every job they hold renewed.
BEAT_HOLDERS = (
    """
WITH beaten AS (
    INSERT INTO control.lease_holders (holder, component, instance_id, beat_at, lease_seconds)
    SELECT holder, %(component)s, %(instance_id)s, now(), %(lease)s
      FROM unnest(%(holders)s::text[]) AS h(holder)
    ON CONFLICT (holder) DO UPDATE
       SET component = excluded.component, instance_id = excluded.instance_id,
           beat_at = excluded.beat_at, lease_seconds = excluded.lease_seconds
)
"""
    + RENEW_LEASES
)


# A worker that stops cleanly forgets its holders, but one still holding a running job (its
# outcome could not be recorded): that job is recovered once the holder's lease runs out.
FORGET_HOLDERS = """
DELETE FROM control.lease_holders h
 WHERE h.instance_id = %(instance_id)s
   AND NOT EXISTS (SELECT 1 FROM control.platform_jobs j
                    WHERE j.status = 'running' AND j.locked_by = h.holder)
"""


def _fenced(conn: Conn, statement: str, lease: Lease, **params: Any) -> Job:
    row = fetch_one(
        conn,
        statement,
        {"id": lease.job_id, "worker": lease.locked_by, "attempts": lease.attempts, **params},
    )
    if row is None:
        raise LeaseLost(_lease_lost(lease))
    return Job.from_row(row)


def _lease_lost(lease: Lease) -> str:
    return (
        f"job {lease.job_id} is no longer held by {lease.locked_by} (attempt "
        f"{lease.attempts}): it was recovered, re-claimed or cancelled"
    )


def _check_progress(progress: int) -> None:
    if not 0 <= progress <= 100:
        raise InvalidInput(f"progress must be between 0 and 100, got {progress}")


def record_step(conn: Conn, lease: Lease, done: list[str], progress: int) -> Job:
    """Record the finished steps (the caller orders them) and the progress they make."""
    _check_progress(progress)
    return _fenced(conn, RECORD_STEP, lease, steps=Jsonb(list(done)), progress=progress)


@dataclass(frozen=True)
class ClosedStep:
    """What :func:`close_step` recorded: the job as the checkpoint left it, the next job its
    commit claims (``claim_next``), the journal row it opened for the job's next step, and the
    one it opened for the claimed job's first step (``first_steps``: queue/handoff.py)."""

    job: Job
    claimed: Claim | None = None
    next_run_id: int | None = None
    opened: OpenedRun | None = None


@dataclass(frozen=True)
class NextStep:
    """The job's next step, whose journal row :func:`close_step` opens: its tenant and name."""

    tenant_id: str | None
    step: str


def close_step(
    conn: Conn,
    run_id: int,
    detail: str | None,
    lease: Lease,
    done: list[str],
    progress: int,
    *,
    last: bool,
    claim_next: Sequence[str] = (),
    open_next: NextStep | None = None,
    first_steps: Mapping[str, Sequence[str]] | None = None,
    begin_with: Composed | None = None,
) -> ClosedStep:
    """End a step inside its own transaction: close its journal row and record the fenced
    checkpoint (``last``: and complete the job) in one statement, and, with ``claim_next``,
    claim the holder's next job of those kinds in the same round trip (pipeline mode), so that
    the claim commits with the step instead of costing a round trip and a commit of its own.
    With ``open_next`` (a step that is not the last), the same statement opens the journal row
    of the job's next step (:data:`CLOSE_STEP_OPEN_NEXT`). With ``first_steps`` too (each
    kind's steps), the claim also opens the claimed job's first step's journal row
    (:data:`provisioner.queue.handoff.CLAIM_NEXT_OPENING`). With ``begin_with``, the caller's
    transaction was begun deferred (nothing sent yet: :meth:`provisioner.db.Session.transaction`):
    its ``BEGIN`` and that first statement (the tenant's lock, values as literals) go first, in
    the same round trip.

    Raises :class:`LeaseLost` when the fence matched nothing: the caller's transaction then
    rolls back, the step's work, its journal close and the claim with it.
    """
    _check_progress(progress)
    params = {
        "id": lease.job_id,
        "worker": lease.locked_by,
        "attempts": lease.attempts,
        "steps": Jsonb(list(done)),
        "progress": progress,
        "run_id": run_id,
        "detail": run_detail(detail),
    }
    if last:
        statement = CLOSE_LAST_STEP
    elif open_next is not None:
        statement = CLOSE_STEP_OPEN_NEXT
        params.update(run=lease.run, tenant_id=open_next.tenant_id, next_step=open_next.step)
    else:
        statement = CLOSE_STEP
    claimed_row = None
    with conn.cursor(row_factory=dict_row) as record:
        if claim_next:
            claiming, claiming_params = (
                (CLAIM_NEXT, claim_params(claim_next, lease.locked_by))
                if first_steps is None
                else (
                    CLAIM_NEXT_OPENING,
                    claim_opening_params(claim_next, lease.locked_by, first_steps),
                )
            )
            with conn.cursor(row_factory=dict_row) as claim:
                with pipeline(conn):
                    _begin(conn, begin_with)
                    record.execute(statement, params)
                    # in a savepoint: the claim's id of its own is the run's token (fence.py)
                    conn.execute(CLAIM_SAVEPOINT)
                    claim.execute(claiming, claiming_params)
                    conn.execute(CLAIM_RELEASE)
                claimed_row = claim.fetchone()
        elif begin_with is not None:
            with pipeline(conn):
                _begin(conn, begin_with)
                record.execute(statement, params)
        else:
            record.execute(statement, params)
        row = record.fetchone()
    if row is None:
        raise LeaseLost(_lease_lost(lease))
    next_run = row.get("next_run_id")
    return ClosedStep(
        Job.from_row(row),
        as_claim(claimed_row),
        None if next_run is None else int(next_run),
        opened_run(claimed_row),
    )


def _begin(conn: Conn, first: Composed | None) -> None:
    """In a pipeline, the ``BEGIN`` of a transaction begun deferred, and its first statement
    (the session is in autocommit: the ``BEGIN`` keeps the transaction open past the Sync).
    Neither is prepared: the lock names its tenant, a statement of its own for each."""
    if first is not None:
        conn.execute("BEGIN", prepare=False)
        conn.execute(first, prepare=False)


def complete(conn: Conn, lease: Lease) -> Job:
    return _fenced(conn, COMPLETE, lease)


def fail_or_retry(
    conn: Conn,
    lease: Lease,
    error: str,
    *,
    permanent: bool = False,
    contended: bool = False,
    at_once: bool = False,
) -> Job:
    """Back off and requeue, or fail when attempts are spent or the error is permanent.
    ``contended``: the job gave up waiting for a lock; it is queued again without spending an
    attempt. ``at_once``: the database cut the attempt short (a lost session); it is queued
    again without a backoff (:data:`FAIL_OR_RETRY`)."""
    return _fenced(
        conn,
        FAIL_OR_RETRY,
        lease,
        error=bounded_error(error),
        permanent=permanent,
        contended=contended,
        at_once=at_once,
        cap=BACKOFF_CAP_SECONDS,
        lock_cap=LOCK_WAIT_CAP_SECONDS,
    )


def release(conn: Conn, lease: Lease) -> Job:
    return _fenced(conn, RELEASE, lease)


def release_unreported(conn: Conn, worker: str, reported: list[UUID]) -> list[Job]:
    """Queue again, untouched, the jobs ``worker`` (a dead engine process) holds other than the
    ``reported`` ones: it claimed them and died before telling its worker, so none of their
    steps started."""
    return [
        Job.from_row(r)
        for r in fetch_all(conn, RELEASE_UNREPORTED, {"worker": worker, "reported": reported})
    ]


def renew_leases(conn: Conn, holders: list[str]) -> int:
    return len(fetch_all(conn, RENEW_LEASES, {"holders": holders}))


@dataclass(frozen=True)
class HolderBeat:
    """Who beats for a set of lease holders, and the lease each beat promises: a holder not
    heard from for ``lease_seconds`` is taken for dead and its jobs are recovered."""

    component: str
    instance_id: str
    lease_seconds: float


def beat_holders(conn: Conn, beat: HolderBeat, holders: list[str]) -> int:
    """Beat for ``holders`` and renew every job they hold (:data:`BEAT_HOLDERS`); the number of
    jobs renewed."""
    params = {
        "component": beat.component,
        "instance_id": beat.instance_id,
        "lease": beat.lease_seconds,
        "holders": holders,
    }
    return len(fetch_all(conn, BEAT_HOLDERS, params))


def forget_holders(conn: Conn, instance_id: str) -> None:
    with conn.cursor() as cur:
        cur.execute(FORGET_HOLDERS, {"instance_id": instance_id})
