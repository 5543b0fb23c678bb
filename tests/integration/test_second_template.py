"""A second, deliberately different tenant template (``tests/second_template``: a help desk with
enum types, a domain, citext, composite keys, a generated column, a partitioned table, a view,
trigger functions and row-level security, 33 tables) and its SQL and Python seeds, driven as its
team would drive it, through the CLI and workers run in its project folder: provision, check,
suspend and restore, purge, the warm pool, a fleet upgrade to a second revision, and the pytest
plugin in the project's own test run (issue 24, "Done means").

The tenants every test only reads are built once per module, in a database of the module's.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import psycopg
import pytest

from provisioner.settings import Settings
from provisioner.tenant import catalog
from provisioner.testing import SERVER_URL_ENV
from tests.conftest import Database, Server
from tests.second_template import (
    PROJECT,
    add_readonly_role,
    add_upgrade,
    cli,
    copy_project,
    own_database,
    project_env,
    provision,
    record_naming,
    tables,
)
from tests.workers import Workers, job_row, step_runs, wait_until


@pytest.fixture(scope="module")
def project(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return copy_project(tmp_path_factory.mktemp("second") / "project")


@pytest.fixture(scope="module")
def module_database(pg_server: Server) -> Iterator[Database]:
    with own_database(pg_server, "s") as database:
        yield database


@pytest.fixture(scope="module")
def readonly_url(pg_server: Server, module_database: Database) -> str:
    return pg_server.url("app_ro", module_database.name)


def settings_for(database: Database, state: Path) -> Settings:
    return Settings(
        migrations_database_url=database.owner_url,
        app_database_url=database.app_url,
        object_store_provider="none",
        state_dir=state,
    )


@pytest.fixture(scope="module")
def module_settings(
    module_database: Database, tmp_path_factory: pytest.TempPathFactory
) -> Settings:
    return settings_for(module_database, tmp_path_factory.mktemp("state"))


@pytest.fixture(scope="module")
def fleet(module_settings: Settings, project: Path) -> list[str]:
    """Two tenants provisioned from the second template (read, never changed, by the tests)."""
    record_naming(module_settings, project)
    for tenant in ("alpha", "beta"):
        provision(module_settings, project, tenant)
    return ["alpha", "beta"]


def app_session(database: Database, schema: str) -> psycopg.Connection:
    """The application role's session on a tenant, the way an application sets it up."""
    conn = psycopg.connect(database.app_url)
    conn.execute(f'SET search_path TO "{schema}", public')
    return conn


def objects(database: Database, schema: str) -> dict[str, int]:
    """How many of each kind of object the schema holds."""
    with database.owner() as conn:
        row = conn.execute(
            """
            SELECT (SELECT count(*) FROM pg_type t WHERE t.typnamespace = n.oid
                      AND t.typtype = 'e') AS enums,
                   (SELECT count(*) FROM pg_type t WHERE t.typnamespace = n.oid
                      AND t.typtype = 'd') AS domains,
                   (SELECT count(*) FROM pg_class c WHERE c.relnamespace = n.oid
                      AND c.relkind = 'v') AS views,
                   (SELECT count(*) FROM pg_class c WHERE c.relnamespace = n.oid
                      AND c.relkind = 'p') AS partitioned,
                   (SELECT count(*) FROM pg_class c WHERE c.relnamespace = n.oid
                      AND c.relkind = 'r' AND c.relispartition) AS partitions,
                   (SELECT count(*) FROM pg_proc p WHERE p.pronamespace = n.oid) AS functions,
                   (SELECT count(*) FROM pg_trigger g JOIN pg_class c ON c.oid = g.tgrelid
                     WHERE c.relnamespace = n.oid AND NOT g.tgisinternal) AS triggers,
                   (SELECT count(*) FROM pg_policy p JOIN pg_class c ON c.oid = p.polrelid
                     WHERE c.relnamespace = n.oid) AS policies,
                   (SELECT count(*) FROM pg_attribute a JOIN pg_class c ON c.oid = a.attrelid
                     WHERE c.relnamespace = n.oid AND a.attgenerated = 's') AS generated,
                   (SELECT count(*) FROM pg_constraint k WHERE k.connamespace = n.oid
                      AND k.contype = 'f' AND cardinality(k.conkey) > 1) AS composite_fks
              FROM pg_namespace n WHERE n.nspname = %s
            """,
            (schema,),
        ).fetchone()
        assert row is not None, f"no schema {schema}"
    names = ("enums", "domains", "views", "partitioned", "partitions", "functions", "triggers")
    names += ("policies", "generated", "composite_fks")
    return dict(zip(names, row, strict=True))


