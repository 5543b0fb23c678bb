"""A kind added from outside the package: one registry entry, its two step functions, these
tests. Nothing in the queue, the engine, the CLI or the worker knows about it.

The entry is this module's ``JOB_KINDS``; the settings name the module
(``PROVISIONER_JOB_KIND_MODULES``), so a worker's spawned engine processes import it too.
"""

from __future__ import annotations

import tempfile
from dataclasses import replace
from typing import Any

import psycopg
import pytest
from psycopg import pq
from psycopg.rows import dict_row

from provisioner import db, kinds, queue
from provisioner.engine import Engine, StepEvent, runner
from provisioner.kinds import JobKind, Step, StepContext, keyed_by_tenant
from provisioner.models import JobStatus, TenantId
from provisioner.settings import Settings
from provisioner.tenant import row as tenants
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
        settings, heartbeat_seconds=0.5, job_stale_after_seconds=30.0, job_kind_modules=(MODULE,)
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
    registry = kinds.for_settings(fast)
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


def drain_once(engine: Engine, stop: bool = False) -> runner.Outcome:
    """What a worker's engine process does for each job of its drain."""
    return runner.claim_next_and_run(
        engine,
        (KIND,),
        on_claimed=lambda job: None,
        on_progress=lambda event: None,
        should_stop=lambda: stop,
    )


def job_of(database: Database, tenant: str) -> dict[str, Any]:
    with psycopg.connect(database.owner_url) as conn:
        row = conn.execute(
            "SELECT status, attempts, locked_by FROM control.platform_jobs WHERE tenant_id = %s",
            (tenant,),
        ).fetchone()
    assert row is not None
    return {"status": row[0], "attempts": row[1], "locked_by": row[2]}


def test_a_draining_engine_claims_its_next_job_with_the_last_steps_commit(
    fast: Settings, database: Database
) -> None:
    enqueue(database, "first")
    enqueue(database, "second")
    with Engine.from_settings(fast, "drainer") as engine:
        first = drain_once(engine)
        assert isinstance(first, runner.Settled) and first.job.tenant_id == "first"
        # The first job's last step claimed the second: committed, under this holder.
        assert engine.holds_claim()
        assert job_of(database, "second") == {
            "status": "running", "attempts": 1, "locked_by": "drainer"
        }  # fmt: skip
        second = drain_once(engine)
        assert isinstance(second, runner.Settled) and second.job.tenant_id == "second"
        assert second.job.status is JobStatus.SUCCEEDED
        assert not engine.holds_claim()
        assert isinstance(drain_once(engine), runner.NothingQueued)
    assert display_name(database, "second") == "one,two"


def test_a_stop_request_hands_the_claimed_next_job_back_before_its_first_step(
    fast: Settings, database: Database
) -> None:
    enqueue(database, "first")
    enqueue(database, "second")
    with Engine.from_settings(fast, "drainer") as engine:
        drain_once(engine)
        stopped = drain_once(engine, stop=True)
    assert isinstance(stopped, runner.Settled) and stopped.stopped
    assert job_of(database, "second") == {"status": "queued", "attempts": 0, "locked_by": None}
    assert display_name(database, "second") is None  # no step ran
    assert journal(database, "second") == []  # the row its claim opened went with it


def test_closing_an_engine_hands_back_the_job_it_claimed_and_never_started(
    fast: Settings, database: Database
) -> None:
    enqueue(database, "first")
    enqueue(database, "second")
    with Engine.from_settings(fast, "drainer") as engine:
        drain_once(engine)
        assert engine.holds_claim()
    assert job_of(database, "second") == {"status": "queued", "attempts": 0, "locked_by": None}
    assert journal(database, "second") == []  # the row its claim opened went with it
    assert not begun_ahead(database, "drainer", "second")  # rolled back with the engine


def begun_ahead(database: Database, holder: str, tenant: str) -> bool:
    """True when a session of ``holder`` sits in an open transaction and the lock row of
    ``tenant`` (control.tenant_locks) is held: a transaction begun ahead for its next step."""
    with psycopg.connect(database.owner_url, autocommit=True) as conn:
        idle = conn.execute(
            "SELECT count(*) FROM pg_stat_activity "
            "WHERE application_name = %s AND state = 'idle in transaction'",
            (holder,),
        ).fetchone()
        try:
            with conn.transaction():
                conn.execute(
                    "SELECT FROM control.tenant_locks WHERE tenant_id = %s FOR UPDATE NOWAIT",
                    (tenant,),
                )
        except psycopg.errors.LockNotAvailable:
            return bool(idle and idle[0])
    return False


