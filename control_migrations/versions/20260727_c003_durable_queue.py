"""Make control.platform_jobs a durable retryable work queue.

Revision ID: 20260727_c003
Revises: 20260724_c002
Create Date: 2026-07-27
"""

from alembic import op

from provisioner.control_migrations.privileges import grant_to_app_role, revoke_from_app_role

revision = "20260727_c003"
down_revision = "20260724_c002"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.execute(
        """
        ALTER TABLE control.platform_jobs
            ADD COLUMN IF NOT EXISTS payload JSONB NOT NULL DEFAULT '{}'::jsonb,
            ADD COLUMN IF NOT EXISTS idempotency_key TEXT,
            ADD COLUMN IF NOT EXISTS attempts INTEGER NOT NULL DEFAULT 0
                CHECK (attempts >= 0),
            ADD COLUMN IF NOT EXISTS max_attempts INTEGER NOT NULL DEFAULT 5
                CHECK (max_attempts >= 1),
            ADD COLUMN IF NOT EXISTS available_at TIMESTAMPTZ NOT NULL DEFAULT now(),
            ADD COLUMN IF NOT EXISTS locked_at TIMESTAMPTZ,
            ADD COLUMN IF NOT EXISTS locked_by TEXT,
            ADD COLUMN IF NOT EXISTS finished_at TIMESTAMPTZ
        """
    )
    op.execute(
        """
        -- CONCURRENTLY cannot run in the migration's transaction; the table is a small job
        -- record when this revision runs, so the brief lock is harmless.
        -- squawk-ignore require-concurrent-index-creation
        CREATE UNIQUE INDEX IF NOT EXISTS platform_jobs_idempotency_idx
            ON control.platform_jobs (idempotency_key) WHERE idempotency_key IS NOT NULL
        """
    )
    op.execute(
        """
        -- CONCURRENTLY cannot run in the migration's transaction; the table is a small job
        -- record when this revision runs, so the brief lock is harmless.
        -- squawk-ignore require-concurrent-index-creation
        CREATE INDEX IF NOT EXISTS platform_jobs_queue_idx
            ON control.platform_jobs (status, available_at, created_at) WHERE status = 'queued'
        """
    )
    op.execute(
        """
        CREATE TABLE IF NOT EXISTS control.runtime_heartbeats (
            component    TEXT PRIMARY KEY,
            instance_id  TEXT NOT NULL,
            heartbeat_at TIMESTAMPTZ NOT NULL DEFAULT now(),
            detail       JSONB NOT NULL DEFAULT '{}'::jsonb
        )
        """
    )
    grant_to_app_role("SELECT, INSERT, UPDATE", "TABLE control.runtime_heartbeats")


def downgrade() -> None:
    revoke_from_app_role("ALL", "TABLE control.runtime_heartbeats")
    op.execute("DROP TABLE control.runtime_heartbeats")
    op.execute("DROP INDEX control.platform_jobs_queue_idx")
    op.execute("DROP INDEX control.platform_jobs_idempotency_idx")
    op.execute(
        """
        ALTER TABLE control.platform_jobs
            DROP COLUMN finished_at,
            DROP COLUMN locked_by,
            DROP COLUMN locked_at,
            DROP COLUMN available_at,
            DROP COLUMN max_attempts,
            DROP COLUMN attempts,
            DROP COLUMN idempotency_key,
            DROP COLUMN payload
        """
    )
