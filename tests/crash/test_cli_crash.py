"""A one-off provisioning killed with SIGKILL resumes on re-run, running only what is missing.

Each case freezes a real child process at a chosen point, kills it with SIGKILL, provisions
again, and checks the database: the job succeeded, the second attempt ran exactly the steps the
first had not committed, and the schema equals a cleanly provisioned tenant's.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from provisioner import service
from provisioner.engine import StepEvent
from provisioner.kinds.provision import STEPS
from provisioner.models import JobStatus
from provisioner.settings import Settings
from provisioner.tenant.fingerprint import fingerprint
from tests.conftest import Database
from tests.workers import kill_frozen

CHILD = Path(__file__).with_name("provision_child.py")


def kill_at(settings: Settings, tenant: str, step: str, outcome: str) -> None:
    """Run the child until it freezes at (step, outcome), then SIGKILL it."""
    kill_frozen(settings, CHILD, tenant, step, outcome)


def runs(database: Database, tenant: str) -> list[tuple[int, str, str]]:
    with database.owner() as conn:
        return conn.execute(
            "SELECT attempt, step, outcome FROM control.job_step_runs WHERE tenant_id = %s "
            "ORDER BY id",
            (tenant,),
        ).fetchall()


def committed_steps(database: Database, tenant: str) -> list[str]:
    with database.owner() as conn:
        row = conn.execute(
            "SELECT steps_completed FROM control.platform_jobs WHERE tenant_id = %s", (tenant,)
        ).fetchone()
    return list(row[0]) if row else []


@pytest.mark.parametrize("index", range(len(STEPS)), ids=list(STEPS))
def test_sigkill_after_each_step_resumes_with_the_missing_steps(
    settings: Settings, database: Database, clean_fingerprint: dict, index: int
) -> None:
    step = STEPS[index]
    kill_at(settings, "victim", step, "done")
    assert committed_steps(database, "victim") == list(STEPS[: index + 1])

    events: list[StepEvent] = []
    result = service.provision(settings, "victim", on_progress=events.append)

    assert result.job.status is JobStatus.SUCCEEDED
    if step == STEPS[-1]:
        # The last step completes the job in its own transaction: nothing is left to resume.
        assert result.job.attempts == 1
        assert events == []
        assert runs(database, "victim") == [(1, s, "succeeded") for s in STEPS]
        with database.owner() as conn:
            assert fingerprint(conn, "tenant_victim") == clean_fingerprint
        return
    assert result.job.attempts == 2
    assert [e.step for e in events if e.outcome == "done"] == list(STEPS[index + 1 :])
    assert [e.step for e in events if e.outcome == "skipped"] == list(STEPS[: index + 1])
    # The killed step's commit had opened the next step's journal row (its start, at the same
    # instant): the process died before that step began, and the take-over marked it abandoned.
    assert runs(database, "victim") == [(1, s, "succeeded") for s in STEPS[: index + 1]] + [
        (1, STEPS[index + 1], "abandoned")
    ] + [(2, s, "succeeded") for s in STEPS[index + 1 :]]
    with database.owner() as conn:
        assert fingerprint(conn, "tenant_victim") == clean_fingerprint


@pytest.mark.parametrize("step", ["create_schema", "run_tenant_migrations", "grant_app_rw"])
def test_sigkill_inside_a_step_rolls_the_step_back_and_reruns_it(
    settings: Settings, database: Database, clean_fingerprint: dict, step: str
) -> None:
    index = STEPS.index(step)
    kill_at(settings, "victim", step, "started")
    assert committed_steps(database, "victim") == list(STEPS[:index])
    if step == "create_schema":  # its transaction never committed: no schema at all
        with database.owner() as conn:
            found = conn.execute(
                "SELECT count(*) FROM pg_namespace WHERE nspname = 'tenant_victim'"
            ).fetchone()
        assert found == (0,)

    result = service.provision(settings, "victim")

    assert result.job.status is JobStatus.SUCCEEDED
    first, second = (
        [(s, o) for a, s, o in runs(database, "victim") if a == attempt] for attempt in (1, 2)
    )
    assert first == [(s, "succeeded") for s in STEPS[:index]] + [(step, "abandoned")]
    assert second == [(s, "succeeded") for s in STEPS[index:]]
    with database.owner() as conn:
        assert fingerprint(conn, "tenant_victim") == clean_fingerprint