def test_a_handed_off_job_begins_without_a_round_trip_of_its_own(
    fast: Settings, database: Database
) -> None:
    """engine/handoff.py: the first job's final commit opened the second job's first journal
    row and began its first transaction with its tenant's lock; the second job's first step
    runs in that transaction and closes that row."""
    enqueue(database, "first")
    enqueue(database, "second")
    with Engine.from_settings(fast, "drainer") as engine:
        drain_once(engine)
        assert engine.holds_claim()
        (opened,) = journal(database, "second")
        assert (opened["step"], opened["outcome"]) == ("stamp_one", "running")
        assert begun_ahead(database, "drainer", "second")
        session = engine.sessions._session  # kept checked out between the two jobs
        assert session is not None
        wire = session.driver.pgconn
        with tempfile.TemporaryFile() as trace:
            wire.trace(trace.fileno())
            wire.set_trace_flags(pq.Trace.SUPPRESS_TIMESTAMPS)
            try:
                second = drain_once(engine)
            finally:
                wire.untrace()
            trace.seek(0)
            sent = [
                line for line in trace.read().decode(errors="replace").splitlines()
                if line.split("\t")[:3:2] == ["F", "Query"]
            ]  # fmt: skip
        # The first step ran in the transaction begun ahead: nothing rolled back, and the one
        # BEGIN sent is the one its own commit sent for the second step.
        assert not any("ROLLBACK" in line for line in sent), sent
        assert sum(line.count("BEGIN") for line in sent) == 1, sent
        assert isinstance(second, runner.Settled) and second.job.status is JobStatus.SUCCEEDED
        assert not begun_ahead(database, "drainer", "second")
    runs = journal(database, "second")
    assert [(r["step"], r["outcome"]) for r in runs] == [
        ("stamp_one", "succeeded"),
        ("stamp_two", "succeeded"),
    ]
    assert runs[0]["started_at"] == opened["started_at"]  # the row the first job opened


def test_a_worker_childs_steps_session_is_replaced_after_its_jobs(
    fast: Settings, database: Database, monkeypatch: pytest.MonkeyPatch
) -> None:
    """db/sessions.py, engine/sessions.py: a worker child holds its steps' session from one
    job to the next (hand-offs), and counts each job as a use of it: after 2 (here) the
    session is handed back and closed, the transaction begun ahead for the next job rolled
    back, and the next job opens a new one. Five jobs, three sessions; every job succeeds at
    its first attempt."""
    monkeypatch.setattr(db.sessions, "RECYCLE_AFTER_USES", 2)
    tenants_ = [f"recycled{i}" for i in range(5)]
    for tenant in tenants_:
        enqueue(database, tenant)
    steps_pids: set[int] = set()
    with Engine.from_settings(fast, "drainer") as engine:
        control_pid = engine.control.info.backend_pid
        for _ in tenants_:
            outcome = drain_once(engine)
            assert isinstance(outcome, runner.Settled), outcome
            assert (outcome.job.status, outcome.job.attempts) == (JobStatus.SUCCEEDED, 1)
            with psycopg.connect(database.owner_url, autocommit=True) as conn:
                rows = conn.execute(
                    "SELECT pid FROM pg_stat_activity WHERE application_name = 'drainer'"
                ).fetchall()
            steps_pids |= {int(pid) for (pid,) in rows} - {control_pid}
        assert not begun_ahead(database, "drainer", tenants_[-1])
    assert len(steps_pids) == 3, steps_pids


def journal(database: Database, tenant: str) -> list[dict[str, Any]]:
    with psycopg.connect(database.owner_url, row_factory=dict_row) as conn:
        return conn.execute(
            "SELECT step, outcome, started_at, finished_at FROM control.job_step_runs "
            "WHERE tenant_id = %s ORDER BY id",
            (tenant,),
        ).fetchall()


def test_each_step_after_the_first_starts_in_the_journal_when_the_one_before_finished(
    fast: Settings, database: Database
) -> None:
    enqueue(database, "acme")
    with Engine.from_settings(fast, "drainer") as engine:
        assert isinstance(drain_once(engine), runner.Settled)
    one, two = journal(database, "acme")
    assert [(r["step"], r["outcome"]) for r in (one, two)] == [
        ("stamp_one", "succeeded"),
        ("stamp_two", "succeeded"),
    ]
    assert two["started_at"] == one["finished_at"] < two["finished_at"]


def test_a_job_handed_back_between_steps_keeps_no_run_for_the_step_that_did_not_begin(
    fast: Settings, database: Database
) -> None:
    job = enqueue(database, "acme")
    asked: list[bool] = []

    def should_stop() -> bool:  # before stamp_one: go on; before stamp_two (and after): stop
        asked.append(bool(asked))
        return asked[-1]

    with Engine.from_settings(fast, "drainer") as engine:
        outcome = runner.claim_and_run(
            engine, job.id, on_progress=lambda e: None, should_stop=should_stop
        )
    assert isinstance(outcome, runner.Settled) and outcome.stopped
    assert job_of(database, "acme") == {"status": "queued", "attempts": 0, "locked_by": None}
    assert [(r["step"], r["outcome"]) for r in journal(database, "acme")] == [
        ("stamp_one", "succeeded")
    ]
    assert display_name(database, "acme") == "one"


def test_a_run_that_breaks_between_steps_keeps_no_run_for_the_step_that_did_not_begin(
    fast: Settings, database: Database
) -> None:
    job = enqueue(database, "acme")

    def report(event: StepEvent) -> None:
        if (event.step, event.outcome) == ("stamp_one", "done"):
            raise RuntimeError("the progress display broke")

    with Engine.from_settings(fast, "drainer") as engine:
        outcome = runner.claim_and_run(
            engine, job.id, on_progress=report, should_stop=lambda: False
        )
    assert isinstance(outcome, runner.Settled)
    assert outcome.job.status is JobStatus.QUEUED  # retried later, from its checkpoint
    assert outcome.job.steps_completed == ["stamp_one"]
    assert "the progress display broke" in (outcome.job.error_detail or "")
    assert [(r["step"], r["outcome"]) for r in journal(database, "acme")] == [
        ("stamp_one", "succeeded")
    ]