def test_provisioning_builds_every_kind_of_object_and_applies_both_kinds_of_seed(
    fleet: list[str], module_database: Database, module_settings: Settings, project: Path
) -> None:
    database = module_database
    assert len(tables(database, "helpdesk_alpha")) >= 34  # 33 of the template's, and its version
    assert objects(database, "helpdesk_alpha") == {
        "enums": 3,
        "domains": 1,
        "views": 1,
        "partitioned": 1,
        "partitions": 3,
        "functions": 3,
        "triggers": 3,
        "policies": 3,
        "generated": 1,
        "composite_fks": 2,  # tickets -> projects, tickets -> team_members
    }
    status = json.loads(cli(module_settings, project, "status", "alpha", "--json").stdout)
    assert status["status"] == "succeeded" and status["attempts"] == 1
    with database.owner() as conn:
        seeds = conn.execute(
            "SELECT seed FROM control.tenant_seeds WHERE tenant_id = 'alpha' ORDER BY seed"
        ).fetchall()
        assert seeds == [
            ("001_reference_data.sql",),
            ("002_calendar.sql",),
            ("second_seeds:seed_workspace",),
        ]
        # SQL seeds with the tenant's id; the Python seed's ticket audited by its trigger.
        assert conn.execute(
            "SELECT value->>'tenant' FROM helpdesk_beta.settings WHERE key = 'workspace'"
        ).fetchone() == ("beta",)
        assert conn.execute("SELECT count(*) FROM helpdesk_beta.business_hours").fetchone() == (5,)
        assert conn.execute(
            "SELECT a.email::text, l.action FROM helpdesk_beta.tickets t "
            "JOIN helpdesk_beta.accounts a ON a.id = t.requester_id "
            "JOIN helpdesk_beta.audit_log l ON l.row_id = t.id AND l.table_name = 'tickets'"
        ).fetchall() == [("owner@beta.example", "INSERT")]
        # The drift inventory names objects in full (names were cut at 63 bytes, and two grants
        # on one function became one) and reads the pinned path as the tenant's own schema.
        inventory = catalog.read(conn, "helpdesk_alpha")
    assert inventory is not None
    for grantee in ("PUBLIC", "provisioner_owner"):
        assert (
            "privilege",
            f"EXECUTE ON FUNCTION ticket_age(t <tenant>.tickets) TO {grantee}",
        ) in (inventory)
    audit = inventory[("function", "audit_ticket_change()")]["definition"]
    assert "SET search_path TO '<tenant>'" in audit


def test_the_readonly_role_reads_everything_and_writes_nothing(
    fleet: list[str], readonly_url: str
) -> None:
    with psycopg.connect(readonly_url) as conn:
        conn.execute('SET search_path TO "helpdesk_beta", public')
        assert conn.execute("SELECT count(*) FROM open_tickets").fetchone() == (1,)
        assert conn.execute("SELECT count(*) FROM events").fetchone() == (0,)
        assert conn.execute("SELECT count(*) FROM holidays").fetchone() == (2,)
        for statement in (
            "INSERT INTO labels (name) VALUES ('nope')",
            "UPDATE tickets SET status = 'closed'",
            "DELETE FROM settings",
            "INSERT INTO events (occurred_at, kind) VALUES ('2026-02-02', 'x')",
            "SELECT nextval(pg_get_serial_sequence('tickets', 'id'))",
            "CREATE TABLE sneaky (id int)",
        ):
            with pytest.raises(psycopg.errors.InsufficientPrivilege), conn.transaction():
                conn.execute(statement)  # type: ignore[arg-type]


