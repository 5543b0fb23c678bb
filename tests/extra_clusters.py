"""The suite's extra PostgreSQL clusters, as tenant servers: ``east`` and ``west``, at most two
per test run, whatever the number of pytest-xdist workers.

Each is a throwaway cluster shared by every worker of the run exactly as the main cluster is
(:mod:`provisioner.testing.shared`, in a folder of its own next to the main cluster's record):
the first worker to need it starts it, the last one to leave stops and removes it. West is
started only by a run that has a test using it (the fleet's fan-out tests). The moves by
logical replication have a third, PostgreSQL 16 with ``wal_level = logical``, shared the same
way (:mod:`tests.logical_servers`).

Sharing is safe because no test changes anything cluster-wide there: every test gets databases
of its own (random names, dropped after it), and registers them in its own control database
(the per-test ``database``). Roles are cluster-wide, so their bootstrap takes the suite's
advisory lock (:data:`provisioner.testing.BOOTSTRAP_LOCK_KEY`), one process at a time. Nobody
stops a shared cluster: a test that needs a server down takes it down *as its control database
sees it* (:meth:`FleetServer.stop`: the directory's reference then names a port that refuses
connections, which is all a client of a stopped server sees).

Each cluster asks every role for its password (:mod:`provisioner.local.cluster`); the roles'
passwords derive from the cluster's own superuser's and are in its password file. Three views
of a test's database there, one per family of tests (their fixture names are the old modules'
and stay: ``tests.tenant_servers``, ``tests.move_server`` and ``tests.job_server`` re-export
them):

- ``tenant_servers`` (:class:`FleetServer`): a database on east and one on west, the control
  schema at head so that the tool can build tenants there (cloned from a migrated template:
  a clone costs milliseconds, a migration seconds); :func:`register` and :func:`place`.
- ``tenant_server`` (:class:`TenantServer`, the moves): a database on east whose reference
  holds no password and names no password file: the owner's comes from ``PGPASSFILE``
  (:attr:`TenantServer.env`), libpq's own source, as in production.
- ``jobs_server`` (:class:`TenantServerDb`, jobs on the tenant's server): a database on east,
  its reference naming the cluster's password file.
"""

from __future__ import annotations

import functools
import os
import socket
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, replace
from pathlib import Path

import psycopg
import pytest
from psycopg import sql
from psycopg.types.json import Jsonb

import provisioner
from provisioner import servers, service
from provisioner.local import cluster as local_pg
from provisioner.servers import journal
from provisioner.settings import Settings
from provisioner.templates import migrations
from provisioner.testing import PgServer, bootstrap
from provisioner.testing.pytest_plugin import shared_folder
from tests.conftest import Database

EAST, WEST = "east", "west"


def _start(name: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[local_pg.Cluster]:
    """The run's cluster ``name``: shared by the xdist workers (a folder of its own under the
    run's shared folder), or this process's own without xdist."""
    shared = shared_folder(tmp_path_factory)
    server = PgServer.start(shared_dir=None if shared is None else shared / f"extra-{name}")
    try:
        assert server.cluster is not None
        yield server.cluster
    finally:
        server.stop()


@pytest.fixture(scope="session")
def east_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[local_pg.Cluster]:
    yield from _start(EAST, tmp_path_factory)


@pytest.fixture(scope="session")
def west_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[local_pg.Cluster]:
    yield from _start(WEST, tmp_path_factory)


def _execute(cluster: local_pg.Cluster, statement: sql.Composed) -> None:
    with psycopg.connect(cluster.superuser_url(), autocommit=True) as conn:
        conn.execute(statement)


def create_database(cluster: local_pg.Cluster, prefix: str, template: str | None = None) -> str:
    """A new database with a random name (a clone of ``template``, if given), the roles
    bootstrapped in it (database-level grants are not cloned); its name."""
    name = f"{prefix}_{uuid.uuid4().hex[:12]}"
    create = sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name))
    if template is not None:
        create += sql.SQL(" TEMPLATE {}").format(sql.Identifier(template))
    _execute(cluster, create)
    try:
        bootstrap(cluster.superuser_url(), name)  # under the suite's advisory lock
    except BaseException:
        drop_database(cluster, name)
        raise
    return name


def apply_tool_schema(cluster: local_pg.Cluster, name: str) -> None:
    """The tool's schema on database ``name`` as the owner, as `provisioner migrate` applies it
    to a server in the directory (``move --to`` refuses a server without it)."""
    with psycopg.connect(cluster.url(local_pg.OWNER_ROLE, name), autocommit=True) as conn:
        journal.migrate(conn)


def drop_database(cluster: local_pg.Cluster, name: str) -> None:
    drop = sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)")
    _execute(cluster, drop.format(sql.Identifier(name)))


