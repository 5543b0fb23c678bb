"""The durable work queue on ``control.platform_jobs``: every statement of it lives here.

Each function takes the caller's psycopg connection and does NOT commit, except
:func:`claim_next` and :func:`claim_job`, which commit the claim before returning (a worker never
holds a transaction open while it works). :func:`enqueue` therefore joins the caller's
transaction: the job and the business write it belongs to commit together, and the NOTIFY that
wakes idle workers is delivered only on that commit.

Every write to a running job is *fenced* by its :class:`~provisioner.models.Lease`
(``id``, ``locked_by``, ``attempts``): once recovery, a take-over or a cancel has changed the
row, the old holder's writes match nothing and raise :class:`LeaseLost`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any
from uuid import UUID, uuid4

import psycopg
from psycopg import sql
from psycopg.rows import dict_row
from psycopg.types.json import Jsonb

from provisioner.errors import InvalidInput, KeyConflict, LeaseLost, UnknownJob
from provisioner.models import (
    PRODUCT_JOB_TYPES,
    PROVISION_JOB_TYPE,
    Job,
    JobStatus,
    Lease,
    TenantId,
)
from provisioner.redact import redact

NOTIFY_CHANNEL = "provisioner_jobs"
ERROR_DETAIL_LIMIT = 4000
BACKOFF_CAP_SECONDS = 300
RECOVERED_DETAIL = "Recovered after worker lease expired."
#: First key of the advisory lock a claim takes on the job's tenant for its transaction ('jobs').
TENANT_JOB_LOCK_CLASS = 0x6A6F6273
UNPROCESSABLE_DETAIL = (
    "failed unprocessed: a time of this job was not finite (or its steps not a list), so no "
    "worker could claim or recover it; queue it again"
)
#: The most attempts a job may be given (a constraint of control c005 says the same).
MAX_ATTEMPTS_LIMIT = 100

# -- statements ---------------------------------------------------------------------------------

# Insert a job; an existing idempotency key makes it a no-op that returns nothing.
ENQUEUE = """
INSERT INTO control.platform_jobs
    (tenant_id, job_type, payload, idempotency_key, max_attempts)
VALUES (%(tenant_id)s, %(job_type)s, %(payload)s, %(idempotency_key)s, %(max_attempts)s)
ON CONFLICT (idempotency_key) WHERE idempotency_key IS NOT NULL DO NOTHING
RETURNING *
"""

# A job under an id chosen by the caller, and its wake-up, in one statement; an existing key
# inserts nothing, wakes nobody and returns no row (the caller then reads the job holding it).
_ENQUEUE_WOKEN = """job AS (
    INSERT INTO control.platform_jobs
        (id, tenant_id, job_type, payload, idempotency_key, max_attempts)
    VALUES (%(id)s, %(tenant_id)s, %(job_type)s, %(payload)s, %(idempotency_key)s,
            %(max_attempts)s)
    ON CONFLICT (idempotency_key) WHERE idempotency_key IS NOT NULL DO NOTHING
    RETURNING *
)
SELECT job.*, pg_notify(%(channel)s, job.job_type) AS woken FROM job
"""
ENQUEUE_WOKEN = "WITH " + _ENQUEUE_WOKEN

# The run row (RUN_START) of the job ENQUEUE_WOKEN inserted under that id, if it did. A
# statement of its own, after that one: the application role's policy on job_runs checks that
# the job exists, which a statement does not see of its own inserts.
RUN_START_ENQUEUED = """
INSERT INTO control.job_runs (job_id, run, job_type, started_by)
SELECT id, run, job_type, %(started_by)s FROM control.platform_jobs WHERE id = %(id)s
ON CONFLICT (job_id, run) DO NOTHING
"""

# The job already holding an idempotency key.
BY_IDEMPOTENCY_KEY = "SELECT * FROM control.platform_jobs WHERE idempotency_key = %(key)s"

# Put a failed or cancelled job back in the queue: a new run, with a fresh set of attempts.
REQUEUE_TERMINAL = """
UPDATE control.platform_jobs
   SET status = 'queued', attempts = 0, run = run + 1, available_at = now(), locked_at = NULL,
       locked_by = NULL, finished_at = NULL, updated_at = now()
 WHERE id = %(id)s AND status IN ('failed', 'cancelled')
RETURNING *
"""

# Open a succeeded job again (part of its effect is gone, or the request is made anew): a new
# run, with a fresh set of attempts.
REOPEN_SUCCEEDED = """
UPDATE control.platform_jobs
   SET status = 'queued', attempts = 0, run = run + 1, available_at = now(), finished_at = NULL,
       updated_at = now()
 WHERE id = %(id)s AND status = 'succeeded'
