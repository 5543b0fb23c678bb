"""Tenant lifecycle after onboarding, and numbered runs of a job.

* ``control.tenants.state`` gains ``deleted`` (a purged tenant: schema dropped, row kept as the
  audit record); ``previous_state`` is the state restore returns to; ``deleted_at`` stamps purge.
* ``control.platform_jobs.run`` counts the runs of a job: re-opening it (upgrade, repair,
  ``jobs retry``, a second suspend) starts run n+1 with its attempts from 1. Step runs record
  their run, and ``control.job_runs`` says which kind and which command started each run.

Revision ID: 20260802_c006
Revises: 20260728_c004
Create Date: 2026-08-02
"""

from alembic import op

from provisioner.control_migrations.privileges import (
    for_app_role,
    grant_to_app_role,
    revoke_from_app_role,
)

revision = "20260802_c006"
down_revision = "20260801_c005"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.execute(
        """
        -- The state CHECK widens (one more state): every existing row keeps satisfying it.
        -- squawk-ignore ban-drop-constraint
        ALTER TABLE control.tenants DROP CONSTRAINT tenants_state_check
        """
    )
    op.execute(
        """
        -- squawk-ignore constraint-missing-not-valid
        ALTER TABLE control.tenants ADD CONSTRAINT tenants_state_check
            CHECK (state IN ('pending', 'provisioning', 'onboarding', 'active', 'suspended',
                             'archived', 'deleted'))
        """
    )
    op.execute(
        """
        ALTER TABLE control.tenants
            ADD COLUMN previous_state TEXT,
            ADD COLUMN deleted_at TIMESTAMPTZ
        """
    )
    op.execute("ALTER TABLE control.platform_jobs ADD COLUMN run INTEGER NOT NULL DEFAULT 1")
    op.execute("ALTER TABLE control.job_step_runs ADD COLUMN run INTEGER NOT NULL DEFAULT 1")
    op.execute(
        """
        CREATE TABLE control.job_runs (
            job_id      UUID NOT NULL
                        REFERENCES control.platform_jobs (id) ON DELETE CASCADE,
            run         INTEGER NOT NULL,
            job_type    TEXT NOT NULL,
            started_by  TEXT NOT NULL,
            started_at  TIMESTAMPTZ NOT NULL DEFAULT now(),
            PRIMARY KEY (job_id, run)
        )
        """
    )
    op.execute(
        """
        INSERT INTO control.job_runs (job_id, run, job_type, started_by, started_at)
        SELECT id, 1, job_type, 'unknown (before run numbers)', created_at
          FROM control.platform_jobs
        """
    )
    grant_to_app_role("SELECT, INSERT", "TABLE control.job_runs")
    # app_rw records the first run of a job it just inserted (its enqueue) and the runs of the
    # product jobs it works; later runs of the owner's kinds, and who started them, are the
    # owner's to write (the owner owns the table: no policy binds it).
    op.execute("ALTER TABLE control.job_runs ENABLE ROW LEVEL SECURITY")
    for_app_role(
        "CREATE POLICY app_reads_runs ON control.job_runs FOR SELECT TO {role} USING (true)"
    )
    for_app_role(
        """
        CREATE POLICY app_records_first_runs ON control.job_runs FOR INSERT TO {role}
        WITH CHECK (
            EXISTS (SELECT 1 FROM control.platform_jobs j
                     WHERE j.id = job_runs.job_id AND j.run = job_runs.run
                       AND j.job_type = job_runs.job_type
                       AND (j.run = 1 OR j.job_type IN ('train_tenant_model',
                                                        'materialize_insights', 'send_email')))
        )
        """
    )


def downgrade() -> None:
    revoke_from_app_role("ALL", "TABLE control.job_runs")
    op.execute("DROP TABLE control.job_runs")
    op.execute("ALTER TABLE control.job_step_runs DROP COLUMN run")
    op.execute("ALTER TABLE control.platform_jobs DROP COLUMN run")
    op.execute("UPDATE control.tenants SET state = 'archived' WHERE state = 'deleted'")
    op.execute(
        """
        -- squawk-ignore ban-drop-constraint
        ALTER TABLE control.tenants
            DROP CONSTRAINT tenants_state_check,
            DROP COLUMN deleted_at,
            DROP COLUMN previous_state
        """
    )
    op.execute(
        """
        -- squawk-ignore constraint-missing-not-valid
        ALTER TABLE control.tenants ADD CONSTRAINT tenants_state_check
            CHECK (state IN ('pending', 'provisioning', 'onboarding', 'active', 'suspended',
                             'archived'))
        """
    )
