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
a silent or unreachable control database fails ``check`` in one line instead of hanging it.

Tenants on tenant servers are read on their own server, through the fan-out
(:mod:`provisioner.servers.fanout`: one owner session per server, a bounded number of servers
at once, every tenant of a server over its one session). A tenant server that is down is
reported (:attr:`DriftReport.servers`), its tenants counted as unchecked and their stored
checks left as they were; the other servers are checked and recorded.
"""

from __future__ import annotations

import enum
from collections import Counter
from contextlib import ExitStack, closing
from dataclasses import dataclass, field
from typing import Any

import psycopg
from psycopg.rows import tuple_row

from provisioner import db, queue, servers
from provisioner.control.schema import require_control_at_head
from provisioner.errors import ProvisionerError, UnknownTenant
from provisioner.kinds.provision import PROVISION_JOB_TYPE
from provisioner.kinds.repair import expected_for
from provisioner.models import Job, JobStatus, TenantId
from provisioner.roles import AppRoles
from provisioner.servers.reach import owner_address, reference_problem
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
class ServerCheck:
    """One server's part of a check: its tenants checked (by outcome), or, when it was down,
    why, and the tenants left unchecked."""

    server: str
    tenants: int
    counts: dict[str, int]
    problem: str | None = None
    unchecked: tuple[str, ...] = ()
    #: the tenants checked there
    checked: tuple[str, ...] = ()

    def view(self) -> dict[str, Any]:
        return {
            "server": self.server,
            "reachable": self.problem is None,
            "problem": self.problem,
            "tenants": self.tenants,
            "counts": self.counts,
            "unchecked": list(self.unchecked),
        }


@dataclass(frozen=True)
class DriftReport:
    heads: frozenset[str]
    tenants: list[TenantDrift] = field(default_factory=list)
    #: each server that holds a tenant of the check (the control database as ``control``)
    servers: list[ServerCheck] = field(default_factory=list)

    @property
    def down(self) -> list[ServerCheck]:
        """The servers that could not be reached: their tenants are unchecked."""
        return [s for s in self.servers if s.problem is not None]

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
    import sqlalchemy as sa  # where it is used: `provisioner status` imports this module

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
    each on its own server (:mod:`provisioner.servers.fanout`), and record each checked
    tenant's result (:mod:`provisioner.tenant.checks`, one statement at the end): the console's
    and the metrics' drift figures read it. A server that is down is reported, not raised."""
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
        placed = servers.servers_of(conn)
        by_server: dict[str, list[str]] = {}
        for tenant_id in known:
            by_server.setdefault(placed.get(tenant_id, servers.CONTROL), []).append(tenant_id)
        found = servers.directory(conn) if placed else servers.Directory([], 0)
        head = expected_inventory(settings)

        def check_server(on: psycopg.Connection[Any], target: servers.Target) -> list[TenantDrift]:
            return [
                check_tenant(
                    on,
                    TenantId(tenant_id),
                    heads,
                    head,
                    settings.app_roles,
                    job=jobs.get(tenant_id),
                    lifecycle=states.get(tenant_id),
                )
                for tenant_id in by_server[target.name]
            ]

        reached = servers.fan_out(
            servers.targets(found, settings.owner_url, by_server),
            check_server,
            application_name="check",
            control=conn,
        )
        results, sections = _gathered(reached, by_server, every=wanted is None)
        checks.record(conn, [stored(r) for r in results if r.state in STORED], checked_by)
    return DriftReport(heads, sorted(results, key=lambda r: r.tenant_id), sections)


def _gathered(
    reached: dict[str, servers.Reached[list[TenantDrift]]],
    by_server: dict[str, list[str]],
    *,
    every: bool,
) -> tuple[list[TenantDrift], list[ServerCheck]]:
    """The checked tenants (purged ones left out of ``--all``), and each server's section."""
    results: list[TenantDrift] = []
    sections = []
    for name, outcome in reached.items():
        if outcome.result is None:
            unchecked = tuple(by_server[name])
            sections.append(ServerCheck(name, 0, {}, outcome.problem, unchecked))
            continue
        kept = [
            r for r in outcome.result if not (r.state is TenantCheck.DELETED and every)
        ]  # purged tenants are out of the fleet's view
        results.extend(kept)
        found = Counter(r.state for r in kept)
        counts = {s.value: found[s] for s in TenantCheck}
        checked = tuple(r.tenant_id for r in kept)
        sections.append(ServerCheck(name, len(kept), counts, checked=checked))
    return results, sections


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
    with ExitStack() as stack, db.translated():
        conn = stack.enter_context(closing(owner))
        me = tenant_schema.schema_owner(conn, "")[1]
        placed = servers.servers_of(conn)
        # a tenant on a tenant server is planned there, over one owner session per server
        opened: dict[str, tuple[psycopg.Connection[Any], str] | str] = {}
        for tenant in report.drifted:
            server = placed.get(tenant.tenant_id)
            if server is not None and server not in opened:
                opened[server] = _open(stack, conn, server, settings.owner_url)
            there = (conn, me) if server is None else opened[server]
            if isinstance(there, str):  # went down since the check
                left = repairs.LeftAlone("every difference", f"tenant server {server}: {there}")
                plan = repairs.Plan([], [left])
            else:
                plan = _plan(there[0], there[1], tenant)
            out.append(TenantPlan(tenant.tenant_id, tenant, plan))
    return out


def _open(
    stack: ExitStack, control: psycopg.Connection[Any], server: str, owner_url: str
) -> tuple[psycopg.Connection[Any], str] | str:
    """An owner session on tenant server ``server`` (closed with ``stack``) and the role it
    runs as; or why it cannot be opened."""
    found = servers.get(control, server)
    problem = reference_problem(found)
    if problem is not None:  # never connected with (see provisioner.servers.reach)
        return problem
    address = owner_address(found, owner_url)
    try:
        there = stack.enter_context(
            closing(db.connect(address, application_name="repair", autocommit=True))
        )
    except ProvisionerError as exc:  # translated and redacted, on one line
        return str(exc)
    return there, tenant_schema.schema_owner(there, "")[1]


def _plan(conn: psycopg.Connection[Any], owner: str, tenant: TenantDrift) -> repairs.Plan:
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
