"""Every tenant kind but the product's on the tenant's own server (issue 29, items 3 and 5),
against a second real cluster: a fleet upgrade to a generated revision t005 over tenants on
control and on the server (the verified replay of the new revisions there, proven against
control's stored reference); suspend, restore, deprovision, purge, each schema step committed
on the server with its journal row and the fence, the state on control; and repair, planned
and applied on the server, its check recorded on control."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import psycopg
import pytest

from provisioner.engine import Engine, runner
from provisioner.models import JobStatus
from provisioner.settings import Settings
from provisioner.tenant.fingerprint import fingerprint as catalog_fingerprint
from tests.conftest import Database, fingerprint, run_cli
from tests.integration import test_job_kinds as job_kinds
from tests.integration.test_app_role_boundary import tenant_state
from tests.integration.test_fleet_upgrade import make_tree, use_tree
from tests.job_server import TenantServerDb


def provision(settings: Settings, tenant: str) -> None:
    out = run_cli(settings, "provision", tenant, "--json")
    assert out.returncode == 0, out.stdout + out.stderr


def on_server(jobs_server: TenantServerDb, sql: str, *params: object) -> list[tuple]:
    with jobs_server.owner() as conn:
        return conn.execute(sql, params).fetchall()


def app_sees(jobs_server: TenantServerDb, tenant: str) -> object:
    """What the application role gets from the tenant's table on the server."""
    try:
        with jobs_server.app() as app:
            row = app.execute(f"SELECT count(*) FROM tenant_{tenant}.role_profiles").fetchone()
    except psycopg.errors.InsufficientPrivilege:
        return "permission denied"
    except psycopg.errors.UndefinedTable:
        return "schema gone"
    return "allowed" if row is not None else None


