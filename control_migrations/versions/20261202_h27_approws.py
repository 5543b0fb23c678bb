"""No row, key or lock of the application role can stall or fool the owner side (issue 27).

* **Times Python can hold.** Every time ``app_rw`` may write (``platform_jobs``, the first
  ``job_runs`` row, ``runtime_heartbeats``) lies strictly between 0001-01-02 and 9999-12-31
  (UTC): psycopg loads any such value in any session time zone, where a finite year 20000
  passed control c005's finite-time constraints and then broke every reader of the row (claim,
  recovery, ``health``, ``jobs list``, ``upgrade``, ``check``). Rows already out of that range are
  repaired first: an unfinished job is failed with a reason (``jobs retry`` queues it again), its
  times brought back to now; a finished job keeps its outcome; a heartbeat is deleted (a live
  process writes its row again within seconds).
* **Owner keys.** A product row's idempotency key may not start with ``provision:`` nor with
  ``<kind>_tenant:`` (``suspend_tenant:T``, ``deprovision_tenant:T``, ``purge_tenant:T``,
  ``restore_tenant:T``, and any kind of ``PROVISIONER_JOB_KIND_MODULES`` named ``..._tenant``):
  those keys are the owner's, so no application row can hold them and make suspend, deprovision
  or purge fail with "key held". A product row already holding one loses its key (the row
  stays). ``control.by_application(job_type)`` names the application's kinds, once, for the
  policies and the queue's statements.
* **A tenant lock the application cannot take.** ``control.tenant_locks`` holds one row per
  tenant id (created with its ``control.tenants`` row by a trigger); the engine's step
  transactions and the claim lock that row, which ``app_rw`` has no privilege on, instead of an
  advisory lock any role can take and hold for ever. ``control.try_lock_tenant`` is the claim's
  try-lock: the row for a session that may update it (the owner), the advisory lock as before
  for anyone else (a product worker's claim as ``app_rw``, whose hold stalls only its own kinds).
* **No table lock for the application.** ``app_rw``'s UPDATE on ``platform_jobs`` and
  ``runtime_heartbeats`` becomes column privileges on the same columns: ``LOCK TABLE`` in any
  mode stronger than ROW EXCLUSIVE needs a table-level UPDATE, DELETE or TRUNCATE, and with one
  ``app_rw`` could hold the whole queue (or every heartbeat) in ACCESS EXCLUSIVE mode.

Revision ID: 20261202_h27_approws
Revises: 20261202_lead24
Create Date: 2026-12-02
"""

from alembic import op

from provisioner.control_migrations.privileges import (
    for_app_role,
    grant_to_app_role,
    revoke_from_app_role,
)

revision = "20261202_h27_approws"
down_revision = "20261202_lead24"
branch_labels = None
depends_on = None

#: Job types the product worker runs as app_rw (the same list as control c005's policies).
PRODUCT_JOB_TYPES = "('train_tenant_model', 'materialize_insights', 'send_email')"

#: Strictly inside what psycopg loads as a Python datetime in any session time zone.
EARLIEST = "'0001-01-02 00:00:00+00'"
LATEST = "'9999-12-31 00:00:00+00'"


def held(column: str) -> str:
    """True when ``column`` (NOT NULL) is a time Python can hold."""
    return f"({column} > {EARLIEST} AND {column} < {LATEST})"


def held_or_null(column: str) -> str:
    return f"({column} IS NULL OR {held(column)})"


JOB_TIMES = " AND ".join(
    (
        held("created_at"),
        held("updated_at"),
        held("available_at"),
        held_or_null("locked_at"),
        held_or_null("finished_at"),
    )
)
REPAIRED = (
    "failed by control migration 20261202_h27_approws: a time of this job was out of the range "
    "Python can hold (year 20000?), so no worker could claim or recover it; queue it again"
)
#: A key of the owner's kinds: provisioning's, and those of the kinds keyed by tenant.
OWNER_KEY = "(idempotency_key LIKE 'provision:%' OR idempotency_key ~ '^[a-z][a-z0-9_]*_tenant:')"
NOT_AN_OWNER_KEY = f"(idempotency_key IS NULL OR NOT {OWNER_KEY})"

