"""Several application roles, each with its privilege set (``app_roles``): a project with
``app_rw`` (readwrite) and ``app_ro`` (readonly) gets both granted at provision and at a warm
pool's take, both cut off at suspend and given back at restore, each role's privileges checked
for drift and repaired; ``app_ro`` reads and cannot write, over real connections as each role.
Bad configuration is refused in one line, with nothing created."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import psycopg
import pytest
from psycopg import sql

from provisioner import pool, roles, service
from provisioner.errors import ConfigurationError
from provisioner.kinds import lifecycle
from provisioner.local import cluster as local_pg
from provisioner.local import state as embedded
from provisioner.roles import AppRole, Privileges
from provisioner.settings import Settings
from provisioner.tenant import schema as tenant_schema
from provisioner.testing.server import BOOTSTRAP_LOCK_KEY
from tests.conftest import Database, Server, build_spare, run_cli
from tests.integration.test_embedded import embedded_env, state_dir  # noqa: F401 -- a fixture
from tests.integration.test_pool import step_detail
from tests.integration.test_user_project import run_pytest

RW = AppRole("app_rw", Privileges.READWRITE)
RO = AppRole("app_ro", Privileges.READONLY)
INSERT = "INSERT INTO {s}.role_profiles (key, name) VALUES ('x', 'x')"


@pytest.fixture
def two(settings: Settings, database: Database, pg_server: Server) -> Settings:
    """The test's settings with app_rw readwrite and app_ro readonly; app_ro exists (a LOGIN
    role, as the bootstrap makes app_rw) and may connect to the test's database."""
    with psycopg.connect(pg_server.admin_url, autocommit=True) as lock:
        # Roles are the cluster's: one process at a time creates them (as the bootstrap does).
        lock.execute("SELECT pg_advisory_lock(%s)", (BOOTSTRAP_LOCK_KEY,))
        with psycopg.connect(database.admin_url, autocommit=True) as conn:
            local_pg.add_app_roles(conn, ("app_ro",))
    return replace(settings, app_roles=(RW, RO))


@pytest.fixture
def as_ro(database: Database, pg_server: Server) -> Iterator[psycopg.Connection]:
    with psycopg.connect(pg_server.url("app_ro", database.name), autocommit=True) as conn:
        yield conn


def reads(conn: psycopg.Connection, schema: str) -> bool:
    """The role can SELECT the tenant's rows (False: permission denied)."""
    try:
        conn.execute(f"SELECT count(*) FROM {schema}.role_profiles")  # type: ignore[arg-type]
    except psycopg.errors.InsufficientPrivilege:
        return False
    return True


def writes(conn: psycopg.Connection, schema: str) -> bool:
    """The role can INSERT a row (rolled back) (False: permission denied)."""
    try:
        with conn.transaction(force_rollback=True):
            conn.execute(INSERT.format(s=schema))  # type: ignore[arg-type]
    except psycopg.errors.InsufficientPrivilege:
        return False
    return True


def draws(conn: psycopg.Connection, schema: str) -> bool:
    """The role can take a number from the tenant's sequence (False: permission denied)."""
    try:
        with conn.transaction(force_rollback=True):
            conn.execute(f"SELECT nextval('{schema}.role_profiles_id_seq')")  # type: ignore[arg-type]
    except psycopg.errors.InsufficientPrivilege:
        return False
    return True


def assert_split(database: Database, ro: psycopg.Connection, schema: str) -> None:
    """app_rw reads, writes and draws; app_ro reads (tables and sequences) and nothing else."""
    with database.app() as rw:
        assert (reads(rw, schema), writes(rw, schema), draws(rw, schema)) == (True, True, True)
    assert (reads(ro, schema), writes(ro, schema), draws(ro, schema)) == (True, False, False)
    ro.execute(f"SELECT last_value FROM {schema}.role_profiles_id_seq")  # type: ignore[arg-type]
    with pytest.raises(psycopg.errors.InsufficientPrivilege):
        ro.execute(f"CREATE TABLE {schema}.mine (id int)")  # type: ignore[arg-type]


# -- configuration ------------------------------------------------------------------------------


def test_the_roles_come_from_the_environment_the_older_variable_or_the_default() -> None:
    load = Settings.from_env
    assert load({}).app_roles == (RW,)
    assert load({"PROVISIONER_APP_ROLE": "svc"}).app_roles == (AppRole("svc"),)
    both = load({"PROVISIONER_APP_ROLES": "app_rw=readwrite, app_ro=readonly"})
    assert both.app_roles == (RW, RO)
    assert both.control_role == "app_rw"
    assert load({"PROVISIONER_APP_ROLES": "app_ro=readonly,app_rw"}).control_role == "app_rw"
    assert roles.render(both.app_roles) == "app_rw=readwrite,app_ro=readonly"


