"""A project's own schema naming (issue 24): ``schema_pattern = "acct_{id}_data"`` and a tenant-id
rule of its own, through every path that maps an id to a schema or back (provision, list,
check, suspend/restore, purge, a fleet upgrade, the warm pool's take, the application role's
registration); bad patterns and ids refused with nothing created; the tool's scratch schemas
never a tenant's."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path
from typing import Any

import psycopg
import pytest

from provisioner import naming
from provisioner.errors import ConfigurationError, InvalidInput
from provisioner.kinds.provision import ensure_provision_job
from provisioner.models import TenantId
from provisioner.naming import RESERVED, TenantNaming
from provisioner.settings import Settings, tenant_naming
from provisioner.templates import expected, migrations
from provisioner.testing.factory import own_id
from tests.conftest import Database, Server, run_cli
from tests.integration.test_fleet_upgrade import make_tree
from tests.integration.test_user_project import run_pytest
from tests.workers import Workers, job_row, step_runs, wait_until

RULE = {
    "PROVISIONER_SCHEMA_PATTERN": "acct_{id}_data",
    "PROVISIONER_TENANT_ID_PATTERN": "[a-z][a-z0-9]{2,15}",
    "PROVISIONER_TENANT_ID_MAX_LENGTH": "16",
}
NAMED = TenantNaming("acct_{id}_data", "[a-z][a-z0-9]{2,15}", 16)


@pytest.fixture
def named(monkeypatch: pytest.MonkeyPatch) -> dict[str, str]:
    """The rule in this process (read at each use) and for the commands it runs."""
    for name, value in RULE.items():
        monkeypatch.setenv(name, value)
    assert tenant_naming() == NAMED
    return dict(RULE)


@pytest.fixture
def fast(settings: Settings) -> Settings:
    return replace(settings, heartbeat_seconds=0.5, job_stale_after_seconds=30.0)


def schemas(database: Database) -> list[str]:
    """Every schema that is not PostgreSQL's or the control schema."""
    with database.owner() as conn:
        rows = conn.execute(
            "SELECT nspname FROM pg_namespace WHERE nspname NOT LIKE 'pg\\_%%' "
            "AND nspname NOT IN ('public', 'information_schema', 'control') ORDER BY 1"
        ).fetchall()
    return [r[0] for r in rows]


def control_rows(database: Database) -> list[tuple[Any, ...]]:
    with database.owner() as conn:
        return conn.execute(
            "SELECT tenant_id, schema_name, state FROM control.tenants ORDER BY 1"
        ).fetchall()


def versions(database: Database, schema: str) -> list[str]:
    with database.owner() as conn:
        return [r[0] for r in conn.execute(f"SELECT version_num FROM {schema}.alembic_version")]


def test_a_project_naming_runs_provision_list_check_lifecycle_and_upgrade(
    settings: Settings, database: Database, named: dict[str, str], tmp_path: Path
) -> None:
    migrated = run_cli(settings, "migrate", env=named)
    assert migrated.returncode == 0, migrated.stderr
    with database.owner() as conn:
        assert conn.execute(
            "SELECT schema_pattern, tenant_id_pattern, tenant_id_max_length "
            "FROM control.tenant_naming"
        ).fetchall() == [("acct_{id}_data", "[a-z][a-z0-9]{2,15}", 16)]
    shown = json.loads(run_cli(settings, "config", "--json", env=named).stdout)["settings"]
    by_key = {row["key"]: row for row in shown}
    assert by_key["schema_pattern"]["value"] == "acct_{id}_data"
    assert by_key["schema_pattern"]["source"] == "environment"
    assert by_key["tenant_id_max_length"]["value"] == "16"

    for tenant in ("acme", "bravo"):
        done = run_cli(settings, "provision", tenant, env=named)
        assert done.returncode == 0, done.stderr
    assert schemas(database) == ["acct_acme_data", "acct_bravo_data"]
    assert control_rows(database) == [
        ("acme", "acct_acme_data", "onboarding"),
        ("bravo", "acct_bravo_data", "onboarding"),
    ]
    with database.app() as conn:  # the application role works in the tenant's schema
        conn.execute(
            "INSERT INTO acct_acme_data.members (email, role_profile_id) "
            "SELECT 'a@example.com', id FROM acct_acme_data.role_profiles WHERE key = 'owner'"
        )

    listed = run_cli(settings, "tenants", "list", "--json", env=named)
    assert listed.returncode == 0, listed.stderr
    head = migrations.head_label(migrations.tenant_heads())
    assert {(t["tenant_id"], t["revision"], t["behind"]) for t in json.loads(listed.stdout)} == {
        ("acme", head, False),
        ("bravo", head, False),
    }
    checked = run_cli(settings, "check", "--all", "--json", env=named)
    assert checked.returncode == 0, checked.stdout + checked.stderr

    assert run_cli(settings, "suspend", "acme", env=named).returncode == 0
    with database.app() as conn, pytest.raises(psycopg.errors.InsufficientPrivilege):
        conn.execute("SELECT count(*) FROM acct_acme_data.members")
    assert run_cli(settings, "check", "acme", env=named).returncode == 0
    assert run_cli(settings, "restore", "acme", env=named).returncode == 0
    with database.app() as conn:
        assert conn.execute("SELECT count(*) FROM acct_acme_data.members").fetchone() == (1,)

    # A fleet upgrade finds the tenants' version tables by the pattern, and replays into them.
    tree = make_tree(tmp_path)
    upgrade_env = {**named, migrations.TENANT_TREE_ENV: str(tree)}
    behind = run_cli(settings, "upgrade", "--all", "--json", env=upgrade_env)
    assert behind.returncode == 0, behind.stderr
    drained = run_cli(settings, "worker", "--once", env=upgrade_env)
    assert drained.returncode == 0, drained.stderr
    assert versions(database, "acct_acme_data") == versions(database, "acct_bravo_data") == ["t005"]
    assert run_cli(settings, "check", "--all", env=upgrade_env).returncode == 0

    purged = run_cli(settings, "deprovision", "bravo", "--purge", "--yes", env=upgrade_env)
    assert purged.returncode == 0, purged.stderr
    # Nothing else was ever left: no scratch schema, no tenant_<id> name.
    assert schemas(database) == ["acct_acme_data"]


