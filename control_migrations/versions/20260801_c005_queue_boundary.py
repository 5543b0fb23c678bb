"""The database enforces the app_rw boundary and keeps every queue row processable.

``app_rw`` is not trusted: what the owner side acts on (a provisioning job's tenant, key,
status, steps and lease; the step history; the provisioner-worker's heartbeat; a tenant's
state) can only be written by the owner role. Row-level security scopes ``app_rw``:

* ``platform_jobs``: reads every row; inserts a ``provision_tenant`` job only queued, with no
  steps, no lease, no attempts and the canonical key ``provision:<tenant_id>``; inserts and
  updates the product job types (the product worker claims them as ``app_rw``), whose keys may
  never start with ``provision:``; never updates a provisioning row. No DELETE (as before).
* ``tenants``: reads every row; registers a tenant (``tenant_id``, ``schema_name =
  tenant_<id>``, ``display_name``) in state ``pending``; never changes one.
* ``job_step_runs``: read only.
* ``runtime_heartbeats``: a trigger stamps ``written_by`` with the writing role; ``app_rw``
  updates only the rows it wrote, so it can neither overwrite the owner's beat nor pass a beat
  of its own for the owner's (``health`` trusts a component that advertises an owner job type
  only when the owner wrote its row).

Constraints keep every timestamp finite (psycopg cannot load ``-infinity``, so one such row
used to stop every claim) and ``max_attempts`` within 1-100. Rows breaking them are repaired
first; the constraints are added NOT VALID (no long validation lock) and hold for every write.

Revision ID: 20260801_c005
Revises: 20260728_c004
Create Date: 2026-08-01
"""

from alembic import op

from provisioner.control_migrations.privileges import (
    for_app_role,
    grant_to_app_role,
    revoke_from_app_role,
)

revision = "20260801_c005"
down_revision = "20260728_c004"
branch_labels = None
depends_on = None

#: Job types the product worker runs as app_rw; every other type belongs to the owner.
PRODUCT_JOB_TYPES = "('train_tenant_model', 'materialize_insights', 'send_email')"
NOT_A_PROVISION_KEY = "(idempotency_key IS NULL OR idempotency_key NOT LIKE 'provision:%')"
FINITE_JOB_TIMES = (
    "isfinite(created_at) AND isfinite(updated_at) AND isfinite(available_at)"
    " AND (locked_at IS NULL OR isfinite(locked_at))"
    " AND (finished_at IS NULL OR isfinite(finished_at))"
)
REPAIRED = "refused by control migration 20260801_c005: a timestamp of this job was not finite"


def upgrade() -> None:
    _repair_rows()
    _add_constraints()
    _scope_jobs()
    _scope_tenants()
    revoke_from_app_role("UPDATE", "TABLE control.job_step_runs")
    _stamp_heartbeats()


def _repair_rows() -> None:
    op.execute(
        f"""
        UPDATE control.platform_jobs
           SET status = CASE WHEN status IN ('queued', 'running') THEN 'failed' ELSE status END,
               error_detail = CASE WHEN status IN ('queued', 'running') THEN '{REPAIRED}'
                                   ELSE error_detail END,
               created_at = CASE WHEN isfinite(created_at) THEN created_at ELSE now() END,
               updated_at = now(),
               available_at = CASE WHEN isfinite(available_at) THEN available_at ELSE now() END,
               locked_at = NULL, locked_by = NULL,
               finished_at = CASE WHEN isfinite(finished_at) THEN finished_at ELSE now() END
         WHERE NOT ({FINITE_JOB_TIMES})
        """
    )
    op.execute("UPDATE control.platform_jobs SET max_attempts = 100 WHERE max_attempts > 100")
    op.execute(
        "UPDATE control.platform_jobs SET steps_completed = '[]'::jsonb "
        "WHERE jsonb_typeof(steps_completed) <> 'array'"
    )
    op.execute(
        "UPDATE control.runtime_heartbeats SET heartbeat_at = now() "
        "WHERE NOT isfinite(heartbeat_at)"
    )


def _add_constraints() -> None:
    op.execute(
        f"""
        ALTER TABLE control.platform_jobs
            ADD CONSTRAINT platform_jobs_finite_times CHECK ({FINITE_JOB_TIMES}) NOT VALID
        """
    )
    op.execute(
        """
        ALTER TABLE control.platform_jobs
            ADD CONSTRAINT platform_jobs_max_attempts_range
            CHECK (max_attempts BETWEEN 1 AND 100) NOT VALID
        """
    )
    op.execute(
        """
        ALTER TABLE control.platform_jobs
            ADD CONSTRAINT platform_jobs_steps_array
            CHECK (jsonb_typeof(steps_completed) = 'array') NOT VALID
        """
    )
    op.execute(
        """
        ALTER TABLE control.runtime_heartbeats
            ADD CONSTRAINT runtime_heartbeats_finite_time CHECK (isfinite(heartbeat_at)) NOT VALID
        """
    )


