"""Two real tenant servers for the fleet's fan-out tests: throwaway PostgreSQL clusters on free
127.0.0.1 ports, started by the test module (the control database is the suite's own).

Each cluster asks every role for its password (:mod:`provisioner.local.cluster`); a server's
directory reference names the cluster's password file (``passfile=...``), never a password,
so the owner reaches it through libpq's own sources, as in a deployment.

Until jobs run on tenant servers, a tenant is put on one the way a move would leave it: built
there by the tool itself (``provision`` against a database of that server), and registered in
the control database on that server with a succeeded provisioning job.
"""

from __future__ import annotations

import shutil
import tempfile
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
from provisioner.settings import Settings
from provisioner.templates import migrations
from tests.conftest import Database


@dataclass
class TenantServer:
    """One cluster and the test's database on it."""

    name: str
    cluster: local_pg.Cluster
    database: str = ""

    @property
    def reference(self) -> str:
        return (
            f"host=127.0.0.1 port={self.cluster.port} dbname={self.database} "
            f"passfile={self.cluster.passfile}"
        )

    @property
    def owner_url(self) -> str:
        return self.cluster.url(local_pg.OWNER_ROLE, self.database)

    @property
    def app_url(self) -> str:
        return self.cluster.url(local_pg.APP_ROLE, self.database)

    def admin(self) -> psycopg.Connection:
        return psycopg.connect(self.cluster.superuser_url(self.database), autocommit=True)

    def stop(self) -> None:
        """``pg_ctl stop`` of this cluster (fast: its sessions are cut)."""
        assert self.cluster.stop()

    def start(self) -> None:
        self.cluster.ensure_running()


@pytest.fixture(scope="module")
def clusters() -> Iterator[dict[str, TenantServer]]:
    """Two clusters, ``east`` and ``west``, for the whole module."""
    started: dict[str, TenantServer] = {}
    try:
        for name in ("east", "west"):
            root = Path(tempfile.mkdtemp(prefix=f"provisioner-{name}-"))
            cluster = local_pg.Cluster(root, durable=False)
            started[name] = TenantServer(name, cluster)
            cluster.ensure_running()
        yield started
    finally:
        for server in started.values():
            server.cluster.stop()
            shutil.rmtree(server.cluster.root, ignore_errors=True)


@pytest.fixture
def tenant_servers(
    clusters: dict[str, TenantServer], database: Database
) -> Iterator[dict[str, TenantServer]]:
    """A fresh database on each cluster (the roles bootstrapped, the control schema at head so
    that the tool can build tenants there); :func:`register` adds them to the directory."""
    name = f"s_{uuid.uuid4().hex[:12]}"
    for server in clusters.values():
        server.start()  # a test may have stopped it
        server.database = name
        local_pg.bootstrap_database(server.cluster.superuser_url(), name)
        migrations.upgrade_control(server.owner_url)
    try:
        yield clusters
    finally:
        for server in clusters.values():
            server.start()
            with psycopg.connect(server.cluster.superuser_url(), autocommit=True) as conn:
                conn.execute(
                    sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name))
                )


def register(database: Database, *found: TenantServer) -> None:
    with database.owner() as conn:
        for server in found:
            servers.add(conn, server.name, server.reference)


def place(settings: Settings, database: Database, server: TenantServer, tenant: str) -> None:
    """``tenant`` built on ``server`` by the tool, and registered on it in the control database
    with a succeeded provisioning job."""
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
