"""A kind's steps for a tenant placed on a tenant server (:class:`PlacedStep`), and the
provisioning kind's (:data:`PROVISION_PLACED`: a fleet upgrade's job is one of its runs; the
lifecycle kinds' are in :mod:`provisioner.kinds.placed_lifecycle`).

On a tenant server a step has two sides: its work on the tenant's server (``server``: DDL in
the tenant's schema, in the server's transaction with the journal row and the fence), and its
part of the control database's bookkeeping (``control``: the tenant's state, run in the
transaction of the job's checkpoint). The control side must be safe to run again: a resume
that adopts a step the server's journal shows done runs it with the checkpoint it missed.
Each side has its catalog check. A kind without placed steps (one registered through
``PROVISIONER_JOB_KIND_MODULES`` that has none) keeps refusing a tenant that lives on a tenant
server (:class:`provisioner.errors.TenantElsewhere`).

What differs from the steps on the control database: the warm pool's take spans two
databases (a claim on control, the rename on the server, the record's end in the checkpoint:
:mod:`provisioner.pool.server_spares`), the seeds' record on the server
(:data:`provisioner.servers.journal.SEEDS_TABLE`), and the verified replays (the template's
for a new schema, the new revisions' for one behind the head) proven against control's stored
references (Alembic when there is none or it does not verify on that server).
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import Any

import psycopg

from provisioner import pool
from provisioner.db import Transaction, kept_alive
from provisioner.errors import TemplateUnusable
from provisioner.kinds.provision import GRANTS_IN_PLACE
from provisioner.kinds.step import StepContext
from provisioner.servers.journal import SEEDS_TABLE
from provisioner.templates import migrations, seeds
from provisioner.templates.reference import Reference
from provisioner.templates.replay import connection_key, replay
from provisioner.templates.upgrade import ReferenceSource
from provisioner.tenant import row as tenants
from provisioner.tenant import schema as tenant_schema


@dataclass(frozen=True)
class ControlAccess:
    """What a step's server side may use of the control database: the engine's autocommit
    session (reads), and a transaction of its own (the template's reference, computed and
    stored once per tree state)."""

    conn: psycopg.Connection[Any]
    transaction: Callable[[], AbstractContextManager[Transaction]]
    #: the tenant's server, by name (its spares are taken there)
    server: str | None = None


#: A side's work: (its transaction, the step's context, control) -> detail.
ServerWork = Callable[[Transaction, StepContext, ControlAccess], str | None]
ControlWork = Callable[[psycopg.Connection[Any], StepContext], str | None]
#: Is a server side's effect there: (a transaction on the server, the context, control) -> bool.
ServerCheck = Callable[[Transaction, StepContext, ControlAccess], bool]
Check = Callable[[psycopg.Connection[Any], StepContext], bool]


@dataclass(frozen=True)
class PlacedStep:
    """One step of a kind for a tenant on a tenant server; its name is the kind's step's."""

    name: str
    #: the work on the tenant's server (None: nothing there)
    server: ServerWork | None = None
    #: is the server side's effect there (in a transaction on the server)
    server_effect: ServerCheck | None = None
    #: the control side, in the checkpoint's transaction; safe to run again
    control: ControlWork | None = None
    #: is the control side's effect there (on the control session)
    control_effect: Check | None = None


def _create_schema(tx: Transaction, ctx: StepContext, control: ControlAccess) -> str | None:
    # A spare of the server's warm pool when one is ready there (claimed on control, renamed
    # in this transaction: pool.server_spares), else an empty schema. With the pool off, no
    # claim: no round trip to control's pool (a claim a run with the pool on left behind is
    # the keeper's to drop once the job is done, as any abandoned claim).
    taken = None
    if control.server is not None and ctx.pool:
        taken = pool.take_on_server(tx, control.conn, control.server, ctx.tenant, ctx.app_roles)
    if taken is None:
        tenant_schema.create_schema(tx.pg, ctx.tenant.schema)
        return None
    return taken.detail


def _mark_provisioning(conn: psycopg.Connection[Any], ctx: StepContext) -> str | None:
    # With the checkpoint: a spare the server side took is the tenant's schema now, its record
    # goes (nothing when none was taken; safe to run again, as on an adoption). With the pool
    # off, left alone: a claim of an earlier run with the pool on, renamed or not, is an
    # abandoned claim once the job is done, which the keeper forgets or drops by its name.
    if ctx.pool:
        pool.finish_take(conn, ctx.tenant)
    tenants.mark_provisioning(conn, ctx.tenant)
    return None


def _migrate(tx: Transaction, ctx: StepContext, control: ControlAccess) -> str | None:
    """The schema to head. One behind it (a fleet upgrade's job): the verified replay of the
    new revisions (:meth:`UpgradeCache.upgrade_placed`, control's stored reference), else
    Alembic. A new schema: the template's verified replay (control's stored reference, computed
    there once if missing, proven again here by the fingerprint), else Alembic."""
    schema = ctx.tenant.schema
    source = ReferenceSource(connection_key(control.conn), control.transaction)
    upgraded = ctx.upgrades.upgrade_placed(
        tx,
        schema,
        lock_timeout_ms=ctx.lock_timeout_ms,
        app_roles=ctx.app_roles,
        holder=ctx.templates.holder,
        source=source,
    )
    if upgraded is not None:
        return upgraded
    tree = migrations.tenant_tree_state()
    if tenant_schema.object_count(tx.pg, schema) != 0:
        migrations.upgrade_tenant(tx.sa, schema)
        return "alembic: the schema holds objects"
    reason = ctx.templates.disabled.get(tree.digest)
    if reason is None:
        try:
            reference = _reference(ctx, control, tree, tx)
        except TemplateUnusable as exc:
            reason = ctx.templates.disabled[tree.digest] = f"template capture failed: {exc}"
        else:
            problem = replay(tx, schema, reference)
            if problem is None:
                return "template (verified replay of control's reference)"
            reason = problem
    migrations.upgrade_tenant(tx.sa, schema)
    return f"alembic: {reason}"


def _reference(
    ctx: StepContext, control: ControlAccess, tree: migrations.TreeState, waiting: Transaction
) -> Reference:
    """Control's reference of the tree state: memoised by the engine, else read or computed
    and stored in a control transaction of its own (:meth:`TemplateCache.reference`), the
    server's transaction (``waiting``) kept alive meanwhile (computing it may outlast its idle
    timeout: :func:`provisioner.db.kept_alive`)."""
    found = ctx.templates.remembered(control.conn, tree.digest)
    if found is not None:
        return found
    with kept_alive(waiting.pg), control.transaction() as ctx_tx:
        return ctx.templates.reference(ctx_tx, tree)


def _grant(tx: Transaction, ctx: StepContext, control: ControlAccess) -> str | None:
    # A taken spare carries every grant (the take granted USAGE): one check of every ACL.
    if pool.grant_usage_if_in_place(tx.pg, ctx.tenant.schema, ctx.app_roles):
        return GRANTS_IN_PLACE
    tenant_schema.grant_app_roles(tx.pg, ctx.tenant.schema, ctx.app_roles)
    return None


#: The grant step (provisioning's, and restore's: :mod:`provisioner.kinds.placed_lifecycle`).
GRANT_PLACED = PlacedStep(
    "grant_app_rw",
    _grant,
    lambda tx, ctx, control: (
        not tenant_schema.missing_app_grants(tx.pg, ctx.tenant.schema, ctx.app_roles)
    ),
)


def _declared(ctx: StepContext) -> tuple[seeds.Seed, ...]:
    return seeds.declared(ctx.seeds, migrations.tenant_tree())


def _seed(tx: Transaction, ctx: StepContext, control: ControlAccess) -> str | None:
    return seeds.apply(tx.pg, ctx.tenant, _declared(ctx), SEEDS_TABLE).detail


def _check_storage(conn: psycopg.Connection[Any], ctx: StepContext) -> str | None:
    ctx.store.check()
    return ctx.store.describe()


def _activate(conn: psycopg.Connection[Any], ctx: StepContext) -> str | None:
    tenants.activate_onboarding(conn, ctx.tenant)
    return None


#: provision_tenant on a tenant server: the same six steps, by name.
PROVISION_PLACED: tuple[PlacedStep, ...] = (
    PlacedStep(
        "create_schema",
        _create_schema,
        lambda tx, ctx, control: tenant_schema.schema_ready(tx.pg, ctx.tenant.schema),
        _mark_provisioning,
    ),
    PlacedStep(
        "run_tenant_migrations",
        _migrate,
        lambda tx, ctx, control: migrations.tenant_at_head(tx.pg, ctx.tenant.schema),
    ),
    GRANT_PLACED,
    PlacedStep(
        "seed_role_profiles",
        _seed,
        lambda tx, ctx, control: seeds.seeded(tx.pg, ctx.tenant, _declared(ctx), SEEDS_TABLE),
    ),
    PlacedStep("verify_object_storage", control=_check_storage),
    PlacedStep(
        "activate_onboarding",
        control=_activate,
        control_effect=lambda conn, ctx: tenants.onboarding_active(conn, ctx.tenant),
    ),
)
