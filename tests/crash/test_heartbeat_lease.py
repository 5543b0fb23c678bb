"""A job's lease lives as long as its holder's heartbeat (issue 27, item 9).

Real worker processes, the stale threshold left at its default (900 s): a worker SIGKILLed in
the middle of a step loses its job to a live worker as soon as its lease holder has missed
three beats, not after 15 minutes; ``health`` says not ready while a dead worker's jobs wait,
even when another replica of the component beats; the application role cannot write the
beats that keep a lease alive. Each test prints how long the job waited.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import replace

import psycopg
import pytest
from psycopg.rows import dict_row

from provisioner import service
from provisioner.control import heartbeats
from provisioner.kinds.provision import STEPS
from provisioner.settings import Settings
from tests.conftest import Database, settings_env
from tests.workers import (
    Workers,
    alive,
    job_row,
    step_runs,
    tenant_row_locked,
    wait_blocked_mid_step,
    wait_until,
)

#: The default stale threshold: only the heartbeat's lease can hand the job over in time.
STALE = Settings.job_stale_after_seconds


@pytest.fixture
def fast(settings: Settings) -> Settings:
    return replace(settings, heartbeat_seconds=0.5, job_stale_after_seconds=STALE)


def health(settings: Settings) -> tuple[int, dict]:
    """``provisioner health --json`` as a real process."""
    result = subprocess.run(
        [sys.executable, "-m", "provisioner", "health", "--json"],
        capture_output=True,
        text=True,
        env=settings_env(settings),
        timeout=60,
        check=False,
    )
    return result.returncode, json.loads(result.stdout)


def killed_mid_step(
    workers: Workers,
    database: Database,
    tenant: str,
    *,
    then_start: int = 0,
    settings: Settings | None = None,
) -> tuple[str, float]:
    """Start a worker, let it block inside create_schema, start ``then_start`` more (idle),
    SIGKILL the first (its child dies with it); the dead holder and the monotonic time of the
    kill."""
    first = workers.start(settings=settings)
    holder = wait_blocked_mid_step(database, tenant)
    for _ in range(then_start):
        workers.start(settings=settings).idle()
    children = first.child_pids()
    first.send(signal.SIGKILL)
    killed_at = time.monotonic()
    assert first.wait() == -signal.SIGKILL
    wait_until(lambda: not any(alive(pid) for pid in children), 10, "the child to die")
    return holder, killed_at


@pytest.mark.parametrize("heartbeat", [0.5, Settings.heartbeat_seconds], ids=["fast", "default"])
def test_a_sigkilled_workers_job_runs_again_within_its_heartbeat_lease(
    fast: Settings, database: Database, workers: Workers, heartbeat: float
) -> None:
    fast = replace(fast, heartbeat_seconds=heartbeat)
    service.enqueue(fast, "orphan")
    with tenant_row_locked(database, "orphan"):
        holder, killed_at = killed_mid_step(
            workers, database, "orphan", then_start=1, settings=fast
        )
    second = workers.started[1]
    # The row lock is gone with the block; the dead child's transaction rolled back.

    recovered = second.wait_for("recovered", 60, tenant_id="orphan")
    second.wait_for("claimed", 30, tenant_id="orphan")
    waited = time.monotonic() - killed_at
    second.wait_for("succeeded", 60, tenant_id="orphan")
    done = time.monotonic() - killed_at
    print(
        f"\njob waited {waited:.2f} s after the SIGKILL before a live worker claimed it again "
        f"(heartbeat {fast.heartbeat_seconds:g} s, lease {fast.holder_lease_seconds:g} s, "
        f"stale threshold {STALE:g} s); succeeded {done:.2f} s after the kill"
    )
    assert recovered["status"] == "queued"
    row = job_row(database, "orphan")
    assert (row["status"], row["attempts"], row["steps_completed"]) == ("succeeded", 2, list(STEPS))
    runs = [
        (r["attempt"], r["step"], r["outcome"], r["worker"]) for r in step_runs(database, "orphan")
    ]
    assert runs[0] == (1, "create_schema", "abandoned", holder)
    assert [r[:3] for r in runs[1:]] == [(2, step, "succeeded") for step in STEPS]
    with database.owner() as conn:  # the dead holder's row is forgotten once recovered
        left = conn.execute(
            "SELECT holder FROM control.lease_holders WHERE holder = %s", (holder,)
        ).fetchall()
    assert left == []
    assert second.stop() == 0


@contextmanager
def replica_beating(database: Database, settings: Settings) -> Iterator[None]:
    """Another replica of the worker's component, alive: its row in runtime_heartbeats written
    by the owner every 0.2 s, advertising the job types, its store ready, holding nothing."""
    halt = threading.Event()
    detail = {
        "state": "running",
        "job_types": list(settings.worker_job_types),
        "storage": {"ready": True},
        "current_jobs": [],
    }

    def beat() -> None:
        with psycopg.connect(database.owner_url, autocommit=True) as conn:
            while not halt.is_set():
                heartbeats.beat(conn, settings.worker_component, "replica", detail)
                halt.wait(0.2)

    thread = threading.Thread(target=beat, daemon=True)
    thread.start()
    try:
        yield
    finally:
        halt.set()
        thread.join(10)


def test_health_is_not_ready_while_a_dead_workers_jobs_wait_even_with_a_live_replica(
    fast: Settings, database: Database, workers: Workers
) -> None:
    service.enqueue(fast, "stranded")
    with tenant_row_locked(database, "stranded"):
        first = workers.start()
        wait_blocked_mid_step(database, "stranded")
        wait_until(lambda: health(fast)[0] == 0, 30, "health ready while the job runs")
        holder = job_row(database, "stranded")["locked_by"]
        with replica_beating(database, fast):
            first.send(signal.SIGKILL)
            assert first.wait() == -signal.SIGKILL
            _, seen = wait_until(
                lambda: (r := health(fast))[0] == 1 and r, 30, "health to turn not ready"
            )
            (component,) = seen["components"]
            assert "stopped beating" in component["reason"], component
            assert holder in component["reason"]
            assert job_row(database, "stranded")["status"] == "running"  # nobody recovered it yet

    second = workers.start()
    second.wait_for("succeeded", 60, tenant_id="stranded")
    recovered = second.events("recovered")
    assert [e["tenant_id"] for e in recovered] == ["stranded"]
    wait_until(lambda: health(fast)[0] == 0, 30, "health ready again")
    assert second.stop() == 0


def test_the_application_role_cannot_keep_a_dead_holders_lease_alive(
    fast: Settings, database: Database, workers: Workers
) -> None:
    service.enqueue(fast, "forged")
    with tenant_row_locked(database, "forged"):
        holder, killed_at = killed_mid_step(workers, database, "forged")
        with psycopg.connect(database.app_url, autocommit=True, row_factory=dict_row) as app:
            for statement, params in (
                (
                    "INSERT INTO control.lease_holders (holder, component, instance_id, "
                    "lease_seconds) VALUES (%s, 'provisioner-worker', 'forger', 3600)",
                    ("forger:host:1",),
                ),
                (
                    "UPDATE control.lease_holders SET beat_at = now(), lease_seconds = 604800 "
                    "WHERE holder = %s",
                    (holder,),
                ),
                ("DELETE FROM control.lease_holders WHERE holder = %s", (holder,)),
            ):
                with pytest.raises(psycopg.errors.InsufficientPrivilege):
                    app.execute(statement, params)
            # Nor renew the job's lease itself (row-level security: not an application job).
            renewed = app.execute(
                "UPDATE control.platform_jobs SET locked_at = now() WHERE locked_by = %s",
                (holder,),
            )
            assert renewed.rowcount == 0
            # It may read the holders (health does, with the application's URL).
            seen = app.execute(
                "SELECT holder FROM control.lease_holders WHERE holder = %s", (holder,)
            ).fetchall()
            assert seen == [{"holder": holder}]

    second = workers.start()
    second.wait_for("succeeded", 60, tenant_id="forged")
    print(
        f"\njob waited {time.monotonic() - killed_at:.2f} s in all (a second worker started late)"
    )
    assert job_row(database, "forged")["attempts"] == 2
    assert second.stop() == 0
