"""The job's history: its runs (``control.job_runs``) and its step runs
(``control.job_step_runs``), opened, finished, abandoned and read back as frozen records
(:class:`JobRunRecord`, :class:`StepRunRecord`) that the service hands to the CLI.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from datetime import datetime
from typing import Any
from uuid import UUID

from psycopg import sql

from provisioner.models import (
    Lease,
    TenantId,
)
from provisioner.queue.rows import Conn, bounded_error, fetch_all


class StepRunOutcome(enum.StrEnum):
    """``control.job_step_runs.outcome`` (its ``job_step_runs_outcome_check``, control c004)."""

    #: opened, not yet closed: the step is running, or its process died before closing it
    RUNNING = "running"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    #: the step's transaction found the job's lease taken over
    LEASE_LOST = "lease_lost"
    #: closed by recovery or the supervisor: the process is gone, the outcome unknown
    ABANDONED = "abandoned"


class _ByKey:
    """``record["step"]`` as well as ``record.step``: the history was a list of dicts in the
    public :class:`provisioner.TenantStatus`, and code reading it that way keeps working."""

    def __getitem__(self, key: str) -> Any:
        try:
            return getattr(self, key)
        except AttributeError:
            raise KeyError(key) from None


@dataclass(frozen=True)
class JobRunRecord(_ByKey):
    """One row of ``control.job_runs``: a run of a job, its kind and the command that started
    it."""

    job_id: UUID
    run: int
    job_type: str
    started_by: str
    started_at: datetime
    #: what ended the run by hand (a cancel: ``jobs cancel``, ``console``); None otherwise
    ended_by: str | None = None
    ended_at: datetime | None = None

    @classmethod
    def from_row(cls, row: dict[str, Any]) -> JobRunRecord:
        return cls(
            job_id=row["job_id"],
            run=row["run"],
            job_type=row["job_type"],
            started_by=row["started_by"],
            started_at=row["started_at"],
            ended_by=row.get("ended_by"),
            ended_at=row.get("ended_at"),
        )


@dataclass(frozen=True)
class StepRunRecord(_ByKey):
    """One row of ``control.job_step_runs``: one attempt at one step, by one worker."""

    id: int
    job_id: UUID
    tenant_id: str | None
    run: int
    attempt: int
    step: str
    worker: str
    started_at: datetime
    finished_at: datetime | None
    outcome: StepRunOutcome
    detail: str | None
    #: the job's kind, joined in by a tenant's history (None: read by job)
    job_type: str | None = None

    @classmethod
    def from_row(cls, row: dict[str, Any]) -> StepRunRecord:
        return cls(
            id=row["id"],
            job_id=row["job_id"],
            tenant_id=row["tenant_id"],
            run=row["run"],
            attempt=row["attempt"],
            step=row["step"],
            worker=row["worker"],
            started_at=row["started_at"],
            finished_at=row["finished_at"],
            outcome=StepRunOutcome(row["outcome"]),
            detail=row["detail"],
            job_type=row.get("job_type"),
        )


# Every run of a job, oldest first.
RUNS_FOR_JOB = "SELECT * FROM control.job_runs WHERE job_id = %(job_id)s ORDER BY run"


# A step run opened ahead (CLOSE_STEP_OPEN_NEXT) for a step that never began: the job was
# handed back before it. Gone with the hand-back, in the same transaction.
STEP_RUN_DISCARD = "DELETE FROM control.job_step_runs WHERE id = %(id)s AND outcome = 'running'"


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


# Close the open step runs of one attempt that its process gave up: the process died (a
# worker's child), or it lost the database and could record neither the step nor the job.
STEP_RUNS_ABANDON_ATTEMPT = """
UPDATE control.job_step_runs
   SET finished_at = clock_timestamp(), outcome = 'abandoned', detail = %(detail)s
 WHERE job_id = %(job_id)s AND attempt = %(attempt)s AND worker = %(worker)s
   AND outcome = 'running'
