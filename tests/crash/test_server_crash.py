"""A tenant on a tenant server (a second real cluster): SIGKILL at each seam of a step's two
commits, and a SIGSTOPped holder woken after its job was taken over (issue 29, item 3).

A lifecycle kind (suspend, restore, purge) is killed at its ON_SERVER seam as well, and resumes
to the same end with its server step adopted.

The seams, each a point where a real child process freezes and is killed:
``started`` (before the server's commit), ``on_server`` (the server committed the step and its
journal row, control's checkpoint not yet), ``done`` (both committed). The re-run must repeat no
step's effect (a step the server committed keeps the first run's token in the server's journal:
it was adopted, not run again) and lose none (the job succeeds and the schema equals a clean
tenant's).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import psycopg
import pytest

from provisioner import kinds, queue, servers, service
from provisioner.engine import StepEvent
from provisioner.kinds.provision import STEPS
from provisioner.models import JobStatus
from provisioner.settings import Settings
from provisioner.tenant.fingerprint import fingerprint
from tests.conftest import Database, run_cli, settings_env
from tests.extra_clusters import TenantServerDb
from tests.workers import kill_frozen, wait_until

KILL_CHILD = Path(__file__).with_name("provision_child.py")
PAUSE_CHILD = Path(__file__).with_name("pause_child.py")
SERVER_STEPS = ("create_schema", "run_tenant_migrations", "grant_app_rw", "seed_role_profiles")

SEAMS = [(step, "on_server") for step in SERVER_STEPS] + [
    (step, outcome)
    for step in ("create_schema", "seed_role_profiles")
    for outcome in ("started", "done")
]


@pytest.fixture
def placed(settings: Settings, database: Database, jobs_server: TenantServerDb) -> Settings:
    """The test's control database with the tenant server in its directory, migrated."""
    jobs_server.add_to(database)
    # ``provisioner migrate``'s library call (the command itself: tests/integration/
    # test_server_jobs.py), in process: a child process here would cost a second a test
    assert [m.server for m in servers.migrate_servers(settings.owner_url)] == ["east"]
    return settings


def checkpoint(database: Database, tenant: str) -> list[str]:
    with database.owner() as conn:
        row = conn.execute(
            "SELECT steps_completed FROM control.platform_jobs WHERE tenant_id = %s", (tenant,)
        ).fetchone()
    return list(row[0]) if row else []


@pytest.mark.parametrize(("step", "outcome"), SEAMS, ids=[f"{s}-{o}" for s, o in SEAMS])
def test_sigkill_at_each_seam_repeats_no_step_and_loses_none(
    placed: Settings,
    database: Database,
    jobs_server: TenantServerDb,
    clean_fingerprint: dict,
    step: str,
    outcome: str,
) -> None:
    index = SERVER_STEPS.index(step)
    kill_frozen(placed, KILL_CHILD, "victim", step, outcome)
    on_server = list(SERVER_STEPS[: index + (outcome != "started")])
    recorded = list(STEPS[: index + (outcome == "done")])
    assert sorted(jobs_server.journal("victim")) == sorted(on_server)
    assert checkpoint(database, "victim") == recorded

    events: list[StepEvent] = []
    result = service.provision(placed, "victim", on_progress=events.append)

    assert (result.job.status, result.job.attempts) == (JobStatus.SUCCEEDED, 2)
    assert result.job.steps_completed == list(STEPS)
    adopted = [e.step for e in events if e.outcome == "skipped" and e.detail]
    assert adopted == (on_server[-1:] if outcome == "on_server" else [])
    ran = [e.step for e in events if e.outcome == "done"]
    assert ran == [s for s in STEPS if s not in on_server and s not in recorded]
    tokens = jobs_server.journal("victim")
    first, second = min(tokens.values()), max(tokens.values())
    assert {s: t == first for s, t in tokens.items()} == {
        s: (s in on_server) or not on_server for s in SERVER_STEPS
    }
    if on_server and len(on_server) < len(SERVER_STEPS):
        assert first < second
    fence = jobs_server.fence("victim")  # raised by the resume, whatever it wrote there
    assert fence is not None and fence >= second and (fence > first or not on_server)
    with jobs_server.owner() as conn:
        assert fingerprint(conn, "tenant_victim") == clean_fingerprint


