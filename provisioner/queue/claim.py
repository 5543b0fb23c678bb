"""Claiming: one statement that takes the next job (``FOR UPDATE SKIP LOCKED``), marks it running
and commits before any work, filtered by the job types the caller can run.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any
from uuid import UUID

from provisioner.errors import InvalidInput
from provisioner.models import (
    Job,
)
from provisioner.queue.fence import CLAIM_DURABLE_IF_PLACED, CLAIM_FENCE
from provisioner.queue.rows import TENANT_JOB_LOCK_CLASS, Conn, fetch_one

# Claim the oldest claimable job of the allowed types; SKIP LOCKED keeps claimants apart. A job
# whose tenant has another job running waits (jobs of one tenant never run at the same time,
# whatever their kinds), except that a running row of the application's kinds
# (control.by_application), which app_rw writes as it likes, holds back only the application's
# own kinds: never an owner job. The try-lock keeps two claimants from taking two jobs of one
# tenant: control.try_lock_tenant locks the tenant's control.tenant_locks row, which app_rw can
# neither take nor hold, for the owner, and takes the old advisory lock for anyone else (a
# product worker's claim as app_rw, whose hold then stalls only the application's own kinds).
# A row no claim could load (a non-finite time: impossible since control c005) is passed by;
# FAIL_UNPROCESSABLE fails it with a reason. The try-lock is tried only on a job of the given
# kinds: a CASE, because the planner orders a filter's conditions by their cost, and a generic
# plan (a job-type array of unknown length) put the lock first. Taken on another kind's job, it
# would be held to the end of the claim's transaction, and that kind's claimants would pass the
# job by meanwhile (tests/integration/test_queue.py). A job is ready by the statement's clock,
# not its transaction's: a hand-off claims in a step's transaction begun before the job was
# queued (a move's copy), and would pass by every job queued since.
CLAIMABLE = """
    SELECT id FROM control.platform_jobs q
     WHERE status = 'queued' AND available_at <= statement_timestamp()
       AND job_type = ANY(%(job_types)s)
       AND NOT EXISTS (SELECT 1 FROM control.platform_jobs r
                        WHERE r.tenant_id = q.tenant_id AND r.status = 'running'
                          AND (NOT control.by_application(r.job_type)
                               OR control.by_application(q.job_type)))
       AND CASE WHEN job_type <> ALL(%(job_types)s) THEN false
                WHEN tenant_id IS NULL THEN true
                ELSE control.try_lock_tenant(tenant_id, %(lock_class)s) END
       AND isfinite(available_at) AND isfinite(created_at) AND isfinite(updated_at)
       AND jsonb_typeof(steps_completed) = 'array'
     ORDER BY available_at, created_at
     LIMIT 1
       FOR UPDATE SKIP LOCKED
"""


# The claim's common expressions (``claimed``: the job's row as claimed, and the ``xmin`` its
# claim wrote, the run's fencing token: queue/fence.py), which CLAIM_NEXT and the hand-off's
# claim (queue/handoff.py) select from. Its times are the statement's: a hand-off claims in
# the last step's transaction, which may have begun long before (a move's freeze), and a job
# stamped with that transaction's start would count as without progress for that long
# (RECOVER_STALE).
CLAIMING = f"""next AS ({CLAIMABLE}), claimed AS (
    UPDATE control.platform_jobs AS j
       SET status = 'running', attempts = j.attempts + 1, locked_at = clock_timestamp(),
           locked_by = %(worker)s, updated_at = clock_timestamp()
      FROM next
     WHERE j.id = next.id
    RETURNING j.*, j.xmin AS claim_xmin
)"""

# ``more``: another ready job of the kinds was queued when the claim ran (a hint, read from the
# claim's own snapshot through the queue's partial index: it may count a job another claimant
# is taking at that moment, never misses one queued before the claim). A worker asks its next
# idle child to claim only when it is true (worker/wakeups.py).
MORE_QUEUED = """EXISTS (SELECT 1 FROM control.platform_jobs o
                 WHERE o.status = 'queued' AND o.available_at <= statement_timestamp()
                   AND o.job_type = ANY(%(job_types)s) AND o.id <> claimed.id) AS more"""


# The step engine's claim, with the tenant's state and server, the hint, and the run's fencing
# token; its commit waits for the disk when the tenant lives on a tenant server (the token is
# used there: queue/fence.py), else it keeps the session's mode (asynchronous for the engine).
CLAIM_NEXT = f"""
WITH {CLAIMING}
SELECT claimed.*, t.state AS tenant_state, t.server AS tenant_server,
       {MORE_QUEUED}, {CLAIM_FENCE} AS fence_token, {CLAIM_DURABLE_IF_PLACED} AS commit_waits
  FROM claimed LEFT JOIN control.tenants t ON t.tenant_id = claimed.tenant_id
"""


# A one-off command's claim of one given job (CLAIM_QUEUED_ALONE, CLAIM_QUEUED_JOB or
# TAKE_OVER_JOB), and in the same statement: the open step runs of the job's earlier attempts
# closed (a claim after them proves their holder gone), and the tenant's state, as CLAIM_NEXT
# reads it for the engine.
_CLAIM_JOB = """
WITH claimed AS (
    UPDATE control.platform_jobs AS j
       SET status = 'running', attempts = j.attempts + 1, locked_at = now(),
           locked_by = %(worker)s, available_at = now(), updated_at = now()
     WHERE j.id = %(id)s AND {}
    RETURNING j.*
), abandoned AS (
    UPDATE control.job_step_runs s
       SET finished_at = clock_timestamp(), outcome = 'abandoned',
           detail = 'holder died; step outcome unknown (its transaction rolled back)'
      FROM claimed
     WHERE s.job_id = claimed.id AND s.attempt < claimed.attempts AND s.outcome = 'running'
)
SELECT claimed.*, t.state AS tenant_state, t.server AS tenant_server
  FROM claimed LEFT JOIN control.tenants t ON t.tenant_id = claimed.tenant_id
