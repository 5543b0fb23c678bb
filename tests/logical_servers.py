"""The moves by logical replication: one PostgreSQL 16 cluster (the ``pgserver`` wheel's
binaries) with ``wal_level = logical`` and a password for every role (scram-sha-256, the
cluster's pg_hba.conf), shared by the xdist workers of a run exactly as the extra clusters are
(:mod:`tests.extra_clusters`), started by the first test that needs it.

Each test gets two databases there, tenant servers ``lsrc`` and ``ldst``: the owner holds the
``REPLICATION`` attribute and ``pg_create_subscription`` (cluster-wide, granted under the
suite's bootstrap lock), its password from ``PGPASSFILE`` (:attr:`LogicalServers.env`), as in
production. Two databases of one cluster are two servers to the tool (the slot is made by the
owner's own session, so a subscription to its own cluster does not wait for itself). A missing
binary fails the test: it never skips.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Iterator
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
from tests.extra_clusters import create_database, drop_database

SOURCE, TARGET = "lsrc", "ldst"


def pg16_bin() -> Path:
    """The ``pgserver`` wheel's PostgreSQL 16 binaries (a failure, not a skip, when missing)."""
    spec = importlib.util.find_spec("pgserver")
    assert spec is not None and spec.submodule_search_locations, "pgserver is not installed"
    found = Path(next(iter(spec.submodule_search_locations))) / "pginstall" / "bin"
    assert (found / "postgres").exists(), f"no PostgreSQL 16 binaries at {found}"
    return found


def _make(root: Path) -> local_pg.Cluster:
    return local_pg.Cluster(root, durable=False, bin_dir=pg16_bin(), conf=("wal_level = logical",))


@pytest.fixture(scope="session")
def logical_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[local_pg.Cluster]:
    shared = shared_folder(tmp_path_factory)
    folder = (shared or tmp_path_factory.mktemp("logical")) / "extra-logical"
    joined = SharedCluster.join(folder, make=_make)
    try:
        yield joined.cluster
    finally:
        joined.leave()


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


def _grant_replication(cluster: local_pg.Cluster) -> None:
    """The owner may publish, make slots and subscribe (cluster-wide roles: one process at a
    time, under the suite's bootstrap lock)."""
    with psycopg.connect(cluster.superuser_url(), autocommit=True) as conn:
        conn.execute("SELECT pg_advisory_lock(%s)", (BOOTSTRAP_LOCK_KEY,))
        conn.execute(f"ALTER ROLE {local_pg.OWNER_ROLE} REPLICATION")
        conn.execute(f"GRANT pg_create_subscription TO {local_pg.OWNER_ROLE}")


@pytest.fixture
def logical_servers(logical_cluster: local_pg.Cluster, tmp_path: Path) -> Iterator[LogicalServers]:
    made: dict[str, str] = {}
    try:
        for name in (SOURCE, TARGET):
            made[name] = create_database(logical_cluster, name)
        _grant_replication(logical_cluster)
        passfile = tmp_path / "pgpass-logical"
        passfile.write_text(
            f"127.0.0.1:{logical_cluster.port}:*:{local_pg.OWNER_ROLE}:"
            f"{logical_cluster.password(local_pg.OWNER_ROLE)}\n"
        )
        passfile.chmod(0o600)
        yield LogicalServers(logical_cluster, made, {"PGPASSFILE": str(passfile)})
    finally:
        for database in made.values():
            drop_database(logical_cluster, database)
