"""A tenant's lifecycle state (``control.tenants.state``), its named groups, and the one table
of transitions every other module reads.

    pending -> provisioning -> onboarding -> (active)
    onboarding/active -> suspended -> (restore) -> the state before suspension
    onboarding/active/suspended -> archived -> (restore) -> the state before suspension
    any state but deleted -> deleted (the schema dropped; the row and history kept)
    deleted -> pending (provision --reuse-deleted)

The states are the ``tenants_state_check`` constraint's (control c006); ``active`` is set by the
product, not by this package. Each transition is one guarded UPDATE in
:mod:`provisioner.tenant.row` whose ``WHERE state ...`` spells :data:`TRANSITIONS`' entry in
SQL; ``tests/unit/test_tenant_state.py`` checks the two agree.

The groups are tuples in the enum's order, not sets: messages list them (``applies to
onboarding or active tenants``) and must read the same on every run.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum


class TenantState(StrEnum):
    """``control.tenants.state``. A StrEnum: it formats, compares and serialises as its value."""

    PENDING = "pending"
    PROVISIONING = "provisioning"
    ONBOARDING = "onboarding"
    ACTIVE = "active"
    SUSPENDED = "suspended"
    ARCHIVED = "archived"
    DELETED = "deleted"


def _in_order(*states: TenantState) -> tuple[TenantState, ...]:
    return tuple(s for s in TenantState if s in states)


#: States in which onboarding has begun; activation never moves a tenant backwards.
ONBOARDED: tuple[TenantState, ...] = _in_order(
    TenantState.ONBOARDING, TenantState.ACTIVE, TenantState.SUSPENDED, TenantState.ARCHIVED
)
#: States in which the tenant is in use: suspend and deprovision start from these.
LIVE: tuple[TenantState, ...] = _in_order(TenantState.ONBOARDING, TenantState.ACTIVE)
#: States in which provision, enqueue (and upgrade) leave the tenant alone.
INACTIVE: tuple[TenantState, ...] = _in_order(
    TenantState.SUSPENDED, TenantState.ARCHIVED, TenantState.DELETED
)
#: States restore starts from.
RESTORABLE: tuple[TenantState, ...] = _in_order(TenantState.SUSPENDED, TenantState.ARCHIVED)


@dataclass(frozen=True)
class Transition:
    """One lifecycle change: the states it moves a tenant from, and the states that mean it is
    done (a tenant already there is left alone; any other state refuses)."""

    name: str
    from_states: tuple[TenantState, ...]
    to_states: tuple[TenantState, ...]


def _transition(name: str, sources: tuple[TenantState, ...], *targets: TenantState) -> Transition:
    return Transition(name, _in_order(*sources), _in_order(*targets))


#: Every transition this package makes, by the name of its statement in :mod:`.row`.
TRANSITIONS: dict[str, Transition] = {
    t.name: t
    for t in (
        _transition("MARK_PROVISIONING", (TenantState.PENDING,), TenantState.PROVISIONING),
        _transition(
            "ACTIVATE_ONBOARDING",
            (TenantState.PENDING, TenantState.PROVISIONING),
            TenantState.ONBOARDING,
        ),
        _transition("SUSPEND", LIVE, TenantState.SUSPENDED),
        _transition("ARCHIVE", (*LIVE, TenantState.SUSPENDED), TenantState.ARCHIVED),
        _transition("RESTORE", RESTORABLE, *LIVE),
        _transition(
            "DELETE",
            tuple(s for s in TenantState if s is not TenantState.DELETED),
            TenantState.DELETED,
        ),
        _transition("REUSE_DELETED", (TenantState.DELETED,), TenantState.PENDING),
    )
}
