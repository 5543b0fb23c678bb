"""A second real PostgreSQL cluster, as a tenant server (issue 29's moves).

``second_cluster`` (one per test process) is a throwaway cluster of its own, started from the
machine's binaries like the suite's first. Its bootstrap roles (``provisioner_owner``,
``app_rw``) get the same passwords as on the first cluster, so the application role's URL
differs only by host and port. ``tenant_server`` gives each test a fresh database there and a
password file (``PGPASSFILE``) for the owner: the directory's reference holds no password, so
the owner's comes from libpq's own sources, as in production.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import psycopg
import pytest
from psycopg import sql

from provisioner.local import cluster as local_pg
from provisioner.testing import BOOTSTRAP_LOCK_KEY, PgServer, role_url
from tests.conftest import Server


@pytest.fixture(scope="session")
def second_cluster(pg_server: Server) -> Iterator[PgServer]:
    """A second cluster, its bootstrap roles with the first cluster's passwords."""
    server = PgServer.start()
    try:
        with psycopg.connect(server.admin_url, autocommit=True) as conn:
            conn.execute(local_pg.bootstrap_sql().encode())
            if pg_server.secret:
                local_pg.set_role_passwords(conn, pg_server.secret)
        yield server
    finally:
        server.stop()


@dataclass(frozen=True)
class TenantServer:
    """One test's database on the second cluster."""

    #: the directory's reference: no user, no password
    reference: str
    owner_url: str
    app_url: str
    #: PGPASSFILE for a process that reaches it as the owner through the reference
    env: dict[str, str]

    def owner(self) -> psycopg.Connection:
        return psycopg.connect(self.owner_url, autocommit=True)

    def app(self) -> psycopg.Connection:
        return psycopg.connect(self.app_url, autocommit=True)


@pytest.fixture
def tenant_server(
    pg_server: Server, second_cluster: PgServer, tmp_path: Path
) -> Iterator[TenantServer]:
    name = f"s_{uuid.uuid4().hex[:12]}"
    admin = second_cluster.admin_url
    with psycopg.connect(admin, autocommit=True) as conn:
        conn.execute(
            sql.SQL("CREATE DATABASE {} OWNER provisioner_owner").format(sql.Identifier(name))
        )
    there = psycopg.conninfo.make_conninfo(admin, dbname=name)
    with psycopg.connect(admin, autocommit=True) as lock:
        lock.execute("SELECT pg_advisory_lock(%s)", (BOOTSTRAP_LOCK_KEY,))
        with psycopg.connect(there, autocommit=True) as conn:
            conn.execute(local_pg.bootstrap_sql().encode())
    params = psycopg.conninfo.conninfo_to_dict(admin)
    host, port = params.get("host", "127.0.0.1"), params["port"]
    owner_url = role_url(admin, "provisioner_owner", name, pg_server.secret)
    password = psycopg.conninfo.conninfo_to_dict(owner_url).get("password", "")
    passfile = tmp_path / "pgpass"
    passfile.write_text(f"{host}:{port}:*:provisioner_owner:{password}\n")
    passfile.chmod(0o600)
    try:
        yield TenantServer(
            reference=f"host={host} port={port} dbname={name}",
            owner_url=owner_url,
            app_url=role_url(admin, "app_rw", name, pg_server.secret),
            env={"PGPASSFILE": str(passfile)},
        )
    finally:
        with psycopg.connect(admin, autocommit=True) as conn:
            conn.execute(
                sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name))
            )