@pytest.mark.parametrize(
    ("env", "says"),
    [
        (
            {"PROVISIONER_APP_ROLES": "app_rw=readwrite", "PROVISIONER_APP_ROLE": "app_rw"},
            "are both set",
        ),
        ({"PROVISIONER_APP_ROLES": "app_ro=writeonly"}, "unknown privilege set 'writeonly'"),
        ({"PROVISIONER_APP_ROLES": "app_rw,app_rw=readonly"}, "names role app_rw more than once"),
        ({"PROVISIONER_APP_ROLES": "Bad-Name=readonly"}, "'Bad-Name' is not a role name"),
        ({"PROVISIONER_APP_ROLES": " , "}, "names no role"),
        ({"PROVISIONER_APP_ROLE": "a,b"}, "'a,b' is not a role name"),
    ],
)
def test_bad_role_settings_are_refused_in_one_line_and_nothing_is_created(
    settings: Settings, database: Database, env: dict[str, str], says: str
) -> None:
    with pytest.raises(ConfigurationError, match=says):
        Settings.from_env(env)
    result = run_cli(settings, "provision", "refused", env=env)
    assert result.returncode == 2, result.stdout + result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and says in lines[0], result.stderr
    assert "Traceback" not in result.stderr
    with database.owner() as conn:
        found = conn.execute(
            "SELECT (SELECT count(*) FROM control.tenants WHERE tenant_id = 'refused'),"
            " (SELECT count(*) FROM pg_namespace WHERE nspname = 'tenant_refused')"
        ).fetchone()
    assert found == (0, 0)


def test_the_project_file_declares_the_roles_as_a_table(tmp_path: Path) -> None:
    (tmp_path / "provisioner.toml").write_text(
        '[app_roles]\napp_rw = "readwrite"\napp_ro = "readonly"\n'
    )
    loaded = Settings.load(env={}, start=tmp_path)
    assert loaded.app_roles == (RW, RO)
    # the environment overrides the file, as for every key
    mine = Settings.load(env={"PROVISIONER_APP_ROLES": "app_x=readonly"}, start=tmp_path)
    assert mine.app_roles == (AppRole("app_x", Privileges.READONLY),)

    (tmp_path / "provisioner.toml").write_text('[app_roles]\napp_ro = "everything"\n')
    with pytest.raises(ConfigurationError, match="unknown privilege set 'everything'"):
        Settings.load(env={}, start=tmp_path)
    (tmp_path / "provisioner.toml").write_text('app_roles = "app_rw"\n')
    with pytest.raises(ConfigurationError, match="must be a table of role = privilege set"):
        Settings.load(env={}, start=tmp_path)


def test_a_missing_second_role_is_refused_before_anything_is_granted(
    settings: Settings, database: Database
) -> None:
    env = {"PROVISIONER_APP_ROLES": "app_rw=readwrite,app_nobody=readonly"}
    result = run_cli(settings, "provision", "lonely", env=env)
    assert result.returncode == 2, result.stdout + result.stderr
    assert "application role app_nobody" in result.stderr
    assert "does not exist" in result.stderr
    with database.owner() as conn:
        found = conn.execute(
            "SELECT count(*) FROM pg_namespace WHERE nspname = 'tenant_lonely'"
        ).fetchone()
    assert found == (0,)


def test_the_worker_checks_every_role_at_start(settings: Settings, database: Database) -> None:
    """Each configured role's standing is checked before the worker starts: a second role that
    does not exist stops it in one line naming that role (exit 2)."""
    env = {"PROVISIONER_APP_ROLES": "app_rw=readwrite,app_nobody=readonly"}
    result = run_cli(settings, "worker", "--once", env=env, timeout=60)
    assert result.returncode == 2, result.stdout + result.stderr
    assert "application role app_nobody" in result.stderr, result.stderr
    assert "Traceback" not in result.stderr


# -- provision, suspend, restore ------------------------------------------------------------------