def test_the_application_role_registers_tenants_only_under_the_recorded_pattern(
    settings: Settings, database: Database, named: dict[str, str]
) -> None:
    assert run_cli(settings, "migrate", env=named).returncode == 0
    with psycopg.connect(database.app_url) as conn:  # the application's own sign-up
        ensure_provision_job(conn, TenantId("charlie"))
    assert control_rows(database) == [("charlie", "acct_charlie_data", "pending")]
    for schema in ("tenant_delta", "control", "acct_charlie_data"):
        with (
            psycopg.connect(database.app_url) as conn,
            pytest.raises(psycopg.errors.InsufficientPrivilege),
        ):
            conn.execute(
                "INSERT INTO control.tenants (tenant_id, schema_name) VALUES ('delta', %s)",
                (schema,),
            )
    drained = run_cli(settings, "worker", "--once", env=named)
    assert drained.returncode == 0, drained.stderr
    assert job_row(database, "charlie")["status"] == "succeeded"
    assert schemas(database) == ["acct_charlie_data"]


def test_the_application_role_registers_only_ids_the_recorded_rule_allows(
    settings: Settings, database: Database, named: dict[str, str]
) -> None:
    """Control revision 20261207_h37guard: the registration policy holds the id itself to the
    recorded rule (pattern matched whole, length), to the characters every rule allows, off
    the reserved words. Before it, an id such as ``Evil"; x`` under its pattern's schema name
    got in, and every fleet command that reads the tenants refused it and stopped."""
    assert run_cli(settings, "migrate", env=named).returncode == 0
    refused = (
        'Evil"; x',  # not the rule's characters
        "ab",  # the pattern asks for 3 to 16
        "abcdefghijklmnopq",  # 17 characters: longer than the recorded 16
        "abc_d",  # '_' is outside this project's pattern
        "1abc",  # a digit first
        "select",  # a reserved word
        "abc\nx",
    )
    for tenant in refused:
        with (
            psycopg.connect(database.app_url) as conn,
            pytest.raises(psycopg.errors.InsufficientPrivilege),
        ):
            conn.execute(
                "INSERT INTO control.tenants (tenant_id, schema_name) VALUES (%s, %s)",
                (tenant, NAMED.schema(tenant)),
            )
    with psycopg.connect(database.app_url) as conn:
        ensure_provision_job(conn, TenantId("abc123"))
    assert control_rows(database) == [("abc123", "acct_abc123_data", "pending")]
    listed = run_cli(settings, "tenants", "list", "--json", env=named)
    assert listed.returncode == 0, listed.stderr


def pooled(database: Database) -> int:
    with database.owner() as conn:
        row = conn.execute("SELECT count(*) FROM control.tenant_pool").fetchone()
    assert row is not None
    return int(row[0])


