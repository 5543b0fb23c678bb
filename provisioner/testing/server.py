"""The server and the database the plugin's tenants live in: a PostgreSQL server the tests may
create databases on (one named by the user, or a throwaway cluster), and one database per test
process with the bootstrap roles and the control schema at head.

A server that asks for passwords works with the superuser's given any way libpq takes it (in
the URL, ``PGPASSWORD``, ``~/.pgpass``): the bootstrap roles get passwords derived from it
(:func:`provisioner.local.cluster.role_password`), so every process of a run (and any run with
the same credentials) agrees on them without talking, and their URLs carry them. Whatever
fails while a database is being prepared drops that database again: a failed setup leaves
nothing behind.
"""

from __future__ import annotations

import os
import shutil
import tempfile
import uuid
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Self
from urllib.parse import quote

import psycopg
from psycopg import sql

from provisioner import db, service
from provisioner.local import cluster as local_pg
from provisioner.settings import Settings
from provisioner.templates import migrations
from provisioner.testing.shared import SharedCluster

#: A superuser URL of a server to use instead of a throwaway cluster.
SERVER_URL_ENV = "PROVISIONER_TEST_DATABASE_URL"

#: Serialises role bootstrap across processes sharing one server (roles are cluster-wide).
BOOTSTRAP_LOCK_KEY = 7_220_261_201


def _admin_url_for(admin_url: str, database: str) -> str:
    return psycopg.conninfo.make_conninfo(admin_url, dbname=database)


def role_url(admin_url: str, role: str, database: str, secret: str | None = None) -> str:
    """A URL for one of the bootstrap roles on the admin URL's server: with the role's password
    (derived from the superuser's, ``secret``: see :func:`bootstrap`) when the server asked the
    superuser for one, else none (a server that trusts 127.0.0.1). The password is in the URL,
    not in a password file, because libpq prefers ``PGPASSWORD`` (the superuser's, in a CI job)
    to a password file. The address keeps the admin address's form (its hosts, ports and
    parameters: a host list, a service, key=value: :func:`provisioner.db.with_role`)."""
    address = db.with_role(admin_url, role, database)
    if not secret:
        return address
    password = local_pg.role_password(secret, role)
    if db.is_url(address):
        return address.replace(f"://{role}@", f"://{role}:{quote(password, safe='')}@", 1)
    return psycopg.conninfo.make_conninfo(address, password=password)


@dataclass
class PgServer:
    """A PostgreSQL server the tests may create databases on, as a superuser."""

    admin_url: str = field(repr=False)
    cluster: local_pg.Cluster | None = None
    #: the superuser's password as libpq found it (in the URL, ``PGPASSWORD`` or ``.pgpass``):
    #: the bootstrap roles' passwords derive from it (None: the server asked for none)
    secret: str | None = field(default=None, repr=False)
    #: the throwaway cluster shared by the pytest-xdist workers of one run, if it is that
    shared: SharedCluster | None = None

    @classmethod
    def start(cls, url: str | None = None, *, shared_dir: Path | None = None) -> PgServer:
        """The server at ``url`` (a superuser URL), else a throwaway cluster: started now, or,
        with ``shared_dir`` (a folder every process of one test run sees), the one the first
        process there started (see :mod:`provisioner.testing.shared`)."""
        if url:
            server = cls(admin_url=url)
        elif shared_dir is not None:
            shared = SharedCluster.join(shared_dir)
            server = cls(shared.cluster.superuser_url(), shared.cluster, shared=shared)
        else:
            # Its own top-level temporary folder: as root the server runs as an unprivileged
            # user, who must reach it (pytest's own temporary folders are private).
            root = Path(tempfile.mkdtemp(prefix="provisioner-pg-"))
            cluster = local_pg.Cluster(root, durable=False)
            server = cls(admin_url="", cluster=cluster)
            try:
                cluster.ensure_running()
            except BaseException:
                server.stop()
                raise
            server.admin_url = cluster.superuser_url()
        try:
            with psycopg.connect(
                server.admin_url, connect_timeout=db.CONNECT_TIMEOUT_SECONDS
            ) as conn:
                server.secret = conn.info.password or None
        except BaseException:
            server.stop()
            raise
        return server

    def role_url(self, role: str, database: str) -> str:
        return role_url(self.admin_url, role, database, self.secret)

    def stop(self) -> None:
        if self.shared is not None:
            self.shared.leave()
        elif self.cluster is not None:
            self.cluster.stop()
            shutil.rmtree(self.cluster.root, ignore_errors=True)


