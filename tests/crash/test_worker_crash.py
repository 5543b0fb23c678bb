"""Real worker processes killed, frozen or stopped in the middle of a step.

Each test holds the tenant's ``control.tenants`` row FOR UPDATE, so the worker's
``create_schema`` step blocks *inside* its transaction (schema created, not committed, step run
recorded as running), then does something to the worker and checks the rows: the job row, the
per-attempt record ``control.job_step_runs`` and the schema itself.
"""

from __future__ import annotations

import os
import signal
import time
from dataclasses import replace

import psycopg
import pytest
from psycopg.rows import dict_row

from provisioner import queue, service
from provisioner.kinds.provision import STEPS, ensure_provision_job
from provisioner.models import TenantId
from provisioner.settings import Settings
from provisioner.tenant.fingerprint import fingerprint
from tests.conftest import Database
from tests.workers import (
    WorkerProcess,
    Workers,
    alive,
    job_row,
    overlapping_step_runs,
    step_runs,
    tenant_row_locked,
    wait_blocked_mid_step,
    wait_until,
)

STALE = 3.0


@pytest.fixture
def fast(settings: Settings) -> Settings:
    return replace(settings, heartbeat_seconds=0.5, job_stale_after_seconds=STALE)


def blocked_mid_step(database: Database, tenant: str) -> str:
    """Wait until a worker claimed the tenant's job and blocks inside create_schema."""
    holder = wait_blocked_mid_step(database, tenant)
    runs = step_runs(database, tenant)
    assert [(r["step"], r["outcome"], r["worker"]) for r in runs] == [
        ("create_schema", "running", holder)
    ]
    return holder


def outcomes(database: Database, tenant: str) -> list[tuple[int, str, str, str]]:
    return [
        (r["attempt"], r["step"], r["outcome"], r["worker"]) for r in step_runs(database, tenant)
    ]


def holder_of(worker: WorkerProcess) -> str:
    (holder,) = worker.holders()
    return holder


def test_sigkill_mid_step_the_job_is_recovered_and_finished_by_another_worker(
    fast: Settings, database: Database, workers: Workers, clean_fingerprint: dict
) -> None:
    service.enqueue(fast, "victim")
    with tenant_row_locked(database, "victim"):
        first = workers.start()
        holder = blocked_mid_step(database, "victim")
        children = first.child_pids()
        assert holder == holder_of(first)

        first.send(signal.SIGKILL)  # the parent only: its child must not outlive it
        assert first.wait() == -signal.SIGKILL
        wait_until(lambda: not any(alive(pid) for pid in children), 10, "the child to die")
        second = workers.start()
    # The row lock is gone; the dead child's transaction rolled back.

    second.wait_for("recovered", 30, tenant_id="victim")
    second.wait_for("succeeded", 60, tenant_id="victim")
    row = job_row(database, "victim")
    assert (row["status"], row["attempts"], row["steps_completed"]) == (
        "succeeded",
        2,
        list(STEPS),
    )
    successor = holder_of(second)
    assert outcomes(database, "victim") == [(1, "create_schema", "abandoned", holder)] + [
        (2, step, "succeeded", successor) for step in STEPS
    ]
    assert overlapping_step_runs(database) == []
    with database.owner() as conn:
        assert fingerprint(conn, "tenant_victim") == clean_fingerprint
    assert second.stop() == 0


def test_sigstopped_worker_wakes_after_its_job_was_finished_and_records_nothing(
    fast: Settings, database: Database, workers: Workers
) -> None:
    service.enqueue(fast, "sleeper")
    with tenant_row_locked(database, "sleeper"):
        first = workers.start()
        holder = blocked_mid_step(database, "sleeper")
        first.send_group(signal.SIGSTOP)  # the worker and its child, as `docker pause` does
        second = workers.start()
        second.wait_for("recovered", 30, tenant_id="sleeper")
    # The frozen child's backend now sits idle in its transaction until the server ends it
    # (idle_in_transaction_session_timeout, 10 s here), releasing the tenant's advisory lock.
    second.wait_for("succeeded", 90, tenant_id="sleeper")
    result = job_row(database, "sleeper")
    runs = outcomes(database, "sleeper")
    successor = holder_of(second)
    assert (result["status"], result["attempts"]) == ("succeeded", 2)
    assert runs == [(1, "create_schema", "abandoned", holder)] + [
        (2, step, "succeeded", successor) for step in STEPS
    ]

    first.send_group(signal.SIGCONT)
    lost = first.wait_for("lease_lost", 60, tenant_id="sleeper")
    assert "no longer held" in lost["detail"]

    assert job_row(database, "sleeper") == result
    assert outcomes(database, "sleeper") == runs
    assert overlapping_step_runs(database) == []
    with database.owner() as conn:
        assert fingerprint(conn, "tenant_sleeper")["alembic_version"]
    assert first.stop() == 0
    assert second.stop() == 0


def test_a_live_worker_keeps_its_job_through_a_step_longer_than_its_heartbeat_lease(
    fast: Settings, database: Database, workers: Workers
) -> None:
    """A step outlives three heartbeat leases (0.5 s beats: a 1.5 s lease) on a worker that
    beats: nothing recovers it, and its lease is renewed by each beat."""
    service.enqueue(fast, "marathon")
    with tenant_row_locked(database, "marathon") as lock:
        worker = workers.start("--stale-after", "60")
        holder = blocked_mid_step(database, "marathon")
        leases = set()
        with psycopg.connect(database.owner_url, row_factory=dict_row) as conn:
            until = time.monotonic() + 3 * 3 * fast.heartbeat_seconds
            while time.monotonic() < until:
                assert queue.recover_stale(conn, 60.0) == []
                conn.commit()
                leases.add(job_row(database, "marathon")["locked_at"])
                time.sleep(0.5)
        assert len(leases) > 3  # renewed by the heartbeat while the step was blocked
        lock.commit()

    worker.wait_for("succeeded", 60, tenant_id="marathon")
    row = job_row(database, "marathon")
    assert (row["status"], row["attempts"]) == ("succeeded", 1), worker.output()
    assert outcomes(database, "marathon") == [(1, step, "succeeded", holder) for step in STEPS]
    assert worker.events("recovered") == [] and worker.events("lease_lost") == []
    assert worker.stop() == 0