def test_the_pool_hands_a_spare_out_under_the_pattern(
    fast: Settings, database: Database, named: dict[str, str], workers: Workers
) -> None:
    assert run_cli(fast, "migrate", env=named).returncode == 0
    worker = workers.start(env={**named, "PROVISIONER_POOL_SIZE": "1"})
    wait_until(lambda: pooled(database) == 1, 60, "a spare")
    (spare,) = [s for s in schemas(database) if s.startswith(naming.SPARE_PREFIX)]
    assert NAMED.tenant_of(spare) is None
    with psycopg.connect(database.app_url) as conn:
        ensure_provision_job(conn, TenantId("pooled"))
    wait_until(lambda: job_row(database, "pooled")["status"] == "succeeded", 60, "pooled")
    (create,) = [r for r in step_runs(database, "pooled") if r["step"] == "create_schema"]
    assert create["detail"] == f"taken from the warm pool: {spare}"
    assert "acct_pooled_data" in schemas(database) and spare not in schemas(database)
    assert worker.stop() == 0, worker.output()


def test_a_worker_or_provision_refuses_a_naming_the_control_database_does_not_record(
    settings: Settings, database: Database, named: dict[str, str]
) -> None:
    refused = run_cli(settings, "worker", "--once", env=named)  # recorded: the default
    lines = refused.stderr.strip().splitlines()
    assert refused.returncode == 2 and len(lines) == 1, refused.stderr
    assert "acct_{id}_data" in lines[0] and "provisioner migrate" in lines[0]
    provisioned = run_cli(settings, "provision", "yankee", env=named)  # nor provisions under it
    lines = provisioned.stderr.strip().splitlines()
    assert provisioned.returncode == 2 and len(lines) == 1, provisioned.stderr
    assert "acct_{id}_data" in lines[0]
    assert schemas(database) == [] and control_rows(database) == []
    # Under tenants of the default naming, the rule cannot change: nothing is recorded.
    assert run_cli(settings, "provision", "zulu", env={}).returncode == 0
    changed = run_cli(settings, "migrate", env=named)
    assert changed.returncode == 2 and "tenant zulu lives in schema tenant_zulu" in changed.stderr
    with database.owner() as conn:
        assert conn.execute("SELECT count(*) FROM control.tenant_naming").fetchone() == (0,)


@pytest.mark.parametrize(
    ("variable", "value", "message"),
    [
        ("PROVISIONER_SCHEMA_PATTERN", "tenants", "must hold '{id}' exactly once"),
        ("PROVISIONER_SCHEMA_PATTERN", "t_{id}_{id}", "must hold '{id}' exactly once"),
        ("PROVISIONER_SCHEMA_PATTERN", "Acct_{id}", "only lower-case ASCII letters"),
        ("PROVISIONER_SCHEMA_PATTERN", "acct-{id}", "only lower-case ASCII letters"),
        ("PROVISIONER_SCHEMA_PATTERN", "pool_{id}", "the tool's and PostgreSQL's own"),
        ("PROVISIONER_SCHEMA_PATTERN", "provisioner_{id}", "the tool's and PostgreSQL's own"),
        ("PROVISIONER_SCHEMA_PATTERN", "1_{id}", "must not start with a digit"),
        ("PROVISIONER_TENANT_ID_MAX_LENGTH", "60", "between 1 and 55"),
        ("PROVISIONER_TENANT_ID_MAX_LENGTH", "many", "must be a whole number"),
        ("PROVISIONER_TENANT_ID_PATTERN", "[a-z", "is not a regular expression"),
    ],
)
def test_a_naming_that_cannot_work_is_refused_with_nothing_created(
    settings: Settings, database: Database, variable: str, value: str, message: str
) -> None:
    env = {"PROVISIONER_SCHEMA_PATTERN": "account_{id}", variable: value}
    result = run_cli(settings, "provision", "acme", env=env)
    lines = result.stderr.strip().splitlines()
    assert result.returncode == 2 and len(lines) == 1, result.stderr
    assert message in lines[0], lines
    assert schemas(database) == [] and control_rows(database) == []


@pytest.mark.parametrize(
    "tenant_id",
    ["ab", "a_b_c", "acme2026abcdefghz", "Acme", "9lives", "select", "public", "x" * 200],
)
def test_an_id_the_rule_refuses_is_one_line_exit_2_and_nothing_created(
    settings: Settings, database: Database, named: dict[str, str], tenant_id: str
) -> None:
    for command in (("provision", tenant_id), ("enqueue", tenant_id)):
        result = run_cli(settings, *command, env=named)
        lines = result.stderr.strip().splitlines()
        assert result.returncode == 2 and len(lines) == 1, result.stderr
        assert "invalid tenant id" in lines[0] and "[a-z][a-z0-9]{2,15}" in lines[0], lines
    assert schemas(database) == [] and control_rows(database) == []


PERMISSIVE = [
    TenantNaming(),
    NAMED,
    TenantNaming("{id}", "[a-z_][a-z0-9_]*", 63),
    TenantNaming("{id}_t", "[a-z_][a-z0-9_]*", 61),
    TenantNaming("p{id}", "[a-z_][a-z0-9_]*", 62),
]


