"""The app_rw boundary, enforced by the database (control c005), tried from outside as app_rw.

Each forgery of issue 11 is attempted over the network as ``app_rw``, the way a buggy or
compromised application would, and must be refused (or match no row) with the owner's view of
the job unchanged. What app_rw legitimately does (enqueue, read, run product jobs, beat for its
own worker) keeps working.
"""

from __future__ import annotations

from dataclasses import replace

import psycopg
import pytest
from psycopg import errors
from psycopg.rows import dict_row

from provisioner import kinds, queue, service
from provisioner.control import heartbeats
from provisioner.errors import ConfigurationError, InvalidInput, KeyConflict
from provisioner.kinds.provision import ensure_provision_job
from provisioner.models import JobStatus, TenantId
from provisioner.settings import Settings
from tests.conftest import Database, run_cli

REFUSED = (errors.InsufficientPrivilege, errors.CheckViolation)


def app(database: Database) -> psycopg.Connection:
    return psycopg.connect(database.app_url, autocommit=True, row_factory=dict_row)


def owner_job(database: Database, tenant: str) -> dict:
    with psycopg.connect(database.owner_url, row_factory=dict_row) as conn:
        row = conn.execute(
            "SELECT status, steps_completed, progress, attempts, locked_by, idempotency_key "
            "FROM control.platform_jobs WHERE tenant_id = %s AND job_type = 'provision_tenant'",
            (tenant,),
        ).fetchone()
    assert row is not None
    return row


def register(conn: psycopg.Connection, tenant: str) -> None:
    conn.execute(
        "INSERT INTO control.tenants (tenant_id, schema_name) VALUES (%s, %s) "
        "ON CONFLICT DO NOTHING",
        (tenant, f"tenant_{tenant}"),
    )


def schema_exists(database: Database, tenant: str) -> bool:
    with database.owner() as conn:
        found = conn.execute("SELECT 1 FROM pg_namespace WHERE nspname = %s", (f"tenant_{tenant}",))
        return found.fetchone() is not None


# -- what app_rw may do -------------------------------------------------------------------------


def test_app_rw_enqueues_and_reads_provisioning(database: Database) -> None:
    with app(database) as conn:
        job = ensure_provision_job(conn, TenantId("acme")).job
        assert job.status is JobStatus.QUEUED and job.idempotency_key == "provision:acme"
        assert queue.get_job(conn, job.id).id == job.id
        assert queue.step_runs(conn, job.id) == []
        conn.execute("SELECT * FROM control.runtime_heartbeats").fetchall()
        conn.execute("SELECT * FROM control.tenants").fetchall()


def test_product_jobs_keep_the_row_access_the_contract_gives(database: Database) -> None:
    """A product worker claims, finishes and retries its own jobs as app_rw."""
    with psycopg.connect(database.app_url, row_factory=dict_row) as conn:
        queue.enqueue(conn, "send_email", idempotency_key="mail:1")
        conn.commit()
        claimed = queue.claim_next(conn, ["send_email"], "product-worker")
        assert claimed is not None
        failed = queue.fail_or_retry(conn, claimed.lease, "smtp down", permanent=True)
        assert failed.status is JobStatus.FAILED
        assert queue.retry(conn, failed.id).status is JobStatus.QUEUED
        conn.commit()
        # its own heartbeat row, beaten again and again
        heartbeats.beat(conn, "product-worker", "p1", {"job_types": ["send_email"]})
        heartbeats.beat(conn, "product-worker", "p2", {"job_types": ["send_email"]})
        conn.commit()
        required = {"product-worker": frozenset({"send_email"})}
        assert heartbeats.readiness(conn, required, 10, kinds.BUILTIN.application_kinds).ready


# -- forgeries of the provisioning rows (item 3) ------------------------------------------------


FORGED_INSERTS = {
    "succeeded": {"status": "'succeeded'", "progress": "100"},
    "steps pre-filled": {
        "steps_completed": """'["create_schema", "run_tenant_migrations", "grant_app_rw", """
        """"seed_role_profiles", "verify_object_storage"]'""",
    },
    "leased": {"status": "'running'", "locked_by": "'worker:x:1'", "locked_at": "now()"},
    "attempts spent": {"attempts": "4"},
    "error preset": {"error_detail": "'looks failed'"},
    "other tenant's key": {"idempotency_key": "'provision:victim'"},
    "no key": {"idempotency_key": "NULL"},
    "not yet available": {"available_at": "now() + interval '1 year'"},
    "hostile tenant id": {"tenant_id": "'Robert''); --'"},
}