RETURNING *
"""

# Say which kind and which command started a run of a job (its first, or a re-opening).
RUN_START = """
INSERT INTO control.job_runs (job_id, run, job_type, started_by)
VALUES (%(job_id)s, %(run)s, %(job_type)s, %(started_by)s)
ON CONFLICT (job_id, run) DO NOTHING
"""

# Every run of a job, oldest first.
RUNS_FOR_JOB = "SELECT * FROM control.job_runs WHERE job_id = %(job_id)s ORDER BY run"
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

# Wake idle workers once the surrounding transaction commits; the payload is the job type.
NOTIFY = "SELECT pg_notify(%(channel)s, %(job_type)s)"

# Subscribe a worker's autocommit connection to those wake-ups.
LISTEN = f"LISTEN {NOTIFY_CHANNEL}"

# Make sure the tenant has its control row before its first job.
ENSURE_TENANT = """
INSERT INTO control.tenants (tenant_id, schema_name)
VALUES (%(tenant_id)s, %(schema)s)
ON CONFLICT (tenant_id) DO NOTHING
"""

# ENSURE_TENANT and ENQUEUE_WOKEN in one statement. The job's foreign key is checked at the end
# of the statement, when the tenant's row, inserted by the CTE, is there.
ENSURE_TENANT_ENQUEUE_WOKEN = "WITH tenant AS (" + ENSURE_TENANT.strip() + "\n), " + _ENQUEUE_WOKEN

# Claim the oldest claimable job of the allowed types; SKIP LOCKED keeps claimants apart. A job
# whose tenant has another job running waits (jobs of one tenant never run at the same time,
# whatever their kinds); the try-lock keeps two claimants from taking two jobs of one tenant.
# A row no claim could load (a non-finite time: impossible since control c005) is passed by;
# FAIL_UNPROCESSABLE fails it with a reason. The try-lock is tried only on a job of the given
# kinds: a CASE, because the planner orders a filter's conditions by their cost, and a generic
# plan (a job-type array of unknown length) put the lock first. Taken on another kind's job, it
# would be held to the end of the claim's transaction, and that kind's claimants would pass the
# job by meanwhile (tests/integration/test_queue.py).
CLAIMABLE = """
    SELECT id FROM control.platform_jobs q
     WHERE status = 'queued' AND available_at <= now() AND job_type = ANY(%(job_types)s)
       AND NOT EXISTS (SELECT 1 FROM control.platform_jobs r
                        WHERE r.tenant_id = q.tenant_id AND r.status = 'running')
       AND CASE WHEN job_type <> ALL(%(job_types)s) THEN false
                WHEN tenant_id IS NULL THEN true
                ELSE pg_try_advisory_xact_lock(%(lock_class)s, hashtext(tenant_id)) END
       AND isfinite(available_at) AND isfinite(created_at) AND isfinite(updated_at)
       AND jsonb_typeof(steps_completed) = 'array'
     ORDER BY available_at, created_at
     LIMIT 1
       FOR UPDATE SKIP LOCKED
"""

CLAIM_NEXT = f"""
WITH next AS ({CLAIMABLE}), claimed AS (
    UPDATE control.platform_jobs AS j
       SET status = 'running', attempts = j.attempts + 1, locked_at = clock_timestamp(),
           locked_by = %(worker)s, updated_at = now()
      FROM next
     WHERE j.id = next.id
    RETURNING j.*
)
SELECT claimed.*, t.state AS tenant_state
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
SELECT claimed.*, t.state AS tenant_state
  FROM claimed LEFT JOIN control.tenants t ON t.tenant_id = claimed.tenant_id
