"""Control revision 20261202_h28_rollouts on a database with rollouts an earlier release left:
``done`` becomes ``completed``, a rollout left ``running`` whose jobs have all settled is
completed, one with a job still queued stays running; the downgrade gives ``done`` back."""

from __future__ import annotations

import sqlalchemy as sa
from alembic import command

from provisioner import db, service
from provisioner.settings import Settings
from provisioner.templates import migrations
from tests.conftest import Database

BEFORE = "20260804_c008"


def _control_to(database: Database, revision: str) -> None:
    engine = db.engine(database.owner_url, poolclass=sa.pool.NullPool)
    try:
        with engine.begin() as conn:
            command.downgrade(migrations.control_config(connection=conn), revision)
    finally:
        engine.dispose()


def test_the_revision_completes_settled_rollouts_and_downgrades(
    settings: Settings, database: Database
) -> None:
    _control_to(database, BEFORE)
    with database.owner() as conn:
        for tenant, status in (("settled", "succeeded"), ("busy", "queued")):
            conn.execute(
                "INSERT INTO control.tenants (tenant_id, schema_name) VALUES (%s, %s)",
                (tenant, f"tenant_{tenant}"),
            )
            conn.execute(
                "INSERT INTO control.platform_jobs (tenant_id, job_type, idempotency_key, "
                "status) VALUES (%s, 'provision_tenant', %s, %s)",
                (tenant, f"provision:{tenant}", status),
            )
        for rollout, state, tenant in (
            (1, "done", None),
            (2, "running", "settled"),
            (3, "running", "busy"),
        ):
            conn.execute(
                "INSERT INTO control.rollouts (id, head, state) OVERRIDING SYSTEM VALUE "
                "VALUES (%s, 't004', %s)",
                (rollout, state),
            )
            if tenant:
                conn.execute(
                    "INSERT INTO control.rollout_tenants (rollout_id, tenant_id, job_id, wave, "
                    "state) SELECT %s, %s, id, 'main', 'queued' FROM control.platform_jobs "
                    "WHERE tenant_id = %s",
                    (rollout, tenant, tenant),
                )
    service.migrate(settings)
    with database.owner() as conn:
        rows = conn.execute(
            "SELECT id, state, finished_at IS NOT NULL FROM control.rollouts ORDER BY id"
        ).fetchall()
    assert rows == [(1, "completed", True), (2, "completed", True), (3, "running", False)]

    _control_to(database, BEFORE)
    with database.owner() as conn:
        states = conn.execute("SELECT state FROM control.rollouts ORDER BY id").fetchall()
    assert states == [("done",), ("done",), ("running",)]
