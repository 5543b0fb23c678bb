"""The operator's levers and views on the queue: recovery of stale jobs, cancel, retry, re-open,
listings and a tenant's latest job.
"""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass
from uuid import UUID

from provisioner.errors import InvalidInput, UnknownJob
from provisioner.models import (
    Job,
    TenantId,
)
from provisioner.queue.enqueue import REOPEN_SUCCEEDED, REQUEUE_TERMINAL, notify, start_run
from provisioner.queue.journal import STEP_RUNS_ABANDON
from provisioner.queue.rows import (
    HOLDER_SILENT_DETAIL,
    RECOVERED_DETAIL,
    UNPROCESSABLE_DETAIL,
    Conn,
    fetch_all,
    fetch_one,
)

# A fleet upgrade: open many succeeded jobs again in one statement (one NOTIFY follows), with
# only the migration step left to run and the head it goes to in the payload.
REOPEN_FOR_UPGRADE = """
WITH reopened AS (
    UPDATE control.platform_jobs
       SET status = 'queued', attempts = 0, run = run + 1, available_at = now(),
           finished_at = NULL, steps_completed = steps_completed - %(step)s::text,
           payload = payload || jsonb_build_object(%(key)s::text, %(head)s::text),
           updated_at = now()
     WHERE id = ANY(%(ids)s) AND status = 'succeeded'
    RETURNING *
), started AS (
    INSERT INTO control.job_runs (job_id, run, job_type, started_by)
    SELECT id, run, job_type, %(started_by)s FROM reopened
    ON CONFLICT (job_id, run) DO NOTHING
)
SELECT * FROM reopened
"""


# Bulk recovery: every failed job (of one type, or all) back in the queue, attempts reset.
RETRY_FAILED = """
WITH retried AS (
    UPDATE control.platform_jobs
       SET status = 'queued', attempts = 0, run = run + 1, available_at = now(),
           locked_at = NULL, locked_by = NULL, finished_at = NULL, updated_at = now()
     WHERE status = 'failed' AND (%(job_type)s::text IS NULL OR job_type = %(job_type)s)
    RETURNING *
), started AS (
    INSERT INTO control.job_runs (job_id, run, job_type, started_by)
    SELECT id, run, job_type, %(started_by)s FROM retried
    ON CONFLICT (job_id, run) DO NOTHING
)
SELECT * FROM retried
"""


# The lease holders that stopped beating: not heard from for longer than the lease their last
# beat promised. A server restart gives every holder a full lease again (no holder could beat
# while it was down), counted from the server's start.
SILENT_HOLDERS = """
SELECT h.holder FROM control.lease_holders h
 WHERE greatest(h.beat_at, pg_postmaster_start_time())
       + make_interval(secs => h.lease_seconds) < now()
"""


# Requeue (or fail, when attempts are spent) running jobs whose lease has expired: held by a
# holder that stopped beating (SILENT_HOLDERS); not renewed for the stale threshold (a holder
# that never beats, such as a one-off command); or, for the owner's kinds, without progress
# (no step recorded since the claim or the last step) for the stale threshold although its
# holder beats: a stuck holder. The stale threshold is the outer bound of a step. A job row
# locked now is in its holder's open transaction (a live one: a dead holder's transaction ends
# with its session, or at the idle timeout): skipped, not waited for, which stalled the
# recovering worker's loop behind a move's copy.
RECOVER_STALE = f"""
WITH silent AS MATERIALIZED ({SILENT_HOLDERS.strip()}),
stale AS (
    SELECT id FROM control.platform_jobs
     WHERE status = 'running'
       AND (locked_at < now() - make_interval(secs => %(stale)s)
            OR (updated_at < now() - make_interval(secs => %(stale)s)
                AND (locked_at IS NULL OR NOT control.by_application(job_type)))
            OR locked_by IN (SELECT holder FROM silent))
       FOR UPDATE SKIP LOCKED
)
UPDATE control.platform_jobs
   SET status = CASE WHEN attempts >= max_attempts THEN 'failed' ELSE 'queued' END,
       available_at = now(),
       finished_at = CASE WHEN attempts >= max_attempts THEN now() END,
       error_detail = CASE WHEN locked_by IN (SELECT holder FROM silent) THEN %(silent_detail)s
                           ELSE %(detail)s END,
       locked_at = NULL, locked_by = NULL, updated_at = now()
 WHERE id IN (SELECT id FROM stale)
RETURNING *
"""


