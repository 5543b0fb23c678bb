"""deprovision, purge and restore killed with SIGKILL at every step boundary (and inside a step)
finish on re-run with the same end state, seen from outside as ``app_rw``.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import psycopg
import pytest

from provisioner import kinds, service
from provisioner.errors import WrongState
from provisioner.models import JobStatus
from provisioner.settings import Settings
from provisioner.tenant.fingerprint import fingerprint
from provisioner.testing import Tenant
from tests.conftest import Database
from tests.workers import kill_frozen

CHILD = Path(__file__).with_name("lifecycle_child.py")


def kill_at(settings: Settings, tenant: str, job_type: str, step: str, outcome: str) -> None:
    kill_frozen(settings, CHILD, tenant, job_type, step, outcome)


def end_state(database: Database, tenant: str) -> tuple[str, object]:
    """(control.tenants.state, what app_rw gets from the tenant's role_profiles)."""
    with database.owner() as conn:
        row = conn.execute(
            "SELECT state FROM control.tenants WHERE tenant_id = %s", (tenant,)
        ).fetchone()
    assert row is not None
    try:
        with database.app() as conn:
            seen: object = conn.execute(
                f"SELECT count(*) FROM tenant_{tenant}.role_profiles"
            ).fetchone()
    except psycopg.errors.InsufficientPrivilege:
        seen = "permission denied"
    except psycopg.errors.UndefinedTable:
        seen = "schema gone"
    return row[0], seen


CASES = [
    (kind, step, "done")
    for kind in ("deprovision_tenant", "purge_tenant", "restore_tenant")
    for step in kinds.BUILTIN[kind].step_names
] + [
    ("deprovision_tenant", "revoke_app_rw", "started"),
    ("purge_tenant", "drop_schema", "started"),
    ("restore_tenant", "grant_app_rw", "started"),
]

EXPECTED = {
    "deprovision_tenant": ("archived", "permission denied"),
    "purge_tenant": ("deleted", "schema gone"),
    "restore_tenant": ("onboarding", (4,)),
}


@pytest.mark.parametrize(
    ("kind", "step", "outcome"), CASES, ids=[f"{k}-{s}-{o}" for k, s, o in CASES]
)
def test_sigkill_then_rerun_reaches_the_same_end_state(
    settings: Settings,
    database: Database,
    tenant_factory: Callable[..., Tenant],
    kind: str,
    step: str,
    outcome: str,
) -> None:
    tenant_factory("victim", settings=settings)  # a provisioned tenant in this test's database
    with database.owner() as conn:
        provisioned = fingerprint(conn, "tenant_victim")
    if kind == "restore_tenant":
        service.change_lifecycle(settings, "victim", "deprovision_tenant")

    kill_at(settings, "victim", kind, step, outcome)
    # A kill after the last step finds the job complete (that step's transaction completed it):
    # a second restore is then refused like any restore of a tenant that is not suspended.
    last = outcome == "done" and step == kinds.BUILTIN[kind].step_names[-1]
    if last and kind == "restore_tenant":
        with pytest.raises(WrongState):
            service.change_lifecycle(settings, "victim", kind)
        assert end_state(database, "victim") == EXPECTED[kind]
        return
    result = service.change_lifecycle(settings, "victim", kind)

    assert result.job is not None and result.job.status is JobStatus.SUCCEEDED
    # The killed attempt, then the one that finished (or only the killed one, when it was done).
    assert result.job.attempts == (1 if last else 2)
    assert end_state(database, "victim") == EXPECTED[kind]
    if kind == "restore_tenant":
        with database.owner() as conn:
            assert fingerprint(conn, "tenant_victim") == provisioned
    with database.owner() as conn:
        abandoned = conn.execute(
            "SELECT step FROM control.job_step_runs WHERE tenant_id = 'victim' "
            "AND outcome = 'abandoned'"
        ).fetchall()
    # Killed inside a step: that step's run. Killed after a step that is not the last: the next
    # step's run, which that step's commit opened (the process died before it began).
    names = kinds.BUILTIN[kind].step_names
    following = None if last else names[names.index(step) + (outcome == "done")]
    assert abandoned == ([] if following is None else [(following,)])
