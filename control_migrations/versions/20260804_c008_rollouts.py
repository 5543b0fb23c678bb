"""Fleet rollouts: which tenants an ``upgrade`` queued, in which wave, and the failure brake.

A rollout row records one ``provisioner upgrade``: its target head, its canary size and its
``max_failures`` brake. ``rollout_tenants`` lists its tenants and their jobs; a ``pending``
tenant's job has not been queued yet (the canary is under review). When a job of a running
rollout turns failed and the rollout has reached ``max_failures`` failed jobs, the trigger holds
the rollout's queued jobs (``available_at`` set to 9999-01-01, a finite date drivers can read:
never claimed, not failed) and halts the rollout, in the same transaction as the failure,
whichever process wrote it.

``tenant_upgrade_references``: for one state of the tenant tree and one starting revision, the
catalog fingerprint Alembic builds when it upgrades a granted tenant from there to the head
(computed once per database on a scratch schema that is rolled back): what a replayed upgrade
must match.

Revision ID: 20260804_c008
Revises: 20260728_c004
Create Date: 2026-08-04
"""

from alembic import op

from provisioner.control_migrations.privileges import grant_to_app_role, revoke_from_app_role

revision = "20260804_c008"
down_revision = "20260803_c007"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.execute(
        """
        CREATE TABLE control.rollouts (
            id           BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
            head         TEXT NOT NULL,
            canary       INTEGER CHECK (canary >= 1),
            max_failures INTEGER CHECK (max_failures >= 1),
            state        TEXT NOT NULL DEFAULT 'running'
                         CONSTRAINT rollouts_state_check
                         CHECK (state IN ('canary', 'running', 'halted', 'aborted', 'done')),
            created_at   TIMESTAMPTZ NOT NULL DEFAULT now(),
            updated_at   TIMESTAMPTZ NOT NULL DEFAULT now()
        )
        """
    )
    op.execute(
        """
        CREATE TABLE control.rollout_tenants (
            rollout_id BIGINT NOT NULL REFERENCES control.rollouts (id) ON DELETE CASCADE,
            tenant_id  TEXT NOT NULL,
            job_id     UUID NOT NULL REFERENCES control.platform_jobs (id) ON DELETE CASCADE,
            wave       TEXT NOT NULL CHECK (wave IN ('canary', 'main')),
            state      TEXT NOT NULL DEFAULT 'pending'
                       CONSTRAINT rollout_tenants_state_check
                       CHECK (state IN ('pending', 'queued', 'dropped')),
            PRIMARY KEY (rollout_id, tenant_id)
        )
        """
    )
    op.execute("CREATE INDEX rollout_tenants_job_idx ON control.rollout_tenants (job_id)")
    op.execute(
        """
        CREATE TABLE control.tenant_upgrade_references (
            tree_digest TEXT NOT NULL,
            start       TEXT NOT NULL,
            heads       TEXT[] NOT NULL,
            fingerprint JSONB NOT NULL,
            created_by  TEXT NOT NULL,
            created_at  TIMESTAMPTZ NOT NULL DEFAULT now(),
            PRIMARY KEY (tree_digest, start)
        )
        """
    )
    op.execute(
        """
        CREATE FUNCTION control.rollout_brake() RETURNS trigger
        LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog AS $brake$
        DECLARE
            active control.rollouts%ROWTYPE;
        BEGIN
            SELECT r.* INTO active
              FROM control.rollout_tenants t JOIN control.rollouts r ON r.id = t.rollout_id
             WHERE t.job_id = NEW.id AND r.state = 'running' AND r.max_failures IS NOT NULL
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
    op.execute(
        """
        CREATE TRIGGER platform_jobs_rollout_brake
        AFTER UPDATE OF status ON control.platform_jobs
        FOR EACH ROW WHEN (NEW.status = 'failed' AND OLD.status IS DISTINCT FROM 'failed')
        EXECUTE FUNCTION control.rollout_brake()
        """
    )
    op.execute("REVOKE ALL ON FUNCTION control.rollout_brake() FROM PUBLIC")
    grant_to_app_role("SELECT", "TABLE control.rollouts")
    grant_to_app_role("SELECT", "TABLE control.rollout_tenants")


def downgrade() -> None:
    revoke_from_app_role("ALL", "TABLE control.rollout_tenants")
    revoke_from_app_role("ALL", "TABLE control.rollouts")
    op.execute("DROP TRIGGER platform_jobs_rollout_brake ON control.platform_jobs")
    op.execute("DROP FUNCTION control.rollout_brake()")
    op.execute("DROP TABLE control.tenant_upgrade_references")
    op.execute("DROP TABLE control.rollout_tenants")
    op.execute("DROP TABLE control.rollouts")
