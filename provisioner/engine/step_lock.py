"""A step transaction's first statement: its tenant's lock and its commit mode, sent with its
``BEGIN`` (:meth:`provisioner.db.Session.transaction`), or with the commit before it that
begins it (the step before it, or the job before it: :mod:`provisioner.engine.handoff`).
"""

from __future__ import annotations

from psycopg import sql

from provisioner import queue

# A step's transaction starts by taking its tenant's lock, in the same simple query as its
# BEGIN (db.Database.transaction): the values are composed as literals. The lock is the
# tenant's row in control.tenant_locks, on which the application role has no privilege at all,
# so no application session can take it or hold it (the advisory lock it replaced could be held
# by any role, and an app_rw session holding it hung suspend and purge). The upsert locks the
# row whether it exists or not: ON CONFLICT DO UPDATE locks the row even when its WHERE
# updates nothing, and writes no new row version. It also sets the
# transaction to commit without waiting for its WAL flush. Safe: WAL is replayed in order, so a
# server crash can lose only a tail of such commits, each one atomically (the step's work
# together with its checkpoint): the job then resumes from an earlier, consistent checkpoint
# (its claim is asynchronous too). The statement that completes the job, in its last step's
# transaction, sets the commit back to durable (queue.RECORD_LAST_STEP): what a caller is told
# succeeded is durable, and that flush makes every earlier step of the job durable with it.
# One statement, not two: one execute costs psycopg less than a pipeline of two.
LOCK_ASYNC_COMMIT = sql.SQL(
    "WITH locked AS (INSERT INTO control.tenant_locks AS l (tenant_id) VALUES ({}) "
    "ON CONFLICT (tenant_id) DO UPDATE SET tenant_id = l.tenant_id WHERE false) "
    "SELECT set_config('synchronous_commit', 'off', true)"
)


def tenant_lock(tenant: str) -> sql.Composed:
    """A step's first statement: the tenant's lock and the step's commit mode, in one statement,
    sent with the transaction's BEGIN."""
    return LOCK_ASYNC_COMMIT.format(sql.Literal(tenant))


def next_lock(claimed: queue.Claim | None) -> sql.Composed | None:
    """The first statement of the claimed next job's first step on control (None: no job, no
    tenant, or a tenant on a tenant server). A job on a tenant server does its step's work
    there first and opens its control transaction only after that commit
    (:mod:`provisioner.engine.remote`): a transaction begun for it now would sit idle on
    control, the tenant's lock held, for as long as the server's work lasts, and a step longer
    than the session's idle timeout would find that session ended at its close."""
    if claimed is None or claimed.job.tenant_id is None or claimed.tenant_server is not None:
        return None
    return tenant_lock(claimed.job.tenant_id)
