"""Drift: does each tenant still hold what the template head builds, and what can repair restore?

The expected shape is the inventory (:mod:`provisioner.tenant.catalog`) of a schema built at the
head and granted like a tenant, in a transaction that is rolled back
(:mod:`provisioner.templates.expected`: nothing is written, and the scratch schema's name is one
no tenant id maps to). Each tenant's inventory is then read, one catalog statement per tenant
plus its version rows, and compared object by object: missing, extra, altered.

What a tenant should hold depends on its lifecycle state: a suspended or archived tenant has no
privilege of the application role (revoked by design, not drift). A tenant whose provisioning
succeeded (or whose control row says it was onboarded) and whose schema or version table is gone
is drifted, not "not provisioned". A tenant whose schema records another revision than the head
is reported as behind: ``provisioner upgrade`` is the cure for that. Purged tenants are left out
of ``--all``.

Each check is recorded per tenant (when, its outcome, its counts and a short summary) in
``control.tenant_checks`` (:mod:`provisioner.tenant.checks`); nothing in the tenants' schemas is
written.

Every connection gives up after the connect timeout (:data:`provisioner.db.SA_CONNECT_ARGS`):
a silent or unreachable server fails ``check`` in one line instead of hanging it.
"""

from __future__ import annotations

import enum
from collections import Counter
from contextlib import closing
from dataclasses import dataclass, field
from typing import Any

import psycopg
import sqlalchemy as sa
from psycopg.rows import tuple_row

from provisioner import db, queue
from provisioner.control.schema import require_control_at_head
from provisioner.errors import UnknownTenant
from provisioner.kinds.provision import PROVISION_JOB_TYPE
from provisioner.kinds.repair import expected_for
from provisioner.models import Job, JobStatus, TenantId
from provisioner.roles import AppRoles
from provisioner.settings import Settings
from provisioner.templates import expected, migrations
from provisioner.tenant import catalog, checks, repairs
from provisioner.tenant import row as tenants
from provisioner.tenant import schema as tenant_schema
from provisioner.tenant.catalog import MISSING, Difference
from provisioner.tenant.state import ONBOARDED, TenantState


class TenantCheck(enum.StrEnum):
    CLEAN = "clean"
    DRIFTED = "drifted"
    BEHIND = "behind"
    #: its provisioning has not finished (nor has it been onboarded)
    NOT_PROVISIONED = "not provisioned"
    #: purged: its schema is gone by design
    DELETED = "deleted"


@dataclass(frozen=True)
class TenantDrift:
    tenant_id: str
    state: TenantCheck
    #: control.tenants.state (None: no control row)
    lifecycle: TenantState | None = None
    differences: tuple[Difference, ...] = ()
    versions: frozenset[str] = frozenset()

    @property
    def counts(self) -> dict[str, int]:
        """How many objects are missing, extra and altered (what belongs to a missing or extra
        table is counted with it: :func:`provisioner.tenant.catalog.fold`)."""
        found = Counter(d.change for d, _ in catalog.fold(list(self.differences)))
        return {
            change: found[change] for change in (catalog.MISSING, catalog.EXTRA, catalog.ALTERED)
        }

    @property
    def expects(self) -> str:
        """Which shape the tenant was compared with."""
        if self.lifecycle in (TenantState.SUSPENDED, TenantState.ARCHIVED):
            return f"no application access ({self.lifecycle})"
        return "the template head"


@dataclass(frozen=True)
class DriftReport:
    heads: frozenset[str]
    tenants: list[TenantDrift] = field(default_factory=list)

    @property
    def drifted(self) -> list[TenantDrift]:
        return [t for t in self.tenants if t.state is TenantCheck.DRIFTED]

    @property
    def counts(self) -> dict[str, int]:
        """Tenants by outcome, every outcome named (0 when none)."""
        found = Counter(t.state for t in self.tenants)
        return {state.value: found[state] for state in TenantCheck}


def expected_inventory(settings: Settings) -> catalog.Inventory:
    """The head's inventory, built in a transaction that is rolled back."""
    engine = db.engine(
        settings.owner_url,
        poolclass=sa.pool.NullPool,
        connect_args={**db.SA_CONNECT_ARGS, "application_name": "check"},
    )
    try:
        with db.translated(), engine.connect() as connection:
            transaction = connection.begin()
            try:
                pg = connection.connection.driver_connection
                return expected.build(pg, connection, settings.app_roles)  # type: ignore[arg-type]
            finally:
                transaction.rollback()
    finally:
        engine.dispose()