def _scope_jobs() -> None:
    op.execute("ALTER TABLE control.platform_jobs ENABLE ROW LEVEL SECURITY")
    for_app_role(
        "CREATE POLICY app_reads_jobs ON control.platform_jobs FOR SELECT TO {role} USING (true)"
    )
    for_app_role(
        f"""
        CREATE POLICY app_enqueues ON control.platform_jobs FOR INSERT TO {{role}}
        WITH CHECK (
            (job_type IN {PRODUCT_JOB_TYPES} AND {NOT_A_PROVISION_KEY})
            OR (job_type = 'provision_tenant'
                AND tenant_id ~ '^[a-z][a-z0-9_]{{0,47}}$'
                AND idempotency_key = 'provision:' || tenant_id
                AND status = 'queued' AND attempts = 0 AND progress = 0
                AND steps_completed = '[]'::jsonb AND error_detail IS NULL
                AND locked_at IS NULL AND locked_by IS NULL AND finished_at IS NULL
                AND available_at <= now())
        )
        """
    )
    for_app_role(
        f"""
        CREATE POLICY app_works_product_jobs ON control.platform_jobs FOR UPDATE TO {{role}}
        USING (job_type IN {PRODUCT_JOB_TYPES})
        WITH CHECK (job_type IN {PRODUCT_JOB_TYPES} AND {NOT_A_PROVISION_KEY})
        """
    )


def _scope_tenants() -> None:
    revoke_from_app_role("INSERT, UPDATE", "TABLE control.tenants")
    grant_to_app_role("INSERT (tenant_id, schema_name, display_name)", "TABLE control.tenants")
    op.execute("ALTER TABLE control.tenants ENABLE ROW LEVEL SECURITY")
    for_app_role(
        "CREATE POLICY app_reads_tenants ON control.tenants FOR SELECT TO {role} USING (true)"
    )
    for_app_role(
        """
        CREATE POLICY app_registers_tenants ON control.tenants FOR INSERT TO {role}
        WITH CHECK (schema_name = 'tenant_' || tenant_id AND state = 'pending')
        """
    )


def _stamp_heartbeats() -> None:
    op.execute("ALTER TABLE control.runtime_heartbeats ADD COLUMN written_by TEXT")
    op.execute(
        """
        CREATE FUNCTION control.stamp_heartbeat_writer() RETURNS trigger
        LANGUAGE plpgsql SET search_path = pg_catalog AS $stamp$
        BEGIN
            NEW.written_by := current_user;
            RETURN NEW;
        END
        $stamp$
        """
    )
    op.execute(
        """
        CREATE TRIGGER runtime_heartbeats_writer
        BEFORE INSERT OR UPDATE ON control.runtime_heartbeats
        FOR EACH ROW EXECUTE FUNCTION control.stamp_heartbeat_writer()
        """
    )
    op.execute("ALTER TABLE control.runtime_heartbeats ENABLE ROW LEVEL SECURITY")
    for_app_role(
        "CREATE POLICY app_reads_beats ON control.runtime_heartbeats FOR SELECT TO {role} "
        "USING (true)"
    )
    for_app_role(
        "CREATE POLICY app_beats ON control.runtime_heartbeats FOR INSERT TO {role} "
        "WITH CHECK (true)"
    )
    for_app_role(
        "CREATE POLICY app_beats_again ON control.runtime_heartbeats FOR UPDATE TO {role} "
        "USING (written_by = current_user) WITH CHECK (true)"
    )


def downgrade() -> None:
    for table, policies in (
        ("runtime_heartbeats", ("app_beats_again", "app_beats", "app_reads_beats")),
        ("tenants", ("app_registers_tenants", "app_reads_tenants")),
        ("platform_jobs", ("app_works_product_jobs", "app_enqueues", "app_reads_jobs")),
    ):
        for policy in policies:
            op.execute(f"DROP POLICY IF EXISTS {policy} ON control.{table}")
        op.execute(f"ALTER TABLE control.{table} DISABLE ROW LEVEL SECURITY")
    op.execute("DROP TRIGGER runtime_heartbeats_writer ON control.runtime_heartbeats")
    op.execute("DROP FUNCTION control.stamp_heartbeat_writer()")
    op.execute("ALTER TABLE control.runtime_heartbeats DROP COLUMN written_by")
    op.execute(
        "ALTER TABLE control.runtime_heartbeats DROP CONSTRAINT runtime_heartbeats_finite_time"
    )
    for name in (
        "platform_jobs_steps_array",
        "platform_jobs_max_attempts_range",
        "platform_jobs_finite_times",
    ):
        op.execute(f"ALTER TABLE control.platform_jobs DROP CONSTRAINT {name}")
    grant_to_app_role("UPDATE (finished_at, outcome, detail)", "TABLE control.job_step_runs")
    revoke_from_app_role("INSERT (tenant_id, schema_name, display_name)", "TABLE control.tenants")
    grant_to_app_role("INSERT, UPDATE", "TABLE control.tenants")
