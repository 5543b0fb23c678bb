"""A job of a paused rollout retried by hand is held like the worker's re-queues.

Revision ``20261202_h28rest`` held a job that a worker queues again while its rollout is
paused (``control.rollout_hold_requeued``, fired on ``running -> queued``). An operator's
``provisioner jobs retry`` (one job, or ``--failed``) and a re-enqueue of a failed or cancelled
job move it from ``failed`` or ``cancelled`` to ``queued``, which that trigger did not see: the
job became claimable at once and a pause no longer meant "nothing starts until resume". The
trigger now fires on every move into ``queued`` from a running or finished-by-failure state,
so the rule stays in one place, whatever statement queues the job.

Revision ID: 20261202_hgaps
Revises: 20261202_h29servers
Create Date: 2026-12-02
"""

from alembic import op

revision = "20261202_hgaps"
down_revision = "20261202_h24names"
branch_labels = None
depends_on = None


def _hold_trigger(from_states: str) -> None:
    """The hold trigger, replaced under the migration's lock (a trigger, no table rewrite)."""
    op.execute("DROP TRIGGER platform_jobs_rollout_hold_requeued ON control.platform_jobs")
    op.execute(
        f"""
        CREATE TRIGGER platform_jobs_rollout_hold_requeued
        BEFORE UPDATE OF status ON control.platform_jobs
        FOR EACH ROW WHEN (OLD.status IN ({from_states}) AND NEW.status = 'queued')
        EXECUTE FUNCTION control.rollout_hold_requeued()
        """
    )


def upgrade() -> None:
    _hold_trigger("'running', 'failed', 'cancelled'")


def downgrade() -> None:
    _hold_trigger("'running'")
