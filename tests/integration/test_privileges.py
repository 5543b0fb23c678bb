"""The privilege split, proven from the outside: app_rw reads and writes rows, never DDL."""

from __future__ import annotations

import psycopg
import pytest

from provisioner import queue
from provisioner.kinds.provision import ensure_provision_job
from provisioner.models import TenantId
from tests.conftest import Database

REFUSED_IN_CONTROL = [
    "CREATE TABLE control.evil (id int)",
    "ALTER TABLE control.platform_jobs ADD COLUMN evil int",
    "ALTER TABLE control.platform_jobs DROP CONSTRAINT platform_jobs_status_check",
    "DROP TABLE control.runtime_heartbeats",
    "DROP INDEX control.platform_jobs_queue_idx",
    "CREATE INDEX evil_idx ON control.platform_jobs (payload)",
    "TRUNCATE control.platform_jobs",
    "DELETE FROM control.platform_jobs",
    "DELETE FROM control.tenants",
    "INSERT INTO control.job_step_runs (job_id, attempt, step, worker) "
    "VALUES (gen_random_uuid(), 1, 'x', 'y')",
    "CREATE SCHEMA evil",
    "CREATE TEMP TABLE evil (id int)",
    "CREATE FUNCTION control.evil() RETURNS int LANGUAGE sql AS 'SELECT 1'",
]


@pytest.mark.parametrize("statement", REFUSED_IN_CONTROL)
def test_app_rw_cannot_change_the_control_schema(database: Database, statement: str) -> None:
    with database.app() as conn, pytest.raises(psycopg.errors.InsufficientPrivilege):
        conn.execute(statement)


def test_app_rw_does_the_product_side_of_the_queue(database: Database) -> None:
    """Enqueue provisioning, read status, claim its own (product) job types, finish: rows only."""
    with psycopg.connect(database.app_url) as conn:
        job = ensure_provision_job(conn, TenantId("acme")).job
        queue.enqueue(conn, "send_email", tenant_id="acme", idempotency_key="email:acme:1")
        conn.commit()
        assert queue.get_job(conn, job.id).status.value == "queued"
        # The provisioning job is the owner's: app_rw's claim passes it by (row-level security).
        assert queue.claim_next(conn, ["provision_tenant"], "product-side") is None
        claimed = queue.claim_next(conn, ["send_email"], "product-side")
        assert claimed is not None
        queue.complete(conn, claimed.lease)
        conn.commit()


def test_app_rw_grants_nothing_to_others(database: Database) -> None:
    with database.app() as conn:
        conn.execute("GRANT SELECT ON control.platform_jobs TO PUBLIC")  # a warning, no effect
        acl = conn.execute(
            "SELECT relacl::text FROM pg_class WHERE oid = 'control.platform_jobs'::regclass"
        ).fetchone()[0]
    assert "=r/" not in acl.replace("app_rw=", "").replace("provisioner_owner=", "")


def test_the_roles_are_what_the_bootstrap_says(database: Database) -> None:
    with database.owner() as conn:
        roles = conn.execute(
            "SELECT rolname, rolsuper, rolcreatedb, rolcreaterole, rolbypassrls, rolcanlogin "
            "FROM pg_roles WHERE rolname IN ('provisioner_owner', 'app_rw') ORDER BY 1"
        ).fetchall()
        assert roles == [
            ("app_rw", False, False, False, False, True),
            ("provisioner_owner", False, False, False, False, True),
        ]
        owner = conn.execute(
            "SELECT pg_get_userbyid(datdba) FROM pg_database WHERE datname = current_database()"
        ).fetchone()
        assert owner == ("provisioner_owner",)
        can_create = conn.execute(
            "SELECT has_database_privilege('app_rw', current_database(), 'CREATE'), "
            "has_database_privilege('app_rw', current_database(), 'TEMPORARY'), "
            "has_schema_privilege('app_rw', 'public', 'CREATE')"
        ).fetchone()
        assert can_create == (False, False, False)
        # the suite itself runs as these roles, never as a superuser
        assert conn.execute(
            "SELECT current_user, usesuper FROM pg_user WHERE usename = current_user"
        ).fetchone() == (
            "provisioner_owner",
            False,
        )
