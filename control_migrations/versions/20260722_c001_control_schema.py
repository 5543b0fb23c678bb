"""Control schema: tenants and platform_jobs as a plain job record.

Revision ID: 20260722_c001
Revises:
Create Date: 2026-07-22
"""

from alembic import op

from provisioner.control_migrations.privileges import grant_to_app_role, revoke_from_app_role

revision = "20260722_c001"
down_revision = None
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.execute("CREATE SCHEMA IF NOT EXISTS control")
    op.execute(
        """
        CREATE TABLE control.tenants (
            tenant_id    TEXT PRIMARY KEY,
            schema_name  TEXT NOT NULL UNIQUE,
            display_name TEXT,
            created_at   TIMESTAMPTZ NOT NULL DEFAULT now(),
            updated_at   TIMESTAMPTZ NOT NULL DEFAULT now()
        )
        """
    )
    op.execute(
        """
        CREATE TABLE control.platform_jobs (
            id              UUID PRIMARY KEY DEFAULT gen_random_uuid(),
            tenant_id       TEXT REFERENCES control.tenants (tenant_id) ON DELETE CASCADE,
            job_type        TEXT NOT NULL,
            status          TEXT NOT NULL DEFAULT 'queued'
                            CONSTRAINT platform_jobs_status_check
                            CHECK (status IN ('queued', 'running', 'succeeded', 'failed',
                                              'cancelled')),
            progress        INTEGER NOT NULL DEFAULT 0
                            CONSTRAINT platform_jobs_progress_check
                            CHECK (progress BETWEEN 0 AND 100),
            steps_completed JSONB NOT NULL DEFAULT '[]'::jsonb,
            error_detail    TEXT,
            created_at      TIMESTAMPTZ NOT NULL DEFAULT now(),
            updated_at      TIMESTAMPTZ NOT NULL DEFAULT now()
        )
        """
    )
    op.execute("CREATE INDEX platform_jobs_tenant_idx ON control.platform_jobs (tenant_id)")
    grant_to_app_role("USAGE", "SCHEMA control")
    grant_to_app_role("SELECT, INSERT, UPDATE", "TABLE control.tenants, control.platform_jobs")


def downgrade() -> None:
    revoke_from_app_role("ALL", "TABLE control.tenants, control.platform_jobs")
    op.execute("DROP TABLE control.platform_jobs")
    op.execute("DROP TABLE control.tenants")
