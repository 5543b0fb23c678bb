"""A repair killed with SIGKILL inside its step restores nothing (the step and its record are one
transaction); killed after it, everything. Either way the next ``repair`` ends clean, and the
application role's view is the restored one."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import psycopg
import pytest

from provisioner import service
from provisioner.kinds.repair import REPAIR_JOB_TYPE
from provisioner.models import JobStatus
from provisioner.settings import Settings
from provisioner.testing import Tenant
from tests.conftest import Database
from tests.workers import kill_frozen

CHILD = Path(__file__).with_name("repair_child.py")


def app_can_delete(database: Database) -> bool:
    try:
        with database.app() as app:
            app.execute("DELETE FROM tenant_victim.audit_events")
    except psycopg.errors.InsufficientPrivilege:
        return False
    return True


@pytest.mark.parametrize("outcome", ["started", "done"])
def test_sigkill_during_a_repair_then_repair_again_ends_clean(
    settings: Settings,
    database: Database,
    tenant_factory: Callable[..., Tenant],
    outcome: str,
) -> None:
    tenant_factory("victim", settings=settings)
    with database.owner() as conn:
        conn.execute("REVOKE DELETE ON tenant_victim.audit_events FROM app_rw")
        conn.execute("DROP INDEX tenant_victim.audit_events_actor_idx")

    kill_frozen(settings, CHILD, "victim", "restore_catalog", outcome)
    killed = service.check(settings, ["victim"]).tenants[0]
    assert killed.state.value == ("drifted" if outcome == "started" else "clean")
    assert app_can_delete(database) is (outcome == "done")

    report = service.repair(settings, ["victim"])
    assert service.check(settings, ["victim"]).tenants[0].state.value == "clean"
    assert app_can_delete(database)
    with database.owner() as conn:
        row = conn.execute(
            "SELECT status, attempts FROM control.platform_jobs WHERE job_type = %s",
            (REPAIR_JOB_TYPE,),
        ).fetchone()
    if outcome == "started":  # the killed attempt, then the one that finished
        (result,) = report.results
        assert result.job is not None and result.job.status is JobStatus.SUCCEEDED
        assert row == ("succeeded", 2)
    else:  # the killed process had committed the step and the job: nothing left to do
        assert report.results == []
        assert row == ("succeeded", 1)