@functools.cache
def _refusing_socket() -> socket.socket:
    """A TCP socket bound on 127.0.0.1 and never listening, kept for the process's life: a
    connection to its port is refused at once, as a stopped server's is."""
    held = socket.socket()
    held.bind(("127.0.0.1", 0))
    return held


def refusing_port() -> int:
    return int(_refusing_socket().getsockname()[1])


# -- The fleet's fan-out: a database on east and on west, the control schema at head. ---------


@dataclass(frozen=True)
class FleetServer:
    """Tenant server ``name``: the test's database on its cluster, as the test's control
    database (``control``) may name it in its directory."""

    name: str
    cluster: local_pg.Cluster
    database: str
    control: Database

    @property
    def reference(self) -> str:
        return self._reference(self.cluster.port)

    def _reference(self, port: int | None) -> str:
        return f"host=127.0.0.1 port={port} dbname={self.database} passfile={self.cluster.passfile}"

    @property
    def owner_url(self) -> str:
        return self.cluster.url(local_pg.OWNER_ROLE, self.database)

    @property
    def app_url(self) -> str:
        return self.cluster.url(local_pg.APP_ROLE, self.database)

    def admin(self) -> psycopg.Connection:
        return psycopg.connect(self.cluster.superuser_url(self.database), autocommit=True)

    def stop(self) -> None:
        """The server down for the test's control database: its directory's reference now
        names a port that refuses connections (the shared cluster itself runs on)."""
        self._point_at(refusing_port())

    def start(self) -> None:
        """The server back up (its reference names the cluster again)."""
        self._point_at(self.cluster.port)

    def _point_at(self, port: int | None) -> None:
        with self.control.owner() as conn:
            changed = conn.execute(
                "UPDATE control.tenant_servers SET conninfo = %s WHERE name = %s",
                (self._reference(port), self.name),
            )
            assert changed.rowcount == 1, f"{self.name} is not in the directory"


@pytest.fixture(scope="session")
def clusters(
    east_cluster: local_pg.Cluster, west_cluster: local_pg.Cluster
) -> dict[str, local_pg.Cluster]:
    """The run's two extra clusters, by server name."""
    return {EAST: east_cluster, WEST: west_cluster}


@pytest.fixture(scope="session")
def fleet_templates(clusters: dict[str, local_pg.Cluster]) -> Iterator[dict[str, str]]:
    """This process's template database on each cluster: roles bootstrapped, the control
    schema at head (migrated once, cloned for every test)."""
    worker = os.environ.get("PYTEST_XDIST_WORKER", "main")
    made: dict[str, str] = {}
    try:
        for name, cluster in clusters.items():
            made[name] = create_database(cluster, f"fleet_tmpl_{worker}")
            migrations.upgrade_control(cluster.url(local_pg.OWNER_ROLE, made[name]))
        yield made
    finally:
        for name, template in made.items():
            drop_database(clusters[name], template)


@pytest.fixture
def tenant_servers(
    clusters: dict[str, local_pg.Cluster], fleet_templates: dict[str, str], database: Database
) -> Iterator[dict[str, FleetServer]]:
    """A fresh database on each cluster, a clone of its template (the control schema at head,
    so that the tool can build tenants there); :func:`register` adds them to the directory."""
    made: dict[str, FleetServer] = {}
    try:
        for name, cluster in clusters.items():
            copy = create_database(cluster, "s", template=fleet_templates[name])
            made[name] = FleetServer(name, cluster, copy, database)
        yield made
    finally:
        for server in made.values():
            drop_database(server.cluster, server.database)


def register(database: Database, *found: FleetServer) -> None:
    with database.owner() as conn:
        for server in found:
            servers.add(conn, server.name, server.reference)


def place(settings: Settings, database: Database, server: FleetServer, tenant: str) -> None:
    """``tenant`` built on ``server`` by the tool (``provision`` against the server's database),
    and registered on it in the control database with a succeeded provisioning job, as a move
    would leave it."""
    there = replace(
        settings, migrations_database_url=server.owner_url, app_database_url=server.app_url
    )
    result = service.provision(there, tenant)
    assert result.job.status.value == "succeeded", result.job.error_detail
    with psycopg.connect(database.app_url) as conn:
        provisioner.enqueue(conn, tenant, server=server.name)
    with database.owner() as conn:
        conn.execute(
            "UPDATE control.platform_jobs SET status = 'succeeded', progress = 100,"
            " steps_completed = %s WHERE tenant_id = %s",
            (Jsonb(list(result.job.steps_completed)), tenant),
        )
        conn.execute("UPDATE control.tenants SET state = 'active' WHERE tenant_id = %s", (tenant,))


# -- Moves: a database on east, the owner's password from PGPASSFILE. -------------------------


