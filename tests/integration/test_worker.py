"""``provisioner worker`` as a real process: refused starts, ``--once``, NOTIFY wake-ups and the
polling backstop, heartbeats and ``health``, log lines, and the operator's view while it works."""

from __future__ import annotations

import json
import multiprocessing
import os
import re
import signal
import subprocess
import sys
from dataclasses import replace
from pathlib import Path
from uuid import uuid4

import pytest
import sqlalchemy as sa
from alembic import command
from click.testing import CliRunner

from provisioner import db, service
from provisioner.cli import main
from provisioner.engine import Engine, StepEvent, StepOutcome, runner
from provisioner.kinds.provision import STEPS
from provisioner.models import Job, JobStatus
from provisioner.settings import Settings
from provisioner.templates import migrations
from provisioner.worker import processes
from tests.conftest import Database, run_cli, settings_env
from tests.workers import (
    Workers,
    job_row,
    tenant_row_locked,
    wait_blocked_mid_step,
    wait_until,
)


@pytest.fixture
def fast(settings: Settings) -> Settings:
    """Short heartbeats and lease, so liveness shows within a second or two."""
    return replace(settings, heartbeat_seconds=0.5, job_stale_after_seconds=30.0)


def heartbeat(database: Database) -> dict:
    with database.owner() as conn:
        row = conn.execute(
            "SELECT detail FROM control.runtime_heartbeats WHERE component = 'provisioner-worker'"
        ).fetchone()
    assert row is not None, "no heartbeat row"
    return row[0]


# -- refused starts -----------------------------------------------------------------------------


def downgrade_control_one_revision(database: Database) -> None:
    engine = db.engine(database.owner_url, poolclass=sa.pool.NullPool)
    try:
        with engine.begin() as connection:
            command.downgrade(migrations.control_config(connection=connection), "-1")
    finally:
        engine.dispose()


REFUSALS = {
    "unsupported-job-type": (
        {"PROVISIONER_WORKER_JOB_TYPES": "provision_tenant,reticulate_splines"},
        [],
        "unsupported job type(s) reticulate_splines",
    ),
    "job-type-without-handler": (
        {},
        ["--job-types", "provision_tenant,send_email"],
        "no handler for job type(s) send_email",
    ),
    "no-owner-url": ({"MIGRATIONS_DATABASE_URL": ""}, [], "MIGRATIONS_DATABASE_URL is not set"),
    "no-app-url": ({"APP_DATABASE_URL": ""}, [], "APP_DATABASE_URL is not set"),
    "unknown-store-provider": (
        {"OBJECT_STORE_PROVIDER": "gcs"},
        [],
        "OBJECT_STORE_PROVIDER='gcs' is not one of",
    ),
    "s3-without-bucket": ({"OBJECT_STORE_PROVIDER": "s3"}, [], "needs S3_BUCKET"),
    "heartbeat-too-slow-for-lease": (
        {},
        ["--heartbeat", "5", "--stale-after", "6"],
        "must be at most half of PROVISIONER_JOB_STALE_AFTER_SECONDS",
    ),
    "control-schema-not-at-head": ({}, [], "the control schema is not at head"),
    "superuser-owner": ({}, [], "connects as a superuser"),
}


@pytest.mark.parametrize("case", list(REFUSALS))
def test_worker_refuses_to_start(
    fast: Settings, database: Database, tmp_path: Path, case: str
) -> None:
    env_changes, flags, message = REFUSALS[case]
    env = {**settings_env(fast), **env_changes}
    if case == "control-schema-not-at-head":
        downgrade_control_one_revision(database)
    if case == "superuser-owner":
        env["MIGRATIONS_DATABASE_URL"] = database.admin_url

    # --once: were the refusal missing, the worker would drain an empty queue and return.
    result = CliRunner().invoke(main, ["worker", "--once", *flags], env=env)

    assert result.exit_code == 2, result.output
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), result.stderr
    assert message in lines[0]
    if case == "superuser-owner":
        assert "--allow-superuser" in lines[0]
    if case in ("no-owner-url", "no-app-url"):
        assert "never falls back to the embedded local database" in lines[0]
        assert not (fast.state_dir / "postgres").exists()
    with database.owner() as conn:
        beats = conn.execute("SELECT count(*) FROM control.runtime_heartbeats").fetchone()
    assert beats == (0,)


