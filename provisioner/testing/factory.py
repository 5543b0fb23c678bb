"""Freshly provisioned tenants for tests, handed out in milliseconds.

(See :mod:`provisioner.testing` for why spares, the model, and the hand-out by rename.)
"""

from __future__ import annotations

import threading
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import psycopg
import sqlalchemy as sa
from psycopg import sql
from psycopg.types.json import Jsonb

from provisioner import db, naming, queue, service
from provisioner.db.conninfo import DIALECT_URL
from provisioner.errors import InvalidInput, ProvisionerError
from provisioner.kinds.provision import provision_key
from provisioner.models import TenantId
from provisioner.roles import AppRoles
from provisioner.settings import Settings, tenant_naming
from provisioner.templates import migrations, seeds
from provisioner.templates.replay import Template, TemplateUnusable, describe_difference
from provisioner.tenant import schema as tenant_schema
from provisioner.tenant.fingerprint import fingerprint
from provisioner.testing import search_path
from provisioner.testing.server import ProvisionerDatabase
from provisioner.testing.signups import Sweep

SPARE_PREFIX = "zzspare"

# The factory's sessions commit asynchronously: a test database need not survive a server crash.
ASYNC_COMMIT = "-c synchronous_commit=off"

# A handed-out spare: its schema renamed, its functions that pin their search_path to the
# spare's name pointed at the new one ({repin}: tenant_schema.repin_search_path), and the
# model's control rows written for the new id.
HAND_OUT = "ALTER SCHEMA {spare_schema} RENAME TO {schema}; {repin};" + queue.COPY_MODEL_ROWS


# A tenant's control rows (its jobs and their step runs go with the tenant row).
DELETE_TENANT = "DELETE FROM control.tenants WHERE tenant_id = %(id)s"

SCHEMA_EXISTS = "SELECT 1 FROM pg_namespace WHERE nspname = %(schema)s"


@dataclass(frozen=True)
class Tenant:
    """A provisioned tenant: its id, its schema, and the application role's way in."""

    id: str
    schema: str
    #: the application role's URL (no search_path: see :meth:`connect`)
    app_url: str = field(repr=False)
    #: the owner role's URL, for tests that inspect or break the schema on purpose
    owner_url: str = field(repr=False)

    def connect(self, **kwargs: Any) -> psycopg.Connection[Any]:
        """A psycopg connection as the application role, ``search_path`` set to the tenant's
        schema alone: unqualified names resolve to the tenant's tables.

        Set for the session (libpq ``options``); through a pooler in transaction mode, which
        refuses that, in each transaction instead (:mod:`provisioner.testing.search_path`)."""
        try:
            return psycopg.connect(self.app_url, options=self.search_path_options, **kwargs)
        except psycopg.OperationalError as exc:
            if not db.options_refused(exc):
                raise
        return search_path.connect(self.app_url, self.schema, **kwargs)

    @property
    def search_path_options(self) -> str:
        """``-c search_path=...`` for libpq ``options`` (e.g. SQLAlchemy's ``connect_args``)."""
        return f"-c search_path={self.schema}"

    def sqlalchemy_engine(self, **kwargs: Any) -> sa.Engine:
        """A SQLAlchemy engine (psycopg 3) as the application role, ``search_path`` set to the
        tenant's schema; dispose of it when done.

        Its connections are :meth:`connect`'s: the setting goes in libpq ``options``, or,
        through a pooler in transaction mode that refuses them, with each transaction (the
        refusal is remembered, so later connections go straight to that form)."""
        connect_args = dict(kwargs.pop("connect_args", {}))
        address = db.libpq_address(self.app_url)  # a SQLAlchemy driver suffix dropped
        refused: list[bool] = []

        def creator() -> psycopg.Connection[Any]:
            if not refused:
                try:
                    return psycopg.connect(
                        address, options=self.search_path_options, **connect_args
                    )
                except psycopg.OperationalError as exc:
                    if not db.options_refused(exc):
                        raise
                    refused.append(True)
            return search_path.connect(address, self.schema, **connect_args)

        return sa.create_engine(DIALECT_URL, creator=creator, **kwargs)