@pytest.mark.parametrize("forged", list(FORGED_INSERTS), ids=list(FORGED_INSERTS))
def test_app_rw_cannot_insert_a_forged_provisioning_row(database: Database, forged: str) -> None:
    values = {
        "tenant_id": "'mallory'",
        "job_type": "'provision_tenant'",
        "idempotency_key": "'provision:mallory'",
        **FORGED_INSERTS[forged],
    }
    with app(database) as conn:
        register(conn, "mallory")
        with pytest.raises(REFUSED):
            conn.execute(
                f"INSERT INTO control.platform_jobs ({', '.join(values)}) "
                f"VALUES ({', '.join(values.values())})"
            )
    with database.owner() as conn:
        assert conn.execute("SELECT count(*) FROM control.platform_jobs").fetchone() == (0,)


UPDATES = {
    "mark succeeded": "status = 'succeeded', progress = 100, finished_at = now()",
    "pre-fill steps": "steps_completed = '[\"verify_object_storage\"]'",
    "take the lease": "status = 'running', locked_by = 'mallory', locked_at = now()",
    "move the key": "idempotency_key = 'provision:other'",
    "turn into email": "job_type = 'send_email'",
    "freeze the queue": "available_at = '-infinity'",
}


@pytest.mark.parametrize("change", list(UPDATES), ids=list(UPDATES))
def test_app_rw_cannot_change_a_provisioning_job(database: Database, change: str) -> None:
    with app(database) as conn:
        job = ensure_provision_job(conn, TenantId("victim")).job
        before = owner_job(database, "victim")
        cur = conn.execute(
            f"UPDATE control.platform_jobs SET {UPDATES[change]} WHERE id = %s", (job.id,)
        )
        assert cur.rowcount == 0  # row-level security: the owner's rows are not app_rw's
        with pytest.raises(errors.InsufficientPrivilege):
            conn.execute("DELETE FROM control.platform_jobs WHERE id = %s", (job.id,))
    assert owner_job(database, "victim") == before


def test_a_forged_success_is_not_reported(settings: Settings, database: Database) -> None:
    """The issue's first forgery end to end: status must not say succeeded without a schema."""
    with app(database) as conn:
        ensure_provision_job(conn, TenantId("ghost"))
        conn.execute(
            "UPDATE control.platform_jobs SET status = 'succeeded', progress = 100 "
            "WHERE tenant_id = 'ghost'"
        )
    result = run_cli(settings, "status", "ghost", "--json")
    assert result.returncode == 0, result.stderr
    assert '"status": "queued"' in result.stdout and '"progress": 0' in result.stdout


def test_app_rw_cannot_write_step_history_or_tenant_state(database: Database) -> None:
    with app(database) as conn:
        job = ensure_provision_job(conn, TenantId("acme")).job
    with database.owner() as conn:
        conn.execute(
            "INSERT INTO control.job_step_runs (job_id, tenant_id, attempt, step, worker) "
            "VALUES (%s, 'acme', 1, 'create_schema', 'w')",
            (job.id,),
        )
    with app(database) as conn:
        for statement in (
            "UPDATE control.job_step_runs SET outcome = 'succeeded', detail = 'forged'",
            "INSERT INTO control.job_step_runs (job_id, attempt, step, worker) "
            f"VALUES ('{job.id}', 1, 'x', 'y')",
            "UPDATE control.tenants SET state = 'active' WHERE tenant_id = 'acme'",
            "INSERT INTO control.tenants (tenant_id, schema_name, state) "
            "VALUES ('eve', 'tenant_eve', 'active')",
            "DELETE FROM control.tenants",
        ):
            with pytest.raises(errors.InsufficientPrivilege):
                conn.execute(statement)
        # a tenant registered under another tenant's schema name is refused too
        with pytest.raises(errors.InsufficientPrivilege):
            conn.execute(
                "INSERT INTO control.tenants (tenant_id, schema_name) VALUES ('eve', 'tenant_acme')"
            )
    with database.owner() as conn:
        assert conn.execute("SELECT state FROM control.tenants").fetchall() == [("pending",)]
        assert conn.execute("SELECT outcome FROM control.job_step_runs").fetchall() == [
            ("running",)
        ]


# -- the provisioner-worker's heartbeat (item 3) -------------------------------------------------


def test_app_rw_cannot_pass_for_the_provisioner_worker(
    settings: Settings, database: Database
) -> None:
    beat = {"job_types": ["provision_tenant"], "state": "running"}
    with app(database) as conn:
        heartbeats.beat(conn, "provisioner-worker", "fake", beat)
    report = service.health(settings)
    assert not report.ready
    assert "written by app_rw, not by the owner role" in report.components[0].reason
    result = run_cli(settings, "health")
    assert result.returncode == 1 and "NOT READY" in result.stdout

    # once the owner beats, app_rw can no longer overwrite its row
    with database.owner() as conn:
        heartbeats.beat(conn, "provisioner-worker", "real", beat)
    assert service.health(settings).ready
    with app(database) as conn, pytest.raises(errors.InsufficientPrivilege):
        heartbeats.beat(conn, "provisioner-worker", "fake", beat)
    with app(database) as conn:
        cur = conn.execute(
            "UPDATE control.runtime_heartbeats SET heartbeat_at = now() + interval '1 year'"
        )
        assert cur.rowcount == 0
    report = service.health(settings)
    assert report.ready and report.components[0].instance_id == "real"