def test_superuser_owner_runs_with_allow_superuser_and_says_so(
    database: Database, workers: Workers
) -> None:
    worker = workers.start(
        "--once", "--allow-superuser", env={"MIGRATIONS_DATABASE_URL": database.admin_url}
    )
    assert worker.wait() == 0, worker.output()
    warning = worker.wait_for("superuser_allowed")
    assert warning["level"] == "warning" and "SUPERUSER" in warning["message"]
    worker.wait_for("stopped")


# -- running ------------------------------------------------------------------------------------


def test_once_drains_the_queue_then_exits_and_says_stopped(
    fast: Settings, database: Database, workers: Workers
) -> None:
    tenants = ["alpha", "bravo", "charlie"]
    for tenant in tenants:
        service.enqueue(fast, tenant)

    worker = workers.start("--once", "--concurrency", "2")

    assert worker.wait(120) == 0, worker.output()
    for tenant in tenants:
        row = job_row(database, tenant)
        assert (row["status"], row["attempts"], row["progress"]) == ("succeeded", 1, 100)
    claimed = worker.events("claimed")
    assert sorted(e["tenant_id"] for e in claimed) == tenants
    assert {e["woke"] for e in claimed} <= {"start", "drain"}
    assert len({e["holder"] for e in worker.events("child_started")}) == 2
    done = worker.events("step_done")
    assert sorted((e["tenant_id"], e["step"]) for e in done) == sorted(
        (t, s) for t in tenants for s in STEPS
    )
    assert all(isinstance(e["seconds"], float) for e in done)
    assert sorted(e["tenant_id"] for e in worker.events("succeeded")) == tenants
    assert worker.wait_for("stopped")["jobs_succeeded"] == 3

    detail = heartbeat(database)
    assert detail["state"] == "stopped" and detail["jobs_done"] == 3
    health = run_cli(fast, "health", "--json")
    assert health.returncode == 1
    assert json.loads(health.stdout)["components"][0]["reason"] == "stopped cleanly"


def test_a_childs_finished_step_reports_ride_with_its_next_message(settings: Settings) -> None:
    """A finished step's report (and a tenant server's ``on_server``) is held and sent with the
    child's next message, in the order the engine gave them; a step that starts or fails, and a
    job's end, are sent at once."""
    parent_end, child_end = multiprocessing.get_context("spawn").Pipe()
    job = Job(uuid4(), "acme", "provision_tenant", JobStatus.RUNNING, 0, [], None, 1, 5)
    events = [
        ("create_schema", StepOutcome.STARTED),
        ("create_schema", StepOutcome.DONE),
        ("run_tenant_migrations", StepOutcome.STARTED),
        ("run_tenant_migrations", StepOutcome.REPAIRED),
        ("grant_app_rw", StepOutcome.SKIPPED),
        ("seed_role_profiles", StepOutcome.STARTED),
        ("seed_role_profiles", StepOutcome.ON_SERVER),
        ("seed_role_profiles", StepOutcome.FAILED),
        ("verify_object_storage", StepOutcome.STARTED),
        ("verify_object_storage", StepOutcome.DONE),
    ]
    arrived: list[bool] = []  # after each event: did the parent get a message?
    messages: list[processes.FromChild] = []

    def receive() -> bool:
        got = parent_end.poll()
        while parent_end.poll():
            messages.append(parent_end.recv())
        return got

    with Engine.from_settings(settings, "worker:test") as engine:
        child = processes._ChildLoop(child_end, engine)
        for step, outcome in events:
            child.progress(StepEvent(job, step, outcome, 0.25))
            arrived.append(receive())
        child.send(processes.JobEnded(runner.Settled(job)))
    receive()

    assert [type(m).__name__ for m in messages] == [
        "StepReport",  # create_schema started
        "Batch",  # ... done, run_tenant_migrations started
        "Batch",  # ... repaired, grant_app_rw skipped, seed_role_profiles started
        "Batch",  # ... on its server, then failed (control's side)
        "StepReport",  # verify_object_storage started
        "Batch",  # ... done, the job's end
    ]
    sent = [each for m in messages for each in getattr(m, "messages", (m,))]
    reports = [(r.step, r.outcome) for r in sent if isinstance(r, processes.StepReport)]
    assert reports == events
    assert isinstance(sent[-1], processes.JobEnded)
    held = {StepOutcome.DONE, StepOutcome.REPAIRED, StepOutcome.SKIPPED, StepOutcome.ON_SERVER}
    assert arrived == [outcome not in held for _, outcome in events]