def _paused(settings: Settings, go: Path, step: str, outcome: str) -> subprocess.Popen[str]:
    child = subprocess.Popen(
        [sys.executable, str(PAUSE_CHILD), "sleeper", step, outcome, str(go)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=settings_env(settings),
    )
    assert child.stdout is not None
    line = child.stdout.readline()
    assert line.strip() == f"PAUSED {step} {outcome}", child.stderr.read() if child.stderr else ""
    return child


@pytest.mark.parametrize(
    ("step", "outcome", "refused_by"),
    [
        ("grant_app_rw", "started", "fence on its server"),  # its server write is next
        ("grant_app_rw", "on_server", "no longer held"),  # its control checkpoint is next
    ],
)
def test_a_sigstopped_holder_taken_over_cannot_write_on_either_server(
    placed: Settings,
    database: Database,
    jobs_server: TenantServerDb,
    clean_fingerprint: dict,
    tmp_path: Path,
    step: str,
    outcome: str,
    refused_by: str,
) -> None:
    go = tmp_path / "go"
    zombie = _paused(placed, go, step, outcome)
    os.kill(zombie.pid, signal.SIGSTOP)
    before = jobs_server.journal("sleeper")

    def recovered() -> list[str]:
        with database.owner() as conn:
            return [j.tenant_id for j in queue.recover_stale(conn, 1.0)]

    # its lease expires while it is stopped (a second without heartbeat): then recovered
    assert wait_until(recovered, 60, "the stopped holder's lease to expire") == ["sleeper"]

    result = service.provision(placed, "sleeper")
    assert (result.job.status, result.job.attempts) == (JobStatus.SUCCEEDED, 2)
    after = jobs_server.journal("sleeper")
    fence = jobs_server.fence("sleeper")

    go.touch()
    os.kill(zombie.pid, signal.SIGCONT)
    out, err = zombie.communicate(timeout=120)
    assert out.strip().startswith("REFUSED LeaseLost") and refused_by in out, out + err
    # Nothing the zombie did after its take-over reached either server.
    assert jobs_server.journal("sleeper") == after
    assert jobs_server.fence("sleeper") == fence
    assert all(after[s] == before[s] for s in before)  # adopted, not run again
    with database.owner() as conn:
        row = conn.execute(
            "SELECT status, attempts, steps_completed FROM control.platform_jobs "
            "WHERE tenant_id = 'sleeper'"
        ).fetchone()
    assert row == ("succeeded", 2, list(STEPS))
    with jobs_server.owner() as conn:
        assert fingerprint(conn, "tenant_sleeper") == clean_fingerprint


LIFECYCLE_CHILD = Path(__file__).with_name("lifecycle_child.py")
#: A lifecycle kind's server step killed at its ON_SERVER seam, and the end it resumes to:
#: (the tenant's state, what the application role gets on the server).
LIFECYCLE_SEAMS = {
    ("suspend_tenant", "revoke_app_rw"): ("suspended", "permission denied"),
    ("restore_tenant", "grant_app_rw"): ("onboarding", "allowed"),
    ("purge_tenant", "drop_schema"): ("deleted", "schema gone"),
}


def app_sees(jobs_server: TenantServerDb, tenant: str) -> str:
    try:
        with jobs_server.app() as app:
            app.execute(f"SELECT count(*) FROM tenant_{tenant}.role_profiles").fetchone()
    except psycopg.errors.InsufficientPrivilege:
        return "permission denied"
    except psycopg.errors.UndefinedTable:
        return "schema gone"
    return "allowed"


def lifecycle_journal(
    database: Database, jobs_server: TenantServerDb, tenant: str, job_type: str
) -> dict[str, int]:
    """The server's journal of the tenant's job of ``job_type``: step -> the token that wrote
    it (restore's grant_app_rw shares its name with provisioning's: read by the job's id)."""
    with database.owner() as conn:
        row = conn.execute(
            "SELECT id FROM control.platform_jobs WHERE tenant_id = %s AND job_type = %s",
            (tenant, job_type),
        ).fetchone()
    assert row is not None
    with jobs_server.owner() as conn:
        rows = conn.execute(
            "SELECT step, token FROM provisioner_server.step_journal WHERE job_id = %s",
            (row[0],),
        ).fetchall()
    return {str(step): int(token) for step, token in rows}


@pytest.mark.parametrize(
    ("job_type", "step"), list(LIFECYCLE_SEAMS), ids=[k for k, _ in LIFECYCLE_SEAMS]
)
def test_a_lifecycle_kind_killed_between_its_two_commits_resumes_to_the_same_end(
    placed: Settings,
    database: Database,
    jobs_server: TenantServerDb,
    job_type: str,
    step: str,
) -> None:
    service.provision(placed, "victim")
    if job_type == "restore_tenant":
        service.change_lifecycle(placed, "victim", "suspend_tenant")
        assert app_sees(jobs_server, "victim") == "permission denied"
    kill_frozen(placed, LIFECYCLE_CHILD, "victim", job_type, step, "on_server")
    first = lifecycle_journal(database, jobs_server, "victim", job_type)
    assert step in first  # committed on the server ...
    with database.owner() as conn:  # ... and not in control's checkpoint
        row = conn.execute(
            "SELECT steps_completed FROM control.platform_jobs WHERE tenant_id = 'victim' "
            "AND job_type = %s",
            (job_type,),
        ).fetchone()
    assert row is not None and step not in row[0]

    events: list[StepEvent] = []
    result = service.change_lifecycle(placed, "victim", job_type, on_progress=events.append)

    job = result.job
    assert job is not None
    assert (job.status, job.attempts) == (JobStatus.SUCCEEDED, 2)
    assert job.steps_completed == list(kinds.BUILTIN[job_type].step_names)
    adopted = [e.step for e in events if e.outcome == "skipped" and e.detail]
    assert adopted == [step]  # not run again: its journal row keeps the first run's token
    assert lifecycle_journal(database, jobs_server, "victim", job_type)[step] == first[step]
    with database.owner() as conn:
        found = conn.execute("SELECT state FROM control.tenants WHERE tenant_id = 'victim'")
        state = found.fetchone()
    assert (state[0] if state else None, app_sees(jobs_server, "victim")) == LIFECYCLE_SEAMS[
        (job_type, step)
    ]


REPAIR_CHILD = Path(__file__).with_name("repair_child.py")


def test_a_repair_killed_between_its_two_commits_is_adopted_by_a_worker(
    placed: Settings, database: Database, jobs_server: TenantServerDb
) -> None:
    service.provision(placed, "victim")
    with jobs_server.owner() as conn:
        conn.execute("REVOKE SELECT ON tenant_victim.role_profiles FROM app_rw")
    kill_frozen(placed, REPAIR_CHILD, "victim", "restore_catalog", "on_server")
    assert app_sees(jobs_server, "victim") == "allowed"  # restored on the server, committed
    assert "restore_catalog" in lifecycle_journal(database, jobs_server, "victim", "repair_tenant")

    def recovered() -> list[str]:
        with database.owner() as conn:
            return [j.tenant_id for j in queue.recover_stale(conn, 1.0)]

    # the killed holder's lease expires (a second without heartbeat): then recovered
    assert wait_until(recovered, 60, "the killed holder's lease to expire") == ["victim"]

    env = {"PROVISIONER_WORKER_JOB_TYPES": "repair_tenant"}
    worker = run_cli(placed, "worker", "--once", env=env)
    assert worker.returncode == 0, worker.stderr
    assert "adopted" in worker.stdout + worker.stderr
    with database.owner() as conn:
        row = conn.execute(
            "SELECT status, attempts, steps_completed FROM control.platform_jobs "
            "WHERE job_type = 'repair_tenant'"
        ).fetchone()
    assert row == ("succeeded", 2, ["restore_catalog"])
    assert service.check(placed, ["victim"]).tenants[0].state.value == "clean"
