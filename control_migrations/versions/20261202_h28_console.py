"""Who ended a run by hand: ``control.job_runs`` gains ``ended_by`` and ``ended_at``.

A run records what started it (``started_by``: ``provision``, ``upgrade``, ``console``...). A
cancel starts no run, it ends one: the owner's cancel now records what cancelled it (``jobs
cancel``, ``console``) on the run it ended, so a tenant's history says who stopped it. Written
by the owner only: the application role keeps SELECT and INSERT on the table, no UPDATE.

Revision ID: 20261202_h28_console
Revises: 20261202_h27_approws
Create Date: 2026-12-02
"""

from alembic import op

revision = "20261202_h28_console"
down_revision = "20261202_h27_approws"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.execute(
        """
        ALTER TABLE control.job_runs
            ADD COLUMN ended_by TEXT,
            ADD COLUMN ended_at TIMESTAMPTZ
        """
    )


def downgrade() -> None:
    op.execute("ALTER TABLE control.job_runs DROP COLUMN ended_at, DROP COLUMN ended_by")
