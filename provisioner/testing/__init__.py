"""Real tenant schemas for an application's tests: a server, a migrated database, and tenants
handed out in milliseconds. The pytest plugin (:mod:`provisioner.testing.pytest_plugin`) is a
thin layer of fixtures over this module; nothing here depends on pytest.

Why spares: provisioning a tenant (schema, template DDL, grants, seeds, control rows) costs tens
of milliseconds of catalog writes, too much to pay for every test. The factory builds *spare*
tenants ahead, in batches. The first is provisioned through the real engine
(``service.provision``) and kept as the *model*; the others are copies of it, each in one
transaction: the tenant template's DDL replayed into a new schema (as the engine's fast path
does), the grant and seed steps' own functions, then a check that the new schema's catalog
fingerprint equals the model's. A copy that does not match is rolled back and that spare is
provisioned through the engine instead, for the rest of the session. So a spare is exactly what
provisioning builds, at the cost of its DDL.

Spares (and the model) have no control rows: the model's (its tenant row, its job, its step
history) are kept as JSON once it is built, and deleted, so the application under test never
sees a spare in ``control.tenants``, ``jobs list`` or ``upgrade --all``. Handing a spare out is
one transaction that renames its schema (``ALTER SCHEMA ... RENAME``, which keeps every object,
grant and default privilege: they hang on the schema's oid, not its name) and writes the model's
control rows for the new id. A test then pays that rename, not a provisioning.
Dropping works the same way round: the tenant's control rows are deleted and its schema renamed
out of the way at once (nothing answers to the tenant's id or schema name any more), and the
renamed schemas are dropped together when the next batch of spares is built and at the end of
the session (``DROP SCHEMA ... CASCADE`` costs several times the rename).

A tenant asked for in another database (``create(id, settings=...)``: a test's own database,
migrated, with the same roles) has no spare to rename there: the model's copy is built in place
and checked the same way, in one transaction with its control rows (the engine provisions it if
the copy differs), and it is dropped at once when the test ends.

Safe with pytest-xdist: each process creates its own database (named after the xdist worker and
a random suffix), so tenants of two processes never meet. Role bootstrap, which touches
cluster-wide roles, takes an advisory lock so two processes never run it at once.
"""

from __future__ import annotations

import os
import shutil
import tempfile
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Self

import psycopg
import sqlalchemy as sa
from psycopg import sql
from psycopg.types.json import Jsonb

from provisioner import db, queue, service
from provisioner.errors import InvalidInput, ProvisionerError
from provisioner.kinds.provision import provision_key
from provisioner.local import cluster as local_pg
from provisioner.models import TenantId
from provisioner.settings import Settings
from provisioner.templates import migrations
from provisioner.templates.replay import Template, TemplateUnusable, describe_difference
from provisioner.tenant import schema as tenant_schema

#: A superuser URL of a server to use instead of a throwaway cluster.
SERVER_URL_ENV = "PROVISIONER_TEST_DATABASE_URL"

#: Serialises role bootstrap across processes sharing one server (roles are cluster-wide).
BOOTSTRAP_LOCK_KEY = 7_220_261_201

SPARE_PREFIX = "zzspare_"

# The factory's sessions commit asynchronously: a test database need not survive a server crash.
ASYNC_COMMIT = "-c synchronous_commit=off"

# A handed-out spare: its schema renamed, and the model's control rows written for the new id.
HAND_OUT = "ALTER SCHEMA {spare_schema} RENAME TO {schema};" + queue.COPY_MODEL_ROWS

RETIRED_PREFIX = "zzretired_"

# A tenant's control rows (its jobs and their step runs go with the tenant row).
DELETE_TENANT = "DELETE FROM control.tenants WHERE tenant_id = %(id)s"

SCHEMA_EXISTS = "SELECT 1 FROM pg_namespace WHERE nspname = %(schema)s"


def _admin_url_for(admin_url: str, database: str) -> str:
    return psycopg.conninfo.make_conninfo(admin_url, dbname=database)


def role_url(admin_url: str, role: str, database: str) -> str:
    """The address of one of the bootstrap roles on the admin URL's server, in the admin URL's
    form (the same hosts, ports and parameters: a host list, a service, key=value). A password
    in the admin URL is not reused for other roles: the test servers trust 127.0.0.1, and a
    server that asks for passwords gets them the libpq way (PGPASSWORD, a password file, the
    service file)."""
    return db.with_role(admin_url, role, database)