def check(
    settings: Settings, tenant_ids: list[str] | None = None, *, checked_by: str = "check"
) -> DriftReport:
    """Compare each provisioned tenant (all but the purged, or the named ones) with the head,
    and record each one's result (:mod:`provisioner.tenant.checks`, one statement at the
    end): the console's and the metrics' drift figures read it."""
    wanted = None if tenant_ids is None else [TenantId(t) for t in tenant_ids]
    heads = migrations.tenant_heads()
    owner = db.connect(settings.owner_url, application_name="check", autocommit=True)
    with closing(owner) as conn, db.translated():
        require_control_at_head(conn)
        jobs = {str(j.tenant_id): j for j in queue.latest_jobs(conn, PROVISION_JOB_TYPE, wanted)}
        states = tenants.states_of(conn, wanted)
        known = sorted(jobs.keys() | states.keys())
        unknown = sorted({t.value for t in wanted or []} - set(known))
        if unknown:
            raise UnknownTenant(f"unknown tenant(s) {', '.join(unknown)}: no provisioning job")
        head = expected_inventory(settings)
        results = []
        for tenant_id in known:
            result = check_tenant(
                conn,
                TenantId(tenant_id),
                heads,
                head,
                settings.app_roles,
                job=jobs.get(tenant_id),
                lifecycle=states.get(tenant_id),
            )
            if result.state is TenantCheck.DELETED and wanted is None:
                continue  # purged tenants are out of the fleet's view
            results.append(result)
        checks.record(conn, [stored(r) for r in results if r.state in STORED], checked_by)
    return DriftReport(heads, results)


#: Outcomes recorded in ``control.tenant_checks`` (a purged tenant has nothing to check).
STORED = (
    TenantCheck.CLEAN,
    TenantCheck.DRIFTED,
    TenantCheck.BEHIND,
    TenantCheck.NOT_PROVISIONED,
)


def stored(result: TenantDrift) -> checks.CheckRecord:
    """A tenant's check as ``control.tenant_checks`` keeps it."""
    if result.state is TenantCheck.DRIFTED:
        return checks.of_differences(result.tenant_id, list(result.differences))
    summary = ""
    if result.state is TenantCheck.BEHIND:
        summary = f"at {migrations.head_label(result.versions)}"
    return checks.CheckRecord(result.tenant_id, result.state.value, summary=summary)


def check_tenant(
    conn: psycopg.Connection[Any],
    tenant: TenantId,
    heads: frozenset[str],
    head: catalog.Inventory,
    app_roles: AppRoles,
    *,
    job: Job | None,
    lifecycle: TenantState | None,
) -> TenantDrift:
    """One tenant against the head's inventory ``head``: one catalog statement, and one more
    for its version rows when it has a version table."""
    name = tenant.value
    if lifecycle is TenantState.DELETED:
        return TenantDrift(name, TenantCheck.DELETED, lifecycle)
    provisioned = (job is not None and job.status is JobStatus.SUCCEEDED) or lifecycle in ONBOARDED
    if not provisioned:
        return TenantDrift(name, TenantCheck.NOT_PROVISIONED, lifecycle)
    found = catalog.read(conn, tenant.schema)
    if found is None:
        gone = Difference(MISSING, "schema", tenant.schema, {"owner": "?"}, None)
        return TenantDrift(name, TenantCheck.DRIFTED, lifecycle, (gone,))
    versions: frozenset[str] = frozenset()
    if ("table", "alembic_version") in found:
        versions = _versions(conn, tenant.schema)
        if versions and versions != heads:
            return TenantDrift(name, TenantCheck.BEHIND, lifecycle, versions=versions)
    differences = catalog.compare(expected_for(head, lifecycle, app_roles), found)
    if ("table", "alembic_version") in found and not versions:
        empty = Difference(MISSING, "version", "alembic_version", {"revision": "?"}, None)
        differences.insert(0, empty)
    state = TenantCheck.DRIFTED if differences else TenantCheck.CLEAN
    return TenantDrift(name, state, lifecycle, tuple(differences), versions)


def _versions(conn: psycopg.Connection[Any], schema: str) -> frozenset[str]:
    with conn.cursor(row_factory=tuple_row) as cur:
        cur.execute(tenant_schema.versions_query(schema), prepare=False)
        return frozenset(str(row[0]) for row in cur.fetchall())


@dataclass(frozen=True)
class TenantPlan:
    """What ``repair`` would do to one tenant (``plan.actions``), and what it leaves alone."""

    tenant_id: str
    check: TenantDrift
    plan: repairs.Plan


def plans(settings: Settings, report: DriftReport) -> list[TenantPlan]:
    """Each drifted tenant's repair plan, from its check (read-only: a dry run)."""
    out: list[TenantPlan] = []
    owner = db.connect(settings.owner_url, application_name="repair", autocommit=True)
    with closing(owner) as conn, db.translated():
        me = tenant_schema.schema_owner(conn, "")[1]
        for tenant in report.drifted:
            out.append(TenantPlan(tenant.tenant_id, tenant, _plan(conn, tenant, me)))
    return out


def _plan(conn: psycopg.Connection[Any], tenant: TenantDrift, owner: str) -> repairs.Plan:
    """The tenant's plan, or why it cannot be repaired in place."""
    first = tenant.differences[0] if tenant.differences else None
    if first is not None and first.kind == "schema":
        why = f"`provisioner provision {tenant.tenant_id}` builds it again"
        return repairs.Plan([], [repairs.LeftAlone(repairs.describe(first), why)])
    if (first is not None and first.kind == "version") or any(
        d.kind == "table" and d.name == "alembic_version" for d in tenant.differences
    ):
        what = "missing version table alembic_version"
        why = f"its revision is unknown: `provisioner provision {tenant.tenant_id}` records it"
        return repairs.Plan([], [repairs.LeftAlone(what, why)])
    schema = TenantId(tenant.tenant_id).schema
    return repairs.plan(conn, schema, list(tenant.differences), owner=owner)