"""


# A queued job's claim, unless another job of its tenant is running (and, with the condition
# filled in, only one whose holder is live); a running row of the application's kinds holds
# back only the application's kinds, as in CLAIMABLE.
_CLAIM_QUEUED = _CLAIM_JOB.format("""j.status = 'queued'
       AND NOT EXISTS (SELECT 1 FROM control.platform_jobs r
                        WHERE r.tenant_id = j.tenant_id AND r.id <> j.id AND r.status = 'running'
                          AND (NOT control.by_application(r.job_type)
                               OR control.by_application(j.job_type))
                          {})""")


# Claim one given job that is queued (ready or not) when no other job of its tenant runs: a
# one-off command does it now. The usual case, and cheap to plan.
CLAIM_QUEUED_ALONE = _CLAIM_QUEUED.format("")


# The same when another job of its tenant runs, unless under a live holder (a holder is live
# while a session carries its name). pg_stat_activity is costly to plan (a new session's first
# use of it takes milliseconds), so this runs only when the claim above found another job.
CLAIM_QUEUED_JOB = _CLAIM_QUEUED.format(
    "AND EXISTS (SELECT 1 FROM pg_stat_activity a WHERE a.application_name = r.locked_by)"
)


# Take over one running job whose holder has no live session (a one-off CLI that was killed);
# only when the claims above found the job running.
TAKE_OVER_JOB = _CLAIM_JOB.format("""j.status = 'running'
       AND NOT EXISTS (SELECT 1 FROM pg_stat_activity a WHERE a.application_name = j.locked_by)""")


def claim_next(conn: Conn, job_types: tuple[str, ...] | list[str], worker: str) -> Job | None:
    """Claim the oldest ready job of ``job_types`` for ``worker`` and commit the claim."""
    claimed = claim_next_with_state(conn, job_types, worker)
    conn.commit()
    return claimed.job if claimed else None


@dataclass(frozen=True)
class Claim:
    """A job the step engine claimed, and its tenant's lifecycle state read by the same
    statement (None: the job has no tenant, or the tenant no control row), and the tenant
    server it lives on (None: the control database, or no control row)."""

    job: Job
    tenant_state: str | None
    tenant_server: str | None = None
    #: another ready job of the claimed kinds was queued (CLAIM_NEXT's hint; True when unread)
    more: bool = True
    #: the run's fencing token for a tenant server, when the claim's own write gives one
    #: (CLAIM_NEXT alone in its transaction, or in a hand-off's savepoint: queue/fence.py)
    fence: int | None = None


def claim_params(job_types: Sequence[str], worker: str) -> dict[str, Any]:
    if not job_types:
        raise InvalidInput("at least one job type is required")
    return {"job_types": list(job_types), "worker": worker, "lock_class": TENANT_JOB_LOCK_CLASS}


def plan_claim(conn: Conn, worker: str) -> None:
    """Run the claim of no job type (it takes nothing and tries no tenant's lock), prepared,
    so that a session keeping generic plans (the engine's control session) holds the claim's
    plan ready: the next claim after a sign-up's wake-up skips planning it (0.3-0.5 ms with
    the plans every schema rename resets)."""
    with conn.cursor() as cur:
        nothing = {"job_types": [], "worker": worker, "lock_class": TENANT_JOB_LOCK_CLASS}
        cur.execute(CLAIM_NEXT, nothing, prepare=True)


def as_claim(row: dict[str, Any] | None) -> Claim | None:
    if not row:
        return None
    more, fence = row.get("more"), row.get("fence_token")
    return Claim(
        Job.from_row(row),
        row["tenant_state"],
        row.get("tenant_server"),
        more is not False,
        None if fence is None else int(fence),
    )


def claim_next_with_state(conn: Conn, job_types: Sequence[str], worker: str) -> Claim | None:
    """The step engine's claim: the oldest ready job of ``job_types`` for ``worker``, with its
    tenant's state. On an autocommit session the statement commits itself; in a transaction it
    commits with it."""
    return as_claim(fetch_one(conn, CLAIM_NEXT, claim_params(job_types, worker)))


def claim_job(conn: Conn, job_id: UUID, worker: str) -> Job | None:
    """Claim one job by id (queued, or running under a dead holder) and commit the claim."""
    claimed = claim_job_with_state(conn, job_id, worker)
    return claimed.job if claimed else None


def claim_job_with_state(conn: Conn, job_id: UUID, worker: str) -> Claim | None:
    """:func:`claim_job`, with the tenant's state read by the claiming statement (for the
    engine). One statement when no other job of the tenant runs."""
    params = {"id": job_id, "worker": worker}
    row = (
        fetch_one(conn, CLAIM_QUEUED_ALONE, params)
        or fetch_one(conn, CLAIM_QUEUED_JOB, params)
        or fetch_one(conn, TAKE_OVER_JOB, params)
    )
    conn.commit()
    return as_claim(row)
