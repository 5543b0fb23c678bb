"""The steps of a tenant's life after onboarding: suspend, restore, deprovision, purge.

Each kind (:data:`JOB_KINDS`, registered in :mod:`provisioner.kinds.registry`) runs through a
job row like provisioning:
every step in one transaction with its record, skipped on a resume only when the catalog (or
``control.tenants``) still shows its effect, so a SIGKILL at any point resumes to the same end.

* ``suspend_tenant``: revoke_app_rw, mark_suspended. ``app_rw`` loses every privilege on the
  schema in one transaction (its next query gets ``permission denied``); the data stays.

A tenant that leaves the fleet (suspended, archived, purged) leaves its rollouts in the
transaction that changes its state: an upgrade job still queued (or held) there goes back to
succeeded and the tenant is counted ``skipped``, never ``failed``
(:func:`provisioner.queue.skip_departed_tenant`).
* ``restore_tenant``: grant_app_rw (the provisioning step's own grants and catalog check),
  mark_restored (back to the state before suspension or archival).
* ``deprovision_tenant``: revoke_app_rw, mark_archived (data kept, restorable).
* ``purge_tenant``: revoke_app_rw, drop_schema (``DROP SCHEMA ... CASCADE``), mark_deleted. The
  control rows and every job's history stay as the audit record. A tenant still ``pending``
  never had its schema made by the tool (:func:`made`): its purge revokes and drops nothing,
  and says whether a schema of that name exists (someone else's, left as it is).

For a tenant on a tenant server, each kind runs the same steps split in two
(:mod:`provisioner.kinds.placed_lifecycle`): the schema's side on its server, the state change
(:class:`Mark`) on control.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import psycopg

from provisioner import queue
from provisioner.db import Transaction
from provisioner.kinds.provision import PROVISION_STEPS
from provisioner.kinds.registry import JobKind, keyed_by_tenant
from provisioner.kinds.step import Step, StepContext
from provisioner.tenant import row as tenants
from provisioner.tenant import schema as tenant_schema
from provisioner.tenant.state import INACTIVE, TRANSITIONS, TenantState, Transition

SUSPEND_JOB_TYPE = "suspend_tenant"
RESTORE_JOB_TYPE = "restore_tenant"
DEPROVISION_JOB_TYPE = "deprovision_tenant"
PURGE_JOB_TYPE = "purge_tenant"


@dataclass(frozen=True)
class Rule:
    """A lifecycle kind's transition (:data:`provisioner.tenant.state.TRANSITIONS`): the states
    it starts from, the states that mean it is done, and the verb that reports it."""

    job_type: str
    transition: Transition
    verb: str

    @property
    def from_states(self) -> tuple[TenantState, ...]:
        return self.transition.from_states

    @property
    def done_states(self) -> tuple[TenantState, ...]:
        return self.transition.to_states


RULES: dict[str, Rule] = {
    SUSPEND_JOB_TYPE: Rule(SUSPEND_JOB_TYPE, TRANSITIONS["SUSPEND"], "suspended"),
    RESTORE_JOB_TYPE: Rule(RESTORE_JOB_TYPE, TRANSITIONS["RESTORE"], "restored"),
    DEPROVISION_JOB_TYPE: Rule(DEPROVISION_JOB_TYPE, TRANSITIONS["ARCHIVE"], "archived"),
    PURGE_JOB_TYPE: Rule(PURGE_JOB_TYPE, TRANSITIONS["DELETE"], "purged"),
}


def made(conn: psycopg.Connection[Any], ctx: StepContext) -> bool:
    """Whether the tool ever made the tenant's schema, read on control (``conn``): a tenant
    still ``pending`` never had one made (``create_schema`` marks it ``provisioning`` in the
    transaction that makes or takes the schema, :mod:`provisioner.kinds.provision`), so a
    schema bearing its name is someone else's, and purging the tenant leaves it alone."""
    return tenants.state_of(conn, ctx.tenant) is not TenantState.PENDING


def left_alone(conn: psycopg.Connection[Any], ctx: StepContext) -> str:
    """A skipped step's detail: what was not touched, and whether a schema of that name exists
    (on ``conn``, the schema's server)."""
    found = tenant_schema.object_count(conn, ctx.tenant.schema) is not None
    there = f"; schema {ctx.tenant.schema} exists and is left as it is" if found else ""
    return f"nothing done: the tenant is pending, the tool never made its schema{there}"


def _revoke_app_rw(tx: Transaction, ctx: StepContext) -> str | None:
    if not made(tx.pg, ctx):
        return left_alone(tx.pg, ctx)
    tenant_schema.revoke_app_roles(tx.pg, ctx.tenant.schema, ctx.app_roles)
    return None


def _revoked(tx: Transaction, ctx: StepContext) -> bool:
    if not made(tx.pg, ctx):
        return True
    return tenant_schema.app_roles_cut_off(tx.pg, ctx.tenant.schema, ctx.app_roles)


