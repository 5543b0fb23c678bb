"""Jobs on the tenant's own server (issue 29, item 3), against a second real cluster: the tool's
schema applied by ``provisioner migrate``, the worker's refusal to start without it or without
credentials or as a superuser there, and provisioning by a one-off command and by a worker,
every step committed on the tenant server with its journal row and the fence."""

from __future__ import annotations

import json
from pathlib import Path

import psycopg
import pytest

from provisioner import service
from provisioner.kinds.provision import STEPS
from provisioner.local import cluster as local_pg
from provisioner.settings import Settings
from provisioner.tenant.fingerprint import fingerprint
from tests.conftest import Database, run_cli
from tests.extra_clusters import TenantServerDb

#: The provisioning steps with work on the tenant's server (the journal's rows).
SERVER_STEPS = ("create_schema", "run_tenant_migrations", "grant_app_rw", "seed_role_profiles")


def on_control(database: Database, schema: str) -> bool:
    with database.owner() as conn:
        found = conn.execute("SELECT 1 FROM pg_namespace WHERE nspname = %s", (schema,))
        return found.fetchone() is not None


def test_migrate_applies_the_tool_schema_and_a_worker_refuses_a_server_behind(
    settings: Settings, database: Database, jobs_server: TenantServerDb
) -> None:
    jobs_server.add_to(database)
    refused = run_cli(settings, "worker", "--once")
    assert refused.returncode == 2
    assert refused.stderr.strip().splitlines() == [
        "error: tenant server east: its tool schema is at version 0, this build needs 1: "
        "run `provisioner migrate`"
    ]
    first = run_cli(settings, "migrate")
    assert first.returncode == 0, first.stderr
    assert "tenant server east: tool schema (none) -> 1" in first.stdout
    again = run_cli(settings, "migrate")
    assert "tenant server east: tool schema at version 1" in again.stdout
    assert run_cli(settings, "worker", "--once").returncode == 0
    # The application role cannot read the tool's schema.
    with jobs_server.app() as app, pytest.raises(psycopg.errors.InsufficientPrivilege):
        app.execute("SELECT * FROM provisioner_server.fences")


def test_a_worker_refuses_a_server_without_credentials_or_owned_by_a_superuser(
    settings: Settings, database: Database, jobs_server: TenantServerDb, tmp_path: Path
) -> None:
    port, name = jobs_server.cluster.port, jobs_server.name
    empty = tmp_path / "pgpass"
    empty.write_text("")
    empty.chmod(0o600)
    with database.owner() as conn:
        conn.execute(
            "INSERT INTO control.tenant_servers (name, conninfo) VALUES ('east', %s)",
            (f"host=127.0.0.1 port={port} dbname={name} passfile={empty}",),
        )
    refused = run_cli(settings, "worker", "--once", env={"PGPASSFILE": str(empty)})
    assert refused.returncode == 2
    (line,) = refused.stderr.strip().splitlines()
    assert line.startswith("error: tenant server east: ") and "password" in line
    secret = jobs_server.cluster.password(local_pg.OWNER_ROLE)
    assert secret and secret not in refused.stderr + refused.stdout

    root = f"{jobs_server.reference} user={local_pg.SUPERUSER}"
    with database.owner() as conn:
        conn.execute("UPDATE control.tenant_servers SET conninfo = %s", (root,))
    refused = run_cli(settings, "worker", "--once")
    assert refused.returncode == 2
    assert refused.stderr.strip().splitlines() == [
        f"error: tenant server east: role {local_pg.SUPERUSER} is a superuser: the owner must "
        "be an ordinary role"
    ]


def test_provisioning_runs_every_step_on_the_tenant_server(
    settings: Settings,
    database: Database,
    jobs_server: TenantServerDb,
    clean_fingerprint: dict,
) -> None:
    jobs_server.add_to(database)
    assert run_cli(settings, "migrate").returncode == 0
    out = run_cli(settings, "provision", "acme", "--json")
    assert out.returncode == 0, out.stdout + out.stderr
    job = json.loads(out.stdout)
    assert (job["status"], job["steps_completed"], job["attempts"]) == (
        "succeeded",
        list(STEPS),
        1,
    )
    assert jobs_server.schema_exists("tenant_acme")
    assert not on_control(database, "tenant_acme")
    with jobs_server.owner() as conn:
        assert fingerprint(conn, "tenant_acme") == clean_fingerprint
        seeds = conn.execute(
            "SELECT count(*) FROM provisioner_server.tenant_seeds WHERE tenant_id = 'acme'"
        ).fetchone()
    assert seeds is not None and seeds[0] > 0
    written = jobs_server.journal("acme")
    assert sorted(written) == sorted(SERVER_STEPS)
    assert len(set(written.values())) == 1  # one run, one token
    assert jobs_server.fence("acme") == next(iter(written.values()))
    with database.owner() as conn:
        state = conn.execute("SELECT state FROM control.tenants WHERE tenant_id = 'acme'")
        assert state.fetchone() == ("onboarding",)
        runs = conn.execute(
            "SELECT step, outcome FROM control.job_step_runs WHERE tenant_id = 'acme' ORDER BY id"
        ).fetchall()
    assert runs == [(step, "succeeded") for step in STEPS]
    # The schema is the template's verified replay (control's reference), not an Alembic run.
    with jobs_server.owner() as conn:
        how = conn.execute(
            "SELECT detail FROM provisioner_server.step_journal WHERE step = %s",
            ("run_tenant_migrations",),
        ).fetchone()
    assert how == ("template (verified replay of control's reference)",)
    # The application reaches its tenant on the server the directory names.
    with jobs_server.app() as app:
        app.execute("SET search_path TO tenant_acme")
        app.execute("SELECT count(*) FROM role_profiles").fetchone()
    # Provisioning again finds every effect there (on the server's catalog): nothing runs.
    again = run_cli(settings, "provision", "acme", "--json")
    assert again.returncode == 0 and json.loads(again.stdout)["attempts"] == 1
    with jobs_server.app() as app:
        app.execute("SELECT count(*) FROM tenant_acme.role_profiles").fetchone()


def test_a_worker_provisions_tenants_on_the_tenant_server(
    settings: Settings, database: Database, jobs_server: TenantServerDb
) -> None:
    jobs_server.add_to(database)
    assert run_cli(settings, "migrate").returncode == 0
    for tenant in ("one", "two"):
        service.enqueue(settings, tenant)
    worker = run_cli(settings, "worker", "--once")
    assert worker.returncode == 0, worker.stderr
    for tenant in ("one", "two"):
        status = json.loads(run_cli(settings, "status", tenant, "--json").stdout)
        assert (status["status"], status["attempts"]) == ("succeeded", 1)
        assert jobs_server.schema_exists(f"tenant_{tenant}")
        assert not on_control(database, f"tenant_{tenant}")
        assert sorted(jobs_server.journal(tenant)) == sorted(SERVER_STEPS)
