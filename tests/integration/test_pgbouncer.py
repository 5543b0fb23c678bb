"""Through a real PgBouncer 1.18 in transaction mode (``tests/pgbouncer.py``): the application's
``enqueue`` works (sync and async, psycopg and SQLAlchemy), the one-off commands that need no
session of their own work (``upgrade`` with its lock timeout), and the worker refuses to start
in one line.

Each enqueue test makes the pooling bite: between two of the application's transactions,
another client opens a transaction and holds it, taking the server connection the application
just released, so the application's next transaction runs on another one. A statement
prepared on the server in one transaction (psycopg prepares a query from its fifth run on a
connection) is then missing in the next: "prepared statement ... does not exist".
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import subprocess
import sys
import uuid

import psycopg
import pytest
import sqlalchemy as sa
from psycopg import sql
from sqlalchemy.orm import Session

import provisioner
from provisioner import db, servers
from provisioner.templates.migrations import TENANT_TREE_ENV
from provisioner.testing import Tenant
from tests.conftest import ROOT, Database
from tests.integration.test_fleet_upgrade import make_tree
from tests.pgbouncer import Bouncer, start_bouncer

#: More than psycopg's prepare_threshold (5): a prepared statement would be used.
ROUNDS = 8


def _backend_pid(conn: psycopg.Connection) -> int:
    """The server session running ``conn``'s transaction (never prepared: the test's own
    statements must not be what breaks)."""
    return conn.execute("SELECT pg_backend_pid()", prepare=False).fetchone()[0]


def _queued(database: Database) -> list[str]:
    with database.owner() as conn:
        rows = conn.execute(
            "SELECT tenant_id FROM control.platform_jobs WHERE status = 'queued' ORDER BY 1"
        ).fetchall()
    return [row[0] for row in rows]


def test_the_probe_tells_transaction_pooling_from_a_session(
    pgbouncer: Bouncer, database: Database, provisioner_server
) -> None:
    assert db.transaction_pooled(pgbouncer.url("app_rw", database.name))
    assert not db.transaction_pooled(database.app_url)
    port = int(psycopg.conninfo.conninfo_to_dict(provisioner_server.admin_url)["port"])
    session_mode = start_bouncer(port, pool_mode="session", secret=pgbouncer.secret)
    try:
        assert not db.transaction_pooled(session_mode.url("app_rw", database.name))
    finally:
        session_mode.stop()


def test_enqueue_on_a_psycopg_connection_through_pgbouncer(
    pgbouncer: Bouncer, database: Database
) -> None:
    url = pgbouncer.url("app_rw", database.name)
    pids = set()
    with psycopg.connect(url) as app, psycopg.connect(url) as other:
        for i in range(ROUNDS):
            with app.transaction():
                provisioner.enqueue(app, f"sync_{i}")
                pids.add(_backend_pid(app))
            _backend_pid(other)  # holds the server connection app just released
            with app.transaction():
                provisioner.enqueue(app, f"sync_{i}")  # idempotent: the same job
                pids.add(_backend_pid(app))
            other.rollback()
    assert len(pids) > 1, "the application's transactions ran on more than one server session"
    assert _queued(database) == sorted(f"sync_{i}" for i in range(ROUNDS))


def test_enqueue_through_sqlalchemy_through_pgbouncer(
    pgbouncer: Bouncer, database: Database
) -> None:
    url = pgbouncer.url("app_rw", database.name).replace("postgresql://", "postgresql+psycopg://")
    engine = sa.create_engine(url, pool_size=1, max_overflow=0)
    try:
        with psycopg.connect(pgbouncer.url("app_rw", database.name)) as other:
            for i in range(ROUNDS):
                with Session(engine) as session, session.begin():
                    provisioner.enqueue(session, f"orm_{i}")
                _backend_pid(other)
                with engine.begin() as conn:
                    provisioner.enqueue(conn, f"core_{i}")
                other.rollback()
    finally:
        engine.dispose()
    expected = sorted([f"orm_{i}" for i in range(ROUNDS)] + [f"core_{i}" for i in range(ROUNDS)])
    assert _queued(database) == expected


def test_enqueue_async_through_pgbouncer_wakes_a_directly_connected_listener(
    pgbouncer: Bouncer, database: Database
) -> None:
    url = pgbouncer.url("app_rw", database.name)

    async def sign_ups() -> None:
        async with (
            await psycopg.AsyncConnection.connect(url) as app,
            await psycopg.AsyncConnection.connect(url) as other,
        ):
            for i in range(ROUNDS):
                async with app.transaction():
                    await provisioner.enqueue_async(app, f"async_{i}")
                await other.execute("SELECT 1", prepare=False)
                async with app.transaction():
                    await provisioner.enqueue_async(app, f"async_{i}")
                await other.rollback()

    with psycopg.connect(database.owner_url, autocommit=True) as listener:
        listener.execute("LISTEN provisioner_jobs")
        asyncio.run(sign_ups())
        woken = [n.payload for n in listener.notifies(timeout=5, stop_after=1)]
    assert woken and set(woken) == {"provision_tenant"}
    assert _queued(database) == sorted(f"async_{i}" for i in range(ROUNDS))


def _cli(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "provisioner", *args],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
        check=False,
    )


@pytest.fixture
def bouncer_env(pgbouncer: Bouncer, database: Database, tmp_path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PROVISIONER_", "OBJECT_"))}
    env.update(
        MIGRATIONS_DATABASE_URL=pgbouncer.url("provisioner_owner", database.name),
        APP_DATABASE_URL=pgbouncer.url("app_rw", database.name),
        OBJECT_STORE_PROVIDER="filesystem",
        OBJECT_STORE_PATH=str(tmp_path),
        PROVISIONER_STATE_DIR=str(tmp_path / "state"),
        PYTHONPATH=str(ROOT),
    )
    return env


def test_the_worker_refuses_transaction_pooling_in_one_line(
    bouncer_env: dict[str, str], database: Database
) -> None:
    assert _cli(bouncer_env, "enqueue", "acme").returncode == 0
    result = _cli(bouncer_env, "worker", "--once")
    assert result.returncode == 2, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert "transaction" in lines[0] and "connect the worker directly" in lines[0]
    assert _queued(database) == ["acme"], "the refused worker claimed nothing"


def test_one_off_commands_through_pgbouncer(
    bouncer_env: dict[str, str], database: Database
) -> None:
    for args in (("migrate",), ("enqueue", "acme"), ("status", "acme"), ("jobs", "list")):
        result = _cli(bouncer_env, *args)
        assert result.returncode == 0, (args, result.stderr)
    assert "acme" in _cli(bouncer_env, "jobs", "list").stdout
    checked = _cli(bouncer_env, "check", "--all")
    assert checked.returncode == 0, checked.stderr
    health = _cli(bouncer_env, "health")
    assert health.returncode == 1 and "no heartbeat" in health.stdout, health.stderr
    # The test server has no standby at all: health says what a failover would lose.
    assert "database: no synchronous standby" in health.stdout

    # provision runs the step engine, whose sessions need a server session of their own.
    refused = _cli(bouncer_env, "provision", "beta")
    assert refused.returncode == 2, refused.stdout + refused.stderr
    assert "connect it directly to PostgreSQL" in refused.stderr
    assert "Traceback" not in refused.stderr


def _server_settings(
    bouncer: Bouncer, database: Database, name: str, role: str = "provisioner_owner"
) -> set[str]:
    """``name`` as each server connection of the role's pool has it (default_pool_size = 4):
    four clients each hold a transaction open at once, so each runs on a server connection of
    its own."""
    url = bouncer.url(role, database.name)
    clients = [psycopg.connect(url) for _ in range(4)]
    try:
        return {c.execute(f"SHOW {name}", prepare=False).fetchone()[0] for c in clients}
    finally:
        for client in clients:
            client.close()


def test_upgrade_through_pgbouncer_sets_its_lock_timeout_per_transaction(
    pgbouncer: Bouncer, bouncer_env: dict[str, str], database: Database, tmp_path
) -> None:
    """``upgrade`` sends no ``options`` startup parameter (PgBouncer refuses it): its lock
    timeout is set in each of its transactions, so a tenant held by a migration fails the
    command in one line instead of hanging it, and no pooled server connection keeps it."""
    direct = {
        **bouncer_env,
        "MIGRATIONS_DATABASE_URL": database.owner_url,
        "APP_DATABASE_URL": database.app_url,
    }
    provisioned = _cli(direct, "provision", "acme")
    assert provisioned.returncode == 0, provisioned.stderr
    ahead = {**bouncer_env, TENANT_TREE_ENV: str(make_tree(tmp_path))}

    with psycopg.connect(database.owner_url) as migration:
        migration.execute("LOCK TABLE tenant_acme.alembic_version IN ACCESS EXCLUSIVE MODE")
        stuck = _cli(ahead, "upgrade", "acme")
    assert stuck.returncode == 1, stuck.stdout + stuck.stderr
    assert stuck.stderr.strip().count("\n") == 0 and "lock timeout" in stuck.stderr, stuck.stderr
    assert _server_settings(pgbouncer, database, "lock_timeout") == {"0"}

    upgraded = _cli(ahead, "upgrade", "acme", "--json")
    assert upgraded.returncode == 0, upgraded.stderr
    behind = json.loads(upgraded.stdout)["behind"]
    assert [(b["tenant_id"], b["action"]) for b in behind] == [("acme", "queued")]
    assert _server_settings(pgbouncer, database, "lock_timeout") == {"0"}


def test_a_tenant_connection_through_pgbouncer_keeps_its_search_path(
    pgbouncer: Bouncer, bouncer_env: dict[str, str], database: Database
) -> None:
    """The plugin's ``Tenant.connect()`` through PgBouncer in transaction mode (which refuses
    the ``options`` it sets ``search_path`` with): every transaction, on whichever server
    connection, sees the tenant's schema alone, implicit ones and ``transaction()`` blocks
    alike; its statements are never prepared on a server connection (the eighth INSERT would
    find its statement missing); and no pooled server connection keeps the setting."""
    direct = {
        **bouncer_env,
        "MIGRATIONS_DATABASE_URL": database.owner_url,
        "APP_DATABASE_URL": database.app_url,
    }
    provisioned = _cli(direct, "provision", "acme")
    assert provisioned.returncode == 0, provisioned.stderr
    url = pgbouncer.url("app_rw", database.name)
    tenant = Tenant("acme", "tenant_acme", app_url=url, owner_url=database.owner_url)
    pids = set()
    with tenant.connect() as conn, psycopg.connect(url) as other:
        for i in range(ROUNDS):
            with conn.transaction():
                conn.execute(
                    "INSERT INTO role_profiles (key, name) VALUES (%s, %s)",
                    (f"probe_{i}", "probe"),
                )
                pids.add(_backend_pid(conn))
            _backend_pid(other)  # holds the server connection conn just released
            shown = conn.execute("SHOW search_path", prepare=False).fetchone()
            assert shown == ("tenant_acme",)
            pids.add(_backend_pid(conn))
            conn.commit()
            other.rollback()
    assert len(pids) > 1, "the tenant's transactions ran on more than one server session"
    with tenant.connect(autocommit=True) as conn, conn.transaction():
        assert conn.execute("SHOW search_path").fetchone() == ("tenant_acme",)
    with psycopg.connect(database.owner_url) as owner:
        count = owner.execute(
            "SELECT count(*) FROM tenant_acme.role_profiles WHERE key LIKE 'probe%'"
        ).fetchone()
    assert count == (ROUNDS,)
    assert _server_settings(pgbouncer, database, "search_path", role="app_rw") == {
        '"$user", public'
    }


def test_a_tenant_sqlalchemy_engine_through_pgbouncer_keeps_its_search_path(
    pgbouncer: Bouncer, bouncer_env: dict[str, str], database: Database
) -> None:
    """The plugin's ``Tenant.sqlalchemy_engine()`` through PgBouncer in transaction mode: its
    connections are made as ``Tenant.connect()`` makes them, so each transaction, on whichever
    server connection, sees the tenant's schema alone, unqualified names included, and its
    statements are never prepared on a server connection."""
    direct = {
        **bouncer_env,
        "MIGRATIONS_DATABASE_URL": database.owner_url,
        "APP_DATABASE_URL": database.app_url,
    }
    provisioned = _cli(direct, "provision", "acme")
    assert provisioned.returncode == 0, provisioned.stderr
    url = pgbouncer.url("app_rw", database.name)
    tenant = Tenant("acme", "tenant_acme", app_url=url, owner_url=database.owner_url)
    engine = tenant.sqlalchemy_engine(pool_size=1, max_overflow=0)
    pids = set()
    try:
        with psycopg.connect(url) as other:
            for i in range(ROUNDS):
                with engine.begin() as conn:
                    conn.execute(
                        sa.text("INSERT INTO role_profiles (key, name) VALUES (:k, 'probe')"),
                        {"k": f"orm_probe_{i}"},
                    )
                    assert conn.execute(sa.text("SHOW search_path")).scalar() == "tenant_acme"
                    pids.add(conn.execute(sa.text("SELECT pg_backend_pid()")).scalar())
                _backend_pid(other)  # holds the server connection the engine just released
                with engine.begin() as conn:  # so this transaction runs on another one
                    assert conn.execute(sa.text("SHOW search_path")).scalar() == "tenant_acme"
                    pids.add(conn.execute(sa.text("SELECT pg_backend_pid()")).scalar())
                other.rollback()
    finally:
        engine.dispose()
    assert len(pids) > 1, "the engine's transactions ran on more than one server session"
    with psycopg.connect(database.owner_url) as owner:
        count = owner.execute(
            "SELECT count(*) FROM tenant_acme.role_profiles WHERE key LIKE 'orm_probe%'"
        ).fetchone()
    assert count == (ROUNDS,)
    assert _server_settings(pgbouncer, database, "search_path", role="app_rw") == {
        '"$user", public'
    }


def test_the_directorys_entries_reach_a_database_named_with_a_space_and_a_quote(
    pgbouncer: Bouncer, database: Database, provisioner_server
) -> None:
    """``servers pgbouncer``'s quoting as a real PgBouncer reads it: the entry of a server whose
    database name holds a space, a single quote and a backslash reaches that database."""
    odd = f"it's a b\\c {uuid.uuid4().hex[:6]}"
    admin = provisioner_server.admin_url
    port = int(psycopg.conninfo.conninfo_to_dict(admin).get("port") or 5432)
    with psycopg.connect(admin, autocommit=True) as conn:
        conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(odd)))
    try:
        reference = psycopg.conninfo.make_conninfo("", host="127.0.0.1", port=port, dbname=odd)
        with database.owner() as conn:
            servers.add(conn, "odd", reference)
            section = servers.databases_section(servers.directory(conn))
        bouncer = start_bouncer(port, secret=pgbouncer.secret, databases=section)
        try:
            with psycopg.connect(bouncer.url("provisioner_owner", "odd")) as conn:
                found = conn.execute("SELECT current_database()", prepare=False).fetchone()
            assert found == (odd,), section
        finally:
            bouncer.stop()
            shutil.rmtree(bouncer.folder, ignore_errors=True)
    finally:
        with psycopg.connect(admin, autocommit=True) as conn:
            conn.execute(
                sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(odd))
            )