def test_a_fleet_upgrade_brings_tenants_on_control_and_on_the_server_to_the_head(
    settings: Settings,
    database: Database,
    jobs_server: TenantServerDb,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    provision(settings, "home")  # before the server is listed: on control
    jobs_server.add_to(database)
    assert run_cli(settings, "migrate").returncode == 0
    for tenant in ("away1", "away2"):
        provision(settings, tenant)
    env = use_tree(monkeypatch, make_tree(tmp_path))

    # One tenant's upgrade first, then the fleet's: each queued, run by a worker.
    one = run_cli(settings, "upgrade", "away1", "--json", env=env)
    assert one.returncode == 0, one.stdout + one.stderr
    assert [b["tenant_id"] for b in json.loads(one.stdout)["behind"]] == ["away1"]
    assert run_cli(settings, "worker", "--once", env=env).returncode == 0
    queued = run_cli(settings, "upgrade", "--all", "--json", env=env)
    assert queued.returncode == 0, queued.stdout + queued.stderr
    report = json.loads(queued.stdout)
    assert sorted(b["tenant_id"] for b in report["behind"]) == ["away2", "home"]
    worker = run_cli(settings, "worker", "--once", env=env)
    assert worker.returncode == 0, worker.stderr
    for tenant in ("home", "away1", "away2"):
        status = json.loads(run_cli(settings, "status", tenant, "--json", env=env).stdout)
        assert (status["status"], status["error_detail"]) == ("succeeded", None), tenant

    with database.owner() as conn:
        assert conn.execute("SELECT version_num FROM tenant_home.alembic_version").fetchall() == [
            ("t005",)
        ]
        expected = catalog_fingerprint(conn, "tenant_home")
        stored = conn.execute("SELECT start FROM control.tenant_upgrade_references").fetchall()
    assert stored == [("t004",)]  # one reference, control's, for both databases
    for tenant in ("away1", "away2"):
        assert on_server(
            jobs_server, f"SELECT version_num FROM tenant_{tenant}.alembic_version"
        ) == [("t005",)]
        with jobs_server.owner() as conn:
            assert catalog_fingerprint(conn, f"tenant_{tenant}") == expected
        (detail,) = on_server(
            jobs_server,
            "SELECT detail FROM provisioner_server.step_journal WHERE tenant_id = %s AND step = %s",
            tenant,
            "run_tenant_migrations",
        )
        # The new revisions' verified replay on the server, not an Alembic run.
        assert detail == ("path=replay from=t004 head=t005",), tenant
    assert fingerprint(database, "home") == expected


def test_suspend_restore_deprovision_and_purge_run_on_the_tenant_server(
    settings: Settings, database: Database, jobs_server: TenantServerDb
) -> None:
    jobs_server.add_to(database)
    assert run_cli(settings, "migrate").returncode == 0
    provision(settings, "acme")
    assert app_sees(jobs_server, "acme") == "allowed"

    def change(*command: str) -> dict:
        out = run_cli(settings, *command, "acme", "--json")
        assert out.returncode == 0, out.stdout + out.stderr
        job = json.loads(out.stdout)
        assert job["status"] == "succeeded", job
        return job

    suspended = change("suspend")
    assert suspended["steps_completed"] == ["revoke_app_rw", "mark_suspended"]
    assert (tenant_state(database, "acme"), app_sees(jobs_server, "acme")) == (
        "suspended",
        "permission denied",
    )
    job = suspended["job_id"]
    written = on_server(
        jobs_server,
        "SELECT step FROM provisioner_server.step_journal WHERE job_id = %s",
        job,
    )
    assert written == [("revoke_app_rw",)]  # the state change is control's alone

    change("restore")
    assert (tenant_state(database, "acme"), app_sees(jobs_server, "acme")) == (
        "onboarding",
        "allowed",
    )

    change("deprovision")
    assert (tenant_state(database, "acme"), app_sees(jobs_server, "acme")) == (
        "archived",
        "permission denied",
    )
    assert jobs_server.schema_exists("tenant_acme")  # the data is kept

    purged = change("deprovision", "--purge", "--yes")
    assert purged["steps_completed"] == ["revoke_app_rw", "drop_schema", "mark_deleted"]
    assert tenant_state(database, "acme") == "deleted"
    assert not jobs_server.schema_exists("tenant_acme")
    assert app_sees(jobs_server, "acme") == "schema gone"


def test_repair_restores_a_drifted_tenant_on_its_server_and_leaves_a_suspended_one_revoked(
    settings: Settings, database: Database, jobs_server: TenantServerDb
) -> None:
    jobs_server.add_to(database)
    assert run_cli(settings, "migrate").returncode == 0
    for tenant in ("acme", "held"):
        provision(settings, tenant)
    assert run_cli(settings, "suspend", "held").returncode == 0
    with jobs_server.owner() as conn:
        conn.execute("REVOKE SELECT ON tenant_acme.role_profiles FROM app_rw")
        conn.execute("DROP INDEX tenant_held.datasets_created_by_idx")
    assert app_sees(jobs_server, "acme") == "permission denied"

    repaired = run_cli(settings, "repair", "acme", "held", "--json")
    assert repaired.returncode == 0, repaired.stdout + repaired.stderr
    found = {t["tenant_id"]: t for t in json.loads(repaired.stdout)["tenants"]}
    for tenant in ("acme", "held"):
        assert found[tenant]["job_status"] == "succeeded", found[tenant]
        assert found[tenant]["after"]["state"] == "clean", found[tenant]
    assert app_sees(jobs_server, "acme") == "allowed"
    assert app_sees(jobs_server, "held") == "permission denied"  # suspended: never given back
    with jobs_server.owner() as conn:
        index = conn.execute(
            "SELECT 1 FROM pg_indexes WHERE schemaname = 'tenant_held' "
            "AND indexname = 'datasets_created_by_idx'"
        ).fetchone()
        journal = conn.execute(
            "SELECT tenant_id FROM provisioner_server.step_journal WHERE step = 'restore_catalog' "
            "ORDER BY 1"
        ).fetchall()
    assert index is not None
    assert journal == [("acme",), ("held",)]
    with database.owner() as conn:
        recorded = conn.execute(
            "SELECT tenant_id, outcome FROM control.tenant_checks ORDER BY 1"
        ).fetchall()
    assert recorded == [("acme", "clean"), ("held", "clean")]


def test_a_kind_without_steps_for_a_tenant_server_fails_at_once_there(
    settings: Settings, database: Database, jobs_server: TenantServerDb
) -> None:
    """The refusal left: a kind registered from outside with no placed steps."""
    fast = replace(settings, job_kind_modules=(job_kinds.MODULE,))
    jobs_server.add_to(database)
    assert run_cli(settings, "migrate").returncode == 0
    provision(settings, "acme")
    job = job_kinds.enqueue(database, "acme")
    with Engine.from_settings(fast, "test-engine") as engine:
        outcome = runner.claim_and_run(
            engine, job.id, on_progress=lambda e: None, should_stop=lambda: False
        )
    assert isinstance(outcome, runner.Settled)
    assert outcome.job.status is JobStatus.FAILED and outcome.job.steps_completed == []
    assert outcome.job.error_detail is not None
    assert (
        "lives on tenant server east: stamp_tenant runs on the control database only"
        in outcome.job.error_detail
    )
    assert job_kinds.display_name(database, "acme") is None  # nothing written


def test_a_schema_the_tool_did_not_make_on_a_server_is_neither_taken_nor_purged(
    settings: Settings, database: Database, jobs_server: TenantServerDb
) -> None:
    """As on control (tests/integration/test_lifecycle.py): on the tenant's server, a schema of
    the tenant's name with someone else's data fails the provisioning's create_schema in one
    line, and the purge of the still-pending tenant leaves it as it is."""
    jobs_server.add_to(database)
    assert run_cli(settings, "migrate").returncode == 0
    with jobs_server.owner() as conn:
        conn.execute("CREATE SCHEMA tenant_ledger")
        conn.execute("CREATE TABLE tenant_ledger.entries (amount int)")
        conn.execute("INSERT INTO tenant_ledger.entries VALUES (7)")
    refused = run_cli(settings, "provision", "ledger")
    assert refused.returncode == 1, refused.stdout + refused.stderr
    assert "schema tenant_ledger already exists and holds 1 object(s)" in refused.stdout
    assert tenant_state(database, "ledger") == "pending"
    assert app_sees(jobs_server, "ledger") == "permission denied"
    purged = run_cli(settings, "deprovision", "ledger", "--purge", "--yes")
    assert purged.returncode == 0, purged.stdout + purged.stderr
    assert tenant_state(database, "ledger") == "deleted"
    assert on_server(jobs_server, "SELECT amount FROM tenant_ledger.entries") == [(7,)]
