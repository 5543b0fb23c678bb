"""Tenant states as one enum, transitions in one table: the table, the guarded UPDATEs' SQL, the
database's CHECK constraint and the lifecycle kinds all say the same thing."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from provisioner.kinds import lifecycle
from provisioner.kinds import provision as provision_kind
from provisioner.tenant import row
from provisioner.tenant.state import INACTIVE, LIVE, TRANSITIONS, TenantState

ROOT = Path(__file__).resolve().parents[2]


def guard_states(statement: str) -> set[str]:
    """The states a guarded UPDATE's WHERE clause moves a tenant from."""
    where = statement.split("WHERE", 1)[1]
    if found := re.search(r"state IN \(([^)]*)\)", where):
        return set(re.findall(r"'(\w+)'", found.group(1)))
    if found := re.search(r"state = '(\w+)'", where):
        return {found.group(1)}
    if found := re.search(r"state <> '(\w+)'", where):
        return {s.value for s in TenantState} - {found.group(1)}
    raise AssertionError(f"no state guard in {statement}")


def set_state(statement: str) -> set[str]:
    """The state a guarded UPDATE's SET clause moves a tenant to (empty: computed)."""
    assignments = statement.split("WHERE", 1)[0]
    return set(re.findall(r"(?:SET|,)\s*state = '(\w+)'", assignments))


@pytest.mark.parametrize("name", sorted(TRANSITIONS))
def test_each_transition_is_spelled_by_its_guarded_update(name: str) -> None:
    transition = TRANSITIONS[name]
    statement = getattr(row, name)
    assert guard_states(statement) == {s.value for s in transition.from_states}
    moved_to = set_state(statement)
    if name == "RESTORE":  # back to the state before suspension, onboarding when unknown
        assert not moved_to and "coalesce(previous_state, 'onboarding')" in statement
        assert transition.to_states == LIVE
    else:
        assert moved_to == {s.value for s in transition.to_states}


def test_the_enum_is_the_check_constraint() -> None:
    migration = ROOT / "control_migrations/versions/20260802_c006_lifecycle.py"
    check = re.search(r"CHECK \(state IN \(([^)]*)\)\)", migration.read_text())
    assert check is not None
    assert re.findall(r"'(\w+)'", check.group(1)) == [s.value for s in TenantState]


def test_lifecycle_kinds_read_the_table() -> None:
    assert {rule.transition.name for rule in lifecycle.RULES.values()} == {
        "SUSPEND",
        "RESTORE",
        "ARCHIVE",
        "DELETE",
    }
    purge = lifecycle.RULES[lifecycle.PURGE_JOB_TYPE]
    assert TenantState.DELETED not in purge.from_states
    assert purge.done_states == (TenantState.DELETED,)
    (provision,) = provision_kind.JOB_KINDS
    assert provision.refused_states == INACTIVE


def test_a_state_prints_and_serialises_as_its_value() -> None:
    assert f"{TenantState.SUSPENDED}" == "suspended"
    assert " or ".join(LIVE) == "onboarding or active"
    assert TenantState("archived") is TenantState.ARCHIVED