def test_product_rows_under_a_silent_holders_name_do_not_count_in_health(
    settings: Settings, database: Database
) -> None:
    """app_rw writes a product row's status and locked_by: rows it marks running under the name
    of an owner's holder that stopped beating are not that worker's jobs, and neither make
    ``health`` not ready nor count among the jobs waiting for recovery."""
    beat = {"job_types": ["provision_tenant"], "state": "running"}
    with database.owner() as conn:
        heartbeats.beat(conn, "provisioner-worker", "live", beat)
        # Silent: a lease counts from the server's start at the earliest, which may be recent.
        conn.execute(
            "INSERT INTO control.lease_holders (holder, component, instance_id, beat_at, "
            "lease_seconds) VALUES ('worker:dead:1', 'provisioner-worker', 'dead', "
            "now() - interval '1 hour', 0.001)"
        )
    with app(database) as conn:
        register(conn, "mallory")
        for n in range(2):
            conn.execute(
                "INSERT INTO control.platform_jobs (tenant_id, job_type, idempotency_key, "
                "status, locked_by, locked_at) VALUES ('mallory', 'send_email', %s, 'running', "
                "'worker:dead:1', now())",
                (f"mail:{n}",),
            )
    report = service.health(settings)
    assert report.ready, report.components

    # A job of the owner's kinds that the silent holder still holds is counted, alone.
    with database.owner() as conn:
        register(conn, "acme")
        conn.execute(
            "INSERT INTO control.platform_jobs (tenant_id, job_type, idempotency_key, status, "
            "locked_by, locked_at) VALUES ('acme', 'provision_tenant', 'provision:acme', "
            "'running', 'worker:dead:1', now())"
        )
    report = service.health(settings)
    assert not report.ready
    assert report.components[0].reason.startswith("1 running job(s) held by worker:dead:1")


# -- squatted idempotency keys (item 2) ----------------------------------------------------------


def test_app_rw_cannot_squat_a_provisioning_key(database: Database) -> None:
    with app(database) as conn:
        register(conn, "other")
        for statement in (
            "INSERT INTO control.platform_jobs (tenant_id, job_type, idempotency_key) "
            "VALUES ('other', 'provision_tenant', 'provision:victim')",
            "INSERT INTO control.platform_jobs (tenant_id, job_type, idempotency_key) "
            "VALUES ('other', 'send_email', 'provision:vtwo')",
            "INSERT INTO control.platform_jobs (job_type, idempotency_key) "
            "VALUES ('send_email', 'provision:vtwo')",
        ):
            with pytest.raises(errors.InsufficientPrivilege):
                conn.execute(statement)


def squat(database: Database, tenant: str, job_type: str, key: str) -> None:
    """A row holding another's key, as one written before control c005 could be."""
    with database.owner() as conn:
        register(conn, tenant)
        conn.execute(
            "INSERT INTO control.platform_jobs (tenant_id, job_type, idempotency_key) "
            "VALUES (%s, %s, %s)",
            (tenant, job_type, key),
        )


def test_a_key_held_by_another_tenant_fails_provision_and_enqueue(
    settings: Settings, database: Database
) -> None:
    squat(database, "other", "provision_tenant", "provision:victim")
    for args in (("provision", "victim", "--json"), ("enqueue", "victim")):
        result = run_cli(settings, *args)
        assert result.returncode == 1, result.stdout + result.stderr
        assert result.stdout == ""
        line = result.stderr.strip()
        assert "\n" not in line
        assert "provision:victim is held by job" in line
        assert "(provision_tenant of tenant other)" in line
    assert not schema_exists(database, "victim") and not schema_exists(database, "other")
    assert owner_job(database, "other")["status"] == "queued"


def test_a_product_row_holding_a_provisioning_key_is_never_provisioned(
    settings: Settings, database: Database
) -> None:
    squat(database, "vtwo", "send_email", "provision:vtwo")
    with pytest.raises(KeyConflict, match=r"\(send_email of tenant vtwo\)"):
        service.provision(settings, "vtwo")
    with pytest.raises(KeyConflict):
        service.enqueue(settings, "vtwo")
    with database.owner() as conn:
        row = conn.execute(
            "SELECT job_type, status, attempts, steps_completed FROM control.platform_jobs"
        ).fetchall()
    assert row == [("send_email", "queued", 0, [])]
    assert not schema_exists(database, "vtwo")


# -- rows that would stall the queue (item 1) -----------------------------------------------------