# Forget the holders that stopped beating and hold nothing any more (RECOVER_STALE took their
# jobs back): a holder row lives as long as its holder beats, and a lease after it. The owner's.
FORGET_SILENT_HOLDERS = f"""
DELETE FROM control.lease_holders h
 WHERE h.holder IN ({SILENT_HOLDERS.strip()})
   AND NOT EXISTS (SELECT 1 FROM control.platform_jobs j
                    WHERE j.status = 'running' AND j.locked_by = h.holder)
"""


# Running jobs of the owner's kinds whose holder stopped beating, per holder: what ``health``
# reports while they wait for recovery. A row of the application's kinds
# (control.by_application) is not counted: the application role writes its status and
# locked_by, and may name any holder there. Read by the application role too (it may read both
# tables).
ORPHANED_JOBS = f"""
SELECT h.holder, h.component, h.instance_id, count(j.id)::int AS jobs,
       extract(epoch FROM now() - h.beat_at)::float AS silent_seconds, h.lease_seconds
  FROM control.lease_holders h
  JOIN control.platform_jobs j ON j.locked_by = h.holder AND j.status = 'running'
                              AND NOT control.by_application(j.job_type)
 WHERE h.holder IN ({SILENT_HOLDERS.strip()})
 GROUP BY h.holder, h.component, h.instance_id, h.beat_at, h.lease_seconds
 ORDER BY h.holder
"""


# Fail the unfinished jobs no worker could load or lease (a time that is not finite, steps
# that are not a list), repairing the values so every reader can load the row again.
FAIL_UNPROCESSABLE = """
UPDATE control.platform_jobs
   SET status = 'failed', error_detail = %(detail)s, finished_at = now(), updated_at = now(),
       created_at = CASE WHEN isfinite(created_at) THEN created_at ELSE now() END,
       available_at = CASE WHEN isfinite(available_at) THEN available_at ELSE now() END,
       steps_completed = CASE WHEN jsonb_typeof(steps_completed) = 'array'
                              THEN steps_completed ELSE '[]'::jsonb END,
       locked_at = NULL, locked_by = NULL
 WHERE status IN ('queued', 'running')
   AND NOT (isfinite(created_at) AND isfinite(updated_at) AND isfinite(available_at)
            AND coalesce(isfinite(locked_at), true) AND coalesce(isfinite(finished_at), true)
            AND jsonb_typeof(steps_completed) = 'array')
RETURNING *
"""


# Cancel a job that has not finished; a running holder's fenced writes then match nothing.
CANCEL = """
UPDATE control.platform_jobs
   SET status = 'cancelled', locked_at = NULL, locked_by = NULL, finished_at = now(),
       updated_at = now()
 WHERE id = %(id)s AND status IN ('queued', 'running')
RETURNING *
"""


GET_JOB = "SELECT * FROM control.platform_jobs WHERE id = %(id)s"


# The tenant's most recently changed job of any of the owner's kinds: a row of the
# application's kinds (control.by_application) is the application's to write, its times and
# error text included, so it never stands for the tenant's state.
LATEST_ANY_FOR_TENANT = """
SELECT * FROM control.platform_jobs
 WHERE tenant_id = %(tenant_id)s AND NOT control.by_application(job_type)
 ORDER BY updated_at DESC, created_at DESC LIMIT 1
"""


