"""Test harness: real PostgreSQL, one fresh database per test, the suite running as the
bootstrap roles (``provisioner_owner`` and ``app_rw``), never as a superuser.

With ``DATABASE_URL`` (a superuser URL) the harness uses that server; otherwise it starts a
throwaway cluster from the machine's PostgreSQL binaries (or the ``pgserver`` wheel's), through the
package's own pytest plugin (``provisioner_server``, overridden here to read ``DATABASE_URL``;
the plugin's ``tenant`` fixtures use the same server). Either way
it runs ``infra/postgres/bootstrap.sql`` twice on a template database, migrates the control
schema there as the owner, and clones that template for every test (~35 ms). The superuser URL
is used only to create and drop those databases.

A test that needs a provisioned tenant and does not examine provisioning takes it from the
plugin: ``tenant``/``tenant_factory`` in the plugin's database (``tenant_database`` shows it as
a :class:`Database`), or ``tenant_factory(id, settings=settings)`` in the test's own database.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import psycopg
import pytest
import sqlalchemy as sa
from alembic import command as alembic_command
from psycopg import sql

from provisioner import db, pool
from provisioner.local import cluster as local_pg
from provisioner.settings import Settings
from provisioner.templates import migrations
from provisioner.tenant.fingerprint import fingerprint as catalog_fingerprint
from provisioner.testing import (
    BOOTSTRAP_LOCK_KEY,
    PgServer,
    ProvisionerDatabase,
    Tenant,
    role_url,
)
from provisioner.testing.pytest_plugin import shared_folder

pytest_plugins = [
    "tests.storage_fixtures",
    "tests.workers",
    "tests.console_server",
    "tests.pgbouncer",
    "tests.failover",
    "tests.extra_clusters",
    "tests.logical_servers",
]

# A user's project with its own tests, run by tests/integration/test_user_project.py in a pytest
# subprocess of its own (its tests are not this suite's).
collect_ignore = ["user_project", "second_template"]

ROOT = Path(__file__).resolve().parent.parent
BOOTSTRAP_SQL = ROOT / "infra" / "postgres" / "bootstrap.sql"


@dataclass(frozen=True)
class Server:
    admin_url: str  # superuser, for creating/dropping databases only
    template: str
    #: the superuser's password, from which the bootstrap roles' derive (None: none asked)
    secret: str | None = None

    def url(self, role: str, database: str) -> str:
        """A bootstrap role's URL, with its password when the server asks for one (the
        throwaway cluster does: see :mod:`provisioner.local.cluster`)."""
        return role_url(self.admin_url, role, database, self.secret)


def _run_bootstrap(admin_url: str, database: str) -> None:
    """The operator's bootstrap script (the infra copy), run as the plugin runs the packaged
    one: one process at a time per server, since two xdist workers updating the same
    cluster-wide roles at once fail with "tuple concurrently updated"."""
    target = psycopg.conninfo.make_conninfo(admin_url, dbname=database)
    with psycopg.connect(admin_url, autocommit=True) as lock:
        lock.execute("SELECT pg_advisory_lock(%s)", (BOOTSTRAP_LOCK_KEY,))
        with psycopg.connect(target, autocommit=True) as conn:
            conn.execute(BOOTSTRAP_SQL.read_text())
            if conn.info.password:  # the roles' passwords, as the plugin sets them
                local_pg.set_role_passwords(conn, conn.info.password)


@pytest.fixture(scope="session")
def provisioner_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[PgServer]:
    """The plugin's server, but named by ``DATABASE_URL`` here (the suite's own variable); one
    throwaway cluster for all the xdist workers otherwise, as the plugin does."""
    url = os.environ.get("DATABASE_URL") or None
    server = PgServer.start(url, shared_dir=shared_folder(tmp_path_factory))
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture(scope="session")
def pg_server(provisioner_server: PgServer) -> Iterator[Server]:
    """The plugin's server, with a migrated template database to clone for every test."""
    admin_url = provisioner_server.admin_url
    worker = os.environ.get("PYTEST_XDIST_WORKER", "main")
    template = f"provisioner_tmpl_{worker}_{uuid.uuid4().hex[:6]}"
    with psycopg.connect(admin_url, autocommit=True) as conn:
        conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(template)))
    # Twice: the bootstrap must be safe to run again.
    _run_bootstrap(admin_url, template)
    _run_bootstrap(admin_url, template)
    server = Server(admin_url=admin_url, template=template, secret=provisioner_server.secret)
    migrations.upgrade_control(server.url("provisioner_owner", template))
    try:
        yield server
    finally:
        with psycopg.connect(admin_url, autocommit=True) as conn:
            conn.execute(
                sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(template))
            )