JOB_COLUMNS = (
    "tenant_id, job_type, status, progress, steps_completed, error_detail, created_at, "
    "updated_at, payload, idempotency_key, attempts, max_attempts, available_at, locked_at, "
    "locked_by, finished_at, run"
)
BEAT_COLUMNS = "component, instance_id, heartbeat_at, detail"


def upgrade() -> None:
    _by_application()
    _repair_times()
    _bound_times()
    _reserve_owner_keys()
    _tenant_locks()
    _no_table_locks()


def _by_application() -> None:
    op.execute(
        f"""
        CREATE FUNCTION control.by_application(job_type TEXT) RETURNS boolean
        LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $kinds$ SELECT $1 IN {PRODUCT_JOB_TYPES} $kinds$
        """
    )


def _repair_times() -> None:
    op.execute(
        f"""
        UPDATE control.platform_jobs
           SET status = CASE WHEN status IN ('queued', 'running') THEN 'failed' ELSE status END,
               error_detail = CASE WHEN status IN ('queued', 'running') THEN '{REPAIRED}'
                                   ELSE error_detail END,
               created_at = CASE WHEN {held("created_at")} THEN created_at ELSE now() END,
               available_at = CASE WHEN {held("available_at")} THEN available_at ELSE now() END,
               finished_at = CASE WHEN status IN ('queued', 'running')
                                    OR NOT {held_or_null("finished_at")} THEN now()
                                  ELSE finished_at END,
               locked_at = NULL, locked_by = NULL, updated_at = now()
         WHERE NOT ({JOB_TIMES})
        """
    )
    op.execute(f"UPDATE control.job_runs SET started_at = now() WHERE NOT {held('started_at')}")
    op.execute(f"DELETE FROM control.runtime_heartbeats WHERE NOT {held('heartbeat_at')}")


def _bound_times() -> None:
    # Every row satisfies them after the repair above (same transaction): NOT VALID spares the
    # validating scan under the ACCESS EXCLUSIVE lock, and they hold for every later write.
    for table, name, check in (
        ("platform_jobs", "platform_jobs_python_times", JOB_TIMES),
        ("job_runs", "job_runs_python_time", held("started_at")),
        ("runtime_heartbeats", "runtime_heartbeats_python_time", held("heartbeat_at")),
    ):
        op.execute(f"ALTER TABLE control.{table} ADD CONSTRAINT {name} CHECK ({check}) NOT VALID")


def _reserve_owner_keys() -> None:
    op.execute(
        f"""
        UPDATE control.platform_jobs SET idempotency_key = NULL, updated_at = now()
         WHERE control.by_application(job_type) AND {OWNER_KEY}
        """
    )
    _job_policies(
        product=f"control.by_application(job_type) AND {NOT_AN_OWNER_KEY}",
        fresh_times="AND created_at <= now() AND updated_at <= now()",
    )


def _job_policies(*, product: str, fresh_times: str) -> None:
    """(Re)create app_rw's insert and update policies on platform_jobs; ``product`` is what a
    product row must satisfy, ``fresh_times`` what a provisioning row's times must."""
    op.execute("DROP POLICY IF EXISTS app_enqueues ON control.platform_jobs")
    op.execute("DROP POLICY IF EXISTS app_works_product_jobs ON control.platform_jobs")
    for_app_role(
        f"""
        CREATE POLICY app_enqueues ON control.platform_jobs FOR INSERT TO {{role}}
        WITH CHECK (
            ({product})
            OR (job_type = 'provision_tenant'
                AND tenant_id ~ '^[a-z][a-z0-9_]{{0,47}}$'
                AND idempotency_key = 'provision:' || tenant_id
                AND status = 'queued' AND attempts = 0 AND progress = 0
                AND steps_completed = '[]'::jsonb AND error_detail IS NULL
                AND locked_at IS NULL AND locked_by IS NULL AND finished_at IS NULL
                AND available_at <= now() {fresh_times})
        )
        """
    )
    for_app_role(
        f"""
        CREATE POLICY app_works_product_jobs ON control.platform_jobs FOR UPDATE TO {{role}}
        USING (job_type IN {PRODUCT_JOB_TYPES})
        WITH CHECK ({product})
        """
    )