# The newest job of a type for a tenant.
LATEST_FOR_TENANT = """
SELECT * FROM control.platform_jobs
 WHERE tenant_id = %(tenant_id)s AND job_type = %(job_type)s
 ORDER BY created_at DESC LIMIT 1
"""


# The newest job of a type of each tenant (all tenants, or the named ones), by tenant id.
LATEST_JOBS = """
SELECT DISTINCT ON (tenant_id) * FROM control.platform_jobs
 WHERE job_type = %(job_type)s AND tenant_id IS NOT NULL
   AND (%(tenants)s::text[] IS NULL OR tenant_id = ANY(%(tenants)s))
 ORDER BY tenant_id, created_at DESC
"""


# Operator view: running first, then newest; of one status, tenant or job type when asked.
LIST_JOBS = """
SELECT * FROM control.platform_jobs
 WHERE (%(status)s::text IS NULL OR status = %(status)s)
   AND (%(tenant)s::text IS NULL OR tenant_id = %(tenant)s)
   AND (%(kind)s::text IS NULL OR job_type = %(kind)s)
 ORDER BY (status = 'running') DESC, updated_at DESC
 LIMIT %(limit)s
"""


def recover_stale(
    conn: Conn, stale_after_seconds: float, unjournaled: Collection[str] = ()
) -> list[Job]:
    """Requeue or fail running jobs whose lease expired (their holder stopped beating, or the
    lease was not renewed for ``stale_after_seconds``), closing their open step runs; fail
    (with a reason) the unfinished jobs no worker could load, so none stalls the queue.
    ``unjournaled``: the job types whose steps no engine records (the application's)."""
    rows = fetch_all(conn, FAIL_UNPROCESSABLE, {"detail": UNPROCESSABLE_DETAIL})
    params = {
        "stale": stale_after_seconds,
        "detail": RECOVERED_DETAIL,
        "silent_detail": HOLDER_SILENT_DETAIL,
    }
    rows += fetch_all(conn, RECOVER_STALE, params)
    # Step runs are the owner's engine's (app_rw may not write them); product jobs have none.
    owned = [row["id"] for row in rows if row["job_type"] not in unjournaled]
    if owned:
        with conn.cursor() as cur:
            cur.execute(STEP_RUNS_ABANDON, {"job_ids": owned})
    return [Job.from_row(row) for row in rows]


def forget_silent_holders(conn: Conn) -> None:
    """Delete the rows of lease holders that stopped beating and hold no running job."""
    with conn.cursor() as cur:
        cur.execute(FORGET_SILENT_HOLDERS)


@dataclass(frozen=True)
class OrphanedJobs:
    """Running jobs of the owner's kinds held by a lease holder that stopped beating, waiting
    for recovery."""

    holder: str
    component: str
    instance_id: str
    jobs: int
    silent_seconds: float
    lease_seconds: float


def orphaned_jobs(conn: Conn) -> list[OrphanedJobs]:
    """Per silent holder, how many running jobs of the owner's kinds it still holds
    (:data:`ORPHANED_JOBS`)."""
    return [OrphanedJobs(**row) for row in fetch_all(conn, ORPHANED_JOBS, {})]


def cancel(conn: Conn, job_id: UUID) -> Job:
    row = fetch_one(conn, CANCEL, {"id": job_id})
    if row is None:
        get_job(conn, job_id)  # raises UnknownJob when there is no such job
        raise InvalidInput(f"job {job_id} has already finished; only queued or running jobs cancel")
    return Job.from_row(row)


def retry(conn: Conn, job_id: UUID, *, started_by: str = "jobs retry") -> Job:
    """Queue a failed or cancelled job again: a new run (attempts reset, recorded steps kept)."""
    row = fetch_one(conn, REQUEUE_TERMINAL, {"id": job_id})
    if row is None:
        job = get_job(conn, job_id)  # raises UnknownJob when there is no such job
        raise InvalidInput(
            f"job {job_id} is {job.status.value}; only failed or cancelled jobs can be retried"
        )
    job = Job.from_row(row)
    start_run(conn, job, started_by)
    notify(conn, job.job_type)
    return job


