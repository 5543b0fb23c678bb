"""Control revision 20260801_c005 on a database that already holds rows it forbids.

Rows an earlier release let app_rw write (a ``-infinity`` time, ``max_attempts`` of two billion,
steps that are not a list) must not make ``provisioner migrate`` fail: the revision repairs them
first (an unfinished job with a bad time is failed with a reason), then adds its constraints.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import command

from provisioner import db, service
from provisioner.models import JobStatus
from provisioner.settings import Settings
from provisioner.templates import migrations
from tests.conftest import Database

BEFORE = "20260728_c004"


def test_the_revision_repairs_rows_it_forbids(settings: Settings, database: Database) -> None:
    engine = db.engine(database.owner_url, poolclass=sa.pool.NullPool)
    try:
        with engine.begin() as conn:
            command.downgrade(migrations.control_config(connection=conn), BEFORE)
    finally:
        engine.dispose()
    with database.app() as conn:  # as app_rw, as an earlier release allowed
        for tenant in ("neginf", "huge", "done"):
            conn.execute(
                "INSERT INTO control.tenants (tenant_id, schema_name) VALUES (%s, %s)",
                (tenant, f"tenant_{tenant}"),
            )
        conn.execute(
            "INSERT INTO control.platform_jobs (tenant_id, job_type, idempotency_key, "
            "available_at) VALUES ('neginf', 'provision_tenant', 'provision:neginf', '-infinity')"
        )
        conn.execute(
            "INSERT INTO control.platform_jobs (tenant_id, job_type, idempotency_key, "
            "max_attempts, steps_completed) "
            "VALUES ('huge', 'provision_tenant', 'provision:huge', 2147483647, '{\"a\": 1}')"
        )
        conn.execute(
            "INSERT INTO control.platform_jobs (tenant_id, job_type, idempotency_key, status, "
            "finished_at) VALUES ('done', 'provision_tenant', 'provision:done', 'succeeded', "
            "'infinity')"
        )
    before, after = service.migrate(settings)
    assert (before, after) == (BEFORE, migrations.head_label(migrations.control_heads()))

    neginf = service.status(settings, "neginf").job
    assert neginf.status is JobStatus.FAILED
    assert "timestamp of this job was not finite" in (neginf.error_detail or "")
    huge = service.status(settings, "huge").job
    assert (huge.status, huge.max_attempts, huge.steps_completed) == (JobStatus.QUEUED, 100, [])
    done = service.status(settings, "done").job
    assert done.status is JobStatus.SUCCEEDED and done.finished_at is not None