@dataclass(frozen=True)
class Database:
    name: str
    owner_url: str
    app_url: str
    admin_url: str

    def owner(self) -> psycopg.Connection:
        return psycopg.connect(self.owner_url, autocommit=True)

    def app(self) -> psycopg.Connection:
        return psycopg.connect(self.app_url, autocommit=True)


def create_database(server: Server, name: str) -> Database:
    with psycopg.connect(server.admin_url, autocommit=True) as conn:
        conn.execute(
            sql.SQL("CREATE DATABASE {} TEMPLATE {} OWNER provisioner_owner").format(
                sql.Identifier(name), sql.Identifier(server.template)
            )
        )
    _run_bootstrap(server.admin_url, name)  # database-level privileges are not templated
    return Database(
        name=name,
        owner_url=server.url("provisioner_owner", name),
        app_url=server.url("app_rw", name),
        admin_url=psycopg.conninfo.make_conninfo(server.admin_url, dbname=name),
    )


def drop_database(server: Server, name: str) -> None:
    with psycopg.connect(server.admin_url, autocommit=True) as conn:
        conn.execute(
            sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name))
        )


@pytest.fixture
def database(pg_server: Server) -> Iterator[Database]:
    name = f"t_{uuid.uuid4().hex[:12]}"
    db = create_database(pg_server, name)
    try:
        yield db
    finally:
        drop_database(pg_server, name)


@pytest.fixture
def bare_database(pg_server: Server) -> Iterator[Database]:
    """A fresh database with the bootstrap roles and NO control schema (for migration tests
    that start from the base revision)."""
    name = f"b_{uuid.uuid4().hex[:12]}"
    with psycopg.connect(pg_server.admin_url, autocommit=True) as conn:
        conn.execute(
            sql.SQL("CREATE DATABASE {} OWNER provisioner_owner").format(sql.Identifier(name))
        )
    _run_bootstrap(pg_server.admin_url, name)
    try:
        yield Database(
            name=name,
            owner_url=pg_server.url("provisioner_owner", name),
            app_url=pg_server.url("app_rw", name),
            admin_url=psycopg.conninfo.make_conninfo(pg_server.admin_url, dbname=name),
        )
    finally:
        drop_database(pg_server, name)


@pytest.fixture
def objects_dir(tmp_path: Path) -> Path:
    path = tmp_path / "objects"
    path.mkdir()
    return path


@pytest.fixture
def settings(database: Database, objects_dir: Path, tmp_path: Path) -> Settings:
    return Settings(
        migrations_database_url=database.owner_url,
        app_database_url=database.app_url,
        object_store_provider="filesystem",
        object_store_path=objects_dir,
        state_dir=tmp_path / "state",
    )


