"""``provisioner repair``: a tenant damaged by hand gets back, through a recorded
``repair_tenant`` job, what is safe to restore (privileges, indexes, columns, sequence options,
row-level security flags...), seen from a real ``app_rw`` session; what it will not touch
(extra objects with data) is named; ``--dry-run`` changes nothing; a suspended tenant gets no
access back."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import psycopg
import pytest

from provisioner import kinds, service
from provisioner.kinds import lifecycle
from provisioner.kinds.repair import REPAIR_JOB_TYPE
from provisioner.settings import Settings
from provisioner.templates import migrations
from provisioner.testing import Tenant
from tests.conftest import Database, run_cli
from tests.integration.test_fleet_upgrade import make_tree
from tests.workers import step_runs


@pytest.fixture
def make(tenant_factory: Callable[..., Tenant], settings: Settings) -> Callable[[str], str]:
    def provision(tenant_id: str) -> str:
        tenant_factory(tenant_id, settings=settings)
        return f"tenant_{tenant_id}"

    return provision


def by_hand(database: Database, *statements: str) -> None:
    with database.owner() as conn:
        for statement in statements:
            conn.execute(statement)  # type: ignore[arg-type]


def check_findings(settings: Settings, tenant: str) -> set[tuple[str, str, str]]:
    result = run_cli(settings, "check", tenant, "--json")
    (view,) = json.loads(result.stdout)["tenants"]
    return {(f["change"], f["kind"], f["name"]) for f in view["findings"]}


def damage(database: Database, schema: str) -> None:
    """What an operator's or a script's hand did to the tenant."""
    by_hand(
        database,
        f"INSERT INTO {schema}.role_profiles (key, name) VALUES ('x', 'X')",
        f"INSERT INTO {schema}.members (email, role_profile_id) "
        f"SELECT 'a@example.com', id FROM {schema}.role_profiles WHERE key = 'x'",
        f"DROP INDEX {schema}.audit_events_actor_idx",
        f"REVOKE DELETE ON {schema}.members FROM app_rw",
        f"ALTER DEFAULT PRIVILEGES IN SCHEMA {schema} REVOKE DELETE ON TABLES FROM app_rw",
        f"ALTER TABLE {schema}.datasets DROP COLUMN description",
        f"ALTER SEQUENCE {schema}.audit_events_id_seq MAXVALUE 10",
        f"ALTER TABLE {schema}.members ENABLE ROW LEVEL SECURITY",
        f"CREATE POLICY nobody ON {schema}.members USING (false)",
        f"GRANT SELECT (email) ON {schema}.members TO PUBLIC",
        f"CREATE TABLE {schema}.scratch (id int PRIMARY KEY)",
        f"INSERT INTO {schema}.scratch VALUES (1)",
    )


RESTORED = {
    ("missing", "index", "audit_events_actor_idx"),
    ("missing", "privilege", "DELETE ON TABLE members TO app_rw"),
    ("missing", "default privilege", "DELETE ON TABLES TO app_rw (FOR ROLE provisioner_owner)"),
    ("missing", "column", "datasets.description"),
    ("altered", "sequence", "audit_events_id_seq"),
    ("altered", "table", "members"),
    ("extra", "privilege", "SELECT ON COLUMN members.email TO PUBLIC"),
}
LEFT_ALONE = {("extra", "policy", "members.nobody"), ("extra", "table", "scratch")}


def app_sees(database: Database, schema: str) -> int:
    with database.app() as app:
        row = app.execute(f"SELECT count(*) FROM {schema}.members").fetchone()  # type: ignore[arg-type]
    assert row is not None
    return int(row[0])


def test_dry_run_prints_the_plan_and_changes_nothing(
    settings: Settings, database: Database, make: Callable[[str], str]
) -> None:
    schema = make("broken")
    damage(database, schema)
    before = check_findings(settings, "broken")
    assert before >= RESTORED | LEFT_ALONE

    result = run_cli(settings, "repair", "broken", "--dry-run")
    assert result.returncode == 0, result.stdout + result.stderr
    lines = result.stdout.splitlines()
    assert "  restore    missing index audit_events_actor_idx" in lines
    assert "  restore    missing column datasets.description" in lines
    assert "  restore    altered table members: row security" in lines
    assert (
        "  left alone extra table scratch: not the template's (it holds rows): "
        "drop it by hand if it is unwanted"
    ) in lines
    assert any(line.startswith("  left alone extra policy members.nobody") for line in lines)
    assert check_findings(settings, "broken") == before
    assert app_sees(database, schema) == 0  # the policy still hides every row
    with database.owner() as conn:
        jobs = conn.execute(
            "SELECT count(*) FROM control.platform_jobs WHERE job_type = %s", (REPAIR_JOB_TYPE,)
        ).fetchone()
    assert jobs == (0,)


def test_repair_restores_what_is_safe_as_a_recorded_job_and_names_the_rest(
    settings: Settings, database: Database, make: Callable[[str], str]
) -> None:
    schema = make("broken")
    make("healthy")
    damage(database, schema)
    assert app_sees(database, schema) == 0  # what the application lives with meanwhile
    with database.app() as app, pytest.raises(psycopg.errors.InsufficientPrivilege):
        app.execute(f"DELETE FROM {schema}.members")  # type: ignore[arg-type]

    result = run_cli(settings, "repair", "--all", "--json")
    # drift is left (the extra policy and table, by design): exit 1
    assert result.returncode == 1, result.stdout + result.stderr
    view = json.loads(result.stdout)
    (broken,) = view["tenants"]  # the healthy tenant needs nothing
    assert broken["tenant_id"] == "broken" and broken["job_status"] == "succeeded"
    assert {a["what"] for a in broken["left_alone"]} == {
        "extra policy members.nobody",
        "extra table scratch",
    }
    assert {(f["change"], f["kind"], f["name"]) for f in broken["after"]["findings"]} == (
        LEFT_ALONE
    )

    # seen from the application's own session: rows visible, DELETE allowed, the column back
    assert app_sees(database, schema) == 1
    with database.app() as app:
        app.execute(f"UPDATE {schema}.datasets SET description = 'd'")  # type: ignore[arg-type]
        app.execute(f"DELETE FROM {schema}.members")  # type: ignore[arg-type]
        for _ in range(11):  # past the MAXVALUE 10 put there by hand
            app.execute(
                f"INSERT INTO {schema}.audit_events (action) VALUES ('a')"  # type: ignore[arg-type]
            )
    with psycopg.connect(database.admin_url) as admin:  # PUBLIC lost the column grant
        admin.execute("CREATE ROLE stranger")  # rolled back below, with its grant
        admin.execute(f"GRANT USAGE ON SCHEMA {schema} TO stranger")  # type: ignore[arg-type]
        admin.execute("SET ROLE stranger")
        with pytest.raises(psycopg.errors.InsufficientPrivilege):
            admin.execute(f"SELECT email FROM {schema}.members")  # type: ignore[arg-type]
        admin.rollback()

    runs = [r for r in step_runs(database, "broken") if r["step"] == "restore_catalog"]
    assert [r["outcome"] for r in runs] == ["succeeded"]
    assert "restored 7" in str(runs[0]["detail"]) and "left alone 2" in str(runs[0]["detail"])

    again = run_cli(settings, "repair", "broken")  # nothing left that repair restores
    assert again.returncode == 1
    assert "broken: restores 0, leaves alone 2" in again.stdout


def test_a_restore_that_the_data_refuses_is_reported_and_the_others_still_apply(
    settings: Settings, database: Database, make: Callable[[str], str]
) -> None:
    schema = make("refusing")
    by_hand(
        database,
        f"INSERT INTO {schema}.audit_events (action) VALUES ('kept')",
        f"ALTER TABLE {schema}.audit_events DROP COLUMN action",  # NOT NULL, no default
        f"DROP INDEX {schema}.datasets_created_by_idx",
    )
    report = service.repair(settings, ["refusing"])
    (result,) = report.results
    assert result.job is not None and result.job.status.value == "succeeded"
    assert result.after is not None
    remaining = {(d.change, d.kind, d.name) for d in result.after.differences}
    assert remaining == {("missing", "column", "audit_events.action")}
    runs = [r for r in step_runs(database, "refusing") if r["step"] == "restore_catalog"]
    assert "failed 1: missing column audit_events.action" in str(runs[-1]["detail"])


def test_a_suspended_tenant_is_repaired_without_getting_its_access_back(
    settings: Settings, database: Database, make: Callable[[str], str]
) -> None:
    schema = make("paused")
    service.change_lifecycle(settings, "paused", lifecycle.SUSPEND_JOB_TYPE)
    by_hand(database, f"DROP INDEX {schema}.members_role_profile_idx")
    result = run_cli(settings, "repair", "paused")
    assert result.returncode == 0, result.stdout + result.stderr
    assert "  now clean" in result.stdout
    with database.app() as app, pytest.raises(psycopg.errors.InsufficientPrivilege):
        app.execute(f"SELECT count(*) FROM {schema}.members")  # type: ignore[arg-type]
    with database.owner() as conn:
        state = conn.execute(
            "SELECT state FROM control.tenants WHERE tenant_id = 'paused'"
        ).fetchone()
    assert state == ("suspended",)


def test_a_missing_schema_or_version_table_is_named_not_repaired(
    settings: Settings, database: Database, make: Callable[[str], str]
) -> None:
    gone = make("gone")
    unversioned = make("unversioned")
    by_hand(database, f"DROP SCHEMA {gone} CASCADE", f"DROP TABLE {unversioned}.alembic_version")
    result = run_cli(settings, "repair", "gone", "unversioned", "--dry-run", "--json")
    assert result.returncode == 0, result.stderr
    plans: dict[str, Any] = {t["tenant_id"]: t for t in json.loads(result.stdout)["tenants"]}
    assert plans["gone"]["restores"] == [] and plans["unversioned"]["restores"] == []
    assert "provisioner provision gone" in plans["gone"]["left_alone"][0]["reason"]
    assert plans["unversioned"]["left_alone"][0]["what"] == "missing version table alembic_version"


def test_provision_saying_nothing_to_do_points_to_check_and_repair(
    settings: Settings, database: Database, make: Callable[[str], str]
) -> None:
    schema = make("quiet")
    by_hand(database, f"ALTER TABLE {schema}.datasets DROP COLUMN description")
    result = run_cli(settings, "provision", "quiet")
    assert result.returncode == 0, result.stderr
    assert "tenant quiet is already provisioned; nothing to do" in result.stdout
    assert "`provisioner check quiet`" in result.stdout
    assert "`provisioner repair quiet`" in result.stdout


def test_the_repair_kind_is_one_registry_entry_with_its_step() -> None:
    kind = kinds.BUILTIN[REPAIR_JOB_TYPE]
    assert kind.step_names == ("restore_catalog",)
    assert kind.command == "repair"
    assert not kind.default_worker
    assert "deleted" in kind.refused_states


def test_repair_refuses_bad_input(settings: Settings, make: Callable[[str], str]) -> None:
    make("known")
    assert run_cli(settings, "repair").returncode == 2
    assert run_cli(settings, "repair", "known", "--all").returncode == 2
    assert run_cli(settings, "repair", "Nope!").returncode == 2
    assert run_cli(settings, "repair", "ghost").returncode == 3
    clean = run_cli(settings, "repair", "--all")
    assert clean.returncode == 0 and "nothing to repair" in clean.stdout


def test_queued_repairs_are_run_by_a_worker(
    settings: Settings, database: Database, make: Callable[[str], str]
) -> None:
    schema = make("later")
    by_hand(database, f"REVOKE INSERT ON {schema}.audit_events FROM app_rw")
    queued = run_cli(settings, "repair", "later", "--queue", "--json")
    assert queued.returncode == 0, queued.stderr
    (tenant,) = json.loads(queued.stdout)["tenants"]
    assert tenant["queued"] and tenant["job_status"] == "queued"
    assert check_findings(settings, "later") == {
        ("missing", "privilege", "INSERT ON TABLE audit_events TO app_rw")
    }
    env = {"PROVISIONER_WORKER_JOB_TYPES": REPAIR_JOB_TYPE}
    assert run_cli(settings, "worker", "--once", env=env).returncode == 0
    assert check_findings(settings, "later") == set()
    with database.app() as app:
        app.execute(f"INSERT INTO {schema}.audit_events (action) VALUES ('a')")  # type: ignore[arg-type]
    status = run_cli(settings, "status", "later", "--json")
    assert json.loads(status.stdout)["job_type"] == REPAIR_JOB_TYPE


# A template revision that creates what the shipped template does not: an enum type and a
# column of it, a trigger and its function, a view, row-level security and a policy, a rule.
EVERY_KIND = "\n".join(
    f"    op.execute({statement!r})"
    for statement in (
        "CREATE TYPE mood AS ENUM ('calm', 'busy')",
        "ALTER TABLE members ADD COLUMN mood mood",
        "CREATE FUNCTION touch_updated_at() RETURNS trigger LANGUAGE plpgsql "
        "AS $$BEGIN NEW.updated_at := now(); RETURN NEW; END$$",
        "CREATE TRIGGER members_touch BEFORE UPDATE ON members "
        "FOR EACH ROW EXECUTE FUNCTION touch_updated_at()",
        "CREATE VIEW active_members AS SELECT id, email FROM members WHERE status = 'active'",
        "ALTER TABLE api_keys ENABLE ROW LEVEL SECURITY",
        "CREATE POLICY live_keys ON api_keys USING (revoked_at IS NULL)",
        "CREATE RULE keep_audit AS ON DELETE TO audit_events DO INSTEAD NOTHING",
    )
)


def test_objects_the_template_defines_are_created_again_from_its_definitions(
    settings: Settings,
    database: Database,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    tree = make_tree(tmp_path, EVERY_KIND)
    monkeypatch.setenv(migrations.TENANT_TREE_ENV, str(tree))
    env = {migrations.TENANT_TREE_ENV: str(tree)}
    service.provision(settings, "rich")
    assert run_cli(settings, "check", "rich", env=env).returncode == 0
    by_hand(
        database,
        "DROP TRIGGER members_touch ON tenant_rich.members",
        "CREATE OR REPLACE FUNCTION tenant_rich.touch_updated_at() RETURNS trigger "
        "LANGUAGE plpgsql AS $$BEGIN RETURN NEW; END$$",
        "DROP VIEW tenant_rich.active_members",
        "DROP POLICY live_keys ON tenant_rich.api_keys",
        "ALTER TABLE tenant_rich.api_keys DISABLE ROW LEVEL SECURITY",
        "DROP RULE keep_audit ON tenant_rich.audit_events",
        "DROP TYPE tenant_rich.mood CASCADE",  # and the column of that type with it
    )
    found = run_cli(settings, "check", "rich", "--json", env=env)
    assert found.returncode == 1
    (view,) = json.loads(found.stdout)["tenants"]
    assert {(f["change"], f["kind"], f["name"]) for f in view["findings"]} == {
        ("missing", "type", "mood"),
        ("missing", "column", "members.mood"),
        ("altered", "function", "touch_updated_at()"),
        ("missing", "trigger", "members.members_touch"),
        ("missing", "view", "active_members"),
        ("altered", "table", "api_keys"),
        ("missing", "policy", "api_keys.live_keys"),
        ("missing", "rule", "audit_events.keep_audit"),
    }

    repaired = run_cli(settings, "repair", "rich", env=env)
    assert repaired.returncode == 0, repaired.stdout + repaired.stderr
    assert "  now clean" in repaired.stdout
    with database.owner() as conn:  # and they work again
        conn.execute(
            "INSERT INTO tenant_rich.role_profiles (key, name) VALUES ('r', 'R');"
            "INSERT INTO tenant_rich.members (email, role_profile_id, status, updated_at, mood)"
            " SELECT 'a@b.c', id, 'active', '2000-01-01', 'busy' FROM tenant_rich.role_profiles"
            " WHERE key = 'r';"
            "UPDATE tenant_rich.members SET display_name = 'A'"
        )
        row = conn.execute(
            "SELECT updated_at > '2001-01-01', (SELECT count(*) FROM tenant_rich.active_members)"
            " FROM tenant_rich.members"
        ).fetchone()
        assert row == (True, 1)
        conn.execute("INSERT INTO tenant_rich.audit_events (action) VALUES ('kept')")
        conn.execute("DELETE FROM tenant_rich.audit_events")
        kept = conn.execute("SELECT count(*) FROM tenant_rich.audit_events").fetchone()
        assert kept == (1,)
