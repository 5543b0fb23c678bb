"""The lifecycle kinds' steps for a tenant placed on a tenant server
(:mod:`provisioner.kinds.lifecycle`; the two sides of a step: :mod:`provisioner.kinds.placed`).

Each kind has the same steps, by name, as on the control database: the schema's side (revoke
or grant the application roles' access, drop the schema) commits on the tenant's server with
its journal row and the fence; the state change (``mark_*``) runs on control in the
checkpoint's transaction, where a tenant already in the target state stays there (safe to run
again). The application role's access is the server's: the revoke and the grant act on the
schema there, and each side's catalog check reads the server's catalog.
"""

from __future__ import annotations

from provisioner.db import Transaction
from provisioner.kinds.lifecycle import MARKS, left_alone, made
from provisioner.kinds.placed import GRANT_PLACED, ControlAccess, PlacedStep
from provisioner.kinds.step import StepContext
from provisioner.tenant import schema as tenant_schema


def _revoke(tx: Transaction, ctx: StepContext, control: ControlAccess) -> str | None:
    if not made(control.conn, ctx):  # a pending tenant's schema is not the tool's
        return left_alone(tx.pg, ctx)
    tenant_schema.revoke_app_roles(tx.pg, ctx.tenant.schema, ctx.app_roles)
    return None


def _revoked(tx: Transaction, ctx: StepContext, control: ControlAccess) -> bool:
    if not made(control.conn, ctx):
        return True
    return tenant_schema.app_roles_cut_off(tx.pg, ctx.tenant.schema, ctx.app_roles)


def _drop(tx: Transaction, ctx: StepContext, control: ControlAccess) -> str | None:
    if not made(control.conn, ctx):
        return left_alone(tx.pg, ctx)
    # Bounded by the lock timeout, as on control (lifecycle._drop_schema): an application
    # transaction on one of the tables makes the purge give up and retry, never queue behind it.
    tenant_schema.drop_schema(tx.pg, ctx.tenant.schema, lock_timeout_ms=ctx.lock_timeout_ms)
    return None


def _dropped(tx: Transaction, ctx: StepContext, control: ControlAccess) -> bool:
    if not made(control.conn, ctx):
        return True
    return tenant_schema.object_count(tx.pg, ctx.tenant.schema) is None


def _mark(name: str) -> PlacedStep:
    """The kind's state change, on control alone."""
    mark = MARKS[name]
    return PlacedStep(name, control=mark.run, control_effect=mark.present)


REVOKE_PLACED = PlacedStep("revoke_app_rw", _revoke, _revoked)
DROP_PLACED = PlacedStep("drop_schema", _drop, _dropped)

SUSPEND_PLACED: tuple[PlacedStep, ...] = (REVOKE_PLACED, _mark("mark_suspended"))
RESTORE_PLACED: tuple[PlacedStep, ...] = (GRANT_PLACED, _mark("mark_restored"))
DEPROVISION_PLACED: tuple[PlacedStep, ...] = (REVOKE_PLACED, _mark("mark_archived"))
PURGE_PLACED: tuple[PlacedStep, ...] = (REVOKE_PLACED, DROP_PLACED, _mark("mark_deleted"))
