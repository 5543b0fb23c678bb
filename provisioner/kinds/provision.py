"""The provisioning kind (``provision_tenant``): six steps, in order, each safe to run again on
its own, and everything else the kind is (:data:`JOB_KINDS`).

A step has ``run`` (do the work inside the engine's transaction) and ``effect_present`` (read
the catalog: is the work still there?). The engine skips a recorded step only when its effect is
present; a step whose effect vanished (a dropped schema, revoked grants) runs again.

The kind also owns what the warm pool adds to a run: the take's memo (:class:`SpareMemo`: a
spare was taken, its grants were in place), which has the later steps join the take's
transaction; the take's statements, prepared ahead on the steps' session
(:data:`provisioner.pool.TAKE_PLANS`); and a fleet upgrade's scope (:func:`upgrade_scope`: the
migration step alone).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import psycopg
from psycopg.rows import dict_row

from provisioner import pool, queue, servers
from provisioner.db import Transaction
from provisioner.errors import InvalidInput
from provisioner.kinds import step
from provisioner.kinds.registry import JobKind, Scope, keyed_by_tenant
from provisioner.kinds.step import RunMemo, Step
from provisioner.models import Job, TenantId
from provisioner.servers.directory import CONTROL_PLACEMENT
from provisioner.templates import migrations, seeds
from provisioner.templates.upgrade import UPGRADE_TO
from provisioner.tenant import row as tenants
from provisioner.tenant import schema as tenant_schema
from provisioner.tenant.state import INACTIVE

__all__ = [
    "JOB_KINDS",
    "MIGRATION_STEP",
    "PROVISION_JOB_TYPE",
    "PROVISION_STEPS",
    "STEPS",
    "SpareMemo",
    "Step",
    "StepContext",
    "ensure_provision_job",
    "ensure_provision_job_async",
    "provision_key",
]

#: The job type of provisioning (the contract's name).
PROVISION_JOB_TYPE = "provision_tenant"
#: Its idempotency key: one provisioning job per tenant, re-opened for each request.
provision_key = keyed_by_tenant("provision")

#: The migration step's name (a fleet upgrade re-opens a job to run it alone).
MIGRATION_STEP = "run_tenant_migrations"


@dataclass
class SpareMemo(RunMemo):
    """A provisioning run's memo: what the take from the warm pool found, for the later steps."""

    #: create_schema took a spare (True) or created the schema (False); None: not run here
    spare_taken: bool | None = None
    #: the taken spare carried every grant but USAGE (read by the take, before its rename)
    spare_grants_in_place: bool = False


@dataclass(frozen=True)
class StepContext(step.StepContext):
    """A provisioning step's context, built outside the engine (a test, a one-off check): its
    memo is the kind's. The engine builds its contexts with :attr:`JobKind.memo`."""

    memo: SpareMemo = field(default_factory=SpareMemo)


def spares(ctx: step.StepContext) -> SpareMemo:
    """The run's warm-pool memo. A run of another kind (restore reuses the grant step) has
    none: a fresh one says that no spare was taken in this run, which is true."""
    return ctx.memo if isinstance(ctx.memo, SpareMemo) else SpareMemo()


def _create_schema(tx: Transaction, ctx: step.StepContext) -> str | None:
    # A spare from the warm pool when one is ready at the head (renamed in this transaction).
    taken = pool.take(tx, ctx.tenant.schema, ctx.app_roles)
    if taken is None:
        tenant_schema.create_schema(tx.pg, ctx.tenant.schema)
    tenants.mark_provisioning(tx.pg, ctx.tenant)
    memo = spares(ctx)
    memo.spare_taken = taken is not None
    memo.spare_grants_in_place = taken is not None and taken.all_but_usage
    # A taken spare's other steps are a few statements each: they join the take's transaction,
    # so that a sign-up's tenant appears whole or not at all (a crash leaves the spare), with
    # one commit where there were six.
    ctx.memo.one_transaction = memo.spare_taken
    return None if taken is None else taken.detail


def _run_tenant_migrations(tx: Transaction, ctx: step.StepContext) -> str | None:
    # A verified replay when it applies (the template for a new schema, the new revisions' DDL
    # for one behind the head), else Alembic; the detail says which ran and why. A schema this
    # run did not create (a fleet upgrade's job) tries the engine's last proven upgrade first.
    taken = spares(ctx).spare_taken
    return ctx.upgrades.migrate(
        tx,
        ctx.tenant.schema,
        lock_timeout_ms=ctx.lock_timeout_ms,
        templates=ctx.templates,
        app_roles=ctx.app_roles,
        versioned=taken is True,
        existing=taken is None,
    )