def _drop_schema(tx: Transaction, ctx: StepContext) -> str | None:
    if not made(tx.pg, ctx):
        return left_alone(tx.pg, ctx)
    # Bounded by the lock timeout: DROP SCHEMA ... CASCADE needs every table's strongest lock,
    # so an application transaction on one of them would hold the purge (and every query
    # queued behind it) for as long as it lives. It gives up instead and is retried, without
    # spending an attempt, until that transaction has ended (queue.FAIL_OR_RETRY).
    tenant_schema.drop_schema(tx.pg, ctx.tenant.schema, lock_timeout_ms=ctx.lock_timeout_ms)
    return None


def _schema_gone(tx: Transaction, ctx: StepContext) -> bool:
    if not made(tx.pg, ctx):
        return True
    return tenant_schema.object_count(tx.pg, ctx.tenant.schema) is None


@dataclass(frozen=True)
class Mark:
    """A step moving ``control.tenants.state`` with one guarded UPDATE (``statement``, which
    spells ``transition`` in SQL), on a control session: the control database's step and the
    control side of a tenant server's (:mod:`provisioner.kinds.placed_lifecycle`). Safe to run
    again: a tenant already in the target states stays there."""

    statement: str
    transition: Transition

    def run(self, conn: psycopg.Connection[Any], ctx: StepContext) -> str | None:
        target = self.transition.to_states
        state = tenants.transition(conn, ctx.tenant, self.statement, target)
        if not all(s in INACTIVE for s in target):
            return f"state {state}"
        # Out of the fleet: an upgrade still waiting in a rollout is skipped now, in this
        # transaction, so it can never run, fail on the tenant's state and trip a brake.
        steps = [step.name for step in PROVISION_STEPS]
        skipped = queue.skip_departed_tenant(conn, ctx.tenant.value, steps, f"tenant {state}")
        return f"state {state}" + "".join(f"; skipped in rollout {r}" for r in skipped)

    def present(self, conn: psycopg.Connection[Any], ctx: StepContext) -> bool:
        """The effect: the tenant is in the transition's target states."""
        return tenants.state_of(conn, ctx.tenant) in self.transition.to_states


def _mark(name: str, mark: Mark) -> Step:
    """The control database's step of ``mark``."""
    return Step(
        name, lambda tx, ctx: mark.run(tx.pg, ctx), lambda tx, ctx: mark.present(tx.pg, ctx)
    )


#: Each lifecycle kind's state change (its last step), by the step's name.
MARKS: dict[str, Mark] = {
    "mark_suspended": Mark(tenants.SUSPEND, TRANSITIONS["SUSPEND"]),
    "mark_restored": Mark(tenants.RESTORE, TRANSITIONS["RESTORE"]),
    "mark_archived": Mark(tenants.ARCHIVE, TRANSITIONS["ARCHIVE"]),
    "mark_deleted": Mark(tenants.DELETE, TRANSITIONS["DELETE"]),
}


REVOKE_APP_RW = Step("revoke_app_rw", _revoke_app_rw, _revoked)
GRANT_APP_RW = next(step for step in PROVISION_STEPS if step.name == "grant_app_rw")
DROP_SCHEMA = Step("drop_schema", _drop_schema, _schema_gone)

SUSPEND_STEPS: tuple[Step, ...] = (
    REVOKE_APP_RW,
    _mark("mark_suspended", MARKS["mark_suspended"]),
)
RESTORE_STEPS: tuple[Step, ...] = (
    GRANT_APP_RW,
    _mark("mark_restored", MARKS["mark_restored"]),
)
DEPROVISION_STEPS: tuple[Step, ...] = (
    REVOKE_APP_RW,
    _mark("mark_archived", MARKS["mark_archived"]),
)
PURGE_STEPS: tuple[Step, ...] = (
    REVOKE_APP_RW,
    DROP_SCHEMA,
    _mark("mark_deleted", MARKS["mark_deleted"]),
)


#: Where each kind's steps for a tenant on a tenant server live.
PLACED = "provisioner.kinds.placed_lifecycle"

JOB_KINDS: tuple[JobKind, ...] = (
    JobKind(
        SUSPEND_JOB_TYPE,
        f"{__name__}:SUSPEND_STEPS",
        placed_steps_ref=f"{PLACED}:SUSPEND_PLACED",
        idempotency_key=keyed_by_tenant(SUSPEND_JOB_TYPE),
        command="suspend",
        description="revoke the application role's access; data untouched",
    ),
    JobKind(
        RESTORE_JOB_TYPE,
        f"{__name__}:RESTORE_STEPS",
        placed_steps_ref=f"{PLACED}:RESTORE_PLACED",
        idempotency_key=keyed_by_tenant(RESTORE_JOB_TYPE),
        command="restore",
        description="grant the application role's access again; back to the earlier state",
    ),
    JobKind(
        DEPROVISION_JOB_TYPE,
        f"{__name__}:DEPROVISION_STEPS",
        placed_steps_ref=f"{PLACED}:DEPROVISION_PLACED",
        idempotency_key=keyed_by_tenant(DEPROVISION_JOB_TYPE),
        command="deprovision",
        description="revoke access and archive; data kept, restorable",
    ),
    JobKind(
        PURGE_JOB_TYPE,
        f"{__name__}:PURGE_STEPS",
        placed_steps_ref=f"{PLACED}:PURGE_PLACED",
        idempotency_key=keyed_by_tenant(PURGE_JOB_TYPE),
        command="deprovision --purge",
        description="revoke access and drop the schema; control rows and history kept",
    ),
)