"""

#: Why an attempt's step run was closed by someone else (its ``detail``).
PROCESS_DIED = "worker process died; step outcome unknown (its transaction rolled back)"
UNRECORDED = (
    "the connection was lost before the step's outcome was recorded (a failover or a restart "
    "of the server); outcome unknown, the next attempt checks the catalog"
)


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


# A run ended by hand (a cancel): what ended it, when. The owner's only (app_rw may not
# update job_runs).
RUN_ENDED = """
UPDATE control.job_runs SET ended_by = %(ended_by)s, ended_at = now()
 WHERE job_id = %(job_id)s AND run = %(run)s
"""


def record_run_ended(conn: Conn, job_id: UUID, run: int, ended_by: str) -> None:
    """Record on the job's run what ended it by hand (in the caller's transaction)."""
    with conn.cursor() as cur:
        cur.execute(RUN_ENDED, {"job_id": job_id, "run": run, "ended_by": ended_by})


# Many jobs' current runs ended by hand at once (a rollout's abort drops its queued jobs).
RUNS_ENDED = """
UPDATE control.job_runs r SET ended_by = %(ended_by)s, ended_at = now()
  FROM control.platform_jobs j
 WHERE j.id = ANY(%(job_ids)s) AND r.job_id = j.id AND r.run = j.run
"""


def record_runs_ended(conn: Conn, job_ids: list[UUID], ended_by: str) -> None:
    """Record on each job's current run what ended it by hand (in the caller's transaction)."""
    with conn.cursor() as cur:
        cur.execute(RUNS_ENDED, {"job_ids": job_ids, "ended_by": ended_by})


def runs(conn: Conn, job_id: UUID) -> list[JobRunRecord]:
    """Each run of the job: its number, kind, the command that started it, when."""
    return [JobRunRecord.from_row(row) for row in fetch_all(conn, RUNS_FOR_JOB, {"job_id": job_id})]


def discard_step_run(conn: Conn, run_id: int) -> None:
    """Delete a step run opened ahead for a step that never began (:data:`STEP_RUN_DISCARD`)."""
    with conn.cursor() as cur:
        cur.execute(STEP_RUN_DISCARD, {"id": run_id})


def tenant_history(conn: Conn, tenant: TenantId) -> tuple[list[JobRunRecord], list[StepRunRecord]]:
    """(every run of the tenant's jobs, every step run of them), oldest first."""
    params = {"tenant_id": tenant.value}
    runs = [JobRunRecord.from_row(row) for row in fetch_all(conn, RUNS_FOR_TENANT, params)]
    steps = [StepRunRecord.from_row(row) for row in fetch_all(conn, STEP_RUNS_FOR_TENANT, params)]
    return runs, steps


def step_run_opening(lease: Lease, tenant_id: str | None, step: str) -> sql.Composed:
    """The statement that opens a step run's journal row (:data:`STEP_RUN_OPEN`), to be sent
    before the step's transaction begins and committed on its own; the row's id is the first
    column of its row (``db.Transaction.before_row``)."""
    values = (lease.job_id, tenant_id, lease.run, lease.attempts, step, lease.locked_by)
    return STEP_RUN_OPEN.format(*(sql.Literal(value) for value in values))


def run_detail(detail: str | None) -> str | None:
    """A step run's detail as the journal stores it: redacted and bounded."""
    return bounded_error(detail) if detail else None


def finish_step_run(
    conn: Conn, run_id: int, outcome: StepRunOutcome, detail: str | None = None
) -> None:
    with conn.cursor() as cur:
        cur.execute(
            STEP_RUN_FINISH,
            {"id": run_id, "outcome": outcome, "detail": run_detail(detail)},
        )


def abandon_step_runs(conn: Conn, lease: Lease, detail: str = PROCESS_DIED) -> None:
    """Close the attempt's open step runs: its process died, or gave the job up unrecorded,
    before it could close them."""
    with conn.cursor() as cur:
        cur.execute(
            STEP_RUNS_ABANDON_ATTEMPT,
            {
                "job_id": lease.job_id,
                "attempt": lease.attempts,
                "worker": lease.locked_by,
                "detail": detail,
            },
        )


def step_runs(conn: Conn, job_id: UUID) -> list[StepRunRecord]:
    rows = fetch_all(conn, STEP_RUNS_FOR_JOB, {"job_id": job_id})
    return [StepRunRecord.from_row(row) for row in rows]
