"""Four worker processes on one control database share sixty tenants.

The proof is in the database, not the logs: every job succeeded on its first attempt, each of
the 360 steps ran exactly once (``control.job_step_runs``), and no two step runs of one tenant
overlap in time.
"""

from __future__ import annotations

import time
from collections import Counter
from dataclasses import replace

import pytest

from provisioner import service
from provisioner.kinds.provision import STEPS
from provisioner.settings import Settings
from tests.conftest import Database
from tests.workers import Workers, overlapping_step_runs, wait_until

TENANTS = [f"fleet_{i:02d}" for i in range(60)]


@pytest.fixture
def fast(settings: Settings) -> Settings:
    return replace(settings, heartbeat_seconds=0.5, job_stale_after_seconds=10.0)


def succeeded(database: Database) -> int:
    with database.owner() as conn:
        row = conn.execute(
            "SELECT count(*) FROM control.platform_jobs "
            "WHERE status = 'succeeded' AND tenant_id LIKE 'fleet%%'"
        ).fetchone()
    return int(row[0]) if row else 0


def test_four_workers_provision_sixty_tenants_each_exactly_once(
    fast: Settings, database: Database, workers: Workers
) -> None:
    for tenant in TENANTS[:30]:  # waiting before the fleet starts
        service.enqueue(fast, tenant)
    began = time.monotonic()
    fleet = [
        workers.start(),
        workers.start(),
        workers.start("--concurrency", "2"),
        workers.start("--concurrency", "2"),
    ]
    for tenant in TENANTS[30:]:  # and arriving while it runs
        service.enqueue(fast, tenant)

    wait_until(lambda: succeeded(database) == len(TENANTS), 180, "all sixty tenants")
    elapsed = time.monotonic() - began
    for worker in fleet:
        assert worker.stop() == 0, worker.output()

    with database.owner() as conn:
        jobs = conn.execute(
            "SELECT tenant_id, status, attempts, steps_completed FROM control.platform_jobs "
            "ORDER BY tenant_id"
        ).fetchall()
        runs = conn.execute(
            "SELECT tenant_id, step, outcome, worker FROM control.job_step_runs"
        ).fetchall()
        schemas = conn.execute(
            "SELECT count(*) FROM pg_namespace WHERE nspname LIKE 'tenant_fleet%'"
        ).fetchone()
    assert jobs == [(t, "succeeded", 1, list(STEPS)) for t in TENANTS]
    assert schemas == (len(TENANTS),)
    # Each step of each tenant ran exactly once, and it succeeded.
    assert Counter((t, s, o) for t, s, o, _ in runs) == {
        (t, s, "succeeded"): 1 for t in TENANTS for s in STEPS
    }
    assert overlapping_step_runs(database) == []

    # The fleet partitioned the work: each job was claimed once, by one child of one worker.
    claims = [e["tenant_id"] for w in fleet for e in w.events("claimed")]
    assert sorted(claims) == TENANTS
    holder_of_worker = {h: i for i, w in enumerate(fleet) for h in w.holders()}
    by_tenant = {t: {holder_of_worker[w] for tt, _, _, w in runs if tt == t} for t in TENANTS}
    assert all(len(owners) == 1 for owners in by_tenant.values())
    busy_workers = {next(iter(owners)) for owners in by_tenant.values()}
    assert len(busy_workers) >= 2, f"only worker(s) {busy_workers} did any work"
    print(
        f"\n4 workers (6 engine processes): {len(TENANTS)} tenants in {elapsed:.1f} s, "
        f"{len(TENANTS) / elapsed * 60:.0f} tenants/minute; claims per worker "
        f"{[len(w.events('claimed')) for w in fleet]}"
    )