@dataclass
class PgServer:
    """A PostgreSQL server the tests may create databases on, as a superuser."""

    admin_url: str
    cluster: local_pg.Cluster | None = None

    @classmethod
    def start(cls, url: str | None = None) -> PgServer:
        """The server at ``url`` (a superuser URL), else a throwaway cluster started now."""
        if url:
            return cls(admin_url=url)
        # Its own top-level temporary folder: as root the server runs as an unprivileged user,
        # who must reach it (pytest's own temporary folders are private).
        cluster = local_pg.Cluster(Path(tempfile.mkdtemp(prefix="provisioner-pg-")), durable=False)
        cluster.ensure_running()
        return cls(admin_url=cluster.superuser_url(), cluster=cluster)

    def stop(self) -> None:
        if self.cluster is not None:
            self.cluster.stop()
            shutil.rmtree(self.cluster.root, ignore_errors=True)


def bootstrap(admin_url: str, database: str) -> None:
    """Run the role bootstrap in ``database``, one process at a time per server."""
    with psycopg.connect(admin_url, autocommit=True) as lock:
        lock.execute("SELECT pg_advisory_lock(%s)", (BOOTSTRAP_LOCK_KEY,))
        with psycopg.connect(_admin_url_for(admin_url, database), autocommit=True) as conn:
            conn.execute(local_pg.bootstrap_sql().encode())


@dataclass
class ProvisionerDatabase:
    """A database with the two roles and the control schema at head, for one test process."""

    name: str
    admin_url: str
    owner_url: str
    app_url: str
    settings: Settings

    @classmethod
    def create(cls, server: PgServer, work_dir: Path, name: str | None = None) -> Self:
        worker = os.environ.get("PYTEST_XDIST_WORKER", "main")
        name = name or f"provisioner_test_{worker}_{uuid.uuid4().hex[:8]}"
        with psycopg.connect(server.admin_url, autocommit=True) as conn:
            conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
        bootstrap(server.admin_url, name)
        owner_url = role_url(server.admin_url, local_pg.OWNER_ROLE, name)
        app_url = role_url(server.admin_url, local_pg.APP_ROLE, name)
        objects = work_dir / "objects"
        objects.mkdir(parents=True, exist_ok=True)
        settings = Settings(
            migrations_database_url=owner_url,
            app_database_url=app_url,
            object_store_provider="filesystem",
            object_store_path=objects,
            state_dir=work_dir / "state",
        )
        migrations.upgrade_control(owner_url, settings.app_role)
        return cls(name, _admin_url_for(server.admin_url, name), owner_url, app_url, settings)

    def drop(self, server: PgServer) -> None:
        with psycopg.connect(server.admin_url, autocommit=True) as conn:
            conn.execute(
                sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(self.name))
            )


@dataclass(frozen=True)
class Tenant:
    """A provisioned tenant: its id, its schema, and the application role's way in."""

    id: str
    schema: str
    #: the application role's URL (no search_path: see :meth:`connect`)
    app_url: str
    #: the owner role's URL, for tests that inspect or break the schema on purpose
    owner_url: str

    def connect(self, **kwargs: Any) -> psycopg.Connection[Any]:
        """A psycopg connection as the application role, ``search_path`` set to the tenant's
        schema alone: unqualified names resolve to the tenant's tables."""
        options = f"-c search_path={self.schema}"
        return psycopg.connect(self.app_url, options=options, **kwargs)

    @property
    def search_path_options(self) -> str:
        """``-c search_path=...`` for libpq ``options`` (e.g. SQLAlchemy's ``connect_args``)."""
        return f"-c search_path={self.schema}"

    def sqlalchemy_engine(self, **kwargs: Any) -> sa.Engine:
        """A SQLAlchemy engine (psycopg 3) as the application role, ``search_path`` set to the
        tenant's schema; dispose of it when done."""
        connect_args = {"options": self.search_path_options, **kwargs.pop("connect_args", {})}
        return db.engine(self.app_url, connect_args=connect_args, **kwargs)


