"""The repair kind's step for a tenant placed on a tenant server (:mod:`provisioner.kinds.repair`;
the two sides of a step: :mod:`provisioner.kinds.placed`).

``restore_catalog`` builds the head's shape, compares and restores on the tenant's server, in
its transaction there with the journal row and the fence (the tenant's state, which decides
whether the application role's access belongs to that shape, read on control). The check it
leaves is recorded on control in the checkpoint's transaction, from the run's memo
(:class:`RepairMemo`). A run that adopts the step after a crash has no memo and records no
check: ``repair`` checks every tenant it ran again afterwards, and records that.
"""

from __future__ import annotations

from typing import Any

import psycopg

from provisioner.db import Transaction
from provisioner.kinds.placed import ControlAccess, PlacedStep
from provisioner.kinds.repair import CHECKED_BY, RepairMemo, current_plan, restore
from provisioner.kinds.step import StepContext
from provisioner.tenant import checks
from provisioner.tenant import row as tenants


def _restore(tx: Transaction, ctx: StepContext, control: ControlAccess) -> str | None:
    detail, check = restore(tx, ctx, tenants.state_of(control.conn, ctx.tenant))
    if isinstance(ctx.memo, RepairMemo):
        ctx.memo.check = check
    return detail


def _nothing_to_restore(tx: Transaction, ctx: StepContext, control: ControlAccess) -> bool:
    return not current_plan(tx, ctx, tenants.state_of(control.conn, ctx.tenant)).actions


def _record_check(conn: psycopg.Connection[Any], ctx: StepContext) -> str | None:
    check = ctx.memo.check if isinstance(ctx.memo, RepairMemo) else None
    if check is not None:
        checks.record(conn, [check], CHECKED_BY)
    return None


REPAIR_PLACED: tuple[PlacedStep, ...] = (
    PlacedStep("restore_catalog", _restore, _nothing_to_restore, _record_check),
)
