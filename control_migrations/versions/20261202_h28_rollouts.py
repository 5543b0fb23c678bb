"""Rollouts that end, and say how: ``completed`` replaces ``done``, a rollout records when it
finished, and each of its tenants the revision it started from and whether it was skipped.

A rollout is ``canary`` (waiting for review), ``running``, ``halted`` (the brake held the rest),
or ends ``completed`` (no job of it is queued or running any more) or ``aborted``. Nothing
closes a running rollout but its last job: a trigger (``control.rollout_finish``) completes a
running rollout in the transaction that settles its last queued or running job, whichever
process wrote it, as the brake halts one; ``control.rollout_settle(id)`` is that check, which
a resume that queued nothing calls itself. ``finished_at`` is stamped when a rollout completes
or is aborted. A ``skipped`` tenant left the fleet (suspended, archived or purged) before its
job was queued or released: it is not upgraded, and does not count as a failure.

Revision ID: 20261202_h28_rollouts
Revises: 20261202_h27_ops
Create Date: 2026-12-02
"""

from alembic import op

revision = "20261202_h28_rollouts"
down_revision = "20261202_h27_ops"
branch_labels = None
depends_on = None


def _drop_check(table: str, name: str) -> None:
    """A state CHECK about to be replaced (the next statement adds its successor)."""
    op.execute(
        f"""
        -- squawk-ignore ban-drop-constraint
        ALTER TABLE control.{table} DROP CONSTRAINT {name}
        """
    )


def _add_check(table: str, name: str, check: str) -> None:
    """A CHECK on a small control table, validated at once under the migration's lock."""
    op.execute(
        f"""
        -- squawk-ignore constraint-missing-not-valid
        ALTER TABLE control.{table} ADD CONSTRAINT {name} CHECK ({check})
        """
    )


def upgrade() -> None:
    _drop_check("rollouts", "rollouts_state_check")
    op.execute("UPDATE control.rollouts SET state = 'completed' WHERE state = 'done'")
    _add_check(
        "rollouts",
        "rollouts_state_check",
        "state IN ('canary', 'running', 'halted', 'completed', 'aborted')",
    )
    op.execute("ALTER TABLE control.rollouts ADD COLUMN finished_at TIMESTAMPTZ")
    op.execute(
        """
        UPDATE control.rollouts SET finished_at = updated_at
         WHERE state IN ('completed', 'aborted')
        """
    )
    _add_check("rollouts", "rollouts_finished_at_finite", "isfinite(finished_at)")
    _drop_check("rollout_tenants", "rollout_tenants_state_check")
    _add_check(
        "rollout_tenants",
        "rollout_tenants_state_check",
        "state IN ('pending', 'queued', 'dropped', 'skipped')",
    )
    op.execute("ALTER TABLE control.rollout_tenants ADD COLUMN from_revision TEXT")
    op.execute(
        """
        CREATE FUNCTION control.rollout_settle(rollout BIGINT) RETURNS TEXT
        LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog AS $settle$
        DECLARE
            now_state TEXT;
        BEGIN
            -- Serialised on the rollout's row: of two jobs settled at once, the second to
            -- take the lock sees the first one's commit, so the last one always completes it.
            SELECT r.state INTO now_state FROM control.rollouts r
             WHERE r.id = rollout FOR UPDATE;
            IF now_state IS DISTINCT FROM 'running' THEN
                RETURN now_state;
            END IF;
            IF EXISTS (SELECT 1 FROM control.rollout_tenants t
                         JOIN control.platform_jobs j ON j.id = t.job_id
                        WHERE t.rollout_id = rollout AND t.state = 'queued'
                          AND j.status IN ('queued', 'running')) THEN
                RETURN now_state;
            END IF;
            UPDATE control.rollouts SET state = 'completed', finished_at = now(),
                   updated_at = now()
             WHERE id = rollout;
            RETURN 'completed';
        END
        $settle$
        """
    )
    op.execute(
        """
        CREATE FUNCTION control.rollout_finish() RETURNS trigger
        LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog AS $finish$
        DECLARE
            rollout BIGINT;
        BEGIN
            FOR rollout IN
                SELECT t.rollout_id FROM control.rollout_tenants t
                  JOIN control.rollouts r ON r.id = t.rollout_id
                 WHERE t.job_id = NEW.id AND t.state = 'queued' AND r.state = 'running'
            LOOP
                -- More of the rollout waits in the queue: its own settlement will look
                -- again, so no lock is taken here. Only the head of the queue is read, in
                -- claim order through the queue's index (a bounded read per job, whatever the
                -- rollout's size); a rollout whose queued jobs are further back is looked at
                -- under the lock by rollout_settle, which finds them and leaves it running.
                CONTINUE WHEN EXISTS (
                    SELECT 1
                      FROM (SELECT j.id FROM control.platform_jobs j
                             WHERE j.status = 'queued'
                             ORDER BY j.status, j.available_at, j.created_at
                             LIMIT 100) AS head
                      JOIN control.rollout_tenants t ON t.job_id = head.id
                     WHERE t.rollout_id = rollout AND t.state = 'queued');
                PERFORM control.rollout_settle(rollout);
            END LOOP;
            RETURN NULL;
        END
        $finish$
        """
    )
    # Fires after the brake's trigger (names in order): a failure that halts a rollout leaves
    # it halted, not completed.
    op.execute(
        """
        CREATE TRIGGER platform_jobs_rollout_finish
        AFTER UPDATE OF status ON control.platform_jobs
        FOR EACH ROW WHEN (NEW.status IN ('succeeded', 'failed', 'cancelled')
                           AND OLD.status IN ('queued', 'running'))
        EXECUTE FUNCTION control.rollout_finish()
        """
    )
    op.execute("REVOKE ALL ON FUNCTION control.rollout_finish() FROM PUBLIC")
    op.execute("REVOKE ALL ON FUNCTION control.rollout_settle(BIGINT) FROM PUBLIC")
    # Rollouts left running although their last job settled before this revision: completed.
    op.execute("SELECT control.rollout_settle(id) FROM control.rollouts WHERE state = 'running'")


def downgrade() -> None:
    op.execute("DROP TRIGGER platform_jobs_rollout_finish ON control.platform_jobs")
    op.execute("DROP FUNCTION control.rollout_finish()")
    op.execute("DROP FUNCTION control.rollout_settle(BIGINT)")
    op.execute("ALTER TABLE control.rollout_tenants DROP COLUMN from_revision")
    _drop_check("rollout_tenants", "rollout_tenants_state_check")
    op.execute("UPDATE control.rollout_tenants SET state = 'dropped' WHERE state = 'skipped'")
    _add_check(
        "rollout_tenants",
        "rollout_tenants_state_check",
        "state IN ('pending', 'queued', 'dropped')",
    )
    op.execute("ALTER TABLE control.rollouts DROP COLUMN finished_at")
    _drop_check("rollouts", "rollouts_state_check")
    op.execute("UPDATE control.rollouts SET state = 'done' WHERE state = 'completed'")
    _add_check(
        "rollouts",
        "rollouts_state_check",
        "state IN ('canary', 'running', 'halted', 'aborted', 'done')",
    )