def test_the_app_role_works_through_views_partitions_triggers_and_policies(
    fleet: list[str], module_database: Database
) -> None:
    with app_session(module_database, "helpdesk_alpha") as conn:
        # citext: the owner's address, whatever its case; the view reads through the join.
        (owner,) = conn.execute(
            "SELECT id FROM accounts WHERE email = 'OWNER@Alpha.Example'"
        ).fetchone()
        assert conn.execute("SELECT subject, requester::text FROM open_tickets").fetchall() == [
            ("Welcome to your help desk", "owner@alpha.example")
        ]
        with pytest.raises(psycopg.errors.UniqueViolation), conn.transaction():
            conn.execute(
                "INSERT INTO accounts (email, display_name) VALUES ('Owner@ALPHA.example', 'x')"
            )
        # The generated column; the partitioned table routes rows to their partition.
        conn.execute("INSERT INTO customers (name) VALUES ('Initech')")
        conn.execute("INSERT INTO products (sku, name, price) VALUES ('TPS-1', 'Cover', 250)")
        conn.execute(
            "INSERT INTO orders (customer_id) SELECT id FROM customers WHERE name = 'Initech'"
        )
        conn.execute(
            "INSERT INTO order_lines (order_id, line_no, product_id, quantity, unit_cents) "
            "SELECT o.id, 1, p.id, 3, p.price FROM orders o, products p"
        )
        assert conn.execute("SELECT total_cents FROM order_lines").fetchone() == (750,)
        conn.execute(
            "INSERT INTO events (occurred_at, kind) VALUES ('2026-03-01', 'a'), "
            "('2026-09-01', 'b'), ('2030-01-01', 'c')"
        )
        assert conn.execute(
            "SELECT tableoid::regclass::text, kind FROM events ORDER BY kind"
        ).fetchall() == [("events_2026h1", "a"), ("events_2026h2", "b"), ("events_default", "c")]
        # Triggers: the pinned audit function writes its row whatever the session's path.
        conn.execute("SET search_path TO public")
        conn.execute("UPDATE helpdesk_alpha.tickets SET status = 'open'")
        actions = conn.execute("SELECT action FROM helpdesk_alpha.audit_log ORDER BY id")
        assert actions.fetchall() == [("INSERT",), ("UPDATE",)]
        conn.execute('SET search_path TO "helpdesk_alpha", public')
        # Row-level security: an internal comment is seen only by a session of an agent.
        conn.execute(
            "INSERT INTO ticket_comments (ticket_id, author_id, body, internal) "
            "SELECT id, %s, 'note to self', true FROM tickets",
            (owner,),
        )
        assert conn.execute("SELECT count(*) FROM ticket_comments").fetchone() == (0,)
        conn.execute("SELECT set_config('app.agent', 'on', true)")
        assert conn.execute("SELECT count(*) FROM ticket_comments").fetchone() == (1,)
        # ...and it cannot change the schema.
        with pytest.raises(psycopg.errors.InsufficientPrivilege):
            conn.execute("CREATE TABLE sneaky (id int)")
        conn.rollback()