"""

# A queued job's claim, unless another job of its tenant is running (and, with the condition
# filled in, only one whose holder is live).
_CLAIM_QUEUED = _CLAIM_JOB.format("""j.status = 'queued'
       AND NOT EXISTS (SELECT 1 FROM control.platform_jobs r
                        WHERE r.tenant_id = j.tenant_id AND r.id <> j.id AND r.status = 'running'
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

# Record one finished step with the new progress, fenced by the lease. The lease is renewed
# with clock_timestamp(): now() is the start of the step's transaction, which may be older
# than the lease itself after a long step.
_RECORD_STEP = """
UPDATE control.platform_jobs
   SET steps_completed = %(steps)s, progress = %(progress)s, locked_at = clock_timestamp(),
       updated_at = now()
 WHERE id = %(id)s AND status = 'running' AND locked_by = %(worker)s AND attempts = %(attempts)s
RETURNING *"""
RECORD_STEP = _RECORD_STEP + "\n"

# Finish a job successfully, fenced by the lease. ``finished_at`` is the clock when the job
# ended, not the start of the transaction that ended it: for a job completed with its last step
# (RECORD_LAST_STEP), that step's work is part of the job's time.
COMPLETE = """
UPDATE control.platform_jobs
   SET status = 'succeeded', progress = 100, error_detail = NULL, locked_at = NULL,
       locked_by = NULL, finished_at = clock_timestamp(), updated_at = now()
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
       locked_at = NULL, locked_by = NULL, finished_at = clock_timestamp(), updated_at = now()
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

# A step run opened ahead (CLOSE_STEP_OPEN_NEXT) for a step that never began: the job was
# handed back before it. Gone with the hand-back, in the same transaction.
STEP_RUN_DISCARD = "DELETE FROM control.job_step_runs WHERE id = %(id)s AND outcome = 'running'"

# Fail terminally when attempts are spent (or the error is permanent), else back off.
FAIL_OR_RETRY = """
UPDATE control.platform_jobs
   SET status = CASE WHEN %(permanent)s OR attempts >= max_attempts THEN 'failed'
                     ELSE 'queued' END,
       available_at = CASE WHEN %(permanent)s OR attempts >= max_attempts THEN available_at
                           ELSE now() + make_interval(
                                    secs => least(%(cap)s, power(2, least(attempts, 8))))
                      END,
       finished_at = CASE WHEN %(permanent)s OR attempts >= max_attempts THEN clock_timestamp()
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
# between its claim and its report): none of their steps started, so the attempt is not counted.
RELEASE_UNREPORTED = """
UPDATE control.platform_jobs
   SET status = 'queued', attempts = greatest(attempts - 1, 0), available_at = now(),
       locked_at = NULL, locked_by = NULL, updated_at = now()
 WHERE status = 'running' AND locked_by = %(worker)s AND NOT id = ANY(%(reported)s)
RETURNING *
"""

# Requeue (or fail, when attempts are spent) running jobs whose lease has expired.
RECOVER_STALE = """
UPDATE control.platform_jobs
   SET status = CASE WHEN attempts >= max_attempts THEN 'failed' ELSE 'queued' END,
       available_at = now(),
       finished_at = CASE WHEN attempts >= max_attempts THEN now() END,
       error_detail = %(detail)s, locked_at = NULL, locked_by = NULL, updated_at = now()
 WHERE status = 'running'
   AND (locked_at < now() - make_interval(secs => %(stale)s)
        OR (locked_at IS NULL AND updated_at < now() - make_interval(secs => %(stale)s)))
RETURNING *
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

# Renew the leases a live worker holds, so long steps are never taken for abandoned.
RENEW_LEASES = """
UPDATE control.platform_jobs SET locked_at = now()
 WHERE status = 'running' AND locked_by = ANY(%(holders)s)
RETURNING id
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

# The tenant's most recently changed job of any kind.
LATEST_ANY_FOR_TENANT = """
SELECT * FROM control.platform_jobs WHERE tenant_id = %(tenant_id)s
 ORDER BY updated_at DESC, created_at DESC LIMIT 1
"""

# The newest job of a type for a tenant.
LATEST_FOR_TENANT = """
SELECT * FROM control.platform_jobs
 WHERE tenant_id = %(tenant_id)s AND job_type = %(job_type)s
 ORDER BY created_at DESC LIMIT 1
"""

# The provisioning job of each tenant (all tenants, or the named ones), by tenant id.
PROVISION_JOBS = """
SELECT DISTINCT ON (tenant_id) * FROM control.platform_jobs
 WHERE job_type = %(job_type)s AND tenant_id IS NOT NULL
   AND (%(tenants)s::text[] IS NULL OR tenant_id = ANY(%(tenants)s))
 ORDER BY tenant_id, created_at DESC
"""

# Operator view: running first, then newest.
LIST_JOBS = """
SELECT * FROM control.platform_jobs
 WHERE (%(status)s::text IS NULL OR status = %(status)s)
 ORDER BY (status = 'running') DESC, updated_at DESC
 LIMIT %(limit)s
"""

# -- the per-attempt record of step runs ---------------------------------------------------------

# A step begins: its row is committed before its work, so a crash leaves the trace. Opened by
# the steps' session just before the step's transaction begins, in the same simple
# query (db.Session.transaction's ``before``), so the values are literals. Its commit does not
# wait for the disk (the set_config runs before it): a server crash may lose the row with the
# step's attempt, and recovery requeues the job either way.
STEP_RUN_OPEN = sql.SQL("""
INSERT INTO control.job_step_runs (job_id, tenant_id, run, attempt, step, worker)
VALUES ({}, {}, {}, {}, {}, {})
RETURNING id, set_config('synchronous_commit', 'off', true)
""")

# A step ends, with its outcome and a one-line detail; a run already closed (abandoned by
# recovery) stays as recovery left it.
STEP_RUN_FINISH = """
UPDATE control.job_step_runs
   SET finished_at = clock_timestamp(), outcome = %(outcome)s, detail = %(detail)s
 WHERE id = %(id)s AND outcome = 'running'
"""

# Close the open step runs of recovered jobs: their process is gone.
STEP_RUNS_ABANDON = """
UPDATE control.job_step_runs
   SET finished_at = clock_timestamp(), outcome = 'abandoned',
       detail = 'worker lease expired; step outcome unknown (its transaction rolled back)'
 WHERE job_id = ANY(%(job_ids)s) AND outcome = 'running'
"""

# Close the open step runs of one attempt whose process is known to be gone (a worker's child).
STEP_RUNS_ABANDON_ATTEMPT = """
UPDATE control.job_step_runs
   SET finished_at = clock_timestamp(), outcome = 'abandoned',
       detail = 'worker process died; step outcome unknown (its transaction rolled back)'
 WHERE job_id = %(job_id)s AND attempt = %(attempt)s AND worker = %(worker)s
   AND outcome = 'running'
"""

STEP_RUNS_FOR_JOB = "SELECT * FROM control.job_step_runs WHERE job_id = %(job_id)s ORDER BY id"

# Every step run of a tenant, whatever the job's kind, oldest first.
STEP_RUNS_FOR_TENANT = """
SELECT s.*, j.job_type FROM control.job_step_runs s
  JOIN control.platform_jobs j ON j.id = s.job_id
 WHERE s.tenant_id = %(tenant_id)s
 ORDER BY s.id
"""

# Every run of every job of a tenant (which kind, which command started it), oldest first.
RUNS_FOR_TENANT = """
SELECT r.* FROM control.job_runs r JOIN control.platform_jobs j ON j.id = r.job_id
 WHERE j.tenant_id = %(tenant_id)s
 ORDER BY r.started_at, r.run
"""

# -- operations ---------------------------------------------------------------------------------

Conn = psycopg.Connection[Any]


@dataclass(frozen=True)
class Enqueued:
    """What :func:`enqueue` did: the job, and whether this call created or re-queued it."""

    job: Job
    created: bool
    requeued: bool = False


def _one(conn: Conn, statement: str, params: dict[str, Any]) -> dict[str, Any] | None:
    with conn.cursor(row_factory=dict_row) as cur:
        cur.execute(statement, params)
        return cur.fetchone()


def _all(conn: Conn, statement: str, params: dict[str, Any]) -> list[dict[str, Any]]:
    with conn.cursor(row_factory=dict_row) as cur:
        cur.execute(statement, params)
        return cur.fetchall()


def bounded_error(text: str) -> str:
    """Secrets redacted, then cut to the column's budget."""
    text = redact(text).strip() or "unknown error"
    if len(text) <= ERROR_DETAIL_LIMIT:
        return text
    return text[: ERROR_DETAIL_LIMIT - 15] + " ...[truncated]"


def enqueue(
    conn: Conn,
    job_type: str,
    *,
    tenant_id: str | None = None,
    payload: dict[str, Any] | None = None,
    idempotency_key: str | None = None,
    max_attempts: int = 5,
    retry_terminal: bool = False,
    started_by: str = "enqueue",
) -> Enqueued:
    """Insert a job in the caller's transaction, or return the one holding the key.

    With ``retry_terminal``, an existing failed or cancelled job is queued again with its
    attempts reset (its ``steps_completed`` stay, so the work resumes where it stopped).
    The caller checks ``job_type`` against the kind registry (:mod:`provisioner.kinds`).
    """
    return _enqueue(
        conn,
        _JobRequest(job_type, tenant_id, payload, idempotency_key, max_attempts, started_by),
        retry_terminal=retry_terminal,
    )


@dataclass(frozen=True)
class _JobRequest:
    """What an enqueue asks for; the sync and async enqueues share its statements' params."""

    job_type: str
    tenant_id: str | None
    payload: dict[str, Any] | None
    idempotency_key: str | None
    max_attempts: int
    started_by: str
    #: the tenant's schema: its control row is made sure of in the same statement
    tenant_schema: str | None = None

    def params(self) -> dict[str, Any]:
        """The new job's statement params (refused here when out of range); its id is chosen
        here, as the column default would, so its run's row can name it in the same round
        trip (:data:`RUN_START_ENQUEUED`)."""
        if not self.job_type:
            raise InvalidInput("a job needs a job type")
        if not 1 <= self.max_attempts <= MAX_ATTEMPTS_LIMIT:
            raise InvalidInput(f"max_attempts must be between 1 and {MAX_ATTEMPTS_LIMIT}")
        return {
            "tenant_id": self.tenant_id,
            "job_type": self.job_type,
            "payload": Jsonb(self.payload or {}),
            "idempotency_key": self.idempotency_key,
            "max_attempts": self.max_attempts,
            "started_by": self.started_by,
            "channel": NOTIFY_CHANNEL,
            "schema": self.tenant_schema,
            "id": uuid4(),
        }

    @property
    def statement(self) -> str:
        """A new job with its wake-up (and the tenant's row when the request names a schema)."""
        return ENQUEUE_WOKEN if self.tenant_schema is None else ENSURE_TENANT_ENQUEUE_WOKEN

    def holder(self, existing: dict[str, Any] | None) -> Job:
        """The job already holding the key; KeyConflict when it is another tenant's or kind's."""
        assert existing is not None, "ON CONFLICT fired, so the key exists"
        job = Job.from_row(existing)
        if (job.tenant_id, job.job_type) != (self.tenant_id, self.job_type):
            raise KeyConflict(
                f"idempotency key {str(self.idempotency_key)[:80]} is held by job {job.id} "
                f"({job.job_type} of tenant {str(job.tenant_id)[:48]}), not a {self.job_type} "
                f"job of tenant {str(self.tenant_id)[:48]}: nothing was queued"
            )
        return job


def _retried(job: Job, retry_terminal: bool) -> bool:
    return retry_terminal and job.status in (JobStatus.FAILED, JobStatus.CANCELLED)


def _enqueue(conn: Conn, request: _JobRequest, *, retry_terminal: bool) -> Enqueued:
    params = request.params()
    # A new job with its wake-up, then its run's row: one round trip with the transaction's
    # BEGIN (a sign-up waits for its enqueue, and each round trip of it is latency it sees).
    row = _insert_started(conn, request.statement, params)
    if row is not None:
        return Enqueued(Job.from_row(row), created=True)
    job = request.holder(_one(conn, BY_IDEMPOTENCY_KEY, {"key": request.idempotency_key}))
    if _retried(job, retry_terminal):
        requeued = _one(conn, REQUEUE_TERMINAL, {"id": job.id})
        if requeued is not None:
            _start_run(conn, job := Job.from_row(requeued), request.started_by)
            _notify(conn, request.job_type)
            return Enqueued(job, created=False, requeued=True)
    return Enqueued(job, created=False)


async def _enqueue_async(
    conn: psycopg.AsyncConnection[Any], request: _JobRequest, *, retry_terminal: bool
) -> Enqueued:
    """:func:`_enqueue` on an async connection: the same statements, awaited."""
    params = request.params()
    async with conn.pipeline(), conn.cursor(row_factory=dict_row) as cur:
        await cur.execute(request.statement, params)
        await conn.execute(RUN_START_ENQUEUED, params)
        row = await cur.fetchone()
    if row is not None:
        return Enqueued(Job.from_row(row), created=True)
    async with conn.cursor(row_factory=dict_row) as cur:
        await cur.execute(BY_IDEMPOTENCY_KEY, {"key": request.idempotency_key})
        job = request.holder(await cur.fetchone())
        if _retried(job, retry_terminal):
            await cur.execute(REQUEUE_TERMINAL, {"id": job.id})
            requeued = await cur.fetchone()
            if requeued is not None:
                job = Job.from_row(requeued)
                await cur.execute(RUN_START, _run_params(job, request.started_by))
                await cur.execute(NOTIFY, _notify_params(job.job_type))
                return Enqueued(job, created=False, requeued=True)
    return Enqueued(job, created=False)


def _insert_started(conn: Conn, statement: str, params: dict[str, Any]) -> dict[str, Any] | None:
    """The job ``statement`` inserted (None: none), then its run's row: one pipeline, so one
    round trip, together with the ``BEGIN`` psycopg sends first outside a transaction."""
    with conn.pipeline(), conn.cursor(row_factory=dict_row) as cur:
        cur.execute(statement, params)
        conn.execute(RUN_START_ENQUEUED, params)
        return cur.fetchone()


def _run_params(job: Job, started_by: str) -> dict[str, Any]:
    return {"job_id": job.id, "run": job.run, "job_type": job.job_type, "started_by": started_by}


def _start_run(conn: Conn, job: Job, started_by: str) -> None:
    with conn.cursor() as cur:
        cur.execute(RUN_START, _run_params(job, started_by))


def runs(conn: Conn, job_id: UUID) -> list[dict[str, Any]]:
    """Each run of the job: its number, kind, the command that started it, when."""
    return _all(conn, RUNS_FOR_JOB, {"job_id": job_id})


def _notify_params(job_type: str) -> dict[str, Any]:
    return {"channel": NOTIFY_CHANNEL, "job_type": job_type}


def _notify(conn: Conn, job_type: str) -> None:
    with conn.cursor() as cur:
        cur.execute(NOTIFY, _notify_params(job_type))


def listen(conn: Conn) -> None:
    """Subscribe ``conn`` (autocommit) to enqueue wake-ups; read them with :func:`wake_ups`."""
    with conn.cursor() as cur:
        cur.execute(LISTEN)


def wake_ups(conn: Conn) -> list[str]:
    """The job types of the wake-ups already received on a listening connection; never waits."""
    return [notify.payload for notify in conn.notifies(timeout=0)]


def provision_key(tenant: TenantId) -> str:
    return f"provision:{tenant.value}"


def ensure_provision_job(
    conn: Conn, tenant: TenantId, *, retry_terminal: bool = False, started_by: str = "enqueue"
) -> Enqueued:
    """The tenant's control row and its one ``provision_tenant`` job, created if missing."""
    return ensure_tenant_job(
        conn,
        tenant,
        PROVISION_JOB_TYPE,
        provision_key(tenant),
        retry_terminal=retry_terminal,
        started_by=started_by,
    )


def ensure_tenant_job(
    conn: Conn,
    tenant: TenantId,
    job_type: str,
    idempotency_key: str | None,
    *,
    retry_terminal: bool = False,
    started_by: str = "enqueue",
) -> Enqueued:
    """The tenant's control row and its job of ``job_type`` under the key, created if missing.

    A new job costs two statements in one round trip, with the transaction's ``BEGIN``:
    :data:`ENSURE_TENANT_ENQUEUE_WOKEN` (the tenant's row, the job and its wake-up), then its
    run's row. An error (a refused row, a key held by another job) is raised as it would be
    one statement at a time.
    """
    request = _tenant_request(tenant, job_type, idempotency_key, started_by)
    return _enqueue(conn, request, retry_terminal=retry_terminal)


async def ensure_provision_job_async(
    conn: psycopg.AsyncConnection[Any],
    tenant: TenantId,
    *,
    retry_terminal: bool = False,
    started_by: str = "enqueue",
) -> Enqueued:
    """:func:`ensure_provision_job` for a psycopg ``AsyncConnection``: the same statements, in
    the same round trips, awaited."""
    return await _enqueue_async(
        conn,
        _tenant_request(tenant, PROVISION_JOB_TYPE, provision_key(tenant), started_by),
        retry_terminal=retry_terminal,
    )


def _tenant_request(
    tenant: TenantId, job_type: str, idempotency_key: str | None, started_by: str
) -> _JobRequest:
    return _JobRequest(
        job_type, tenant.value, None, idempotency_key, 5, started_by, tenant_schema=tenant.schema
    )


def claim_next(conn: Conn, job_types: tuple[str, ...] | list[str], worker: str) -> Job | None:
    """Claim the oldest ready job of ``job_types`` for ``worker`` and commit the claim."""
    claimed = claim_next_with_state(conn, job_types, worker)
    conn.commit()
    return claimed.job if claimed else None


@dataclass(frozen=True)
class Claim:
    """A job the step engine claimed, and its tenant's lifecycle state read by the same
    statement (None: the job has no tenant, or the tenant no control row)."""

    job: Job
    tenant_state: str | None


def _claim_params(job_types: Sequence[str], worker: str) -> dict[str, Any]:
    if not job_types:
        raise InvalidInput("at least one job type is required")
    return {"job_types": list(job_types), "worker": worker, "lock_class": TENANT_JOB_LOCK_CLASS}


def plan_claim(conn: Conn, worker: str) -> None:
    """Run the claim of no job type (it takes nothing and tries no tenant's lock), prepared,
    so that a session keeping generic plans (the engine's control session) holds the claim's
    plan ready: the next claim after a sign-up's wake-up skips planning it (0.3-0.5 ms with
    the plans every schema rename resets; docs/PERFORMANCE.md)."""
    with conn.cursor() as cur:
        nothing = {"job_types": [], "worker": worker, "lock_class": TENANT_JOB_LOCK_CLASS}
        cur.execute(CLAIM_NEXT, nothing, prepare=True)


def _as_claim(row: dict[str, Any] | None) -> Claim | None:
    return Claim(Job.from_row(row), row["tenant_state"]) if row else None


def claim_next_with_state(conn: Conn, job_types: Sequence[str], worker: str) -> Claim | None:
    """The step engine's claim: the oldest ready job of ``job_types`` for ``worker``, with its
    tenant's state. On an autocommit session the statement commits itself; in a transaction it
    commits with it."""
    return _as_claim(_one(conn, CLAIM_NEXT, _claim_params(job_types, worker)))


def claim_job(conn: Conn, job_id: UUID, worker: str) -> Job | None:
    """Claim one job by id (queued, or running under a dead holder) and commit the claim."""
    claimed = claim_job_with_state(conn, job_id, worker)
    return claimed.job if claimed else None


def claim_job_with_state(conn: Conn, job_id: UUID, worker: str) -> Claim | None:
    """:func:`claim_job`, with the tenant's state read by the claiming statement (for the
    engine). One statement when no other job of the tenant runs."""
    params = {"id": job_id, "worker": worker}
    row = (
        _one(conn, CLAIM_QUEUED_ALONE, params)
        or _one(conn, CLAIM_QUEUED_JOB, params)
        or _one(conn, TAKE_OVER_JOB, params)
    )
    conn.commit()
    return _as_claim(row)


def _fenced(conn: Conn, statement: str, lease: Lease, **params: Any) -> Job:
    row = _one(
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
    commit claims (``claim_next``), and the journal row it opened for the job's next step."""

    job: Job
    claimed: Claim | None = None
    next_run_id: int | None = None


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
) -> ClosedStep:
    """End a step inside its own transaction: close its journal row and record the fenced
    checkpoint (``last``: and complete the job) in one statement, and, with ``claim_next``,
    claim the holder's next job of those kinds in the same round trip (pipeline mode), so that
    the claim commits with the step instead of costing a round trip and a commit of its own.
    With ``open_next`` (a step that is not the last), the same statement opens the journal row
    of the job's next step (:data:`CLOSE_STEP_OPEN_NEXT`).

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
        "detail": _run_detail(detail),
    }
    if last:
        statement = CLOSE_LAST_STEP
    elif open_next is not None:
        statement = CLOSE_STEP_OPEN_NEXT
        params.update(run=lease.run, tenant_id=open_next.tenant_id, next_step=open_next.step)
    else:
        statement = CLOSE_STEP
    with conn.cursor(row_factory=dict_row) as record:
        if claim_next:
            with conn.cursor(row_factory=dict_row) as claim:
                with conn.pipeline():
                    record.execute(statement, params)
                    claim.execute(CLAIM_NEXT, _claim_params(claim_next, lease.locked_by))
                claimed = _as_claim(claim.fetchone())
        else:
            record.execute(statement, params)
            claimed = None
        row = record.fetchone()
    if row is None:
        raise LeaseLost(_lease_lost(lease))
    next_run = row.get("next_run_id")
    return ClosedStep(Job.from_row(row), claimed, None if next_run is None else int(next_run))


def discard_step_run(conn: Conn, run_id: int) -> None:
    """Delete a step run opened ahead for a step that never began (:data:`STEP_RUN_DISCARD`)."""
    with conn.cursor() as cur:
        cur.execute(STEP_RUN_DISCARD, {"id": run_id})


def complete(conn: Conn, lease: Lease) -> Job:
    return _fenced(conn, COMPLETE, lease)


def fail_or_retry(conn: Conn, lease: Lease, error: str, *, permanent: bool = False) -> Job:
    """Back off and requeue, or fail when attempts are spent or the error is permanent."""
    return _fenced(
        conn,
        FAIL_OR_RETRY,
        lease,
        error=bounded_error(error),
        permanent=permanent,
        cap=BACKOFF_CAP_SECONDS,
    )


def release(conn: Conn, lease: Lease) -> Job:
    return _fenced(conn, RELEASE, lease)


def release_unreported(conn: Conn, worker: str, reported: list[UUID]) -> list[Job]:
    """Queue again, untouched, the jobs ``worker`` (a dead engine process) holds other than the
    ``reported`` ones: it claimed them and died before telling its worker, so none of their
    steps started."""
    return [
        Job.from_row(r)
        for r in _all(conn, RELEASE_UNREPORTED, {"worker": worker, "reported": reported})
    ]


def recover_stale(conn: Conn, stale_after_seconds: float) -> list[Job]:
    """Requeue or fail running jobs whose lease expired, closing their open step runs; fail
    (with a reason) the unfinished jobs no worker could load, so none stalls the queue."""
    rows = _all(conn, FAIL_UNPROCESSABLE, {"detail": UNPROCESSABLE_DETAIL})
    rows += _all(conn, RECOVER_STALE, {"stale": stale_after_seconds, "detail": RECOVERED_DETAIL})
    # Step runs are the owner's engine's (app_rw may not write them); product jobs have none.
    owned = [row["id"] for row in rows if row["job_type"] not in PRODUCT_JOB_TYPES]
    if owned:
        with conn.cursor() as cur:
            cur.execute(STEP_RUNS_ABANDON, {"job_ids": owned})
    return [Job.from_row(row) for row in rows]


def renew_leases(conn: Conn, holders: list[str]) -> int:
    return len(_all(conn, RENEW_LEASES, {"holders": holders}))


def cancel(conn: Conn, job_id: UUID) -> Job:
    row = _one(conn, CANCEL, {"id": job_id})
    if row is None:
        get_job(conn, job_id)  # raises UnknownJob when there is no such job
        raise InvalidInput(f"job {job_id} has already finished; only queued or running jobs cancel")
    return Job.from_row(row)


def retry(conn: Conn, job_id: UUID, *, started_by: str = "jobs retry") -> Job:
    """Queue a failed or cancelled job again: a new run (attempts reset, recorded steps kept)."""
    row = _one(conn, REQUEUE_TERMINAL, {"id": job_id})
    if row is None:
        job = get_job(conn, job_id)  # raises UnknownJob when there is no such job
        raise InvalidInput(
            f"job {job_id} is {job.status.value}; only failed or cancelled jobs can be retried"
        )
    job = Job.from_row(row)
    _start_run(conn, job, started_by)
    _notify(conn, job.job_type)
    return job


def reopen(
    conn: Conn, job_id: UUID, *, wake_workers: bool = False, started_by: str = "upgrade"
) -> Job:
    """Queue a succeeded job again (its steps are re-checked against the catalog on the run).

    ``wake_workers`` sends the NOTIFY with the commit; a one-off provisioning that claims the
    job itself right after leaves it off, so no worker races it for the claim.
    """
    row = _one(conn, REOPEN_SUCCEEDED, {"id": job_id})
    if row is None:
        return get_job(conn, job_id)
    job = Job.from_row(row)
    _start_run(conn, job, started_by)
    if wake_workers:
        _notify(conn, job.job_type)
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
    jobs = [Job.from_row(r) for r in _all(conn, REOPEN_FOR_UPGRADE, params)]
    for job_type in sorted({j.job_type for j in jobs}):
        _notify(conn, job_type)
    return jobs


def retry_failed(
    conn: Conn, job_type: str | None = None, *, started_by: str = "jobs retry --failed"
) -> list[Job]:
    """Queue every failed job (of ``job_type``, or all) again, each a new run; the workers are
    woken once."""
    params = {"job_type": job_type, "started_by": started_by}
    jobs = [Job.from_row(r) for r in _all(conn, RETRY_FAILED, params)]
    for kind in sorted({j.job_type for j in jobs}):
        _notify(conn, kind)
    return jobs


def get_job(conn: Conn, job_id: UUID) -> Job:
    row = _one(conn, GET_JOB, {"id": job_id})
    if row is None:
        raise UnknownJob(f"no job with id {job_id}")
    return Job.from_row(row)


def latest_for_tenant(
    conn: Conn, tenant: TenantId, job_type: str = PROVISION_JOB_TYPE
) -> Job | None:
    row = _one(conn, LATEST_FOR_TENANT, {"tenant_id": tenant.value, "job_type": job_type})
    return Job.from_row(row) if row else None


def latest_any_for_tenant(conn: Conn, tenant: TenantId) -> Job | None:
    """The tenant's most recently changed job, whatever its kind."""
    row = _one(conn, LATEST_ANY_FOR_TENANT, {"tenant_id": tenant.value})
    return Job.from_row(row) if row else None


def tenant_history(
    conn: Conn, tenant: TenantId
) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """(every run of the tenant's jobs, every step run of them), oldest first."""
    params = {"tenant_id": tenant.value}
    return _all(conn, RUNS_FOR_TENANT, params), _all(conn, STEP_RUNS_FOR_TENANT, params)


def provision_jobs(conn: Conn, tenants: list[TenantId] | None = None) -> list[Job]:
    """Each tenant's provisioning job (the newest), ordered by tenant id; None means all."""
    names = None if tenants is None else [t.value for t in tenants]
    rows = _all(conn, PROVISION_JOBS, {"job_type": PROVISION_JOB_TYPE, "tenants": names})
    return [Job.from_row(r) for r in rows]


def list_jobs(conn: Conn, *, status: str | None = None, limit: int = 50) -> list[Job]:
    return [Job.from_row(r) for r in _all(conn, LIST_JOBS, {"status": status, "limit": limit})]


def step_run_opening(lease: Lease, tenant_id: str | None, step: str) -> sql.Composed:
    """The statement that opens a step run's journal row (:data:`STEP_RUN_OPEN`), to be sent
    before the step's transaction begins and committed on its own; the row's id is the first
    column of its row (``db.Transaction.before_row``)."""
    values = (lease.job_id, tenant_id, lease.run, lease.attempts, step, lease.locked_by)
    return STEP_RUN_OPEN.format(*(sql.Literal(value) for value in values))


# What a job's statements read, touched without a row read or written: run on a worker child's
# idle sessions after a spare build (Engine.warm) so their catalog caches are loaded again.
WARM = """
SELECT (SELECT 1 FROM control.platform_jobs WHERE id IS NULL),
       (SELECT 1 FROM control.job_step_runs WHERE id IS NULL),
       (SELECT 1 FROM control.tenants WHERE tenant_id IS NULL),
       (SELECT 1 FROM control.tenant_pool WHERE schema_name IS NULL),
       (SELECT 1 FROM pg_namespace WHERE nspname IS NULL)
"""

#: A statement and parameters of the right types for it (values that match nothing), to be
#: planned by :func:`warm` and never run.
PlanAhead = tuple[str, Mapping[str, Any]]

_NOTHING: dict[str, Any] = {
    "id": UUID(int=0),
    "job_id": UUID(int=0),
    "worker": "",
    "attempts": 0,
    "attempt": 0,
    "run": 0,
    "run_id": 0,
    "steps": Jsonb([]),
    "progress": 0,
    "detail": None,
    "tenant_id": "",
    "step": "",
    "next_step": "",
    "job_types": [""],
    "lock_class": TENANT_JOB_LOCK_CLASS,
}
#: What its steps' session runs for every job: the steps' ends, and the claim of the next job
#: that rides on the last one.
STEP_PLANS: tuple[PlanAhead, ...] = (
    (CLOSE_STEP_OPEN_NEXT, _NOTHING),
    (CLOSE_LAST_STEP, _NOTHING),
    (CLAIM_NEXT, _NOTHING),
)


def warm(conn: Conn, plans: Sequence[PlanAhead] = ()) -> None:
    """Run :data:`WARM`, then plan each of ``plans`` without running it (``EXPLAIN``).

    A spare of a large template sends more catalog invalidations than the server's queue
    holds, and every session that sat idle meanwhile then empties all its catalog caches; the
    next statements each session plans reload them (a 200-table take planned its grant check
    in 7 ms instead of 1 ms). Planning them now, while idle, loads every cache entry they
    need; the take then only plans again, which its schema rename would make it do anyway.
    """
    with conn.cursor() as cur:
        cur.execute(WARM)
        for statement, params in plans:
            cur.execute("EXPLAIN " + statement, params)


def _run_detail(detail: str | None) -> str | None:
    """A step run's detail as the journal stores it: redacted and bounded."""
    return bounded_error(detail) if detail else None


def finish_step_run(conn: Conn, run_id: int, outcome: str, detail: str | None = None) -> None:
    with conn.cursor() as cur:
        cur.execute(
            STEP_RUN_FINISH,
            {"id": run_id, "outcome": outcome, "detail": _run_detail(detail)},
        )


def abandon_step_runs(conn: Conn, lease: Lease) -> None:
    """Close the attempt's open step runs: its process died before it could."""
    with conn.cursor() as cur:
        cur.execute(
            STEP_RUNS_ABANDON_ATTEMPT,
            {"job_id": lease.job_id, "attempt": lease.attempts, "worker": lease.locked_by},
        )


def step_runs(conn: Conn, job_id: UUID) -> list[dict[str, Any]]:
    return _all(conn, STEP_RUNS_FOR_JOB, {"job_id": job_id})