@pytest.mark.parametrize(
    "values",
    [
        "available_at = '-infinity'",
        "available_at = 'infinity'",
        "created_at = '-infinity'",
        "max_attempts = 2147483647",
    ],
)
def test_constraints_refuse_rows_no_worker_could_process(database: Database, values: str) -> None:
    column, value = values.split(" = ")
    with app(database) as conn:
        register(conn, "neginf")
        for job_type, key in (("provision_tenant", "provision:neginf"), ("send_email", "m:1")):
            with pytest.raises(REFUSED):
                conn.execute(
                    f"INSERT INTO control.platform_jobs (tenant_id, job_type, idempotency_key, "
                    f"{column}) VALUES ('neginf', %s, %s, {value})",
                    (job_type, key),
                )
        # nor can a product job be made so afterwards (locked_at on a running job included)
        job = queue.enqueue(conn, "send_email", tenant_id="neginf", idempotency_key="m:2").job
        for change in (values, "status = 'running', locked_at = 'infinity'"):
            with pytest.raises(errors.CheckViolation):
                conn.execute(f"UPDATE control.platform_jobs SET {change} WHERE id = %s", (job.id,))
    with database.owner() as conn, pytest.raises(errors.CheckViolation):
        # the owner is held to the same rules
        conn.execute(f"UPDATE control.platform_jobs SET {values}")


def test_enqueue_refuses_an_absurd_max_attempts(database: Database) -> None:
    with app(database) as conn, pytest.raises(InvalidInput, match="between 1 and 100"):
        queue.enqueue(conn, "send_email", max_attempts=2147483647)


def bad_row_past_the_constraint(database: Database, tenant: str) -> None:
    """A -infinity row as it could exist before control c005 (the constraints dropped for it:
    c005's, and 20261202_h27_approws's, which refuses it too)."""
    with psycopg.connect(database.admin_url, autocommit=True) as conn:
        conn.execute("ALTER TABLE control.platform_jobs DROP CONSTRAINT platform_jobs_finite_times")
        conn.execute("ALTER TABLE control.platform_jobs DROP CONSTRAINT platform_jobs_python_times")
        register(conn, tenant)
        conn.execute(
            "INSERT INTO control.platform_jobs (tenant_id, job_type, idempotency_key, "
            "available_at) VALUES (%s, 'provision_tenant', %s, '-infinity')",
            (tenant, f"provision:{tenant}"),
        )


def test_one_unprocessable_row_is_failed_and_the_queue_moves_on(
    settings: Settings, database: Database
) -> None:
    bad_row_past_the_constraint(database, "neginf")
    good = service.enqueue(settings, "good").job
    with psycopg.connect(database.owner_url) as conn:
        claimed = queue.claim_next(conn, ["provision_tenant"], "w1")
        assert claimed is not None and claimed.id == good.id  # the bad row is passed by
        failed = queue.recover_stale(conn, 900)
        conn.commit()
    assert [(j.tenant_id, j.status) for j in failed] == [("neginf", JobStatus.FAILED)]
    assert failed[0].error_detail == queue.UNPROCESSABLE_DETAIL
    # every reader loads the row again; the operator can queue it afresh
    assert [j.tenant_id for j in service.list_jobs(settings, status="failed")] == ["neginf"]
    assert service.retry_job(settings, str(failed[0].id)).status is JobStatus.QUEUED


@pytest.mark.slow
def test_a_real_worker_fails_the_unprocessable_row_and_provisions_the_rest(
    settings: Settings, database: Database
) -> None:
    bad_row_past_the_constraint(database, "neginf")
    service.enqueue(settings, "good")
    result = run_cli(replace(settings, heartbeat_seconds=1.0), "worker", "--once", timeout=180)
    assert result.returncode == 0, result.stdout + result.stderr
    assert service.status(settings, "good").job.status is JobStatus.SUCCEEDED
    bad = service.status(settings, "neginf").job
    assert bad.status is JobStatus.FAILED and bad.error_detail == queue.UNPROCESSABLE_DETAIL
    assert "database_unavailable" not in result.stdout + result.stderr


# -- app_rw cannot run the owner's commands (item 3's note) --------------------------------------


def test_retry_and_cancel_of_provisioning_need_the_owner_url(
    settings: Settings, database: Database
) -> None:
    job = service.enqueue(settings, "acme").job
    app_only = replace(settings, migrations_database_url=None)
    assert service.cancel_job(settings, str(job.id)).status is JobStatus.CANCELLED
    # with app_rw alone the row is not app_rw's to change: refused, and nothing happens to it
    with pytest.raises(ConfigurationError, match="only the owner role may change it"):
        service.retry_job(app_only, str(job.id))
    assert service.status(settings, "acme").job.status is JobStatus.CANCELLED
    assert service.retry_job(settings, str(job.id)).status is JobStatus.QUEUED
