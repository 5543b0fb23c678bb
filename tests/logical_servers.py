"""The moves by logical replication: one PostgreSQL 16 cluster (the ``pgserver`` wheel's
binaries) with ``wal_level = logical`` and a password for every role (scram-sha-256, the
cluster's pg_hba.conf), shared by the xdist workers of a run exactly as the extra clusters are
(:mod:`tests.extra_clusters`), started by the first test that needs it.

Each test gets two databases there, tenant servers ``lsrc`` and ``ldst``: the owner holds the
``REPLICATION`` attribute and ``pg_create_subscription`` (cluster-wide, granted under the
suite's bootstrap lock, held shared while the test runs), its password from ``PGPASSFILE``
(:attr:`LogicalServers.env`), as in production. Two databases of one cluster are two servers
to the tool (the slot is made by the owner's own session, so a subscription to its own
cluster does not wait for itself). A missing binary fails the test: it never skips.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import psycopg
import pytest

from provisioner import servers
from provisioner.local import cluster as local_pg
from provisioner.testing import BOOTSTRAP_LOCK_KEY
from provisioner.testing.pytest_plugin import shared_folder
from provisioner.testing.shared import SharedCluster
from tests.conftest import Database
from tests.extra_clusters import apply_tool_schema, create_database, drop_database

SOURCE, TARGET = "lsrc", "ldst"


def pg16_bin() -> Path:
    """The ``pgserver`` wheel's PostgreSQL 16 binaries (a failure, not a skip, when missing)."""
    spec = importlib.util.find_spec("pgserver")
    assert spec is not None and spec.submodule_search_locations, "pgserver is not installed"
    found = Path(next(iter(spec.submodule_search_locations))) / "pginstall" / "bin"
    assert (found / "postgres").exists(), f"no PostgreSQL 16 binaries at {found}"
    return found


def _make(root: Path, *conf: str) -> local_pg.Cluster:
    return local_pg.Cluster(
        root, durable=False, bin_dir=pg16_bin(), conf=("wal_level = logical", *conf)
    )


def _joined(
    tmp_path_factory: pytest.TempPathFactory, folder: str, *conf: str
) -> Iterator[local_pg.Cluster]:
    shared = shared_folder(tmp_path_factory)
    root = (shared or tmp_path_factory.mktemp("logical")) / folder
    joined = SharedCluster.join(root, make=lambda path: _make(path, *conf))
    try:
        yield joined.cluster
    finally:
        joined.leave()


@pytest.fixture(scope="session")
def logical_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[local_pg.Cluster]:
    yield from _joined(tmp_path_factory, "extra-logical")


@pytest.fixture(scope="session")
def one_slot_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[local_pg.Cluster]:
    """Like :func:`logical_cluster`, with a single replication slot: the probe finds it free,
    the move's own slot takes it, and the subscription's table synchronisations (each makes a
    slot of its own on the source) fail: its workers' errors, after the probe passed."""
    yield from _joined(tmp_path_factory, "extra-logical-one-slot", "max_replication_slots = 1")


@dataclass(frozen=True)
class LogicalServers:
    """The test's two databases on the logical cluster."""

    cluster: local_pg.Cluster
    databases: dict[str, str]
    #: PGPASSFILE for a process that reaches them as the owner through the references
    env: dict[str, str]

    def reference(self, name: str) -> str:
        return f"host=127.0.0.1 port={self.cluster.port} dbname={self.databases[name]}"

    def owner(self, name: str) -> psycopg.Connection:
        url = self.cluster.url(local_pg.OWNER_ROLE, self.databases[name])
        return psycopg.connect(url, autocommit=True)

    def app_url(self, name: str) -> str:
        return self.cluster.url(local_pg.APP_ROLE, self.databases[name])

    @property
    def password(self) -> str:
        found = self.cluster.password(local_pg.OWNER_ROLE)
        assert found
        return found

    def register(self, database: Database, *names: str) -> None:
        with database.owner() as conn:
            for name in names:
                servers.add(conn, name, self.reference(name))

    def leftovers(self) -> dict[str, list[str]]:
        """What logical replication may leave, anywhere on the cluster: subscriptions,
        publications and slots of the test's databases."""
        found: dict[str, list[str]] = {}
        with psycopg.connect(self.cluster.superuser_url(), autocommit=True) as conn:
            for kind, query in (
                (
                    "subscriptions",
                    "SELECT s.subname FROM pg_subscription s JOIN pg_database d"
                    " ON d.oid = s.subdbid WHERE d.datname = ANY(%s)",
                ),
                ("slots", "SELECT slot_name FROM pg_replication_slots WHERE database = ANY(%s)"),
            ):
                rows = conn.execute(query, (list(self.databases.values()),)).fetchall()
                found[kind] = [str(r[0]) for r in rows]
        found["publications"] = []
        for name in self.databases:
            with self.owner(name) as conn:
                rows = conn.execute("SELECT pubname FROM pg_publication").fetchall()
                found["publications"] += [str(r[0]) for r in rows]
        return found


@contextmanager
def _replication_granted(cluster: local_pg.Cluster) -> Iterator[None]:
    """The owner may publish, make slots and subscribe while the test runs. Roles are
    cluster-wide and every database's bootstrap (another xdist worker's fixture) makes the
    owner ``NOREPLICATION`` again: the grant is made under the suite's bootstrap lock, which
    is then held shared until the test ends, so that no bootstrap takes it away mid-move (the
    logical tests of two workers run one after the other)."""
    with psycopg.connect(cluster.superuser_url(), autocommit=True) as conn:
        conn.execute("SELECT pg_advisory_lock(%s)", (BOOTSTRAP_LOCK_KEY,))
        conn.execute(f"ALTER ROLE {local_pg.OWNER_ROLE} REPLICATION")
        conn.execute(f"GRANT pg_create_subscription TO {local_pg.OWNER_ROLE}")
        conn.execute("SELECT pg_advisory_lock_shared(%s)", (BOOTSTRAP_LOCK_KEY,))
        conn.execute("SELECT pg_advisory_unlock(%s)", (BOOTSTRAP_LOCK_KEY,))
        yield


@contextmanager
def _servers(cluster: local_pg.Cluster, tmp_path: Path) -> Iterator[LogicalServers]:
    made: dict[str, str] = {}
    try:
        for name in (SOURCE, TARGET):
            made[name] = create_database(cluster, name)
            apply_tool_schema(cluster, made[name])  # as `migrate` leaves a server
        passfile = tmp_path / "pgpass-logical"
        passfile.write_text(
            f"127.0.0.1:{cluster.port}:*:{local_pg.OWNER_ROLE}:"
            f"{cluster.password(local_pg.OWNER_ROLE)}\n"
        )
        passfile.chmod(0o600)
        with _replication_granted(cluster):
            yield LogicalServers(cluster, made, {"PGPASSFILE": str(passfile)})
    finally:
        for database in made.values():
            drop_database(cluster, database)


@pytest.fixture
def logical_servers(logical_cluster: local_pg.Cluster, tmp_path: Path) -> Iterator[LogicalServers]:
    with _servers(logical_cluster, tmp_path) as servers:
        yield servers


@pytest.fixture
def one_slot_servers(
    one_slot_cluster: local_pg.Cluster, tmp_path: Path
) -> Iterator[LogicalServers]:
    """The test's two databases on :func:`one_slot_cluster` (its single slot is the whole
    cluster's: a test using it must be the only one, as it is)."""
    with _servers(one_slot_cluster, tmp_path) as servers:
        yield servers