@dataclass
class TenantFactory:
    """Hands out freshly provisioned tenants from spares built ahead, and drops them later.

    With ``background`` (the default), a thread keeps ``batch`` spares ready: it builds the next
    one (a verified copy of the model, in one transaction on a connection of its own) as soon as
    one is handed out, and drops retired schemas between builds, so that a test never waits for
    a batch. The model is provisioned, and the template captured, on the caller's thread
    (Alembic's module state is not thread-safe). When copies are off (:attr:`copy_off`) or the
    thread failed, spares are provisioned on the caller's thread, a batch at a time.
    """

    database: ProvisionerDatabase
    batch: int = 8
    background: bool = True
    spares: list[TenantId] = field(default_factory=list)
    #: how many spares this factory has provisioned (a figure for benchmarks and tests)
    built: int = 0
    #: schemas of dropped tenants, renamed, waiting for :meth:`reclaim`
    retired: list[str] = field(default_factory=list)
    #: the spare provisioned through the engine that the others are copies of (never handed out)
    model: TenantId | None = None
    #: why spares are provisioned through the engine instead of copied (None: they are copied)
    copy_off: str | None = None
    #: ids of the tenants handed out and not dropped yet (what :class:`Sweep` leaves alone)
    live: set[str] = field(default_factory=set)
    _model_fingerprint: dict[str, list[tuple[Any, ...]]] = field(default_factory=dict, repr=False)
    #: the model's control rows as JSON (``tenant``, ``job``, ``runs``), written at each hand-out
    _model_rows: dict[str, Any] = field(default_factory=dict, repr=False)
    _template: Template | None = field(default=None, repr=False)
    _conn: psycopg.Connection[Any] | None = field(default=None, repr=False)
    #: guards :attr:`spares`, :attr:`retired`, :attr:`built` between the caller and the builder
    _ready: threading.Condition = field(default_factory=threading.Condition, repr=False)
    _builder: threading.Thread | None = field(default=None, repr=False)
    _stopping: bool = field(default=False, repr=False)

    def _provision_model(self) -> TenantId:
        """The model: provisioned through the engine once, its fingerprint and control rows kept
        (and those rows deleted: see the module), the template captured."""
        if self.model is None:
            model = own_id(f"{SPARE_PREFIX}m")
            service.provision(self.database.settings, model.value, holder="pytest-spares")
            with self._owner() as conn:
                self._model_fingerprint = fingerprint(conn, model.schema)
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
        if self._template is None:
            try:
                self._template = Template.capture()
            except TemplateUnusable as exc:
                self.copy_off = f"the template cannot be replayed: {exc}"
        return self.model

    # -- spares built on the caller's thread ---------------------------------------------------

    def _provision_spares(self) -> None:
        """A batch of spares, built now on this thread (no builder, or copies are off)."""
        self.reclaim()
        settings = self.database.settings
        self._provision_model()
        for _ in range(self.batch):
            spare = own_id(SPARE_PREFIX)
            if self.copy_off is None:
                try:
                    self._copy_model(spare)
                except (ProvisionerError, psycopg.Error, TemplateUnusable) as exc:
                    self.copy_off = f"copying the model failed: {exc}"
            if self.copy_off is not None:
                service.provision(settings, spare.value, holder="pytest-spares")
                with self._owner() as conn:  # spares have no control rows (see the module)
                    conn.execute(DELETE_TENANT, {"id": spare.value})
            with self._ready:
                self.spares.append(spare)
                self.built += 1

    def _copy_model(self, spare: TenantId) -> None:
        """Build ``spare`` as a verified copy of the model, in one transaction (see module)."""
        with self._owner() as conn:
            self._build_copy(conn, spare, self.database.settings.app_roles)

    def _build_copy(
        self, conn: psycopg.Connection[Any], tenant: TenantId, app_roles: AppRoles
    ) -> None:
        """In ``conn``'s transaction: the tenant's schema built as the model's copy (template
        DDL, grants, seeds), raising when its catalog fingerprint differs from the model's."""
        assert self.model is not None and self._template is not None
        schema = sql.Identifier(tenant.schema)
        ddl = (
            sql.SQL("CREATE SCHEMA {} AUTHORIZATION CURRENT_USER; SET LOCAL search_path TO {};\n")
            .format(schema, schema)
            .as_string(None)
            + self._template.script
            + "\nSET LOCAL search_path TO DEFAULT;"
        )
        conn.execute(ddl.encode())
        tenant_schema.grant_app_roles(conn, tenant.schema, app_roles)
        declared = seeds.declared(self.database.settings.seeds, migrations.tenant_tree())
        seeds.apply(conn, tenant, declared)
        got = fingerprint(conn, tenant.schema)
        if got != self._model_fingerprint:
            difference = describe_difference(self._model_fingerprint, got)
            raise ProvisionerError(f"a copy differs from the model: {difference}")

    # -- spares built ahead, in the background -------------------------------------------------

    def _start_builder(self) -> None:
        if self._builder is None or not self._builder.is_alive():
            self._builder = threading.Thread(
                target=self._build_ahead, name="provisioner-spares", daemon=True
            )
            self._builder.start()

    def _build_ahead(self) -> None:
        """The builder thread: keep :attr:`batch` spares ready, drop retired schemas; stop when
        asked, or when a copy fails (copies are then off: the caller builds)."""
        conn = psycopg.connect(self.database.owner_url, options=ASYNC_COMMIT)
        try:
            while True:
                with self._ready:
                    while not (self._stopping or self._builder_due()):
                        self._ready.wait()
                    if self._stopping:
                        return
                    build = len(self.spares) < self.batch
                    retired = []
                    if not build or len(self.retired) >= self.batch:
                        retired, self.retired = self.retired, []
                if retired:
                    with conn.transaction():
                        conn.execute(_drop_schemas(retired))
                if not build:
                    continue
                spare = own_id(SPARE_PREFIX)
                with conn.transaction():
                    self._build_copy(conn, spare, self.database.settings.app_roles)
                with self._ready:
                    self.spares.append(spare)
                    self.built += 1
                    self._ready.notify_all()
        except (ProvisionerError, psycopg.Error, TemplateUnusable) as exc:
            with self._ready:
                self.copy_off = self.copy_off or f"copying the model failed: {exc}"
        finally:
            conn.close()
            with self._ready:
                self._ready.notify_all()

    def _builder_due(self) -> bool:
        """Work for the builder: a spare to build, or retired schemas to drop. Spares come
        first; retired schemas are dropped when the spares are all ready, or together once
        there are a batch of them (a ``DROP SCHEMA`` costs several renames: one statement for
        many, and never while a test waits for a spare, if it can be helped)."""
        return len(self.spares) < self.batch or bool(self.retired)

    def _stop_builder(self) -> None:
        with self._ready:
            self._stopping = True
            self._ready.notify_all()
        if self._builder is not None:
            self._builder.join()
            self._builder = None
        self._stopping = False

    def _take_spare(self) -> TenantId:
        """A ready spare: from the builder (waiting for it only when none is ready), or built on
        this thread when there is no builder."""
        with self._ready:
            if self.spares:
                spare = self.spares.pop()
                self._ready.notify_all()  # the builder builds the next one
                return spare
        if self.background:
            self._provision_model()
        if self.background and self.copy_off is None:
            self._start_builder()
            with self._ready:
                while not self.spares and self.copy_off is None:
                    self._ready.wait(timeout=1.0)
                    assert self._builder is not None
                    if not self._builder.is_alive() and not self.spares:
                        break
                if self.spares:
                    spare = self.spares.pop()
                    self._ready.notify_all()
                    return spare
        self._provision_spares()
        with self._ready:
            return self.spares.pop()

    # -- hand-out and drop ---------------------------------------------------------------------

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
        tenant = TenantId(tenant_id) if tenant_id else own_id("t")
        if tenant.value.startswith(SPARE_PREFIX):
            raise InvalidInput(f"tenant ids starting with {SPARE_PREFIX} are the factory's own")
        if settings is not None and settings.owner_url != self.database.owner_url:
            return self.create_in(settings, tenant)
        spare = self._take_spare()
        statement = sql.SQL(HAND_OUT).format(
            spare_schema=sql.Identifier(spare.schema),
            schema=sql.Identifier(tenant.schema),
            repin=tenant_schema.repin_search_path(spare.schema, tenant.schema),
        )
        params = self._control_params(tenant)
        with self._owner() as conn, psycopg.ClientCursor(conn) as cur:
            try:
                cur.execute(statement, params)  # several statements, one round trip
            except (psycopg.errors.DuplicateSchema, psycopg.errors.UniqueViolation):
                with self._ready:
                    self.spares.append(spare)
                raise InvalidInput(f"tenant {tenant} already exists") from None
        self.live.add(tenant.value)
        return Tenant(tenant.value, tenant.schema, self.database.app_url, self.database.owner_url)

    def create_in(self, settings: Settings, tenant: TenantId) -> Tenant:
        """``tenant`` provisioned in another database (``settings``' URLs; its control schema at
        head, the same roles), for a test that needs it beside rows of its own there.

        No spare there to rename: the model's copy is built in place, in one transaction with
        its control rows (the template DDL, grants and seeds, checked against the model's
        fingerprint). When copies are off (see :attr:`copy_off`), or this copy differs from the
        model, it is rolled back and the engine provisions the tenant instead; if that fails
        too, what it left there is dropped before the error is raised."""
        self._provision_model()  # in the factory's own database; no spares needed here
        if self.copy_off is None:
            try:
                with (
                    psycopg.connect(settings.owner_url, options=ASYNC_COMMIT) as conn,
                    psycopg.ClientCursor(conn) as cur,
                ):
                    self._build_copy(conn, tenant, settings.app_roles)
                    cur.execute(queue.COPY_MODEL_ROWS, self._control_params(tenant))
                return Tenant(tenant.value, tenant.schema, settings.app_url, settings.owner_url)
            except (psycopg.errors.DuplicateSchema, psycopg.errors.UniqueViolation):
                raise InvalidInput(f"tenant {tenant} already exists") from None
            except (ProvisionerError, psycopg.Error, TemplateUnusable):
                pass  # rolled back: the engine provisions it below
        try:
            service.provision(settings, tenant.value, holder="pytest-spares")
        except BaseException:
            self._drop_elsewhere(tenant, settings.owner_url)
            raise
        return Tenant(tenant.value, tenant.schema, settings.app_url, settings.owner_url)

    def drop(self, tenant: Tenant | str | TenantId) -> None:
        """Remove the tenant: its control rows (jobs and step history included) at once, and its
        schema, renamed out of the way now and dropped soon after by the builder (without one,
        with the next batch: :meth:`reclaim`)."""
        if isinstance(tenant, Tenant):
            tenant_id = TenantId(tenant.id)
        elif isinstance(tenant, TenantId):
            tenant_id = tenant
        else:
            tenant_id = TenantId(tenant)
        self.live.discard(tenant_id.value)
        if isinstance(tenant, Tenant) and tenant.owner_url != self.database.owner_url:
            self._drop_elsewhere(tenant_id, tenant.owner_url)
            return
        retired = naming.scratch_name("retired")  # never a tenant's name
        with self._owner() as conn:
            conn.execute(DELETE_TENANT, {"id": tenant_id.value})
            if conn.execute(SCHEMA_EXISTS, {"schema": tenant_id.schema}).fetchone():
                conn.execute(
                    sql.SQL("ALTER SCHEMA {} RENAME TO {}").format(
                        sql.Identifier(tenant_id.schema), sql.Identifier(retired)
                    )
                )
            else:
                return
        # Committed (never call this inside a transaction of the factory's session): the
        # builder can see the new name, and drops it.
        with self._ready:
            self.retired.append(retired)
            self._ready.notify_all()

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

    def snapshot(self) -> Sweep:
        """The tenants and jobs in the factory's database now (before a test)."""
        with self._owner() as conn:
            return Sweep.snapshot(conn)

    def sweep(self, before: Sweep) -> list[str]:
        """Drop the tenants added since ``before`` that the factory did not hand out (an
        application's own sign-ups), and the jobs added since that belong to no tenant left;
        the tenant ids dropped."""
        keep = frozenset(self.live)
        with self._owner() as conn:
            added = before.added_tenants(conn, keep)
        for tenant in added:
            self.drop(tenant)
        with self._owner() as conn:
            before.delete_added_jobs(conn, keep)
        return [tenant.value for tenant in added]

    def reclaim(self) -> None:
        """Drop the schemas of the tenants dropped so far, in one statement."""
        with self._ready:
            retired, self.retired = self.retired, []
        if retired:
            with self._owner() as conn:
                conn.execute(_drop_schemas(retired))

    def close(self) -> None:
        """Stop the builder; drop the spares left (and the model) and every retired schema;
        close the session."""
        self._stop_builder()
        while self.spares:
            self.drop(self.spares.pop())
        if self.model is not None:
            self.drop(self.model)
            self.model = None
        self.reclaim()
        if self._conn is not None:
            self._conn.close()


def own_id(prefix: str) -> TenantId:
    """A fresh id starting with ``prefix`` that the project's tenant-id rule accepts (the
    factory's spares and model, and a test's unnamed tenant): ``prefix`` and hex digits, or
    letters only for a rule without digits, cut to the rule's length."""
    rule = tenant_naming()
    token = uuid.uuid4().hex
    for tail in (token[:16], token[:16].translate(_LETTERS)):
        candidate = (prefix + tail)[: rule.max_length]
        if rule.problem(candidate) is None:
            return TenantId(candidate, rule)
    raise InvalidInput(
        f"the pytest plugin names its tenants {prefix}<hex>: the project's rule refuses it "
        f"({rule.rule})"
    )


_LETTERS = str.maketrans("0123456789", "ghijklmnop")


def _drop_schemas(names: list[str]) -> sql.Composed:
    listed = sql.SQL(", ").join(sql.Identifier(name) for name in names)
    return sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(listed)