def test_two_roles_through_provision_suspend_and_restore(
    two: Settings, database: Database, as_ro: psycopg.Connection
) -> None:
    schema = "tenant_duo"
    service.provision(two, "duo")
    assert_split(database, as_ro, schema)
    with database.owner() as conn:
        assert tenant_schema.missing_app_grants(conn, schema, two.app_roles) == []

    service.change_lifecycle(two, "duo", lifecycle.SUSPEND_JOB_TYPE)
    with database.app() as rw:
        assert not reads(rw, schema)
    assert not reads(as_ro, schema)
    with database.owner() as conn:
        assert tenant_schema.app_roles_cut_off(conn, schema, two.app_roles)
        # the cut-off check covers each role: app_ro alone given a grant back is not cut off
        conn.execute(f"GRANT USAGE ON SCHEMA {schema} TO app_ro")  # type: ignore[arg-type]
        assert not tenant_schema.app_roles_cut_off(conn, schema, two.app_roles)
        assert tenant_schema.app_roles_cut_off(conn, schema, (RW,))
        conn.execute(f"REVOKE USAGE ON SCHEMA {schema} FROM app_ro")  # type: ignore[arg-type]

    service.change_lifecycle(two, "duo", lifecycle.RESTORE_JOB_TYPE)
    assert_split(database, as_ro, schema)


def test_a_suspension_fails_while_the_second_role_still_reads(
    settings: Settings, database: Database
) -> None:
    # A readonly role of this test's own that reads through a role it inherits from: no revoke
    # from it touches that grant, and the suspension must not report success.
    tag = uuid.uuid4().hex[:8]
    reader, via = f"ro_{tag}", f"via_{tag}"
    admin = psycopg.connect(database.admin_url, autocommit=True)
    try:
        admin.execute(sql.SQL("CREATE ROLE {} NOLOGIN INHERIT").format(sql.Identifier(reader)))
        admin.execute(sql.SQL("CREATE ROLE {} NOLOGIN").format(sql.Identifier(via)))
        admin.execute(sql.SQL("GRANT {} TO {}").format(sql.Identifier(via), sql.Identifier(reader)))
        mine = replace(settings, app_roles=(RW, AppRole(reader, Privileges.READONLY)))
        service.provision(mine, "leak")
        admin.execute(
            sql.SQL("GRANT USAGE ON SCHEMA tenant_leak TO {}").format(sql.Identifier(via))
        )
        admin.execute(
            sql.SQL("GRANT SELECT ON tenant_leak.members TO {}").format(sql.Identifier(via))
        )

        result = service.change_lifecycle(mine, "leak", lifecycle.SUSPEND_JOB_TYPE)
        assert result.job is not None and result.job.status.value == "failed", result
        assert f"{reader} can still use tenant_leak" in str(result.job.error_detail)
        assert "members: SELECT" in str(result.job.error_detail)
        with database.owner() as conn:
            state = conn.execute(
                "SELECT state FROM control.tenants WHERE tenant_id = 'leak'"
            ).fetchone()
            assert state == ("onboarding",)
            assert not tenant_schema.app_roles_cut_off(conn, "tenant_leak", mine.app_roles)
    finally:
        admin.execute("DROP SCHEMA IF EXISTS tenant_leak CASCADE")
        for role in (reader, via):
            admin.execute(sql.SQL("DROP OWNED BY {}").format(sql.Identifier(role)))
            admin.execute(sql.SQL("DROP ROLE {}").format(sql.Identifier(role)))
        admin.close()


# -- drift and repair -----------------------------------------------------------------------------


def test_each_roles_privileges_are_checked_for_drift_and_repaired(
    two: Settings, database: Database, as_ro: psycopg.Connection
) -> None:
    schema = "tenant_drifty"
    service.provision(two, "drifty")
    assert service.check(two, ["drifty"]).drifted == []
    with database.owner() as conn:
        conn.execute(f"GRANT INSERT ON {schema}.role_profiles TO app_ro")  # type: ignore[arg-type]
        conn.execute(f"REVOKE SELECT ON {schema}.members FROM app_ro")  # type: ignore[arg-type]
        conn.execute(f"REVOKE DELETE ON {schema}.members FROM app_rw")  # type: ignore[arg-type]
        assert tenant_schema.missing_app_grants(conn, schema, two.app_roles) == [
            "app_rw: members: DELETE",
            "app_ro: role_profiles: INSERT must NOT be held",
            "app_ro: members: SELECT",
        ]
    assert writes(as_ro, schema)

    (tenant,) = service.check(two, ["drifty"]).drifted
    found = {(d.change, d.kind, d.name) for d in tenant.differences}
    assert found == {
        ("extra", "privilege", "INSERT ON TABLE role_profiles TO app_ro"),
        ("missing", "privilege", "SELECT ON TABLE members TO app_ro"),
        ("missing", "privilege", "DELETE ON TABLE members TO app_rw"),
    }
    # a single-role project sees app_ro's privileges as extra: the expected shape is per role
    (single,) = service.check(replace(two, app_roles=(RW,)), ["drifty"]).drifted
    assert ("extra", "privilege", "SELECT ON TABLE role_profiles TO app_ro") in {
        (d.change, d.kind, d.name) for d in single.differences
    }

    report = service.repair(two, ["drifty"])
    (result,) = report.results
    assert result.after is not None and result.after.differences == (), result
    assert_split(database, as_ro, schema)
    with database.owner() as conn:
        assert tenant_schema.missing_app_grants(conn, schema, two.app_roles) == []