def test_check_finds_a_dropped_policy_and_repair_restores_it(
    fleet: list[str], module_database: Database, module_settings: Settings, project: Path
) -> None:
    provision(module_settings, project, "delta")
    with module_database.owner() as conn:
        conn.execute("DROP POLICY comments_visible ON helpdesk_delta.ticket_comments")
    drifted = cli(module_settings, project, "check", "--all")
    assert drifted.returncode == 1, drifted.stdout + drifted.stderr
    assert "delta: drifted" in drifted.stdout and "comments_visible" in drifted.stdout
    assert "alpha: drifted" not in drifted.stdout and "beta: drifted" not in drifted.stdout
    repaired = cli(module_settings, project, "repair", "delta")
    assert repaired.returncode == 0, repaired.stdout + repaired.stderr
    clean = cli(module_settings, project, "check", "--all")
    assert clean.returncode == 0, clean.stdout + clean.stderr


def test_suspend_restore_and_purge(
    fleet: list[str], module_database: Database, module_settings: Settings, project: Path
) -> None:
    database, settings = module_database, module_settings
    provision(settings, project, "gamma")

    suspended = cli(settings, project, "suspend", "gamma")
    assert suspended.returncode == 0, suspended.stdout + suspended.stderr
    with app_session(database, "public") as conn:
        for relation in ("tickets", "open_tickets", "events"):
            with pytest.raises(psycopg.errors.InsufficientPrivilege), conn.transaction():
                conn.execute(f"SELECT 1 FROM helpdesk_gamma.{relation}")  # type: ignore[arg-type]
    checked = cli(settings, project, "check", "gamma")  # as a suspension leaves it
    assert checked.returncode == 0, checked.stdout + checked.stderr

    restored = cli(settings, project, "restore", "gamma")
    assert restored.returncode == 0, restored.stdout + restored.stderr
    with app_session(database, "helpdesk_gamma") as conn:
        assert conn.execute("SELECT count(*) FROM open_tickets").fetchone() == (1,)
        conn.execute("INSERT INTO events (occurred_at, kind) VALUES ('2026-05-05', 'restored')")
        conn.commit()

    purged = cli(settings, project, "deprovision", "gamma", "--purge", "--yes")
    assert purged.returncode == 0, purged.stdout + purged.stderr
    assert tables(database, "helpdesk_gamma") == []
    with database.owner() as conn:
        assert conn.execute(
            "SELECT state FROM control.tenants WHERE tenant_id = 'gamma'"
        ).fetchone() == ("deleted",)
        # What the tenants share is not the tenant's: the extension stays, the others work.
        assert conn.execute(
            "SELECT extnamespace::regnamespace::text FROM pg_extension WHERE extname = 'citext'"
        ).fetchone() == ("public",)
        assert conn.execute(
            "SELECT count(*) FROM helpdesk_alpha.accounts WHERE email = 'OWNER@alpha.example'"
        ).fetchone() == (1,)


@pytest.fixture
def fast(settings: Settings) -> Settings:
    return replace(settings, heartbeat_seconds=0.5, job_stale_after_seconds=10.0)


@pytest.fixture
def own_project(tmp_path: Path) -> Path:
    return copy_project(tmp_path / "project")


@pytest.fixture
def second_database(pg_server: Server, database: Database) -> Database:
    """The test's own database, with the project's readonly role."""
    add_readonly_role(pg_server, database)
    return database


def succeeded_detail(database: Database, tenant: str, step: str) -> str:
    (detail,) = [
        r["detail"]
        for r in step_runs(database, tenant)
        if r["step"] == step and r["outcome"] == "succeeded"
    ][-1:]
    return str(detail)