def bootstrap(admin_url: str, database: str, app_roles: tuple[str, ...] = ()) -> None:
    """Run the role bootstrap in ``database``, one process at a time per server. On a server
    that asked the superuser for a password, the roles get theirs, derived from it
    (:func:`provisioner.local.cluster.role_password`): every process that holds the superuser's
    password agrees on them without talking, so concurrent sessions never lock each other out.
    ``app_roles``: the project's application roles, created when missing
    (:func:`provisioner.local.cluster.add_app_roles`)."""
    with psycopg.connect(admin_url, autocommit=True) as lock:
        lock.execute("SELECT pg_advisory_lock(%s)", (BOOTSTRAP_LOCK_KEY,))
        with psycopg.connect(_admin_url_for(admin_url, database), autocommit=True) as conn:
            conn.execute(local_pg.bootstrap_sql().encode())
            if conn.info.password:
                local_pg.set_role_passwords(conn, conn.info.password)
            local_pg.add_app_roles(conn, app_roles)


@dataclass
class ProvisionerDatabase:
    """A database with the two roles and the control schema at head, for one test process."""

    name: str
    admin_url: str = field(repr=False)
    owner_url: str = field(repr=False)
    app_url: str = field(repr=False)
    settings: Settings

    @classmethod
    def create(cls, server: PgServer, work_dir: Path, name: str | None = None) -> Self:
        """Create, bootstrap and migrate the database; a failure on the way drops it again, so
        a failed setup leaves nothing behind."""
        worker = os.environ.get("PYTEST_XDIST_WORKER", "main")
        name = name or f"provisioner_test_{worker}_{uuid.uuid4().hex[:8]}"
        with psycopg.connect(server.admin_url, autocommit=True) as conn:
            conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
        try:
            return cls._prepare(server, work_dir, name)
        except BaseException:
            _drop_database(server.admin_url, name)
            raise

    @classmethod
    def _prepare(cls, server: PgServer, work_dir: Path, name: str) -> Self:
        # The project's settings (its configuration file and environment: tree, seeds, roles),
        # on this database, with a local folder for step 5 unless the project keeps no store.
        project = Settings.load()
        bootstrap(server.admin_url, name, tuple(role.name for role in project.app_roles))
        owner_url = server.role_url(local_pg.OWNER_ROLE, name)
        app_url = server.role_url(local_pg.APP_ROLE, name)
        objects = work_dir / "objects"
        objects.mkdir(parents=True, exist_ok=True)
        settings = replace(
            project,
            migrations_database_url=owner_url,
            app_database_url=app_url,
            object_store_provider="none"
            if project.object_store_provider == "none"
            else "filesystem",
            object_store_path=objects,
            state_dir=work_dir / "state",
        )
        migrations.upgrade_control(owner_url, settings.control_role)
        service.record_naming(owner_url)  # the app's own sign-ups register under it
        return cls(name, _admin_url_for(server.admin_url, name), owner_url, app_url, settings)

    def drop(self, server: PgServer) -> None:
        _drop_database(server.admin_url, self.name)


def _drop_database(admin_url: str, name: str) -> None:
    with psycopg.connect(admin_url, autocommit=True) as conn:
        conn.execute(
            sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name))
        )