def test_a_suspended_tenant_is_expected_without_any_roles_privileges(
    two: Settings, database: Database
) -> None:
    service.provision(two, "paused")
    service.change_lifecycle(two, "paused", lifecycle.SUSPEND_JOB_TYPE)
    assert service.check(two, ["paused"]).drifted == []
    with database.owner() as conn:
        conn.execute("GRANT SELECT ON tenant_paused.members TO app_ro")
    (tenant,) = service.check(two, ["paused"]).drifted
    assert {(d.change, d.kind, d.name) for d in tenant.differences} == {
        ("extra", "privilege", "SELECT ON TABLE members TO app_ro")
    }


# -- the warm pool --------------------------------------------------------------------------------


def test_a_spare_carries_both_roles_grants_and_the_take_gives_both_their_usage(
    two: Settings, database: Database, as_ro: psycopg.Connection
) -> None:
    spare = build_spare(two)
    with database.owner() as conn:
        for role in two.app_roles:
            held = pool.grants_held(conn, spare, role)
            assert held is not None and held.all_but_usage and not held.usage, (role, held)
    assert not reads(as_ro, spare)

    service.provision(two, "pooled")
    assert step_detail(database, "pooled", "create_schema") == f"taken from the warm pool: {spare}"
    assert_split(database, as_ro, "tenant_pooled")
    with database.owner() as conn:
        assert tenant_schema.missing_app_grants(conn, "tenant_pooled", two.app_roles) == []
    assert service.check(two, ["pooled"]).drifted == []


def test_the_single_role_default_grants_exactly_as_before(
    settings: Settings, database: Database
) -> None:
    service.provision(settings, "solo")
    with database.owner() as conn:
        acl = conn.execute(
            "SELECT relacl::text FROM pg_class WHERE oid = 'tenant_solo.members'::regclass"
        ).fetchone()
    assert acl is not None and "app_rw=arwd/" in acl[0], acl


# -- the pytest plugin -----------------------------------------------------------------------------

PLUGIN_TEST = """
import psycopg


def test_every_configured_role_holds_its_set(tenant):
    table = tenant.schema + ".role_profiles"
    with psycopg.connect(tenant.owner_url) as conn:
        held = conn.execute(
            "SELECT has_table_privilege('app_rw', %(t)s, 'INSERT'),"
            " has_table_privilege('app_ro', %(t)s, 'SELECT'),"
            " has_table_privilege('app_ro', %(t)s, 'INSERT')",
            {"t": table},
        ).fetchone()
    assert held == (True, True, False)
"""


def test_the_plugin_grants_every_configured_role(pg_server: Server, tmp_path: Path) -> None:
    """A project whose file declares two roles: the plugin's tenants grant both, each its set
    (the plugin creates a missing role in its cluster)."""
    project = tmp_path / "project"
    project.mkdir()
    (project / "provisioner.toml").write_text(
        'object_store_provider = "none"\n\n[app_roles]\napp_rw = "readwrite"\napp_ro = "readonly"\n'
    )
    (project / "test_roles.py").write_text(PLUGIN_TEST)
    result = run_pytest(project, pg_server)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "1 passed" in result.stdout, result.stdout


def test_the_embedded_default_creates_and_grants_the_configured_roles(
    state_dir: Path,  # noqa: F811 -- the fixture of test_embedded
) -> None:
    """No database URL: the embedded cluster gets the project's second role, and a one-off
    provisioning grants it its set."""
    env = embedded_env(state_dir)
    env["PROVISIONER_APP_ROLES"] = "app_rw=readwrite,app_ro=readonly"
    result = run_cli(None, "provision", "local", env=env)
    assert result.returncode == 0, result.stdout + result.stderr
    urls = embedded.embedded_urls(state_dir)
    with psycopg.connect(urls.owner) as conn:
        held = conn.execute(
            "SELECT has_table_privilege('app_ro', 'tenant_local.members', 'SELECT'),"
            " has_table_privilege('app_ro', 'tenant_local.members', 'INSERT'),"
            " has_table_privilege('app_rw', 'tenant_local.members', 'INSERT')"
        ).fetchone()
    assert held == (True, False, True)