def test_a_fleet_upgrade_to_a_second_revision(
    fast: Settings, second_database: Database, own_project: Path, workers: Workers
) -> None:
    database = second_database
    record_naming(fast, own_project)
    for tenant in ("u1", "u2"):
        provision(fast, own_project, tenant)
    add_upgrade(own_project)

    queued = cli(fast, own_project, "upgrade", "--all")
    assert queued.returncode == 0, queued.stdout + queued.stderr
    worker = workers.start("--once", env=project_env(own_project), cwd=own_project)
    assert worker.wait(180) == 0, worker.output()[-3000:]

    with database.owner() as conn:
        for tenant in ("u1", "u2"):
            assert conn.execute(
                f"SELECT version_num FROM helpdesk_{tenant}.alembic_version"
            ).fetchall() == [("s002",)]
    for tenant in ("u1", "u2"):
        assert job_row(database, tenant)["status"] == "succeeded"
        detail = succeeded_detail(database, tenant, "run_tenant_migrations")
        print(f"{tenant}: {detail}")  # which path ran, in -s output
        assert "head=s002" in detail
    checked = cli(fast, own_project, "check", "--all")
    assert checked.returncode == 0, checked.stdout + checked.stderr
    with app_session(database, "helpdesk_u1") as conn:
        conn.execute("UPDATE tickets SET due_on = '2026-12-24'")
        conn.execute(
            "INSERT INTO ticket_watchers SELECT t.id, m.team_id, m.account_id "
            "FROM tickets t, team_members m"
        )
        assert conn.execute("SELECT due_on::text FROM open_tickets").fetchone() == ("2026-12-24",)
        conn.commit()


def test_the_warm_pool_hands_out_a_spare_of_the_second_template(
    fast: Settings, second_database: Database, own_project: Path, workers: Workers
) -> None:
    database = second_database
    record_naming(fast, own_project)
    env = {**project_env(own_project), "PROVISIONER_POOL_SIZE": "1"}
    worker = workers.start(env=env, cwd=own_project)

    def ready() -> bool:
        with database.owner() as conn:
            row = conn.execute(  # a spare's row is written with its last batch: ready
                "SELECT count(*) FROM control.tenant_pool p JOIN pg_namespace n "
                "ON n.nspname = p.schema_name"
            ).fetchone()
        return bool(row and row[0])

    wait_until(ready, 120, "a ready spare")
    enqueued = cli(fast, own_project, "enqueue", "pooled")
    assert enqueued.returncode == 0, enqueued.stdout + enqueued.stderr
    worker.wait_for("succeeded", 120, tenant_id="pooled")
    assert "warm pool" in succeeded_detail(database, "pooled", "create_schema")
    with database.owner() as conn:
        assert conn.execute(
            "SELECT count(*) FROM helpdesk_pooled.audit_log WHERE action = 'INSERT'"
        ).fetchone() == (1,)
    checked = cli(fast, own_project, "check", "pooled")
    assert checked.returncode == 0, checked.stdout + checked.stderr
    with app_session(database, "public") as conn:
        conn.execute("UPDATE helpdesk_pooled.tickets SET status = 'solved'")
        conn.commit()
    assert worker.stop() == 0


def test_the_projects_own_tests_use_the_plugin_with_its_template(
    pg_server: Server, own_project: Path
) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTEST_", "PROVISIONER_"))}
    env.pop("DATABASE_URL", None)
    env.update(project_env(own_project), **{SERVER_URL_ENV: pg_server.admin_url})
    result = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "app_tests"],
        cwd=own_project,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert "2 passed" in result.stdout, result.stdout


def test_the_tree_is_wired_as_init_scaffolds_it() -> None:
    """The project's env.py, ini and script template are the ones ``provisioner init`` copies."""
    from provisioner.templates import migrations, scaffold

    for name in scaffold.TREE_FILES:
        shipped = (migrations.packaged_tenant_tree() / name).read_text()
        assert (PROJECT / "tenant" / name).read_text() == shipped, name


def test_the_offline_sql_keeps_each_percent_sign() -> None:
    """What the pool and the upgrade replay run is Alembic's offline SQL: a LIKE pattern in it
    was written 'https://%%' (psycopg's paramstyle), so every spare failed its verification
    and the pool was disabled."""
    from provisioner.templates import migrations

    statements = migrations.tenant_offline_sql("tenant_x", tree=PROJECT / "tenant")
    (check,) = [s for s in statements if "CREATE TABLE webhooks" in s]
    assert "LIKE 'https://%')" in check, check