def reopen(
    conn: Conn, job_id: UUID, *, wake_workers: bool = False, started_by: str = "upgrade"
) -> Job:
    """Queue a succeeded job again (its steps are re-checked against the catalog on the run).

    ``wake_workers`` sends the NOTIFY with the commit; a one-off provisioning that claims the
    job itself right after leaves it off, so no worker races it for the claim.
    """
    row = fetch_one(conn, REOPEN_SUCCEEDED, {"id": job_id})
    if row is None:
        return get_job(conn, job_id)
    job = Job.from_row(row)
    start_run(conn, job, started_by)
    if wake_workers:
        notify(conn, job.job_type)
    return job


def reopen_for_upgrade(
    conn: Conn,
    job_ids: list[UUID],
    *,
    step: str,
    key: str,
    head: str,
    started_by: str = "upgrade",
) -> list[Job]:
    """Queue many succeeded jobs again in one statement, ``step`` alone left to run and
    ``payload[key] = head``, and wake the workers once (a fleet upgrade). Jobs no longer
    succeeded are left as they are and not returned."""
    params = {"ids": job_ids, "step": step, "key": key, "head": head, "started_by": started_by}
    jobs = [Job.from_row(r) for r in fetch_all(conn, REOPEN_FOR_UPGRADE, params)]
    for job_type in sorted({j.job_type for j in jobs}):
        notify(conn, job_type)
    return jobs


def retry_failed(
    conn: Conn, job_type: str | None = None, *, started_by: str = "jobs retry --failed"
) -> list[Job]:
    """Queue every failed job (of ``job_type``, or all) again, each a new run; the workers are
    woken once."""
    params = {"job_type": job_type, "started_by": started_by}
    jobs = [Job.from_row(r) for r in fetch_all(conn, RETRY_FAILED, params)]
    for kind in sorted({j.job_type for j in jobs}):
        notify(conn, kind)
    return jobs


def get_job(conn: Conn, job_id: UUID) -> Job:
    row = fetch_one(conn, GET_JOB, {"id": job_id})
    if row is None:
        raise UnknownJob(f"no job with id {job_id}")
    return Job.from_row(row)


def latest_for_tenant(conn: Conn, tenant: TenantId, job_type: str) -> Job | None:
    row = fetch_one(conn, LATEST_FOR_TENANT, {"tenant_id": tenant.value, "job_type": job_type})
    return Job.from_row(row) if row else None


def latest_any_for_tenant(conn: Conn, tenant: TenantId) -> Job | None:
    """The tenant's most recently changed job of the owner's kinds (provisioning, lifecycle,
    plug-in kinds), never one of the application's."""
    row = fetch_one(conn, LATEST_ANY_FOR_TENANT, {"tenant_id": tenant.value})
    return Job.from_row(row) if row else None


def latest_jobs(conn: Conn, job_type: str, tenants: list[TenantId] | None = None) -> list[Job]:
    """Each tenant's newest job of ``job_type``, ordered by tenant id; None means all."""
    names = None if tenants is None else [t.value for t in tenants]
    rows = fetch_all(conn, LATEST_JOBS, {"job_type": job_type, "tenants": names})
    return [Job.from_row(r) for r in rows]


def list_jobs(
    conn: Conn,
    *,
    status: str | None = None,
    limit: int = 50,
    tenant: TenantId | None = None,
    kind: str | None = None,
) -> list[Job]:
    """Jobs for the operator's view: running first, then the most recently changed."""
    params = {
        "status": status,
        "limit": limit,
        "tenant": None if tenant is None else tenant.value,
        "kind": kind,
    }
    return [Job.from_row(r) for r in fetch_all(conn, LIST_JOBS, params)]
