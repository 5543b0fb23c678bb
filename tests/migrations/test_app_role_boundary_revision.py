"""Control revision 20261202_h27_approws on a database that already holds what it forbids.

Rows app_rw could write before it (a provisioning job and product rows in year 20000, a
heartbeat in year 20000, a first run in year 20000, product rows holding the lifecycle keys)
must not make ``provisioner migrate`` fail nor survive it: the revision repairs them (an
unfinished job with such a time is failed with a reason, a finished one keeps its outcome, a
heartbeat is deleted, a squatted key is dropped from the product row), then every command
reads the queue again, the owner's jobs retry and the lifecycle keys are the owner's.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import command

from provisioner import db, service
from provisioner.models import JobStatus
from provisioner.settings import Settings
from provisioner.templates import migrations
from tests.conftest import Database, run_cli

BEFORE = "20260804_c008"
FAR = "20000-01-01 00:00:00+00"


def downgrade(database: Database) -> None:
    engine = db.engine(database.owner_url, poolclass=sa.pool.NullPool)
    try:
        with engine.begin() as conn:
            command.downgrade(migrations.control_config(connection=conn), BEFORE)
    finally:
        engine.dispose()


def test_the_revision_repairs_what_app_rw_could_write_before_it(
    settings: Settings, database: Database
) -> None:
    downgrade(database)
    with database.app() as conn:  # as app_rw, as the earlier release allowed
        for tenant in ("far", "acme"):
            conn.execute(
                "INSERT INTO control.tenants (tenant_id, schema_name) VALUES (%s, %s)",
                (tenant, f"tenant_{tenant}"),
            )
        conn.execute(
            "INSERT INTO control.platform_jobs (tenant_id, job_type, idempotency_key, created_at)"
            " VALUES ('far', 'provision_tenant', 'provision:far', %s)",
            (FAR,),
        )
        conn.execute(
            "INSERT INTO control.platform_jobs (tenant_id, job_type, status, locked_by, "
            "locked_at) VALUES ('far', 'train_tenant_model', 'running', 'app', %s)",
            (FAR,),
        )
        conn.execute(
            "INSERT INTO control.platform_jobs (tenant_id, job_type, status, finished_at, "
            "updated_at) VALUES ('far', 'send_email', 'succeeded', %s, %s)",
            (FAR, FAR),
        )
        for key in ("suspend_tenant:acme", "purge_tenant:acme"):
            conn.execute(
                "INSERT INTO control.platform_jobs (tenant_id, job_type, idempotency_key) "
                "VALUES ('acme', 'send_email', %s)",
                (key,),
            )
        conn.execute(
            "INSERT INTO control.runtime_heartbeats (component, instance_id, heartbeat_at) "
            "VALUES ('provisioner-worker', 'forged', %s)",
            (FAR,),
        )
    service.migrate(settings)

    with database.owner() as conn:
        rows = conn.execute(
            "SELECT job_type, status, error_detail IS NOT NULL, idempotency_key "
            "FROM control.platform_jobs ORDER BY job_type, status, idempotency_key"
        ).fetchall()
        beats = conn.execute("SELECT count(*) FROM control.runtime_heartbeats").fetchone()
    assert rows == [
        ("provision_tenant", "failed", True, "provision:far"),
        ("send_email", "queued", False, None),  # the squatted keys dropped, the rows kept
        ("send_email", "queued", False, None),
        ("send_email", "succeeded", False, None),  # finished: its outcome kept
        ("train_tenant_model", "failed", True, None),
    ]
    assert beats == (0,)
    for args in (("jobs", "list"), ("status", "far"), ("check", "--all")):
        done = run_cli(settings, *args)
        assert done.returncode in (0, 1) and "Traceback" not in done.stderr, (args, done.stderr)
        assert "too large" not in done.stdout + done.stderr
    assert "year 20000" in (service.status(settings, "far").job.error_detail or "")
    retried = run_cli(settings, "jobs", "retry", str(service.status(settings, "far").job.id))
    assert retried.returncode == 0, retried.stderr
    assert service.provision(settings, "far").job.status is JobStatus.SUCCEEDED
    service.provision(settings, "acme")
    suspended = run_cli(settings, "suspend", "acme")
    assert suspended.returncode == 0, suspended.stderr
