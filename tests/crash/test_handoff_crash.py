"""A worker child SIGKILLed between two handed-off jobs (provisioner/engine/handoff.py).

The commit that completes a child's job also claims its next job, opens that job's first
journal row and begins its first transaction (``COMMIT; BEGIN; <tenant lock>``). Each test
stops a real child at one seam around that commit, kills it, and checks the rows: the first job
succeeded once (no step repeated), the second one runs to the end under the next child, and the
journal holds no row left open by the dead child.
"""

from __future__ import annotations

import os
import signal
from dataclasses import replace
from typing import Any

import psycopg
import pytest

from provisioner import service
from provisioner.kinds.provision import STEPS
from provisioner.settings import Settings
from tests.conftest import Database
from tests.workers import (
    Workers,
    alive,
    job_row,
    overlapping_step_runs,
    step_runs,
    tenant_row_locked,
    wait_until,
    waiting_on_lock,
)


@pytest.fixture
def fast(settings: Settings) -> Settings:
    return replace(settings, heartbeat_seconds=0.5, job_stale_after_seconds=3.0)


def outcomes(database: Database, tenant: str) -> list[tuple[int, str, str, str]]:
    return [
        (r["attempt"], r["step"], r["outcome"], r["worker"]) for r in step_runs(database, tenant)
    ]


def first_job_done_once(database: Database, holder: str) -> None:
    """The first job: succeeded at its first attempt, each step run once, by the dead child."""
    row = job_row(database, "first")
    assert (row["status"], row["attempts"], row["steps_completed"]) == (
        "succeeded",
        1,
        list(STEPS),
    )
    assert outcomes(database, "first") == [(1, step, "succeeded", holder) for step in STEPS]


def key_shared_tenant_lock(database: Database, tenant: str) -> psycopg.Connection[Any]:
    """An open transaction holding the tenant's lock row FOR KEY SHARE: the claim's try-lock
    (FOR NO KEY UPDATE) goes on, a step's lock (an upsert, FOR UPDATE) waits for it."""
    conn = psycopg.connect(database.owner_url)
    row = conn.execute(
        "SELECT 1 FROM control.tenant_locks WHERE tenant_id = %s FOR KEY SHARE", (tenant,)
    ).fetchone()
    assert row, f"tenant {tenant} has no lock row: enqueue it first"
    return conn


def test_sigkill_after_the_commit_that_hands_the_next_job_over(
    fast: Settings, database: Database, workers: Workers
) -> None:
    """Killed after the first job's commit (its success, the second job's claim and first
    journal row) and before it told its worker about the second job: the worker hands the
    second job back with the row, the next child runs it whole, the first job stays done."""
    service.enqueue(fast, "first")
    service.enqueue(fast, "second")
    blocker = key_shared_tenant_lock(database, "second")
    try:
        worker = workers.start("--stale-after", "600")
        wait_until(lambda: job_row(database, "second")["status"] == "running", 60, "the claim")
        holder = str(job_row(database, "second")["locked_by"])
        wait_until(lambda: waiting_on_lock(database, holder), 30, "the next job's lock to wait")
        # Between the two commits: the first job is durable, the second claimed with its row.
        first_job_done_once(database, holder)
        assert outcomes(database, "second") == [(1, STEPS[0], "running", holder)]
        assert [e for e in worker.events("claimed") if e["tenant_id"] == "second"] == []
        (pid,) = worker.child_pids()
        os.kill(pid, signal.SIGKILL)
        released = worker.wait_for("released", 30, tenant_id="second")
        assert released["steps_done"] == 0
        assert outcomes(database, "second") == []  # the row went with the hand-back
    finally:
        blocker.rollback()
        blocker.close()
    worker.wait_for("succeeded", 120, tenant_id="second")
    wait_until(lambda: not alive(pid), 10, "the child to be gone")
    row = job_row(database, "second")
    assert (row["status"], row["attempts"]) == ("succeeded", 1)  # the lost attempt not counted
    (successor,) = [h for h in worker.holders() if h != holder]
    assert outcomes(database, "second") == [(1, step, "succeeded", successor) for step in STEPS]
    first_job_done_once(database, holder)
    assert overlapping_step_runs(database) == []
    assert worker.events("recovered") == []
    assert worker.stop() == 0


def test_sigkill_inside_the_handed_over_jobs_first_step(
    fast: Settings, database: Database, workers: Workers
) -> None:
    """Killed inside the second job's first step, whose journal row the first job's commit
    opened: that step rolls back, its row is closed as abandoned, and the next child runs the
    second job again; the first job's steps are not run again."""
    service.enqueue(fast, "first")
    service.enqueue(fast, "second")
    with tenant_row_locked(database, "second"):
        worker = workers.start("--stale-after", "600")
        wait_until(lambda: job_row(database, "second")["status"] == "running", 60, "the claim")
        holder = str(job_row(database, "second")["locked_by"])
        wait_until(lambda: waiting_on_lock(database, holder), 30, "the first step to block")
        worker.wait_for("claimed", 30, tenant_id="second")  # reported: the worker knows it
        first_job_done_once(database, holder)
        (pid,) = worker.child_pids()
        os.kill(pid, signal.SIGKILL)
        wait_until(
            lambda: outcomes(database, "second")[:1] == [(1, STEPS[0], "abandoned", holder)],
            60,
            "the dead child's step run to be closed",
        )
    worker.wait_for("succeeded", 120, tenant_id="second")
    row = job_row(database, "second")
    assert (row["status"], row["steps_completed"]) == ("succeeded", list(STEPS))
    (successor,) = [h for h in worker.holders() if h != holder]
    runs = outcomes(database, "second")
    assert runs[0] == (1, STEPS[0], "abandoned", holder)
    assert [(step, outcome, who) for _, step, outcome, who in runs[1:]] == [
        (step, "succeeded", successor) for step in STEPS
    ]
    first_job_done_once(database, holder)
    assert overlapping_step_runs(database) == []
    assert worker.stop() == 0