@dataclass(frozen=True)
class TenantServer:
    """One test's database on east, for the moves."""

    #: the directory's reference: no user, no password, no password file
    reference: str
    owner_url: str
    app_url: str
    #: PGPASSFILE for a process that reaches it as the owner through the reference
    env: dict[str, str]

    def owner(self) -> psycopg.Connection:
        return psycopg.connect(self.owner_url, autocommit=True)

    def app(self) -> psycopg.Connection:
        return psycopg.connect(self.app_url, autocommit=True)


@pytest.fixture(scope="session")
def second_cluster(east_cluster: local_pg.Cluster) -> PgServer:
    """East as a :class:`PgServer` (its ``secret`` is east's own superuser's: the roles'
    passwords there derive from it, :func:`provisioner.testing.role_url`)."""
    return PgServer(
        east_cluster.superuser_url(),
        east_cluster,
        secret=east_cluster.password(local_pg.SUPERUSER),
    )


@pytest.fixture
def tenant_server(east_cluster: local_pg.Cluster, tmp_path: Path) -> Iterator[TenantServer]:
    name = create_database(east_cluster, "s")
    apply_tool_schema(east_cluster, name)  # a server ready for moves, as `migrate` leaves it
    password = east_cluster.password(local_pg.OWNER_ROLE)
    passfile = tmp_path / "pgpass"
    passfile.write_text(f"127.0.0.1:{east_cluster.port}:*:{local_pg.OWNER_ROLE}:{password}\n")
    passfile.chmod(0o600)
    try:
        yield TenantServer(
            reference=f"host=127.0.0.1 port={east_cluster.port} dbname={name}",
            owner_url=east_cluster.url(local_pg.OWNER_ROLE, name),
            app_url=east_cluster.url(local_pg.APP_ROLE, name),
            env={"PGPASSFILE": str(passfile)},
        )
    finally:
        drop_database(east_cluster, name)


# -- Jobs on the tenant's server: a database on east, named with the password file. ----------


@dataclass(frozen=True)
class TenantServerDb:
    """One test's database on east, for jobs run on the tenant's server."""

    cluster: local_pg.Cluster
    name: str

    @property
    def reference(self) -> str:
        """The directory's reference: host, port, database and the password file."""
        return (
            f"host=127.0.0.1 port={self.cluster.port} dbname={self.name} "
            f"passfile={self.cluster.passfile}"
        )

    def owner(self) -> psycopg.Connection:
        return psycopg.connect(self.cluster.url(local_pg.OWNER_ROLE, self.name), autocommit=True)

    def app(self) -> psycopg.Connection:
        return psycopg.connect(self.cluster.url(local_pg.APP_ROLE, self.name), autocommit=True)

    def admin(self) -> psycopg.Connection:
        return psycopg.connect(self.cluster.superuser_url(self.name), autocommit=True)

    def add_to(self, database: Database, name: str = EAST) -> None:
        """Add this server to ``database``'s directory as ``name`` (active)."""
        with database.owner() as conn:
            servers.add(conn, name, self.reference)

    def sessions(self, application_names: list[str]) -> list[str]:
        """The application names of the sessions open on this database that are among
        ``application_names``, sorted (a worker child's pool shows under its holder id)."""
        with self.admin() as admin:
            rows = admin.execute(
                "SELECT application_name FROM pg_stat_activity WHERE datname = %s "
                "AND application_name = ANY(%s)",
                (self.name, application_names),
            ).fetchall()
        return sorted(str(r[0]) for r in rows)

    def schema_exists(self, schema: str) -> bool:
        with self.owner() as conn:
            found = conn.execute("SELECT 1 FROM pg_namespace WHERE nspname = %s", (schema,))
            return found.fetchone() is not None

    def journal(self, tenant: str) -> dict[str, int]:
        """The tool's journal on the server for ``tenant``: step -> the token that wrote it."""
        with self.owner() as conn:
            rows = conn.execute(
                "SELECT step, token FROM provisioner_server.step_journal WHERE tenant_id = %s",
                (tenant,),
            ).fetchall()
        return {str(step): int(token) for step, token in rows}

    def fence(self, tenant: str) -> int | None:
        with self.owner() as conn:
            row = conn.execute(
                "SELECT token FROM provisioner_server.fences WHERE tenant_id = %s", (tenant,)
            ).fetchone()
        return None if row is None else int(row[0])


@pytest.fixture(scope="session")
def jobs_cluster(east_cluster: local_pg.Cluster) -> local_pg.Cluster:
    """East, a cluster that asks every role for a password (scram-sha-256)."""
    return east_cluster


@pytest.fixture
def jobs_server(east_cluster: local_pg.Cluster) -> Iterator[TenantServerDb]:
    """A fresh database on east, owned by the owner role, bootstrapped."""
    name = create_database(east_cluster, "ts")
    try:
        yield TenantServerDb(east_cluster, name)
    finally:
        drop_database(east_cluster, name)
