"""Leases tied to their holder's heartbeat; lock waits counted apart from attempts.

``control.lease_holders``: one row per lease holder (a worker's engine process), beaten by its
worker's heartbeat thread with every beat, stamped with the lease it promises
(``lease_seconds``: three heartbeat intervals). A running job whose holder's row is older than
its lease is abandoned: recovery queues it again at once (fenced as ever by ``locked_by`` and
``attempts``), instead of after the stale threshold, which stays the bound for a holder that
never beats (a one-off command) or that keeps beating. Only the owner writes the table; the
application role reads it (``health`` reports the jobs of a holder that stopped beating) and
can neither keep a dead holder's lease alive nor end a live one's.

``platform_jobs.lock_waits``: how many times in a row the job gave up waiting for a lock (a
lock timeout behind an application's transaction). Such a retry hands its attempt back, so it
never spends the failure budget nor trips a rollout's brake; the count drives its own backoff,
and is reset when a step completes.

``platform_jobs_running_idx``: the running jobs by holder, for the heartbeat's renewal and the
recovery that now runs every heartbeat interval (each read only the running jobs).

Revision ID: 20261202_h27_ops
Revises: 20261202_h27_tenantside
Create Date: 2026-12-02
"""

from alembic import op

from provisioner.control_migrations.privileges import grant_to_app_role, revoke_from_app_role

revision = "20261202_h27_ops"
down_revision = "20261202_h27_tenantside"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.execute(
        """
        CREATE TABLE control.lease_holders (
            holder        TEXT PRIMARY KEY,
            component     TEXT NOT NULL,
            instance_id   TEXT NOT NULL,
            beat_at       TIMESTAMPTZ NOT NULL DEFAULT now() CHECK (isfinite(beat_at)),
            lease_seconds DOUBLE PRECISION NOT NULL
                          CHECK (lease_seconds > 0 AND lease_seconds <= 604800)
        )
        """
    )
    grant_to_app_role("SELECT", "TABLE control.lease_holders")
    op.execute(
        """
        -- CONCURRENTLY cannot run in the migration's transaction; the index holds the running
        -- jobs alone and is built in one scan of the job table, a brief lock.
        -- squawk-ignore require-concurrent-index-creation
        CREATE INDEX platform_jobs_running_idx
            ON control.platform_jobs (locked_by) WHERE status = 'running'
        """
    )
    op.execute(
        """
        ALTER TABLE control.platform_jobs
            ADD COLUMN lock_waits INTEGER NOT NULL DEFAULT 0
                CONSTRAINT platform_jobs_lock_waits_range CHECK (lock_waits >= 0)
        """
    )
    # app_rw's UPDATE on the queue is per column (20261202_h27_approws): a product worker's
    # fenced writes reset lock_waits on its own rows (row-level security keeps it to them).
    grant_to_app_role("UPDATE (lock_waits)", "TABLE control.platform_jobs")


def downgrade() -> None:
    op.execute("ALTER TABLE control.platform_jobs DROP COLUMN lock_waits")
    op.execute("DROP INDEX control.platform_jobs_running_idx")
    revoke_from_app_role("ALL", "TABLE control.lease_holders")
    op.execute("DROP TABLE control.lease_holders")