def settings_env(settings: Settings) -> dict[str, str]:
    """The environment that gives a child process the same settings."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PROVISIONER_", "OBJECT_"))}
    env.update(
        MIGRATIONS_DATABASE_URL=settings.migrations_database_url or "",
        APP_DATABASE_URL=settings.app_database_url or "",
        OBJECT_STORE_PROVIDER=settings.object_store_provider,
        PROVISIONER_STATE_DIR=str(settings.state_dir),
        PROVISIONER_JOB_STALE_AFTER_SECONDS=str(settings.job_stale_after_seconds),
        PROVISIONER_HEARTBEAT_SECONDS=str(settings.heartbeat_seconds),
        PROVISIONER_POLL_SECONDS=str(settings.poll_interval_seconds),
        # The tests were written against one engine child unless they say --concurrency; the
        # machine's default (one per core) has its own test, which removes this variable.
        PROVISIONER_WORKER_CONCURRENCY=str(settings.worker_concurrency or 1),
        PYTHONPATH=str(ROOT),
    )
    if settings.object_store_path:
        env["OBJECT_STORE_PATH"] = str(settings.object_store_path)
    if settings.pool_size:  # else unset: a project file's pool_size applies
        env["PROVISIONER_POOL_SIZE"] = str(settings.pool_size)
    return env


def run_cli(
    settings: Settings | None,
    *args: str,
    env: dict[str, str] | None = None,
    timeout: float = 120,
    cwd: Path | None = None,
) -> subprocess.CompletedProcess[str]:
    """Run ``python -m provisioner ARGS`` as a real child process (in ``cwd``: a project's
    folder, whose configuration file it then finds)."""
    child_env = settings_env(settings) if settings is not None else dict(os.environ)
    child_env.update(env or {})
    return subprocess.run(
        [sys.executable, "-m", "provisioner", *args],
        capture_output=True,
        text=True,
        env=child_env,
        timeout=timeout,
        check=False,
        cwd=cwd,
    )


def fingerprint(database: Database, tenant: str) -> dict:
    """The catalog fingerprint of the tenant's schema, read as the owner."""
    with database.owner() as conn:
        return catalog_fingerprint(conn, f"tenant_{tenant}")


@pytest.fixture(scope="session")
def tenant_database(provisioner_database: ProvisionerDatabase) -> Database:
    """The plugin's database (where ``tenant`` and ``tenant_factory`` hand out tenants), seen
    through the suite's :class:`Database`, so the suite's helpers read it the same way.

    One database for the whole session (per xdist worker): a test that counts rows or schemas
    across the database, numbers rollouts, or runs a worker beside other rows keeps the per-test
    ``database`` instead."""
    return Database(
        name=provisioner_database.name,
        owner_url=provisioner_database.owner_url,
        app_url=provisioner_database.app_url,
        admin_url=provisioner_database.admin_url,
    )


@pytest.fixture
def clean_fingerprint(tenant: Tenant) -> dict:
    """The fingerprint of a freshly provisioned tenant (the plugin's, provisioned in one clean
    run and verified against it), to compare others with."""
    with psycopg.connect(tenant.owner_url, autocommit=True) as conn:
        return catalog_fingerprint(conn, tenant.schema)


def downgrade_tenant(database: Database, tenant: str, revision: str) -> None:
    """Leave the tenant as an earlier release built it (its schema at ``revision``)."""
    engine = db.engine(database.owner_url, poolclass=sa.pool.NullPool)
    try:
        with engine.begin() as conn:
            config = migrations.tenant_config(f"tenant_{tenant}", connection=conn)
            alembic_command.downgrade(config, revision)
    finally:
        engine.dispose()


def build_spare(settings: Settings) -> str:
    """One spare built and committed as a worker's pool keeper builds it; its schema name."""
    owner = db.Database(settings.owner_url)
    try:
        with owner.session() as session, pool.builder_lock(session) as locked:
            assert locked, "another builder holds the pool's lock"
            return pool.build_spare(session, "test", settings.app_roles)
    finally:
        owner.close()


@pytest.fixture
def silent_listener() -> Iterator[int]:
    """A port that completes TCP handshakes (the kernel's backlog) but never answers."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen(8)
        yield int(sock.getsockname()[1])
