"""A kind added from outside the package: one registry entry, its two step functions, these
tests. Nothing in the queue, the engine, the CLI or the worker knows about it.

The entry is this module's ``JOB_KINDS``; the settings name the module
(``PROVISIONER_JOB_KIND_MODULES``), so a worker's spawned engine processes import it too.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import psycopg
import pytest

from provisioner import db, queue, runner, tenants
from provisioner.engine import Engine, StepEvent
from provisioner.kinds import JobKind, Step, StepContext, keyed_by_tenant
from provisioner.models import JobStatus, TenantId
from provisioner.settings import Settings
from tests.conftest import Database
from tests.workers import Workers

MODULE = "tests.integration.test_job_kinds"  # importable by name, also in a worker
KIND = "stamp_tenant"


def _stamp(value: str) -> Step:
    """A step that appends ``value`` to the tenant's display name (once)."""

    def run(tx: db.Transaction, ctx: StepContext) -> str | None:
        tx.pg.execute(
            "UPDATE control.tenants SET display_name = concat_ws(',', display_name, %s::text) "
            "WHERE tenant_id = %s",
            (value, ctx.tenant.value),
        )
        return None

    def present(tx: db.Transaction, ctx: StepContext) -> bool:
        row = tx.pg.execute(
            "SELECT display_name FROM control.tenants WHERE tenant_id = %s", (ctx.tenant.value,)
        ).fetchone()
        return row is not None and value in (row[0] or "").split(",")

    return Step(f"stamp_{value}", run, present)


STAMP_STEPS: tuple[Step, ...] = (_stamp("one"), _stamp("two"))

JOB_KINDS = (
    JobKind(KIND, f"{MODULE}:STAMP_STEPS", idempotency_key=keyed_by_tenant(KIND), command="test"),
)


@pytest.fixture
def fast(settings: Settings) -> Settings:
    return replace(
        settings, heartbeat_seconds=0.5, job_stale_after_seconds=3.0, job_kind_modules=(MODULE,)
    )


def enqueue(database: Database, tenant: str) -> Any:
    with psycopg.connect(database.owner_url) as conn:
        job = queue.ensure_tenant_job(conn, TenantId(tenant), KIND, f"{KIND}:{tenant}").job
        conn.commit()
    return job


def display_name(database: Database, tenant: str) -> str | None:
    with psycopg.connect(database.owner_url) as conn:
        found = tenants.get_tenant(conn, TenantId(tenant))
        row = conn.execute(
            "SELECT display_name FROM control.tenants WHERE tenant_id = %s", (tenant,)
        ).fetchone()
    assert found is not None and row is not None
    return row[0]


def test_a_registered_kind_runs_through_the_engine(fast: Settings, database: Database) -> None:
    registry = fast.job_kinds
    assert KIND in registry and registry[KIND].step_names == ("stamp_one", "stamp_two")
    assert KIND not in registry.default_worker
    job = enqueue(database, "acme")
    events: list[StepEvent] = []
    with Engine.from_settings(fast, "test-engine") as engine:
        outcome = runner.claim_and_run(
            engine, job.id, on_progress=events.append, should_stop=lambda: False
        )
    assert isinstance(outcome, runner.Settled)
    done = outcome.job
    assert done.status is JobStatus.SUCCEEDED and done.progress == 100
    assert done.steps_completed == ["stamp_one", "stamp_two"]
    assert [(e.step, e.outcome) for e in events if e.outcome != "started"] == [
        ("stamp_one", "done"),
        ("stamp_two", "done"),
    ]
    assert display_name(database, "acme") == "one,two"


@pytest.mark.slow
def test_a_registered_kind_runs_through_a_worker(
    fast: Settings, database: Database, workers: Workers
) -> None:
    job = enqueue(database, "acme")
    worker = workers.start(
        "--once",
        env={"PROVISIONER_JOB_KIND_MODULES": MODULE, "PROVISIONER_WORKER_JOB_TYPES": KIND},
    )
    assert worker.wait() == 0, worker.output()[-3000:]
    with psycopg.connect(database.owner_url) as conn:
        row = conn.execute(
            "SELECT status, progress, steps_completed FROM control.platform_jobs WHERE id = %s",
            (job.id,),
        ).fetchone()
    assert row == ("succeeded", 100, ["stamp_one", "stamp_two"])
    assert display_name(database, "acme") == "one,two"
    assert [e["step"] for e in worker.events("step_done")] == ["stamp_one", "stamp_two"]


def test_a_worker_without_the_module_refuses_the_kind(fast: Settings, workers: Workers) -> None:
    worker = workers.start("--once", env={"PROVISIONER_WORKER_JOB_TYPES": KIND})
    assert worker.wait() == 2
    assert "unsupported job type(s) stamp_tenant" in worker.output()
