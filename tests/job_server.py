"""A second PostgreSQL cluster as a tenant server (issue 29, item 3): started once per test
process, a fresh database on it per test, with the bootstrap roles and their passwords.

The server's reference names the cluster's password file (``passfile=``), never a password:
the owner's password comes from libpq's own sources, as in production.
"""

from __future__ import annotations

import shutil
import tempfile
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import psycopg
import pytest
from psycopg import sql

from provisioner import servers
from provisioner.local import cluster as local_pg
from tests.conftest import Database


@dataclass(frozen=True)
class TenantServerDb:
    """One test's database on the second cluster."""

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

    def add_to(self, database: Database, name: str = "east") -> None:
        """Add this server to ``database``'s directory as ``name`` (active)."""
        with database.owner() as conn:
            servers.add(conn, name, self.reference)

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
def jobs_cluster() -> Iterator[local_pg.Cluster]:
    """A cluster of its own that asks every role for a password (scram-sha-256)."""
    cluster = local_pg.Cluster(Path(tempfile.mkdtemp(prefix="provisioner-ts-")), durable=False)
    try:
        cluster.ensure_running()
        yield cluster
    finally:
        cluster.stop()
        shutil.rmtree(cluster.root, ignore_errors=True)


@pytest.fixture
def jobs_server(jobs_cluster: local_pg.Cluster) -> Iterator[TenantServerDb]:
    """A fresh database on the second cluster, owned by the owner role, bootstrapped."""
    name = f"ts_{uuid.uuid4().hex[:12]}"
    admin = jobs_cluster.superuser_url()
    local_pg.bootstrap_database(admin, name)  # the database, the roles, the owner's ownership
    try:
        yield TenantServerDb(jobs_cluster, name)
    finally:
        with psycopg.connect(admin, autocommit=True) as conn:
            conn.execute(
                sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name))
            )
