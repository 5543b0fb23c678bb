"""The repair kind (``repair_tenant``): bring a drifted tenant back to the template head's shape
where that is safe, recorded like every job (``provisioner repair``, or queued for a worker).

One step, ``restore_catalog``, in one transaction with its record: it builds the head's
inventory (:mod:`provisioner.templates.expected`, rolled back), reads the tenant's, compares
them, and applies what :mod:`provisioner.tenant.repairs` says is safe (each action under its own
savepoint). Its detail names what was restored, what failed and what was left alone and
why; what is left different is recorded as the tenant's last check
(:mod:`provisioner.tenant.checks`). A suspended or archived tenant is compared with the
head's shape without the application role's privileges (revoked by design), so repair never
gives it its access back.

Refused (the job fails at once): a tenant being provisioned (``provision`` finishes it) or
deleted. A tenant behind the head, or without its version table, is not repaired either
(``upgrade``, ``provision``): comparing it with the head would undo the migrations it lacks.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from provisioner.db import Transaction
from provisioner.errors import PermanentError
from provisioner.kinds.registry import JobKind, keyed_by_tenant
from provisioner.kinds.step import RunMemo, Step, StepContext
from provisioner.roles import AppRoles
from provisioner.templates import expected, migrations
from provisioner.tenant import catalog, checks, repairs
from provisioner.tenant import row as tenants
from provisioner.tenant import schema as tenant_schema
from provisioner.tenant.state import TenantState

REPAIR_JOB_TYPE = "repair_tenant"

#: States in which the application role's privileges are revoked by design.
REVOKED_STATES = (TenantState.SUSPENDED, TenantState.ARCHIVED)


def expected_for(
    head: catalog.Inventory, state: TenantState | None, app_roles: AppRoles
) -> catalog.Inventory:
    """The head's shape as a tenant in ``state`` should hold it."""
    return catalog.without_access_of(head, app_roles) if state in REVOKED_STATES else head


def current_plan(
    tx: Transaction, ctx: StepContext, state: TenantState | None = None
) -> repairs.Plan:
    """The tenant's repair plan now, in the step's transaction; ``state``: the tenant's (read
    in ``tx`` when not given: the control database's)."""
    return _planner(tx, ctx, state)()[1]


#: What ``control.tenant_checks`` records as the author of a repair job's check.
CHECKED_BY = "repair_tenant job"


@dataclass
class RepairMemo(RunMemo):
    """A repair run's memo: the check its step left, for a tenant server's run to record on
    control (:mod:`provisioner.kinds.placed_repair`)."""

    check: checks.CheckRecord | None = None


def _planner(
    tx: Transaction, ctx: StepContext, state: TenantState | None = None
) -> Callable[[], tuple[list[catalog.Difference], repairs.Plan]]:
    """The tenant's differences and plan as it is at each call, against the head's shape
    built once (``state``: the tenant's, read in ``tx`` when not given)."""
    schema = ctx.tenant.schema
    versions = migrations.tenant_versions(tx.pg, schema)
    if versions is None:
        raise PermanentError(
            f"{schema} has no alembic_version table: `provisioner provision {ctx.tenant}` "
            "rebuilds what provisioning made"
        )
    heads = migrations.tenant_heads()
    if versions != heads:
        raise PermanentError(
            f"{schema} is at {migrations.head_label(versions) or '(no revision)'}, the head is "
            f"{migrations.head_label(heads)}: `provisioner upgrade {ctx.tenant}` first"
        )
    head = expected.build(tx.pg, tx.sa, ctx.app_roles)
    if state is None:
        state = tenants.state_of(tx.pg, ctx.tenant)
    want = expected_for(head, state, ctx.app_roles)
    owner = tenant_schema.schema_owner(tx.pg, schema)[1]

    def plan() -> tuple[list[catalog.Difference], repairs.Plan]:
        found = catalog.read(tx.pg, schema)
        if found is None:
            raise PermanentError(f"{schema} does not exist: `provisioner provision {ctx.tenant}`")
        differences = catalog.compare(want, found)
        return differences, repairs.plan(tx.pg, schema, differences, owner=owner)

    return plan


def _restore(tx: Transaction, ctx: StepContext) -> str | None:
    detail, check = restore(tx, ctx, None)
    # What is left is the tenant's check now: recorded with the step, for the fleet's figures.
    checks.record(tx.pg, [check], CHECKED_BY)
    return detail


def restore(
    tx: Transaction, ctx: StepContext, state: TenantState | None
) -> tuple[str, checks.CheckRecord]:
    """Plan and apply, then once more: what belongs to an object created again (a view's
    grants, a column of a restored type) is only seen once that object exists. The detail,
    and the tenant's check as it is left (``state``: see :func:`_planner`)."""
    planner = _planner(tx, ctx, state)
    left, plan = planner()
    applied = repairs.apply(tx.pg, plan.actions)
    if applied.restored:
        _, plan = planner()
        tried = {what for what, _ in applied.failed}
        more = repairs.apply(tx.pg, [a for a in plan.actions if a.what not in tried])
        applied = repairs.Applied(applied.restored + more.restored, applied.failed + more.failed)
    if applied.restored:
        left, _ = planner()
    parts = [f"restored {len(applied.restored)}"]
    if applied.restored:
        parts[0] += ": " + "; ".join(applied.restored)
    if applied.failed:
        parts.append(
            f"failed {len(applied.failed)}: " + "; ".join(f"{w} ({r})" for w, r in applied.failed)
        )
    if plan.left_alone:
        parts.append(
            f"left alone {len(plan.left_alone)}: "
            + "; ".join(f"{a.what} ({a.reason})" for a in plan.left_alone)
        )
    return " | ".join(parts), checks.of_differences(ctx.tenant.value, left)


def _nothing_to_restore(tx: Transaction, ctx: StepContext) -> bool:
    return not current_plan(tx, ctx).actions


RESTORE_CATALOG = Step("restore_catalog", _restore, _nothing_to_restore)
REPAIR_STEPS: tuple[Step, ...] = (RESTORE_CATALOG,)

JOB_KINDS: tuple[JobKind, ...] = (
    JobKind(
        REPAIR_JOB_TYPE,
        f"{__name__}:REPAIR_STEPS",
        idempotency_key=keyed_by_tenant(REPAIR_JOB_TYPE),
        command="repair",
        refused_states=(TenantState.PENDING, TenantState.PROVISIONING, TenantState.DELETED),
        description="restore what drifted from the template head where it is safe",
        memo=RepairMemo,
        placed_steps_ref="provisioner.kinds.placed_repair:REPAIR_PLACED",
    ),
)