def test_a_beating_worker_stuck_in_a_step_loses_the_job_at_the_stale_threshold(
    fast: Settings, database: Database, workers: Workers
) -> None:
    """The stale threshold is the outer bound of a step on a worker that beats but is stuck:
    the job goes back to the queue (fenced: the stuck holder records nothing), and runs again
    once the step can go on."""
    service.enqueue(fast, "stuck")
    with tenant_row_locked(database, "stuck") as lock:
        worker = workers.start("--stale-after", str(STALE))
        blocked_mid_step(database, "stuck")
        worker.wait_for("recovered", 60)
        lock.commit()
    worker.wait_for("succeeded", 60, tenant_id="stuck")
    row = job_row(database, "stuck")
    assert (row["status"], row["attempts"]) == ("succeeded", 2), worker.output()
    assert worker.stop() == 0


def test_sigterm_lets_the_step_finish_then_releases_the_job_with_its_progress(
    fast: Settings, database: Database, workers: Workers
) -> None:
    service.enqueue(fast, "tidy")
    with tenant_row_locked(database, "tidy") as lock:
        worker = workers.start()
        holder = blocked_mid_step(database, "tidy")
        children = worker.child_pids()
        worker.send(signal.SIGTERM)
        worker.wait_for("stopping")
        assert worker.proc.poll() is None  # draining: the running step may finish
        lock.commit()
        assert worker.wait(60) == 0, worker.output()

    row = job_row(database, "tidy")
    assert (row["status"], row["steps_completed"], row["attempts"], row["locked_by"]) == (
        "queued",
        ["create_schema"],
        0,
        None,
    )
    assert worker.wait_for("released", tenant_id="tidy")["steps_done"] == 1
    assert not any(alive(pid) for pid in children)

    resumed = workers.start("--once")
    assert resumed.wait(120) == 0, resumed.output()
    row = job_row(database, "tidy")
    assert (row["status"], row["attempts"]) == ("succeeded", 1)
    assert outcomes(database, "tidy") == [(1, "create_schema", "succeeded", holder)] + [
        (1, step, "succeeded", holder_of(resumed)) for step in STEPS[1:]
    ]
    assert [e["step"] for e in resumed.events("step_skipped")] == ["create_schema"]


def test_sigterm_past_the_drain_timeout_interrupts_the_step_and_releases_the_job(
    fast: Settings, database: Database, workers: Workers
) -> None:
    service.enqueue(fast, "stuck")
    with tenant_row_locked(database, "stuck"):
        worker = workers.start("--drain-timeout", "1")
        holder = blocked_mid_step(database, "stuck")
        children = worker.child_pids()
        worker.send(signal.SIGTERM)
        assert worker.wait(60) == 0, worker.output()  # the lock is still held
        worker.wait_for("drain_timeout")
        assert worker.wait_for("released", tenant_id="stuck")["steps_done"] == 0
        row = job_row(database, "stuck")
        assert (row["status"], row["steps_completed"], row["attempts"]) == ("queued", [], 0)
        (run,) = step_runs(database, "stuck")
        assert (run["step"], run["outcome"], run["worker"]) == ("create_schema", "failed", holder)
        assert "drain timeout" in run["detail"]
        assert not any(alive(pid) for pid in children)

    resumed = workers.start("--once")
    assert resumed.wait(120) == 0, resumed.output()
    assert job_row(database, "stuck")["status"] == "succeeded"
    with database.owner() as conn:
        assert fingerprint(conn, "tenant_stuck")["alembic_version"]


def test_a_killed_child_hands_back_at_once_a_job_it_claimed_but_never_reported(
    fast: Settings, database: Database, workers: Workers
) -> None:
    """A child claims its next job with its last step's commit and reports it right after;
    killed in between, the job is held by a dead holder the parent was never told about. The
    parent hands it back when the child's pipe closes, long before its lease would expire."""
    worker = workers.start("--stale-after", "600").idle()
    ((holder,), (pid,)) = (worker.holders(), worker.child_pids())
    with psycopg.connect(database.owner_url) as conn:  # the claim the child never reported
        job = ensure_provision_job(conn, TenantId("ghost")).job
        conn.execute(
            "UPDATE control.platform_jobs SET status = 'running', attempts = 1, "
            "locked_by = %s, locked_at = now() WHERE id = %s",
            (holder, job.id),
        )
    os.kill(pid, signal.SIGKILL)

    released = worker.wait_for("released", 30, tenant_id="ghost")
    assert released["steps_done"] == 0
    worker.wait_for("succeeded", 120, tenant_id="ghost")
    row = job_row(database, "ghost")
    assert (row["status"], row["attempts"]) == ("succeeded", 1)  # the lost attempt not counted
    successor = holder_of_new(worker, holder)
    assert [r["worker"] for r in step_runs(database, "ghost")] == [successor] * len(STEPS)
    assert worker.events("recovered") == []
    assert worker.stop() == 0


def holder_of_new(worker: WorkerProcess, dead: str) -> str:
    (holder,) = [h for h in worker.holders() if h != dead]
    return holder
