"""Per-attempt record of every step run: what ran, where, when, and how it ended.

Revision ID: 20260728_c004
Revises: 20260727_c003
Create Date: 2026-07-28
"""

from alembic import op

from provisioner.control_migrations.privileges import grant_to_app_role, revoke_from_app_role

revision = "20260728_c004"
down_revision = "20260727_c003"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.execute(
        """
        CREATE TABLE control.job_step_runs (
            id          BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
            job_id      UUID NOT NULL
                        REFERENCES control.platform_jobs (id) ON DELETE CASCADE,
            tenant_id   TEXT,
            attempt     INTEGER NOT NULL,
            step        TEXT NOT NULL,
            worker      TEXT NOT NULL,
            started_at  TIMESTAMPTZ NOT NULL DEFAULT clock_timestamp(),
            finished_at TIMESTAMPTZ,
            outcome     TEXT NOT NULL DEFAULT 'running'
                        CONSTRAINT job_step_runs_outcome_check
                        CHECK (outcome IN ('running', 'succeeded', 'failed', 'lease_lost',
                                           'abandoned')),
            detail      TEXT
        )
        """
    )
    op.execute("CREATE INDEX job_step_runs_job_idx ON control.job_step_runs (job_id, id)")
    op.execute(
        "CREATE INDEX job_step_runs_tenant_idx ON control.job_step_runs (tenant_id, started_at)"
    )
    grant_to_app_role("SELECT", "TABLE control.job_step_runs")
    # Stale recovery closes the open runs of the jobs it takes back.
    grant_to_app_role("UPDATE (finished_at, outcome, detail)", "TABLE control.job_step_runs")


def downgrade() -> None:
    revoke_from_app_role("ALL", "TABLE control.job_step_runs")
    op.execute("DROP TABLE control.job_step_runs")
