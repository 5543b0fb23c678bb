"""Putting work on the queue: the idempotent enqueue in the caller's transaction, a tenant's job
(re-opened for each request), the run each request starts, and the NOTIFY that wakes idle
workers on commit.

Nothing here is prepared on the server (``prepare=False``): an application's connection may go
through PgBouncer in transaction mode, where a statement prepared in one transaction is missing
in the next, which another server connection runs (``tests/integration/test_pgbouncer.py``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any
from uuid import uuid4

import psycopg
from psycopg.rows import dict_row
from psycopg.types.json import Jsonb

from provisioner.db.pipelines import async_pipeline, pipeline
from provisioner.db.translate import placement_refused
from provisioner.errors import InvalidInput, KeyConflict
from provisioner.models import (
    Job,
    JobStatus,
    TenantId,
)
from provisioner.queue.rows import MAX_ATTEMPTS_LIMIT, NOTIFY_CHANNEL, Conn, fetch_one

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


# Wake idle workers once the surrounding transaction commits; the payload is the job type.
NOTIFY = "SELECT pg_notify(%(channel)s, %(job_type)s)"


# Subscribe a worker's autocommit connection to those wake-ups.
LISTEN = f"LISTEN {NOTIFY_CHANNEL}"


# Make sure the tenant has its control row before its first job. A new row is placed on a
# tenant server by the control database's trigger (control.place_tenant): the least loaded
# (no server in the directory: the control database). An existing row keeps its server: a
# tenant is placed once.
ENSURE_TENANT = """
INSERT INTO control.tenants (tenant_id, schema_name)
VALUES (%(tenant_id)s, %(schema)s)
ON CONFLICT (tenant_id) DO NOTHING
"""


# ENSURE_TENANT for a new tenant on the server named (the trigger checks that it takes it).
ENSURE_TENANT_ON_SERVER = """
INSERT INTO control.tenants (tenant_id, schema_name, server)
VALUES (%(tenant_id)s, %(schema)s, %(server)s)
ON CONFLICT (tenant_id) DO NOTHING
"""


# The server a registered tenant lives on (NULL: the control database); no row: not registered.
TENANT_SERVER = "SELECT server FROM control.tenants WHERE tenant_id = %(tenant_id)s"


# ENSURE_TENANT and ENQUEUE_WOKEN in one statement. The job's foreign key is checked at the end
# of the statement, when the tenant's row, inserted by the CTE, is there.
ENSURE_TENANT_ENQUEUE_WOKEN = "WITH tenant AS (" + ENSURE_TENANT.strip() + "\n), " + _ENQUEUE_WOKEN


# The same, for a new tenant on the server named.
ENSURE_TENANT_ON_SERVER_ENQUEUE_WOKEN = (
    "WITH tenant AS (" + ENSURE_TENANT_ON_SERVER.strip() + "\n), " + _ENQUEUE_WOKEN
)


@dataclass(frozen=True)
class Enqueued:
    """What :func:`enqueue` did: the job, and whether this call created or re-queued it."""

    job: Job
    created: bool
    requeued: bool = False


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
    #: the tenant server a new tenant goes to (None: placement chooses)
    server: str | None = None

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
            "server": self.server,
            "id": uuid4(),
        }

    @property
    def statement(self) -> str:
        """A new job with its wake-up (and the tenant's row when the request names a schema,
        on the server it names, if it does)."""
        if self.tenant_schema is None:
            return ENQUEUE_WOKEN
        if self.server is None:
            return ENSURE_TENANT_ENQUEUE_WOKEN
        return ENSURE_TENANT_ON_SERVER_ENQUEUE_WOKEN

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


def _refuse_elsewhere(request: _JobRequest, found: dict[str, Any] | None) -> None:
    """InvalidInput when the request names a server and the tenant lives on another."""
    if request.server is None or found is None or found["server"] == request.server:
        return
    raise InvalidInput(
        f"tenant {request.tenant_id} lives on {found['server'] or 'the control database'}, not "
        f"on {request.server}: a tenant is placed once (nothing was queued)"
    )


def _enqueue(conn: Conn, request: _JobRequest, *, retry_terminal: bool) -> Enqueued:
    params = request.params()
    if request.server is not None:  # one more round trip, only when a server is named
        found = fetch_one(conn, TENANT_SERVER, params, prepare=False)
        _refuse_elsewhere(request, found)
    # A new job with its wake-up, then its run's row: one round trip with the transaction's
    # BEGIN (a sign-up waits for its enqueue, and each round trip of it is latency it sees).
    with placement_refused():
        row = _insert_started(conn, request.statement, params)
    if row is not None:
        return Enqueued(Job.from_row(row), created=True)
    key = {"key": request.idempotency_key}
    job = request.holder(fetch_one(conn, BY_IDEMPOTENCY_KEY, key, prepare=False))
    if _retried(job, retry_terminal):
        requeued = fetch_one(conn, REQUEUE_TERMINAL, {"id": job.id}, prepare=False)
        if requeued is not None:
            start_run(conn, job := Job.from_row(requeued), request.started_by)
            notify(conn, request.job_type)
            return Enqueued(job, created=False, requeued=True)
    return Enqueued(job, created=False)


async def _enqueue_async(
    conn: psycopg.AsyncConnection[Any], request: _JobRequest, *, retry_terminal: bool
) -> Enqueued:
    """:func:`_enqueue` on an async connection: the same statements, awaited."""
    params = request.params()
    if request.server is not None:
        async with conn.cursor(row_factory=dict_row) as cur:
            await cur.execute(TENANT_SERVER, params, prepare=False)
            _refuse_elsewhere(request, await cur.fetchone())
    with placement_refused():
        async with async_pipeline(conn), conn.cursor(row_factory=dict_row) as cur:
            await cur.execute(request.statement, params, prepare=False)
            await conn.execute(RUN_START_ENQUEUED, params, prepare=False)
            row = await cur.fetchone()
    if row is not None:
        return Enqueued(Job.from_row(row), created=True)
    async with conn.cursor(row_factory=dict_row) as cur:
        await cur.execute(BY_IDEMPOTENCY_KEY, {"key": request.idempotency_key}, prepare=False)
        job = request.holder(await cur.fetchone())
        if _retried(job, retry_terminal):
            await cur.execute(REQUEUE_TERMINAL, {"id": job.id}, prepare=False)
            requeued = await cur.fetchone()
            if requeued is not None:
                job = Job.from_row(requeued)
                await cur.execute(RUN_START, _run_params(job, request.started_by), prepare=False)
                await cur.execute(NOTIFY, _notify_params(job.job_type), prepare=False)
                return Enqueued(job, created=False, requeued=True)
    return Enqueued(job, created=False)


def _insert_started(conn: Conn, statement: str, params: dict[str, Any]) -> dict[str, Any] | None:
    """The job ``statement`` inserted (None: none), then its run's row: one pipeline, so one
    round trip, together with the ``BEGIN`` psycopg sends first outside a transaction."""
    with pipeline(conn), conn.cursor(row_factory=dict_row) as cur:
        cur.execute(statement, params, prepare=False)
        conn.execute(RUN_START_ENQUEUED, params, prepare=False)
        return cur.fetchone()


def _run_params(job: Job, started_by: str) -> dict[str, Any]:
    return {"job_id": job.id, "run": job.run, "job_type": job.job_type, "started_by": started_by}


def start_run(conn: Conn, job: Job, started_by: str) -> None:
    with conn.cursor() as cur:
        cur.execute(RUN_START, _run_params(job, started_by), prepare=False)


def _notify_params(job_type: str) -> dict[str, Any]:
    return {"channel": NOTIFY_CHANNEL, "job_type": job_type}


def notify(conn: Conn, job_type: str) -> None:
    with conn.cursor() as cur:
        cur.execute(NOTIFY, _notify_params(job_type), prepare=False)


def listen(conn: Conn) -> None:
    """Subscribe ``conn`` (autocommit) to enqueue wake-ups; read them with :func:`wake_ups`."""
    with conn.cursor() as cur:
        cur.execute(LISTEN)


def wake_ups(conn: Conn) -> list[str]:
    """The job types of the wake-ups already received on a listening connection; never waits."""
    return [notify.payload for notify in conn.notifies(timeout=0)]


def ensure_tenant_job(
    conn: Conn,
    tenant: TenantId,
    job_type: str,
    idempotency_key: str | None,
    *,
    retry_terminal: bool = False,
    started_by: str = "enqueue",
    server: str | None = None,
) -> Enqueued:
    """The tenant's control row and its job of ``job_type`` under the key, created if missing.

    A new tenant is placed on ``server`` when one is named (refused with NoServerRoom when it
    takes no new tenants), else on the least loaded active server of the directory, in the
    same statement; a registered tenant living on another server than the one named is
    refused (InvalidInput) before anything is written.

    A new job costs two statements in one round trip, with the transaction's ``BEGIN``:
    :data:`ENSURE_TENANT_ENQUEUE_WOKEN` (the tenant's row, the job and its wake-up), then its
    run's row. An error (a refused row, a key held by another job) is raised as it would be
    one statement at a time.
    """
    request = _tenant_request(tenant, job_type, idempotency_key, started_by, server)
    return _enqueue(conn, request, retry_terminal=retry_terminal)


async def ensure_tenant_job_async(
    conn: psycopg.AsyncConnection[Any],
    tenant: TenantId,
    job_type: str,
    idempotency_key: str | None,
    *,
    retry_terminal: bool = False,
    started_by: str = "enqueue",
    server: str | None = None,
) -> Enqueued:
    """:func:`ensure_tenant_job` for a psycopg ``AsyncConnection``: the same statements, in
    the same round trips, awaited."""
    request = _tenant_request(tenant, job_type, idempotency_key, started_by, server)
    return await _enqueue_async(conn, request, retry_terminal=retry_terminal)


def _tenant_request(
    tenant: TenantId,
    job_type: str,
    idempotency_key: str | None,
    started_by: str,
    server: str | None = None,
) -> _JobRequest:
    return _JobRequest(
        job_type,
        tenant.value,
        None,
        idempotency_key,
        5,
        started_by,
        tenant_schema=tenant.schema,
        server=server,
    )