def _tenant_locks() -> None:
    op.execute("CREATE TABLE control.tenant_locks (tenant_id TEXT PRIMARY KEY)")
    revoke_from_app_role("ALL", "TABLE control.tenant_locks")
    op.execute("INSERT INTO control.tenant_locks (tenant_id) SELECT tenant_id FROM control.tenants")
    op.execute(
        """
        CREATE FUNCTION control.add_tenant_lock() RETURNS trigger
        LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog AS $add$
        BEGIN
            INSERT INTO control.tenant_locks (tenant_id) VALUES (NEW.tenant_id)
            ON CONFLICT (tenant_id) DO NOTHING;
            RETURN NULL;
        END
        $add$
        """
    )
    op.execute("REVOKE ALL ON FUNCTION control.add_tenant_lock() FROM PUBLIC")
    op.execute(
        """
        CREATE TRIGGER tenants_add_lock AFTER INSERT ON control.tenants
        FOR EACH ROW EXECUTE FUNCTION control.add_tenant_lock()
        """
    )
    op.execute(
        """
        CREATE FUNCTION control.try_lock_tenant(tenant TEXT, lock_class INTEGER)
        RETURNS boolean LANGUAGE plpgsql VOLATILE AS $try$
        BEGIN
            IF NOT has_table_privilege('control.tenant_locks', 'UPDATE') THEN
                RETURN pg_try_advisory_xact_lock(lock_class, hashtext(tenant));
            END IF;
            PERFORM FROM control.tenant_locks WHERE tenant_id = tenant
                FOR NO KEY UPDATE SKIP LOCKED;
            RETURN FOUND
                OR NOT EXISTS (SELECT FROM control.tenant_locks WHERE tenant_id = tenant);
        END
        $try$
        """
    )


def _no_table_locks() -> None:
    revoke_from_app_role("UPDATE", "TABLE control.platform_jobs")
    grant_to_app_role(f"UPDATE ({JOB_COLUMNS})", "TABLE control.platform_jobs")
    revoke_from_app_role("UPDATE", "TABLE control.runtime_heartbeats")
    grant_to_app_role(f"UPDATE ({BEAT_COLUMNS})", "TABLE control.runtime_heartbeats")


def downgrade() -> None:
    revoke_from_app_role("UPDATE", "TABLE control.runtime_heartbeats")
    grant_to_app_role("UPDATE", "TABLE control.runtime_heartbeats")
    revoke_from_app_role("UPDATE", "TABLE control.platform_jobs")
    grant_to_app_role("UPDATE", "TABLE control.platform_jobs")
    op.execute("DROP FUNCTION control.try_lock_tenant(TEXT, INTEGER)")
    op.execute("DROP TRIGGER tenants_add_lock ON control.tenants")
    op.execute("DROP FUNCTION control.add_tenant_lock()")
    op.execute("DROP TABLE control.tenant_locks")
    c005_product = (
        f"job_type IN {PRODUCT_JOB_TYPES} "
        "AND (idempotency_key IS NULL OR idempotency_key NOT LIKE 'provision:%')"
    )
    _job_policies(product=c005_product, fresh_times="")
    for table, name in (
        ("runtime_heartbeats", "runtime_heartbeats_python_time"),
        ("job_runs", "job_runs_python_time"),
        ("platform_jobs", "platform_jobs_python_times"),
    ):
        op.execute(f"ALTER TABLE control.{table} DROP CONSTRAINT {name}")
    op.execute("DROP FUNCTION control.by_application(TEXT)")