#: The grant step's detail when a taken spare's grants were in place (the take granted USAGE).
TAKEN_GRANTS = "grants already in place (warm pool): USAGE granted with the take, every ACL checked"
#: ... when a schema's grants were in place but USAGE, read in this step (a job resumed after
#: its create_schema step): USAGE granted here.
GRANTS_IN_PLACE = "grants already in place: USAGE granted, every ACL checked"


def _grant_app_rw(tx: Transaction, ctx: step.StepContext) -> str | None:
    # A taken spare already carries every grant but USAGE, which the take granted: check it,
    # whatever the number of tables (the take read every other ACL before its rename). A
    # schema with its other grants in place (a job resumed after its take) gets USAGE and a
    # check of every ACL in one round trip. Otherwise (a new schema, a restore after a revoke,
    # a spare built without grants) name every table and check, as always. A schema this run
    # created has no grant yet: the one-query check is not tried.
    memo = spares(ctx)
    if memo.spare_grants_in_place and pool.usage_held(tx.pg, ctx.tenant.schema, ctx.app_roles):
        return TAKEN_GRANTS
    fresh = memo.spare_taken is False
    if not fresh and pool.grant_usage_if_in_place(tx.pg, ctx.tenant.schema, ctx.app_roles):
        return GRANTS_IN_PLACE
    tenant_schema.grant_app_roles(tx.pg, ctx.tenant.schema, ctx.app_roles)
    return None


def _project_seeds(ctx: step.StepContext) -> tuple[seeds.Seed, ...]:
    """The seeds the project declares now (read at each run: a changed file is seen)."""
    return seeds.declared(ctx.seeds, migrations.tenant_tree())


def _seed_role_profiles(tx: Transaction, ctx: step.StepContext) -> str | None:
    # The step keeps the contract's name; it applies whatever seeds the project declares.
    return seeds.apply(tx.pg, ctx.tenant, _project_seeds(ctx)).detail


def _verify_object_storage(tx: Transaction, ctx: step.StepContext) -> str | None:
    ctx.store.check()
    return ctx.store.describe()


def _activate_onboarding(tx: Transaction, ctx: step.StepContext) -> str | None:
    tenants.activate_onboarding(tx.pg, ctx.tenant)
    return None


def _always(tx: Transaction, ctx: step.StepContext) -> bool:
    return True


PROVISION_STEPS: tuple[Step, ...] = (
    Step(
        "create_schema",
        _create_schema,
        lambda tx, ctx: tenant_schema.schema_ready(tx.pg, ctx.tenant.schema),
    ),
    Step(
        MIGRATION_STEP,
        _run_tenant_migrations,
        lambda tx, ctx: migrations.tenant_at_head(tx.pg, ctx.tenant.schema),
    ),
    Step(
        "grant_app_rw",
        _grant_app_rw,
        lambda tx, ctx: (
            not tenant_schema.missing_app_grants(tx.pg, ctx.tenant.schema, ctx.app_roles)
        ),
    ),
    Step(
        "seed_role_profiles",
        _seed_role_profiles,
        lambda tx, ctx: seeds.seeded(tx.pg, ctx.tenant, _project_seeds(ctx)),
    ),
    Step("verify_object_storage", _verify_object_storage, _always, uses_database=False),
    Step(
        "activate_onboarding",
        _activate_onboarding,
        lambda tx, ctx: tenants.onboarding_active(tx.pg, ctx.tenant),
    ),
)

#: The six provisioning steps' names, in the order they run (the contract's names: a job's
#: ``steps_completed`` holds them).
STEPS: tuple[str, ...] = tuple(s.name for s in PROVISION_STEPS)


def upgrade_scope(job: Job) -> Scope:
    """A job a fleet upgrade re-opened, for the head the tree has now, runs the migration step
    alone and trusts the other recorded steps without re-checking them (a repair is
    ``provisioner provision``'s job). Re-opened another way, or after the head moved again, the
    job is re-checked as usual."""
    # The tree's state (a stat of every file of it) is read only for a job a rollout
    # re-opened: a sign-up's payload names no head.
    upgrading = (
        UPGRADE_TO in job.payload
        and MIGRATION_STEP not in job.steps_completed
        and job.payload[UPGRADE_TO] == migrations.head_label(migrations.tenant_heads())
    )
    return Scope.PENDING if upgrading else Scope.ALL