@pytest.mark.parametrize("rule", PERMISSIVE, ids=lambda r: r.schema_pattern)
def test_the_tools_own_schemas_are_never_a_tenants(rule: TenantNaming) -> None:
    own = [
        expected.scratch_name(),
        naming.scratch_name("reference"),
        naming.scratch_name("upgrade"),
        "pool_0123456789abcdef",
        "provisioner_template_capture",
    ]
    for schema in own:
        assert rule.tenant_of(schema) is None, schema
    for schema in own[:3]:
        assert rule.accepts(schema)  # the tree's env.py runs in them
    for value in ("pool_0123456789abcdef", "provisioner_x", "control", "public"):
        problem = rule.problem(value)
        if rule.schema(value).startswith(("pool_", "provisioner_")) or value in RESERVED:
            assert problem is not None and "reserved name" in problem
            with pytest.raises(InvalidInput, match="reserved name"):
                TenantId(value, rule)
        if problem is None:  # e.g. tenant_pool_...: an ordinary tenant's name
            assert rule.tenant_of(TenantId(value, rule).schema) == value
    assert not rule.accepts("public") and not rule.accepts("control")
    tenant = TenantId("acme", rule)
    assert rule.tenant_of(tenant.schema) == "acme"


def test_the_tenant_trees_env_refuses_a_schema_outside_the_naming(
    named: dict[str, str],
) -> None:
    assert migrations.tenant_offline_sql("acct_acme_data")  # a tenant's: accepted
    assert migrations.tenant_offline_sql(naming.scratch_name("reference"))
    for schema in ("tenant_acme", "public", "acct_a_b_data"):
        with pytest.raises(SystemExit, match="expected acct_<id>_data"):
            migrations.tenant_offline_sql(schema)


def test_the_pytest_factory_names_its_own_tenants_under_the_rule(named: dict[str, str]) -> None:
    for prefix in ("zzspare", "zzsparem", "t"):
        made = own_id(prefix)
        assert made.value.startswith(prefix[:1]) and NAMED.problem(made.value) is None
    strict = {
        "PROVISIONER_TENANT_ID_PATTERN": "[a-z]{3,8}",
        "PROVISIONER_TENANT_ID_MAX_LENGTH": "8",
    }
    with pytest.MonkeyPatch.context() as patch:
        for name, value in strict.items():
            patch.setenv(name, value)
        assert all(c.isalpha() for c in own_id("t").value)
    with pytest.raises(ConfigurationError):
        TenantNaming("acct_{id}_data", max_length=60)


PLUGIN_PROJECT_TESTS = """
import psycopg

import provisioner


def test_tenants_live_in_the_projects_schemas(tenant, tenant_factory):
    assert tenant.schema == f"acct_{tenant.id}_data"
    other = tenant_factory("northwind")
    assert other.schema == "acct_northwind_data"
    with other.connect() as conn:
        assert conn.execute("SELECT count(*) FROM role_profiles").fetchone()[0] > 0


def test_the_apps_own_sign_up_is_provisioned_and_swept(provisioner_settings, provisioner_worker):
    with psycopg.connect(provisioner_settings.app_url) as conn:
        provisioner.enqueue(conn, "signedup")
    (job,) = provisioner_worker.drain()
    assert job.status is provisioner.JobStatus.SUCCEEDED
    with psycopg.connect(provisioner_settings.owner_url) as conn:
        found = conn.execute(
            "SELECT 1 FROM pg_namespace WHERE nspname = 'acct_signedup_data'"
        ).fetchone()
    assert found is not None


def test_an_id_outside_the_rule_is_refused(tenant_factory):
    try:
        tenant_factory("not_allowed")
    except provisioner.InvalidInput as exc:
        assert "[a-z][a-z0-9]{2,15}" in str(exc)
    else:
        raise AssertionError("refused")
"""


def test_the_pytest_plugin_hands_out_tenants_under_the_projects_naming(
    pg_server: Server, tmp_path: Path
) -> None:
    project = tmp_path / "project"
    (project / "tests").mkdir(parents=True)
    (project / "provisioner.toml").write_text(
        'schema_pattern = "acct_{id}_data"\n'
        'tenant_id_pattern = "[a-z][a-z0-9]{2,15}"\n'
        "tenant_id_max_length = 16\n"
        'object_store_provider = "none"\n'
    )
    (project / "tests" / "test_app.py").write_text(PLUGIN_PROJECT_TESTS)
    result = run_pytest(project, pg_server, "-p", "no:xdist")
    assert result.returncode == 0, result.stdout + result.stderr
    assert "3 passed" in result.stdout, result.stdout