def test_a_worker_at_its_defaults_runs_one_child_per_core(
    fast: Settings, database: Database, workers: Workers
) -> None:
    """No flag, no setting: one engine child per usable core (at most 8), and they drain the
    queue together."""
    tenants = [f"core_{i}" for i in range(4)]
    for tenant in tenants:
        service.enqueue(fast, tenant)

    worker = workers.start("--once", env={"PROVISIONER_WORKER_CONCURRENCY": ""})

    assert worker.wait(120) == 0, worker.output()
    cores = min(len(os.sched_getaffinity(0)), 8)
    assert worker.wait_for("started")["concurrency"] == cores
    assert len({e["holder"] for e in worker.events("child_started")}) == cores
    assert sorted(e["tenant_id"] for e in worker.events("succeeded")) == tenants


def test_the_concurrency_flag_beats_the_setting_and_a_bad_setting_is_refused(
    fast: Settings, database: Database, workers: Workers
) -> None:
    by_setting = workers.start("--once", env={"PROVISIONER_WORKER_CONCURRENCY": "3"})
    assert by_setting.wait(120) == 0, by_setting.output()
    assert by_setting.wait_for("started")["concurrency"] == 3
    assert len({e["holder"] for e in by_setting.events("child_started")}) == 3

    by_flag = workers.start(
        "--once", "--concurrency", "2", env={"PROVISIONER_WORKER_CONCURRENCY": "3"}
    )
    assert by_flag.wait(120) == 0, by_flag.output()
    assert by_flag.wait_for("started")["concurrency"] == 2

    refused = run_cli(fast, "worker", "--once", env={"PROVISIONER_WORKER_CONCURRENCY": "65"})
    assert refused.returncode == 2
    assert refused.stderr.strip().splitlines() == [
        "error: PROVISIONER_WORKER_CONCURRENCY must be between 0 (one per core) and 64, got 65"
    ]


def test_idle_worker_wakes_on_notify_long_before_its_poll(
    fast: Settings, database: Database, workers: Workers
) -> None:
    worker = workers.start("--poll-interval", "60").idle()

    service.enqueue(fast, "nimbus")

    # Timeouts well under the 60 s poll: only the NOTIFY can have woken it in time.
    claimed = worker.wait_for("claimed", 30, tenant_id="nimbus")
    assert claimed["woke"] == "notify"
    worker.wait_for("succeeded", 30, tenant_id="nimbus")
    detail = wait_until(
        lambda: (d := heartbeat(database))["jobs_succeeded"] and d, 10, "a beat after it"
    )
    assert detail["last_woke"] == "notify" and detail["woke"].get("notify") == 1
    assert detail["jobs_succeeded"] == 1
    assert worker.stop() == 0


