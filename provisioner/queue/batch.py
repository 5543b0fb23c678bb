"""Many tenants' jobs of one kind queued as one batch: one statement creates the missing jobs,
queues the finished ones again and starts a run of each, in the caller's transaction.

An operator who suspends or purges hundreds of tenants pays for one round trip and one commit,
not one process and one transaction per tenant. A key held by a job of another tenant or kind
refuses the whole batch before anything is written.
"""

from __future__ import annotations

from provisioner.errors import KeyConflict
from provisioner.models import Job
from provisioner.queue.enqueue import notify
from provisioner.queue.rows import Conn, fetch_all

# The jobs already holding the batch's keys.
HOLDERS = """
SELECT idempotency_key, tenant_id, job_type, id FROM control.platform_jobs
 WHERE idempotency_key = ANY(%(keys)s)
"""

# Each tenant's job of the kind: created when missing; a finished one (succeeded, failed or
# cancelled) queued again as a new run with a fresh set of attempts; a queued or running one
# left as it is. Every created or re-queued job's run is recorded with it. The statement's
# sub-statements see the same snapshot, so the insert and the update never touch one row.
ENSURE_BATCH = """
WITH wanted AS (
    SELECT t, k FROM unnest(%(tenants)s::text[], %(keys)s::text[]) AS u(t, k)
), created AS (
    INSERT INTO control.platform_jobs (tenant_id, job_type, idempotency_key)
    SELECT t, %(job_type)s, k FROM wanted
    ON CONFLICT (idempotency_key) WHERE idempotency_key IS NOT NULL DO NOTHING
    RETURNING *
), requeued AS (
    UPDATE control.platform_jobs j
       SET status = 'queued', attempts = 0, run = j.run + 1, available_at = now(),
           locked_at = NULL, locked_by = NULL, finished_at = NULL, updated_at = now()
      FROM wanted w
     WHERE j.idempotency_key = w.k AND j.tenant_id = w.t AND j.job_type = %(job_type)s
       AND j.status IN ('succeeded', 'failed', 'cancelled')
    RETURNING j.*
), started AS (
    INSERT INTO control.job_runs (job_id, run, job_type, started_by)
    SELECT id, run, job_type, %(started_by)s FROM created
    UNION ALL
    SELECT id, run, job_type, %(started_by)s FROM requeued
    ON CONFLICT (job_id, run) DO NOTHING
), unchanged AS (
    SELECT j.* FROM control.platform_jobs j JOIN wanted w ON j.idempotency_key = w.k
     WHERE j.status IN ('queued', 'running')
)
SELECT * FROM created UNION ALL SELECT * FROM requeued UNION ALL SELECT * FROM unchanged
"""


def ensure_batch(
    conn: Conn,
    job_type: str,
    keys: dict[str, str],
    *,
    started_by: str,
    wake_workers: bool = False,
) -> list[Job]:
    """Each tenant's job of ``job_type`` under its key (``keys``: tenant id -> key), queued,
    in one statement; the jobs, by tenant id. KeyConflict (nothing written) when a key is held
    by another tenant's or kind's job. ``wake_workers`` sends one NOTIFY with the commit."""
    if not keys:
        return []
    tenants = sorted(keys)
    ordered = [keys[t] for t in tenants]
    owner_of = {key: tenant for tenant, key in keys.items()}
    clashes = [
        row
        for row in fetch_all(conn, HOLDERS, {"keys": ordered})
        if (row["tenant_id"], row["job_type"]) != (owner_of.get(row["idempotency_key"]), job_type)
    ]
    if clashes:
        named = ", ".join(f"{r['idempotency_key'][:80]} (job {r['id']})" for r in clashes[:5])
        raise KeyConflict(
            f"{len(clashes)} key(s) held by another tenant's or kind's job: {named}; "
            "nothing was queued"
        )
    params = {"tenants": tenants, "keys": ordered, "job_type": job_type, "started_by": started_by}
    jobs = sorted(
        (Job.from_row(r) for r in fetch_all(conn, ENSURE_BATCH, params)),
        key=lambda j: str(j.tenant_id),
    )
    if wake_workers and jobs:
        notify(conn, job_type)
    return jobs