@dataclass
class TenantFactory:
    """Hands out freshly provisioned tenants from a batch of spares, and drops them later."""

    database: ProvisionerDatabase
    batch: int = 8
    spares: list[TenantId] = field(default_factory=list)
    #: how many spares this factory has provisioned (a figure for benchmarks and tests)
    built: int = 0
    #: schemas of dropped tenants, renamed, waiting for :meth:`reclaim`
    retired: list[str] = field(default_factory=list)
    #: the spare provisioned through the engine that the others are copies of (never handed out)
    model: TenantId | None = None
    #: why spares are provisioned through the engine instead of copied (None: they are copied)
    copy_off: str | None = None
    _model_fingerprint: dict[str, list[tuple[Any, ...]]] = field(default_factory=dict, repr=False)
    #: the model's control rows as JSON (``tenant``, ``job``, ``runs``), written at each hand-out
    _model_rows: dict[str, Any] = field(default_factory=dict, repr=False)
    _template: Template | None = field(default=None, repr=False)
    _conn: psycopg.Connection[Any] | None = field(default=None, repr=False)

    def _provision_model(self) -> TenantId:
        """The model: provisioned through the engine once, its fingerprint and control rows kept
        (and those rows deleted: see the module)."""
        if self.model is None:
            model = TenantId(f"{SPARE_PREFIX}model_{uuid.uuid4().hex[:8]}")
            service.provision(self.database.settings, model.value, holder="pytest-spares")
            with self._owner() as conn:
                self._model_fingerprint = tenant_schema.fingerprint(conn, model.schema)
                rows = conn.execute(queue.MODEL_ROWS, {"id": model.value}).fetchone()
                assert rows is not None and rows[1] is not None, "the model has its job"
                self._model_rows = {
                    "tenant": rows[0],
                    "job": rows[1],
                    "runs": rows[2],
                    "job_runs": rows[3],
                }
                conn.execute(DELETE_TENANT, {"id": model.value})
            self.model = model
        return self.model

    def _provision_spares(self) -> None:
        self.reclaim()
        settings = self.database.settings
        self._provision_model()
        for _ in range(self.batch):
            spare = TenantId(f"{SPARE_PREFIX}{uuid.uuid4().hex[:16]}")
            if self.copy_off is None:
                try:
                    self._copy_model(spare)
                except (ProvisionerError, psycopg.Error, TemplateUnusable) as exc:
                    self.copy_off = f"copying the model failed: {exc}"
            if self.copy_off is not None:
                service.provision(settings, spare.value, holder="pytest-spares")
                with self._owner() as conn:  # spares have no control rows (see the module)
                    conn.execute(DELETE_TENANT, {"id": spare.value})
            self.spares.append(spare)
            self.built += 1

    def _copy_model(self, spare: TenantId) -> None:
        """Build ``spare`` as a verified copy of the model, in one transaction (see module)."""
        with self._owner() as conn:
            self._build_copy(conn, spare, self.database.settings.app_role)

    def _build_copy(self, conn: psycopg.Connection[Any], tenant: TenantId, app_role: str) -> None:
        """In ``conn``'s transaction: the tenant's schema built as the model's copy (template
        DDL, grants, seeds), raising when its catalog fingerprint differs from the model's."""
        assert self.model is not None
        if self._template is None:
            self._template = Template.capture()
        schema = sql.Identifier(tenant.schema)
        ddl = (
            sql.SQL("CREATE SCHEMA {} AUTHORIZATION CURRENT_USER; SET LOCAL search_path TO {};\n")
            .format(schema, schema)
            .as_string(None)
            + self._template.script
            + "\nSET LOCAL search_path TO DEFAULT;"
        )
        conn.execute(ddl.encode())
        tenant_schema.grant_app_role(conn, tenant.schema, app_role)
        tenant_schema.seed_role_profiles(conn, tenant.schema)
        got = tenant_schema.fingerprint(conn, tenant.schema)
        if got != self._model_fingerprint:
            difference = describe_difference(self._model_fingerprint, got)
            raise ProvisionerError(f"a copy differs from the model: {difference}")

    @contextmanager
    def _owner(self) -> Iterator[psycopg.Connection[Any]]:
        """One transaction on the factory's owner session, kept open between tests (a new
        connection costs several milliseconds). Commits are asynchronous: a test database
        does not need to survive a server crash."""
        if self._conn is None or self._conn.closed or self._conn.broken:
            self._conn = psycopg.connect(self.database.owner_url, options=ASYNC_COMMIT)
        with self._conn.transaction():
            yield self._conn

    def _control_params(self, tenant: TenantId) -> dict[str, Any]:
        """The parameters of :data:`provisioner.queue.COPY_MODEL_ROWS` for ``tenant``."""
        return {
            "id": tenant.value,
            "schema": tenant.schema,
            "key": provision_key(tenant),
            "job_id": uuid.uuid4(),
            **{name: Jsonb(value) for name, value in self._model_rows.items()},
        }

    def create(self, tenant_id: str | None = None, *, settings: Settings | None = None) -> Tenant:
        """A freshly provisioned tenant called ``tenant_id`` (a unique id when None), in the
        factory's database, or in the database ``settings`` name (see :meth:`create_in`)."""
        tenant = TenantId(tenant_id or f"t{uuid.uuid4().hex[:12]}")
        if tenant.value.startswith(SPARE_PREFIX):
            raise InvalidInput(f"tenant ids starting with {SPARE_PREFIX} are the factory's own")
        if settings is not None and settings.owner_url != self.database.owner_url:
            return self.create_in(settings, tenant)
        if not self.spares:
            self._provision_spares()
        spare = self.spares.pop()
        statement = sql.SQL(HAND_OUT).format(
            spare_schema=sql.Identifier(spare.schema), schema=sql.Identifier(tenant.schema)
        )
        params = self._control_params(tenant)
        with self._owner() as conn, psycopg.ClientCursor(conn) as cur:
            try:
                cur.execute(statement, params)  # several statements, one round trip
            except (psycopg.errors.DuplicateSchema, psycopg.errors.UniqueViolation):
                self.spares.append(spare)
                raise InvalidInput(f"tenant {tenant} already exists") from None
        return Tenant(tenant.value, tenant.schema, self.database.app_url, self.database.owner_url)

    def create_in(self, settings: Settings, tenant: TenantId) -> Tenant:
        """``tenant`` provisioned in another database (``settings``' URLs; its control schema at
        head, the same roles), for a test that needs it beside rows of its own there.

        No spare there to rename: the model's copy is built in place, in one transaction with
        its control rows (the template DDL, grants and seeds, checked against the model's
        fingerprint). When copies are off (see :attr:`copy_off`), or this copy differs from the
        model, it is rolled back and the engine provisions the tenant instead."""
        self._provision_model()  # in the factory's own database; no spares needed here
        if self.copy_off is None:
            try:
                with (
                    psycopg.connect(settings.owner_url, options=ASYNC_COMMIT) as conn,
                    psycopg.ClientCursor(conn) as cur,
                ):
                    self._build_copy(conn, tenant, settings.app_role)
                    cur.execute(queue.COPY_MODEL_ROWS, self._control_params(tenant))
                return Tenant(tenant.value, tenant.schema, settings.app_url, settings.owner_url)
            except (psycopg.errors.DuplicateSchema, psycopg.errors.UniqueViolation):
                raise InvalidInput(f"tenant {tenant} already exists") from None
            except (ProvisionerError, psycopg.Error, TemplateUnusable):
                pass  # rolled back: the engine provisions it below
        service.provision(settings, tenant.value, holder="pytest-spares")
        return Tenant(tenant.value, tenant.schema, settings.app_url, settings.owner_url)

    def drop(self, tenant: Tenant | str) -> None:
        """Remove the tenant: its control rows (jobs and step history included) at once, and its
        schema, renamed out of the way now and dropped with the next batch (:meth:`reclaim`)."""
        tenant_id = TenantId(tenant.id if isinstance(tenant, Tenant) else tenant)
        if isinstance(tenant, Tenant) and tenant.owner_url != self.database.owner_url:
            self._drop_elsewhere(tenant_id, tenant.owner_url)
            return
        retired = f"{RETIRED_PREFIX}{uuid.uuid4().hex[:16]}"
        with self._owner() as conn:
            conn.execute(DELETE_TENANT, {"id": tenant_id.value})
            if conn.execute(SCHEMA_EXISTS, {"schema": tenant_id.schema}).fetchone():
                conn.execute(
                    sql.SQL("ALTER SCHEMA {} RENAME TO {}").format(
                        sql.Identifier(tenant_id.schema), sql.Identifier(retired)
                    )
                )
                self.retired.append(retired)

    @staticmethod
    def _drop_elsewhere(tenant: TenantId, owner_url: str) -> None:
        """Drop a tenant of :meth:`create_in` at once: its control rows and its schema. A
        database already gone (a test's own, dropped first) took the tenant with it."""
        try:
            conn = psycopg.connect(owner_url, autocommit=True)
        except psycopg.OperationalError:
            return
        with conn:
            conn.execute(DELETE_TENANT, {"id": tenant.value})
            conn.execute(
                sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(sql.Identifier(tenant.schema))
            )

    def reclaim(self) -> None:
        """Drop the schemas of the tenants dropped so far, in one statement."""
        if not self.retired:
            return
        names = sql.SQL(", ").join(sql.Identifier(name) for name in self.retired)
        with self._owner() as conn:
            conn.execute(sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(names))
        self.retired.clear()

    def close(self) -> None:
        """Drop the spares left (and the model) and every retired schema; close the session."""
        while self.spares:
            self.drop(self.spares.pop().value)
        if self.model is not None:
            self.drop(self.model.value)
            self.model = None
        self.reclaim()
        if self._conn is not None:
            self._conn.close()