def test_polling_picks_up_a_job_whose_notification_never_came(
    database: Database, workers: Workers
) -> None:
    worker = workers.start("--poll-interval", "0.5").idle()
    with database.owner() as conn:  # a job written by hand: no NOTIFY is ever sent
        conn.execute(
            "INSERT INTO control.tenants (tenant_id, schema_name) VALUES ('quiet', 'tenant_quiet')"
        )
        conn.execute(
            "INSERT INTO control.platform_jobs (tenant_id, job_type, idempotency_key) "
            "VALUES ('quiet', 'provision_tenant', 'provision:quiet')"
        )

    assert worker.wait_for("claimed", 30, tenant_id="quiet")["woke"] == "poll"
    worker.wait_for("succeeded", 30, tenant_id="quiet")
    assert worker.stop() == 0


def test_health_follows_the_heartbeat(fast: Settings, workers: Workers) -> None:
    worker = workers.start().idle()

    ready = run_cli(fast, "health", "--json")
    assert ready.returncode == 0, ready.stdout + ready.stderr
    seen = json.loads(ready.stdout)["components"][0]
    assert seen["reason"] == "ok" and seen["instance_id"].endswith(f":{worker.pid}")
    detail = seen["detail"]
    assert detail["job_types"] == ["provision_tenant"] and detail["state"] == "running"
    assert detail["storage"]["ready"] is True and detail["storage"]["provider"] == "filesystem"
    assert {"version", "current_jobs", "jobs_done", "jobs_recovered"} <= set(detail)

    missing = run_cli(fast, "health", "--job-types", "provision_tenant,send_email")
    assert missing.returncode == 1 and "does not advertise send_email" in missing.stdout

    worker.send_group(signal.SIGSTOP)  # no beat for more than three intervals
    try:
        stale = wait_until(
            lambda: (r := run_cli(fast, "health")).returncode == 1 and r, 30, "a stale heartbeat"
        )
        assert "old (limit" in stale.stdout
    finally:
        worker.send_group(signal.SIGCONT)
    wait_until(lambda: run_cli(fast, "health").returncode == 0, 30, "fresh beats again")

    assert worker.stop() == 0
    stopped = run_cli(fast, "health")
    assert stopped.returncode == 1 and "stopped cleanly" in stopped.stdout


def test_storage_down_at_start_is_reported_and_its_jobs_fail(
    fast: Settings, database: Database, workers: Workers, tmp_path: Path
) -> None:
    service.enqueue(fast, "dusty")
    missing = tmp_path / "no-such-bucket"
    worker = workers.start("--once", env={"OBJECT_STORE_PATH": str(missing)})

    assert worker.wait(120) == 0, worker.output()
    warning = worker.wait_for("storage_not_ready")
    assert warning["ready"] is False and "does not exist" in warning["error"]
    storage = heartbeat(database)["storage"]
    assert storage["ready"] is False and storage["provider"] == "filesystem"
    assert "does not exist" in storage["error"]
    failed = worker.wait_for("failed", tenant_id="dusty")
    assert failed["error"].startswith("verify_object_storage:")
    row = job_row(database, "dusty")
    assert row["status"] == "failed" and row["steps_completed"] == list(STEPS[:4])


def test_human_log_lines_never_carry_the_password(
    fast: Settings, database: Database, workers: Workers
) -> None:
    secret = "pw-9f3c-never-log-me"
    env = {
        "MIGRATIONS_DATABASE_URL": database.owner_url.replace("_owner@", f"_owner:{secret}@"),
        "APP_DATABASE_URL": database.app_url.replace("app_rw@", f"app_rw:{secret}@"),
    }
    service.enqueue(fast, "quill")
    worker = workers.start("--once", env=env, log_format="human")

    assert worker.wait(120) == 0, worker.output()
    output = worker.output()
    assert secret not in output
    lines = output.strip().splitlines()
    pattern = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z (INFO|WARNING|ERROR)\s+\w+")
    assert all(pattern.match(line) for line in lines), output
    assert any(
        " claimed " in line and "tenant_id=quill" in line and "woke=start" in line for line in lines
    )
    assert any(
        " step_done " in line and "step=run_tenant_migrations seconds=" in line for line in lines
    )
    assert any(" succeeded " in line and "tenant_id=quill" in line for line in lines)


