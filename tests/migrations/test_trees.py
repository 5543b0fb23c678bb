"""Both Alembic trees: upgrade, downgrade, upgrade again; offline SQL; by-hand use; packaging."""

from __future__ import annotations

import os
import subprocess
import sys
import zipfile
from pathlib import Path

import psycopg
import pytest
import sqlalchemy as sa
from alembic import command

from provisioner import db, service
from provisioner.settings import Settings
from provisioner.templates import migrations
from provisioner.tenant.fingerprint import fingerprint
from tests.conftest import ROOT, Database

ALEMBIC = str(Path(sys.executable).with_name("alembic"))


def objects_outside(conn: psycopg.Connection, schema: str) -> list[tuple[str, str]]:
    return conn.execute(
        "SELECT n.nspname, c.relname FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace "
        "WHERE n.nspname NOT IN ('pg_catalog', 'information_schema', 'control', %s) "
        "AND n.nspname NOT LIKE 'pg_toast%%'",
        (schema,),
    ).fetchall()


def test_control_migrate_is_a_noop_the_second_time(settings: Settings) -> None:
    before, after = service.migrate(settings)  # the template database is already at head
    assert before == after == migrations.head_label(migrations.control_heads())


def test_control_heads_read_without_alembic_are_alembics() -> None:
    """The command line's at-head check reads the control tree's revision files itself."""
    from alembic.script import ScriptDirectory

    script = ScriptDirectory.from_config(migrations.control_config())
    assert migrations.control_heads() == frozenset(script.get_heads())
    assert len(list(script.walk_revisions())) > 20  # the whole chain, not an empty folder


def test_control_tree_downgrades_and_upgrades(database: Database) -> None:
    engine = db.engine(database.owner_url, poolclass=sa.pool.NullPool)
    try:
        with engine.begin() as conn:
            command.downgrade(migrations.control_config(connection=conn), "base")
        with database.owner() as conn:
            tables = conn.execute(
                "SELECT tablename FROM pg_tables WHERE schemaname = 'control'"
            ).fetchall()
            assert tables == [("alembic_version",)]
    finally:
        engine.dispose()
    migrations.upgrade_control(database.owner_url)
    with database.owner() as conn:
        assert migrations.control_at_head(conn)
        privileges = conn.execute(
            "SELECT table_name, string_agg(privilege_type, ',' ORDER BY privilege_type) "
            "FROM information_schema.role_table_grants WHERE grantee = 'app_rw' "
            "AND table_schema = 'control' GROUP BY 1 ORDER BY 1"
        ).fetchall()
    assert privileges == [
        ("job_runs", "INSERT,SELECT"),
        ("job_step_runs", "SELECT"),
        ("lease_holders", "SELECT"),  # read by health; only the owner beats for a holder
        # UPDATE as column privileges (control 20261202_h27_approws): no LOCK TABLE for app_rw
        ("platform_jobs", "INSERT,SELECT"),
        ("rollout_tenants", "SELECT"),
        ("rollouts", "SELECT"),
        ("runtime_heartbeats", "INSERT,SELECT"),
        # the recorded naming its registrations are held to (control 20261202_h24names)
        ("tenant_naming", "SELECT"),
        # app_rw inserts only (tenant_id, schema_name, display_name): a column privilege
        ("tenants", "SELECT"),
    ]


def tenant_engine(database: Database) -> sa.Engine:
    return db.engine(database.owner_url, poolclass=sa.pool.NullPool)


def test_tenant_tree_up_down_up_stays_inside_its_schema(database: Database) -> None:
    schema = "tenant_roundtrip"
    with database.owner() as conn:
        conn.execute(f"CREATE SCHEMA {schema}")
    engine = tenant_engine(database)
    try:
        with engine.begin() as conn:
            migrations.upgrade_tenant(conn, schema)
        with database.owner() as conn:
            first = fingerprint(conn, schema)
            assert objects_outside(conn, schema) == []
            assert len([r for r in first["relations"] if r[1] == "r"]) >= 9
        revisions = ["t003", "t002", "t001", "base"]
        for target in revisions:  # every revision's downgrade works, one at a time
            with engine.begin() as conn:
                command.downgrade(migrations.tenant_config(schema, connection=conn), target)
        with database.owner() as conn:
            left = conn.execute(
                "SELECT tablename FROM pg_tables WHERE schemaname = %s", (schema,)
            ).fetchall()
            assert left == [("alembic_version",)]
        with engine.begin() as conn:
            migrations.upgrade_tenant(conn, schema)
        with database.owner() as conn:
            assert fingerprint(conn, schema) == first
            assert migrations.tenant_at_head(conn, schema)
    finally:
        engine.dispose()


