"""Rollouts an operator can pause, and the stored result of each drift check.

A rollout may now be ``paused``: ``provisioner rollouts pause ID`` (or the console) holds its
queued jobs with the brake's marker (never claimed, not failed), lets its running jobs finish,
and records who paused it and when (``paused_by``, ``paused_at``; cleared on resume). A job of
it that a worker queues again meanwhile (a retry, a lock wait, a release, a recovered lease) is
held too (``control.rollout_hold_requeued``). The brake still counts the failures of the jobs
that finish while it is paused: the K-th halts it, as it halts a running one
(``control.rollout_brake`` now looks at running and paused rollouts).

``control.tenant_checks`` keeps the last drift check of each tenant (``provisioner check``,
``check --all``, and the ``repair_tenant`` job once it has restored what it could): when, its
outcome (clean, drifted, behind, not provisioned), its counts of missing, extra and altered
objects and a short summary. Only the owner writes it; the console's fleet page and the
worker's metrics count the drifted tenants and show when the fleet was last checked.

Revision ID: 20261202_h28rest
Revises: 20261202_h28_rollouts
Create Date: 2026-12-02
"""

from alembic import op

revision = "20261202_h28rest"
down_revision = "20261202_h28_rollouts"
branch_labels = None
depends_on = None

STATES_BEFORE = "state IN ('canary', 'running', 'halted', 'completed', 'aborted')"
STATES_AFTER = "state IN ('canary', 'running', 'paused', 'halted', 'completed', 'aborted')"


def _replace_state_check(check: str) -> None:
    """The rollouts' state CHECK, replaced on a small control table under the migration's lock."""
    op.execute(
        """
        -- squawk-ignore ban-drop-constraint
        ALTER TABLE control.rollouts DROP CONSTRAINT rollouts_state_check
        """
    )
    op.execute(
        f"""
        -- squawk-ignore constraint-missing-not-valid
        ALTER TABLE control.rollouts ADD CONSTRAINT rollouts_state_check CHECK ({check})
        """
    )


def _brake(states: str) -> None:
    """``control.rollout_brake`` (control c008) acting on rollouts in ``states``."""
    op.execute(
        f"""
        CREATE OR REPLACE FUNCTION control.rollout_brake() RETURNS trigger
        LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog AS $brake$
        DECLARE
            active control.rollouts%ROWTYPE;
        BEGIN
            SELECT r.* INTO active
              FROM control.rollout_tenants t JOIN control.rollouts r ON r.id = t.rollout_id
             WHERE t.job_id = NEW.id AND r.state IN ({states}) AND r.max_failures IS NOT NULL
             ORDER BY r.id DESC LIMIT 1
               FOR UPDATE OF r;
            IF NOT FOUND THEN
                RETURN NULL;
            END IF;
            IF (SELECT count(*) FROM control.rollout_tenants t
                  JOIN control.platform_jobs j ON j.id = t.job_id
                 WHERE t.rollout_id = active.id AND t.state = 'queued'
                   AND j.status = 'failed') >= active.max_failures THEN
                UPDATE control.platform_jobs j
                   SET available_at = '9999-01-01 00:00:00+00', updated_at = now()
                  FROM control.rollout_tenants t
                 WHERE t.rollout_id = active.id AND t.job_id = j.id AND j.status = 'queued';
                UPDATE control.rollouts SET state = 'halted', updated_at = now()
                 WHERE id = active.id;
            END IF;
            RETURN NULL;
        END
        $brake$
        """
    )


def upgrade() -> None:
    _replace_state_check(STATES_AFTER)
    op.execute("ALTER TABLE control.rollouts ADD COLUMN paused_at TIMESTAMPTZ")
    op.execute("ALTER TABLE control.rollouts ADD COLUMN paused_by TEXT")
    _brake("'running', 'paused'")
    op.execute(
        """
        CREATE FUNCTION control.rollout_hold_requeued() RETURNS trigger
        LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog AS $hold$
        BEGIN
            -- A job of a paused rollout that a worker queues again (a retry after an error, a
            -- lock wait, a release at shutdown, a stale lease recovered) is held with the
            -- others: a pause starts nothing until resume.
            IF EXISTS (SELECT 1 FROM control.rollout_tenants t
                         JOIN control.rollouts r ON r.id = t.rollout_id
                        WHERE t.job_id = NEW.id AND t.state = 'queued'
                          AND r.state = 'paused') THEN
                NEW.available_at := '9999-01-01 00:00:00+00';
            END IF;
            RETURN NEW;
        END
        $hold$
        """
    )
    op.execute(
        """
        CREATE TRIGGER platform_jobs_rollout_hold_requeued
        BEFORE UPDATE OF status ON control.platform_jobs
        FOR EACH ROW WHEN (OLD.status = 'running' AND NEW.status = 'queued')
        EXECUTE FUNCTION control.rollout_hold_requeued()
        """
    )
    op.execute("REVOKE ALL ON FUNCTION control.rollout_hold_requeued() FROM PUBLIC")
    op.execute(
        """
        CREATE TABLE control.tenant_checks (
            tenant_id  TEXT PRIMARY KEY,
            checked_at TIMESTAMPTZ NOT NULL DEFAULT now() CHECK (isfinite(checked_at)),
            outcome    TEXT NOT NULL
                       CHECK (outcome IN ('clean', 'drifted', 'behind', 'not provisioned')),
            missing    INTEGER NOT NULL DEFAULT 0 CHECK (missing >= 0),
            extra      INTEGER NOT NULL DEFAULT 0 CHECK (extra >= 0),
            altered    INTEGER NOT NULL DEFAULT 0 CHECK (altered >= 0),
            summary    TEXT NOT NULL DEFAULT '',
            checked_by TEXT NOT NULL
        )
        """
    )


def downgrade() -> None:
    op.execute("DROP TABLE control.tenant_checks")
    op.execute("DROP TRIGGER platform_jobs_rollout_hold_requeued ON control.platform_jobs")
    op.execute("DROP FUNCTION control.rollout_hold_requeued()")
    _brake("'running'")
    op.execute("UPDATE control.rollouts SET state = 'halted' WHERE state = 'paused'")
    op.execute("ALTER TABLE control.rollouts DROP COLUMN paused_by")
    op.execute("ALTER TABLE control.rollouts DROP COLUMN paused_at")
    _replace_state_check(STATES_BEFORE)