def test_operator_sees_the_running_job_and_watches_it_finish(
    fast: Settings, database: Database, workers: Workers
) -> None:
    service.enqueue(fast, "vista")
    with tenant_row_locked(database, "vista") as lock:
        worker = workers.start()
        holder = wait_blocked_mid_step(database, "vista")
        # A beat is a snapshot: one may land after the parent saw the claim and before it read
        # the child's report that the step started; a later one shows the step.
        current = wait_until(
            lambda: [j for j in heartbeat(database)["current_jobs"] if j["step"]], 10, "a beat"
        )
        assert [(j["tenant_id"], j["step"], j["holder"]) for j in current] == [
            ("vista", "create_schema", holder)
        ]

        listed = run_cli(fast, "jobs", "list")
        line = next(ln for ln in listed.stdout.splitlines() if "vista" in ln)
        assert "running" in line and holder in line
        as_json = json.loads(run_cli(fast, "jobs", "list", "--json").stdout)
        assert [(j["tenant_id"], j["status"], j["locked_by"]) for j in as_json] == [
            ("vista", "running", holder)
        ]

        watch = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "provisioner",
                "status",
                "vista",
                "--watch",
                "--interval",
                "0.2",
            ],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=settings_env(fast),
        )
        assert watch.stdout is not None
        first = watch.stdout.readline()
        assert "running" in first
        lock.commit()  # the step goes on
        rest, errors = watch.communicate(timeout=60)
    assert watch.returncode == 0, errors
    last = rest.strip().splitlines()[-1]
    assert "succeeded" in last and "100%" in last
    assert worker.stop() == 0


def test_bad_flag_values_are_refused_by_the_cli(fast: Settings) -> None:
    result = CliRunner().invoke(
        main, ["worker", "--once", "--concurrency", "0"], env=settings_env(fast)
    )
    assert result.exit_code == 2 and "--concurrency" in result.output


def test_one_sign_up_wakes_one_of_the_idle_children(
    fast: Settings, database: Database, workers: Workers
) -> None:
    worker = workers.start("--concurrency", "3", "--poll-interval", "60").idle(180)
    before = wait_until(lambda: heartbeat(database).get("claims_asked"), 10, "a beat")

    service.enqueue(fast, "lone")

    assert worker.wait_for("claimed", 30, tenant_id="lone")["woke"] == "notify"
    worker.wait_for("succeeded", 60, tenant_id="lone")

    def settled() -> dict | None:
        detail = heartbeat(database)
        return detail if detail["jobs_succeeded"] == 1 and not detail["current_jobs"] else None

    wait_until(settled, 10, "an idle beat after the job")
    # One ask for the NOTIFY and one after the job's end (a job of its tenant may have been
    # held back), whatever the number of idle children; asking every idle child made it 5.
    asked = wait_until(
        lambda: (n := heartbeat(database)["claims_asked"] - before) >= 2 and n, 10, "the asks"
    )
    assert asked == 2
    assert len(worker.events("claimed")) == 1
    assert worker.stop() == 0


def test_two_workers_of_three_children_run_every_job_of_a_burst_once(
    fast: Settings, database: Database, workers: Workers
) -> None:
    tenants = [f"burst_{i}" for i in range(12)]
    for tenant in tenants:
        service.enqueue(fast, tenant)

    started = [workers.start("--once", "--concurrency", "3") for _ in range(2)]

    assert [w.wait(300) for w in started] == [0, 0], [w.output()[-2000:] for w in started]
    claimed = [e["tenant_id"] for w in started for e in w.events("claimed")]
    assert sorted(claimed) == sorted(tenants)  # each claimed once, none lost
    for tenant in tenants:
        row = job_row(database, tenant)
        assert (row["status"], row["attempts"], row["progress"]) == ("succeeded", 1, 100)