JOB_KINDS: tuple[JobKind, ...] = (
    JobKind(
        PROVISION_JOB_TYPE,
        f"{__name__}:PROVISION_STEPS",
        idempotency_key=provision_key,
        default_worker=True,
        command="provision",
        refused_states=INACTIVE,
        description="create, migrate, grant, seed, check storage, start onboarding",
        scope=upgrade_scope,
        memo=SpareMemo,
        prepared_plans=pool.TAKE_PLANS,
        warm_touches=pool.WARM_TOUCHES,
        placed_steps_ref="provisioner.kinds.placed:PROVISION_PLACED",
    ),
)


def ensure_provision_job(
    conn: psycopg.Connection[Any],
    tenant: TenantId,
    *,
    retry_terminal: bool = False,
    started_by: str = "enqueue",
    server: str | None = None,
) -> queue.Enqueued:
    """The tenant's control row and its one provisioning job, created if missing (in the
    caller's transaction, woken on its commit); a new tenant is placed on ``server``, or on the
    least loaded tenant server (:func:`queue.ensure_tenant_job`). ``server`` ``control`` (the
    control database) is taken while placement puts the tenant there anyway: it lives there, or
    it is new and the directory has no server but retired ones; else InvalidInput, nothing written
    (:func:`provisioner.servers.control_placement_problem`)."""
    on_control = server == servers.CONTROL
    if on_control:
        with conn.cursor(row_factory=dict_row) as cur:
            cur.execute(CONTROL_PLACEMENT, {"tenant_id": tenant.value}, prepare=False)
            _refuse_control(tenant, cur.fetchone())
    enqueued = queue.ensure_tenant_job(
        conn,
        tenant,
        PROVISION_JOB_TYPE,
        provision_key(tenant),
        retry_terminal=retry_terminal,
        started_by=started_by,
        server=None if on_control else server,
    )
    if on_control and enqueued.created:
        with conn.cursor(row_factory=dict_row) as cur:
            cur.execute(CONTROL_PLACEMENT, {"tenant_id": tenant.value}, prepare=False)
            _refuse_placed_elsewhere(tenant, cur.fetchone())
    return enqueued


def _refuse_control(tenant: TenantId, found: dict[str, Any] | None) -> None:
    assert found is not None, "the statement returns one row"
    problem = servers.control_placement_problem(tenant, found)
    if problem is not None:
        raise InvalidInput(problem)


def _refuse_placed_elsewhere(tenant: TenantId, found: dict[str, Any] | None) -> None:
    """A server added between the check and the insert got the tenant: refused, so that the
    caller's rollback (the CLI's, an application's on the error) leaves nothing behind."""
    assert found is not None, "the statement returns one row"
    if found["server"] is not None:
        raise InvalidInput(
            f"tenant {tenant} was placed on {found['server']}, not on {servers.CONTROL}: a "
            "tenant server was added meanwhile (roll back; nothing is queued once you do)"
        )


async def ensure_provision_job_async(
    conn: psycopg.AsyncConnection[Any],
    tenant: TenantId,
    *,
    retry_terminal: bool = False,
    started_by: str = "enqueue",
    server: str | None = None,
) -> queue.Enqueued:
    """:func:`ensure_provision_job` for a psycopg ``AsyncConnection``: the same statements, in
    the same round trips, awaited."""
    on_control = server == servers.CONTROL
    if on_control:
        async with conn.cursor(row_factory=dict_row) as cur:
            await cur.execute(CONTROL_PLACEMENT, {"tenant_id": tenant.value}, prepare=False)
            _refuse_control(tenant, await cur.fetchone())
    enqueued = await queue.ensure_tenant_job_async(
        conn,
        tenant,
        PROVISION_JOB_TYPE,
        provision_key(tenant),
        retry_terminal=retry_terminal,
        started_by=started_by,
        server=None if on_control else server,
    )
    if on_control and enqueued.created:
        async with conn.cursor(row_factory=dict_row) as cur:
            await cur.execute(CONTROL_PLACEMENT, {"tenant_id": tenant.value}, prepare=False)
            _refuse_placed_elsewhere(tenant, await cur.fetchone())
    return enqueued