def test_two_tenants_migrated_in_one_process_do_not_interfere(database: Database) -> None:
    engine = tenant_engine(database)
    try:
        with database.owner() as conn:
            conn.execute("CREATE SCHEMA tenant_a; CREATE SCHEMA tenant_b")
        with engine.begin() as conn:
            migrations.upgrade_tenant(conn, "tenant_a")
        with engine.begin() as conn:
            migrations.upgrade_tenant(conn, "tenant_b")
        with database.owner() as conn:
            a = fingerprint(conn, "tenant_a")
            b = fingerprint(conn, "tenant_b")
        assert a == b
    finally:
        engine.dispose()


def run_alembic(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [ALEMBIC, *args],
        capture_output=True,
        text=True,
        cwd=ROOT,
        env={**os.environ, **(env or {})},
        timeout=60,
        check=False,
    )


def test_operator_can_run_the_tenant_tree_by_hand(database: Database) -> None:
    with database.owner() as conn:
        conn.execute("CREATE SCHEMA tenant_acme")
    out = run_alembic(
        "-c",
        "tenant_template/alembic.ini",
        "-x",
        "tenant_schema=tenant_acme",
        "upgrade",
        "head",
        env={"MIGRATIONS_DATABASE_URL": database.owner_url},
    )
    assert out.returncode == 0, out.stderr
    with database.owner() as conn:
        assert migrations.tenant_at_head(conn, "tenant_acme")
        assert objects_outside(conn, "tenant_acme") == []


def test_tenant_tree_refuses_a_bad_schema_name() -> None:
    out = run_alembic(
        "-c", "tenant_template/alembic.ini", "-x", 'tenant_schema=x"; drop', "upgrade", "head"
    )
    assert out.returncode != 0
    assert "invalid tenant schema" in out.stderr


@pytest.mark.parametrize(
    ("ini", "extra"),
    [
        ("tenant_template/alembic.ini", ["-x", "tenant_schema=tenant_acme"]),
        ("control_migrations/alembic.ini", []),
    ],
)
def test_offline_mode_prints_the_sql(ini: str, extra: list[str]) -> None:
    out = run_alembic("-c", ini, *extra, "upgrade", "head", "--sql")
    assert out.returncode == 0, out.stderr
    assert "CREATE TABLE" in out.stdout
    assert "COMMIT" in out.stdout
    if "tenant" in ini:
        assert 'SET LOCAL search_path TO "tenant_acme"' in out.stdout
        assert "tenant_acme.alembic_version" in out.stdout


def test_the_built_wheel_ships_both_alembic_trees(tmp_path: Path) -> None:
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "--no-deps",
            "-q",
            "-w",
            str(tmp_path),
            str(ROOT),
        ],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert out.returncode == 0, out.stderr
    (wheel,) = tmp_path.glob("pg_tenant_provisioner-*.whl")  # the distribution's name
    names = set(zipfile.ZipFile(wheel).namelist())
    assert "provisioner/py.typed" in names  # mypy in a user's project sees the types
    (entry_points,) = [n for n in names if n.endswith(".dist-info/entry_points.txt")]
    declared = zipfile.ZipFile(wheel).read(entry_points).decode()
    assert "[pytest11]\nprovisioner = provisioner.testing.pytest_plugin" in declared

    # A user's project, type-checked against the installed wheel, sees the API's types.
    site = tmp_path / "site"
    subprocess.run(
        [sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--target", str(site), wheel],
        capture_output=True,
        check=True,
    )
    user = tmp_path / "user_code.py"
    user.write_text("import provisioner\nreveal_type(provisioner.enqueue)\n")
    mypy = subprocess.run(
        [str(Path(sys.executable).with_name("mypy")), "--strict", "--no-incremental", str(user)],
        cwd=tmp_path,
        env={**os.environ, "PYTHONPATH": str(site)},
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert mypy.returncode == 0, mypy.stdout
    assert "-> provisioner.models.Job" in mypy.stdout, mypy.stdout
    for tree in ("control_migrations", "tenant_template"):
        assert f"provisioner/{tree}/alembic.ini" in names
        assert f"provisioner/{tree}/env.py" in names
        assert f"provisioner/{tree}/script.py.mako" in names
        assert sum(n.startswith(f"provisioner/{tree}/versions/") for n in names) >= 4
    assert "provisioner/bootstrap.sql" in names
    assert "provisioner/control_migrations/versions/20260727_c003_durable_queue.py" in names
