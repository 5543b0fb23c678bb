"""Rollouts that report (issue 28 item 3) and resumes that skip tenants which left the fleet
(issue 27 item 12), against real PostgreSQL, real ``provisioner`` processes and a real
pseudo-terminal.

A rollout ends ``completed`` (its last job settled), ``halted`` (its brake) or ``aborted``,
never "running" next to "finished"; its summary counts upgraded, failed and skipped tenants
by starting revision; ``upgrade --watch`` redraws in place on a terminal, prints plain lines
when piped, and exits 1 when the rollout halted or a tenant failed; its failure list says
failed, held or queued for each tenant and has as many failed entries as the counts.
"""

from __future__ import annotations

import json
import os
import pty
import select
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

import psycopg
import pytest
from psycopg.rows import dict_row

from provisioner.settings import Settings
from provisioner.testing import Tenant
from tests.conftest import Database, run_cli, settings_env
from tests.integration import test_fleet_upgrade as fleet_upgrade
from tests.workers import Workers, wait_until

ADD_SOURCE = '    op.execute("ALTER TABLE audit_events ADD COLUMN source TEXT")'
# Fails on a tenant with an audit event whose target_type is NULL (the test writes one).
STRICT_TARGET = '    op.execute("ALTER TABLE audit_events ALTER COLUMN target_type SET NOT NULL")'
# Fails on the same tenants with an error a retry may fix (SQLSTATE 40001, a serialization
# failure): a constraint violation fails its job at once, this one is retried.
BUSY_WHILE_BROKEN = (
    '    op.execute("""DO $busy$ BEGIN\n'
    "      IF EXISTS (SELECT FROM audit_events WHERE target_type IS NULL) THEN\n"
    "        RAISE EXCEPTION 'busy' USING ERRCODE = '40001';\n"
    '      END IF; END $busy$""")'
)


def use_tree(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, body: str) -> dict[str, str]:
    """A copy of the tenant tree with a t005 of ``body``, for this process and the children."""
    return fleet_upgrade.use_tree(monkeypatch, fleet_upgrade.make_tree(tmp_path, body))


@pytest.fixture
def fleet(settings: Settings, tenant_factory: Callable[..., Tenant]) -> Callable[[list[str]], None]:
    """Provisioned tenants in the test's own database (rollouts are numbered per database)."""

    def provision(tenants: list[str]) -> None:
        for tenant in tenants:
            tenant_factory(tenant, settings=settings)

    return provision


@pytest.fixture
def fast(settings: Settings) -> Settings:
    return replace(settings, heartbeat_seconds=0.5, job_stale_after_seconds=30.0)


def kind_job(database: Database, tenant: str, job_type: str) -> dict[str, Any]:
    """The tenant's job of ``job_type`` (a tenant has one per kind)."""
    with database.owner() as conn, conn.cursor(row_factory=dict_row) as cur:
        row = cur.execute(
            "SELECT * FROM control.platform_jobs WHERE tenant_id = %s AND job_type = %s",
            (tenant, job_type),
        ).fetchone()
    assert row is not None, f"no {job_type} job for tenant {tenant}"
    return dict(row)


def versions(database: Database, tenant: str) -> list[str]:
    with database.owner() as conn:
        rows = conn.execute(f"SELECT version_num FROM tenant_{tenant}.alembic_version").fetchall()
    return [r[0] for r in rows]


def break_tenants(database: Database, *tenants: str) -> None:
    """An audit event without a target type: STRICT_TARGET then fails on these tenants."""
    with database.app() as conn:
        for tenant in tenants:
            conn.execute(f"INSERT INTO tenant_{tenant}.audit_events (action) VALUES ('x')")


def watch_json(settings: Settings, env: dict[str, str]) -> tuple[int, dict[str, Any]]:
    shown = run_cli(settings, "upgrade", "--watch", "--json", env=env)
    assert shown.returncode in (0, 1), shown.stderr
    return shown.returncode, dict(json.loads(shown.stdout))


def rollout_row(database: Database) -> dict[str, Any]:
    with database.owner() as conn:
        row = conn.execute(
            "SELECT state, finished_at IS NOT NULL AS stamped FROM control.rollouts "
            "ORDER BY id DESC LIMIT 1"
        ).fetchone()
    assert row is not None
    return {"state": row[0], "stamped": row[1]}


def worker_once(settings: Settings, env: dict[str, str]) -> None:
    done = run_cli(settings, "worker", "--once", env=env)
    assert done.returncode == 0, done.stderr


def test_a_rollout_ends_completed_with_a_summary_and_a_failure_list_that_matches(
    settings: Settings,
    database: Database,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    fleet: Callable[[list[str]], None],
) -> None:
    tenants = ["sum_a", "sum_b", "sum_bad"]
    fleet(tenants)
    break_tenants(database, "sum_bad")
    env = use_tree(tmp_path, monkeypatch, STRICT_TARGET)
    assert run_cli(settings, "upgrade", "--all", env=env).returncode == 0
    with database.owner() as conn:
        conn.execute("UPDATE control.platform_jobs SET max_attempts = 1")
    code, running = watch_json(settings, env)
    assert running["rollout"]["state"] == "running" and not running["finished"]
    assert code == 0 and not running["stopped"]

    worker_once(settings, env)
    code, view = watch_json(settings, env)
    assert view["rollout"]["state"] == "completed" and view["finished"] and view["stopped"]
    assert code == 1  # a tenant failed
    assert rollout_row(database) == {"state": "completed", "stamped": True}
    summary = view["summary"]
    assert (summary["upgraded"], summary["failed"], summary["skipped"]) == (2, 1, 0)
    assert summary["upgraded_from"] == {"t004": 2}
    assert summary["rate_per_minute"] > 0
    failed = [f for f in view["failures"] if f["phase"] == "failed"]
    assert len(failed) == view["phases"]["failed"] == 1
    assert failed[0]["tenant_id"] == "sum_bad" and "target_type" in failed[0]["error"]

    text = run_cli(settings, "upgrade", "--watch", env=env)  # piped: plain lines
    assert text.returncode == 1
    assert "\x1b[" not in text.stdout and "\r" not in text.stdout
    assert "rollout 1 to t005 (completed): 3/3; 2 done, 1 failed;" in text.stdout
    assert "rollout 1 completed after" in text.stdout
    assert "2 upgraded (2 from t004), 1 failed, 0 skipped (left the fleet)" in text.stdout
    assert "failures: 1 failed" in text.stdout
    assert "  sum_bad (failed, attempt 1)" in text.stdout
    for line in text.stdout.splitlines():  # the error is wrapped, never cut mid-word
        if line.startswith("    "):
            assert line.strip() in " ".join(failed[0]["error"].split())

    # A new rollout goes on beside none: the finished one stays completed.
    assert versions(database, "sum_a") == ["t005"]
    again = run_cli(settings, "upgrade", "--all", "--dry-run", env=env)
    assert again.returncode == 0, again.stderr
    assert rollout_row(database)["state"] == "completed"


def test_a_halted_rollout_lists_held_and_failed_tenants_and_its_watch_exits_1(
    settings: Settings,
    database: Database,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    fleet: Callable[[list[str]], None],
) -> None:
    tenants = ["halt_bad", "halt_retry", "halt_ok"]
    fleet(tenants)
    break_tenants(database, "halt_bad", "halt_retry")
    env = use_tree(tmp_path, monkeypatch, BUSY_WHILE_BROKEN)
    started = run_cli(settings, "upgrade", "--all", "--max-failures", "1", env=env)
    assert started.returncode == 0, started.stderr
    with database.owner() as conn:
        # halt_retry gets three attempts; halt_bad one, and waits until halt_retry's first
        # attempt has failed (it is then queued again, for later, with its error).
        conn.execute("UPDATE control.platform_jobs SET max_attempts = 3")
        conn.execute(
            "UPDATE control.platform_jobs SET max_attempts = 1, "
            "available_at = now() + interval '1 hour' WHERE tenant_id = 'halt_bad'"
        )
    worker_once(settings, env)
    retry = kind_job(database, "halt_retry", "provision_tenant")
    assert retry["status"] == "queued" and retry["error_detail"]
    with database.owner() as conn:  # halt_bad now, halt_retry's second attempt later
        conn.execute(
            "UPDATE control.platform_jobs SET available_at = CASE tenant_id "
            "WHEN 'halt_bad' THEN now() ELSE now() + interval '1 hour' END "
            "WHERE tenant_id IN ('halt_bad', 'halt_retry')"
        )
    worker_once(settings, env)

    code, view = watch_json(settings, env)
    assert code == 1
    assert view["rollout"]["state"] == "halted" and not view["finished"] and view["stopped"]
    assert view["phases"] == {"done": 1, "failed": 1, "held": 1}
    phases = {f["tenant_id"]: f["phase"] for f in view["failures"]}
    assert phases == {"halt_bad": "failed", "halt_retry": "held"}
    assert sum(1 for f in view["failures"] if f["phase"] == "failed") == view["phases"]["failed"]

    text = run_cli(settings, "upgrade", "--watch", env=env)
    assert text.returncode == 1, text.stdout
    assert "rollout 1 halted after" in text.stdout
    assert "halted by its brake" in text.stdout
    assert "halt_retry (held, attempt 1)" in text.stdout
    assert "failures: 1 failed, 1 more with an earlier attempt's error" in text.stdout


def read_pty(fd: int, proc: subprocess.Popen[bytes], until: Callable[[bytes], bool]) -> bytes:
    """What the child wrote to its terminal, until ``until(output)`` or its exit."""
    seen = b""
    deadline = time.monotonic() + 90
    while time.monotonic() < deadline:
        ready, _, _ = select.select([fd], [], [], 0.2)
        if ready:
            try:
                chunk = os.read(fd, 65536)
            except OSError:  # the child closed the terminal
                break
            seen += chunk
            if until(seen):
                return seen
        elif proc.poll() is not None:
            break
    return seen


def test_watch_redraws_in_place_on_a_terminal_until_the_rollout_completes(
    settings: Settings,
    database: Database,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    fleet: Callable[[list[str]], None],
) -> None:
    tenants = ["tty_a", "tty_b", "tty_c"]
    fleet(tenants)
    env = use_tree(tmp_path, monkeypatch, ADD_SOURCE)
    assert run_cli(settings, "upgrade", "--all", env=env).returncode == 0
    primary, secondary = pty.openpty()
    child_env = {**settings_env(settings), **env, "COLUMNS": "120", "LINES": "40"}
    proc = subprocess.Popen(
        [sys.executable, "-m", "provisioner", "upgrade", "--watch", "--interval", "0.2"],
        stdin=secondary,
        stdout=secondary,
        stderr=secondary,
        env=child_env,
        close_fds=True,
    )
    os.close(secondary)
    try:
        # Several frames while nothing runs: each moves the cursor up over the last one.
        before = read_pty(primary, proc, lambda out: out.count(b"\x1b[2F") >= 2)
        assert before.count(b"\x1b[2F") >= 2, before
        assert b"[------------------------] 0/3" in before
        worker_once(settings, env)
        after = before + read_pty(primary, proc, lambda out: b"tenants per head" in out)
        assert proc.wait(timeout=60) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
        os.close(primary)
    text = after.decode()
    assert "[########################] 3/3" in text
    assert "rollout 1 completed after" in text and "3 upgraded (3 from t004)" in text
    # Frames replaced each other: the "0 done" frame was printed many times, never appended
    # as a new line after the screen moved on.
    assert text.count("\x1b[J") >= 3
    assert all(versions(database, t) == ["t005"] for t in tenants)


def test_resume_after_canary_review_skips_tenants_that_left_the_fleet(
    settings: Settings,
    database: Database,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    fleet: Callable[[list[str]], None],
) -> None:
    tenants = ["rv_a", "rv_b", "rv_c", "rv_d", "rv_e", "rv_f"]
    fleet(tenants)
    env = use_tree(tmp_path, monkeypatch, ADD_SOURCE)
    started = run_cli(settings, "upgrade", "--all", "--canary", "1", "--max-failures", "1", env=env)
    assert started.returncode == 0, started.stderr
    worker_once(settings, env)
    # During the review: one suspended, one archived, one purged.
    assert run_cli(settings, "suspend", "rv_b", env=env).returncode == 0
    assert run_cli(settings, "deprovision", "rv_c", env=env).returncode == 0
    assert run_cli(settings, "deprovision", "--purge", "--yes", "rv_d", env=env).returncode == 0
    runs_before = {
        t: kind_job(database, t, "provision_tenant")["run"] for t in ("rv_b", "rv_c", "rv_d")
    }

    # Each left the rollout when its state changed: skipped already, before the resume.
    code, view = watch_json(settings, env)
    assert view["phases"] == {"done": 1, "pending": 2, "skipped": 3}
    resumed = run_cli(settings, "upgrade", "--resume", env=env)
    assert resumed.returncode == 0, resumed.stderr
    assert resumed.stdout == "rollout 1 resumed: 2 tenant(s) queued, 0 held job(s) released\n"
    for tenant in ("rv_b", "rv_c", "rv_d"):  # not re-opened: nothing can fail
        row = kind_job(database, tenant, "provision_tenant")
        assert (row["status"], row["run"]) == ("succeeded", runs_before[tenant])
    worker_once(settings, env)

    code, view = watch_json(settings, env)
    assert code == 0, view
    assert view["rollout"]["state"] == "completed"  # the brake was not tripped
    assert view["phases"] == {"done": 3, "skipped": 3}
    assert view["failures"] == []
    assert (view["summary"]["upgraded"], view["summary"]["skipped"]) == (3, 3)
    for tenant in ("rv_a", "rv_e", "rv_f"):
        assert versions(database, tenant) == ["t005"]
    for tenant in ("rv_b", "rv_c"):
        assert versions(database, tenant) == ["t004"]


def test_resume_after_a_halt_does_not_release_the_jobs_of_tenants_that_left(
    settings: Settings,
    database: Database,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    fleet: Callable[[list[str]], None],
) -> None:
    tenants = ["hl_bad", "hl_gone", "hl_ok"]
    fleet(tenants)
    break_tenants(database, "hl_bad")
    env = use_tree(tmp_path, monkeypatch, STRICT_TARGET)
    started = run_cli(settings, "upgrade", "--all", "--max-failures", "1", env=env)
    assert started.returncode == 0, started.stderr
    with database.owner() as conn:  # hl_bad runs (and fails) first; the others wait
        conn.execute("UPDATE control.platform_jobs SET max_attempts = 1")
        conn.execute(
            "UPDATE control.platform_jobs SET available_at = now() + interval '1 hour' "
            "WHERE tenant_id <> 'hl_bad'"
        )
    worker_once(settings, env)
    assert rollout_row(database)["state"] == "halted"
    assert run_cli(settings, "suspend", "hl_gone", env=env).returncode == 0

    resumed = run_cli(settings, "upgrade", "--resume", env=env)
    assert resumed.returncode == 0, resumed.stderr
    # hl_gone's held job left the rollout when it was suspended: only hl_ok's is released.
    assert resumed.stdout == "rollout 1 resumed: 0 tenant(s) queued, 1 held job(s) released\n"
    assert kind_job(database, "hl_gone", "provision_tenant")["status"] == "succeeded"
    worker_once(settings, env)
    code, view = watch_json(settings, env)
    assert view["rollout"]["state"] == "completed"
    assert view["phases"] == {"done": 1, "failed": 1, "skipped": 1}
    assert code == 1  # hl_bad failed
    assert versions(database, "hl_ok") == ["t005"]
    assert versions(database, "hl_gone") == ["t004"]


@pytest.mark.slow
def test_two_workers_settling_the_last_jobs_at_once_complete_the_rollout(
    fast: Settings,
    database: Database,
    workers: Workers,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    fleet: Callable[[list[str]], None],
) -> None:
    tenants = [f"pair_{i}" for i in range(8)]
    fleet(tenants)
    env = use_tree(tmp_path, monkeypatch, ADD_SOURCE)
    workers.start(env=env)
    workers.start(env=env)
    assert run_cli(fast, "upgrade", "--all", env=env).returncode == 0
    wait_until(lambda: rollout_row(database)["state"] == "completed", 90, "a completed rollout")
    assert all(versions(database, t) == ["t005"] for t in tenants)
    code, view = watch_json(fast, env)
    assert code == 0 and view["summary"]["upgraded"] == 8


def test_a_tenant_suspended_while_its_upgrade_is_queued_is_skipped_not_a_failure(
    settings: Settings,
    database: Database,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    fleet: Callable[[list[str]], None],
) -> None:
    """The brake counts failures of upgrades, not of tenants taken out of the fleet: with
    ``--max-failures 2``, one real failure and one tenant suspended while its job waited
    leave the rollout completed, the suspended tenant skipped at its old head."""
    fleet(["br_bad", "br_gone", "br_ok"])
    break_tenants(database, "br_bad")
    env = use_tree(tmp_path, monkeypatch, STRICT_TARGET)
    started = run_cli(settings, "upgrade", "--all", "--max-failures", "2", env=env)
    assert started.returncode == 0, started.stderr
    with database.owner() as conn:
        conn.execute("UPDATE control.platform_jobs SET max_attempts = 1")
    queued = kind_job(database, "br_gone", "provision_tenant")
    assert queued["status"] == "queued"

    suspended = run_cli(settings, "suspend", "br_gone", env=env)
    assert suspended.returncode == 0, suspended.stderr
    job = kind_job(database, "br_gone", "provision_tenant")
    assert (job["status"], job["run"]) == ("succeeded", queued["run"])
    with database.owner() as conn:
        ended = conn.execute(
            "SELECT ended_by FROM control.job_runs WHERE job_id = %s AND run = %s",
            (job["id"], job["run"]),
        ).fetchone()
        detail = conn.execute(
            "SELECT s.detail FROM control.job_step_runs s JOIN control.platform_jobs j "
            "ON j.id = s.job_id WHERE j.tenant_id = 'br_gone' AND s.step = 'mark_suspended'"
        ).fetchone()
    assert ended == ("tenant suspended",)
    assert detail is not None and "skipped in rollout 1" in detail[0]

    worker_once(settings, env)
    code, view = watch_json(settings, env)
    assert view["rollout"]["state"] == "completed", view  # not halted: one failure, not two
    assert view["phases"] == {"done": 1, "failed": 1, "skipped": 1}
    assert (view["summary"]["failed"], view["summary"]["skipped"]) == (1, 1)
    assert [f["tenant_id"] for f in view["failures"]] == ["br_bad"]
    assert code == 1  # br_bad failed
    assert versions(database, "br_ok") == ["t005"]
    assert versions(database, "br_gone") == ["t004"]
    text = run_cli(settings, "upgrade", "--watch", env=env)
    assert "1 upgraded (1 from t004), 1 failed, 1 skipped (left the fleet)" in text.stdout


# Waits for the test's advisory lock inside the migration: a job stays running until it lets go.
# The wait is a tenant's only: the tool's scratch schemas (``provisioner_*``: the template
# reference a worker child builds before it is ready) run the revision without waiting.
WAIT_FOR_TEST = (
    "    op.execute(\"DO $w$ BEGIN IF current_schema() NOT LIKE 'provisioner%' THEN \"\n"
    '               "PERFORM pg_advisory_xact_lock(2028); END IF; END $w$")\n'
    '    op.execute("ALTER TABLE audit_events ADD COLUMN source TEXT")'
)


def jobs_by_status(database: Database) -> dict[str, int]:
    with database.owner() as conn:
        rows = conn.execute(
            "SELECT status, count(*) FROM control.platform_jobs "
            "WHERE job_type = 'provision_tenant' GROUP BY 1"
        ).fetchall()
    return {str(status): int(n) for status, n in rows}


def waiting_on_advisory_lock(database: Database) -> int:
    with psycopg.connect(database.admin_url) as conn:
        row = conn.execute(
            "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
            "AND wait_event_type = 'Lock' AND wait_event = 'advisory'"
        ).fetchone()
    return int(row[0]) if row else 0


@pytest.mark.slow
def test_a_paused_rollout_lets_running_jobs_finish_and_starts_none_until_resumed(
    fast: Settings,
    database: Database,
    workers: Workers,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    fleet: Callable[[list[str]], None],
) -> None:
    tenants = [f"pause_{i}" for i in range(5)]
    fleet(tenants)
    env = use_tree(tmp_path, monkeypatch, WAIT_FOR_TEST)
    gate = psycopg.connect(database.owner_url, autocommit=True)
    try:
        gate.execute("SELECT pg_advisory_lock(2028)")
        assert run_cli(fast, "upgrade", "--all", env=env).returncode == 0
        worker = workers.start(
            "--concurrency", "2", env={**env, "PROVISIONER_LOCK_TIMEOUT_SECONDS": "300"}
        )
        wait_until(lambda: waiting_on_advisory_lock(database) == 2, 60, "two jobs mid-step")
        assert jobs_by_status(database) == {"running": 2, "queued": 3}

        paused = run_cli(fast, "rollouts", "pause", "1", env=env)
        assert paused.returncode == 0, paused.stderr
        assert "rollout 1 paused by rollouts pause (" in paused.stdout
        assert "3 queued job(s) held, 2 running job(s) finish" in paused.stdout
        code, view = watch_json(fast, env)
        assert view["rollout"]["state"] == "paused" and not view["stopped"]
        assert view["rollout"]["paused_by"].startswith("rollouts pause (")
        assert view["rollout"]["paused_at"] is not None
        assert view["phases"] == {"running": 2, "held": 3}
    finally:
        gate.close()  # the two running jobs go on

    wait_until(lambda: jobs_by_status(database).get("succeeded") == 2, 60, "both to finish")
    worker.idle()  # it looked for more work and found none claimable
    assert jobs_by_status(database) == {"succeeded": 2, "queued": 3}
    code, view = watch_json(fast, env)
    assert view["rollout"]["state"] == "paused" and view["stopped"] and code == 1
    assert view["phases"] == {"done": 2, "held": 3}
    assert view["summary"]["state"].startswith("paused by rollouts pause (")
    text = run_cli(fast, "upgrade", "--watch", env=env)
    assert text.returncode == 1
    assert "rollout 1 paused by rollouts pause (" in text.stdout
    assert "`provisioner rollouts resume 1`" in text.stdout
    again = run_cli(fast, "rollouts", "pause", "1", env=env)
    assert again.returncode == 2 and "it is already paused; nothing to pause" in again.stderr

    resumed = run_cli(fast, "rollouts", "resume", "1", env=env)
    assert resumed.returncode == 0, resumed.stderr
    assert "rollout 1 resumed: 0 tenant(s) queued, 3 held job(s) released" in resumed.stdout
    wait_until(lambda: rollout_row(database)["state"] == "completed", 90, "a completed rollout")
    assert all(versions(database, t) == ["t005"] for t in tenants)
    code, view = watch_json(fast, env)
    assert code == 0 and view["summary"]["upgraded"] == 5
    assert view["rollout"]["paused_by"] is None

    for rollout_id, why in (("1", "rollout 1 is completed: it has ended"), ("9", "no rollout 9")):
        ended = run_cli(fast, "rollouts", "pause", rollout_id, env=env)
        assert ended.returncode == 2, ended.stdout
        assert why in ended.stderr and len(ended.stderr.strip().splitlines()) == 1


def test_a_paused_rollout_holds_a_job_queued_again_and_its_brake_still_counts(
    settings: Settings,
    database: Database,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    fleet: Callable[[list[str]], None],
) -> None:
    """What a worker does to a job while the rollout is paused, written as its statements
    write it: a retry queued again is held with the others; the K-th failure halts it."""
    fleet(["ph_a", "ph_b", "ph_c"])
    env = use_tree(tmp_path, monkeypatch, ADD_SOURCE)
    assert run_cli(settings, "upgrade", "--all", "--max-failures", "1", env=env).returncode == 0
    with database.owner() as conn:  # two claims
        conn.execute(
            "UPDATE control.platform_jobs SET status = 'running', attempts = 1 "
            "WHERE tenant_id IN ('ph_a', 'ph_b')"
        )
    assert run_cli(settings, "rollouts", "pause", "1", env=env).returncode == 0
    with database.owner() as conn:  # ph_a's attempt fails and is queued again for a retry
        conn.execute(
            "UPDATE control.platform_jobs SET status = 'queued', available_at = now(), "
            "error_detail = 'busy' WHERE tenant_id = 'ph_a'"
        )
    code, view = watch_json(settings, env)
    assert view["rollout"]["state"] == "paused"
    assert view["phases"] == {"held": 2, "running": 1}
    assert {f["tenant_id"]: f["phase"] for f in view["failures"]} == {"ph_a": "held"}
    with database.owner() as conn:  # ph_b fails for good: the brake's first failure
        conn.execute(
            "UPDATE control.platform_jobs SET status = 'failed', error_detail = 'bad' "
            "WHERE tenant_id = 'ph_b'"
        )
    code, view = watch_json(settings, env)
    assert view["rollout"]["state"] == "halted" and code == 1
    assert view["phases"] == {"held": 2, "failed": 1}


def test_a_job_retried_by_hand_while_its_rollout_is_paused_is_held_until_resume(
    settings: Settings,
    database: Database,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    fleet: Callable[[list[str]], None],
) -> None:
    """``jobs retry`` (one job, or ``--failed``) moves a job from failed to queued: the hold
    trigger sees that move too, so a paused rollout still starts nothing until resume."""
    fleet(["pr_a", "pr_b", "pr_c"])
    env = use_tree(tmp_path, monkeypatch, ADD_SOURCE)
    assert run_cli(settings, "upgrade", "--all", "--max-failures", "3", env=env).returncode == 0
    assert run_cli(settings, "rollouts", "pause", "1", env=env).returncode == 0
    with database.owner() as conn:  # two attempts fail for good (the brake's 1st and 2nd)
        conn.execute(
            "UPDATE control.platform_jobs SET status = 'running' WHERE tenant_id <> 'pr_c'"
        )
        conn.execute(
            "UPDATE control.platform_jobs SET status = 'failed', error_detail = 'bad' "
            "WHERE tenant_id <> 'pr_c'"
        )
    _, view = watch_json(settings, env)
    assert view["rollout"]["state"] == "paused"
    assert view["phases"] == {"held": 1, "failed": 2}

    job_a = kind_job(database, "pr_a", "provision_tenant")["id"]
    one = run_cli(settings, "jobs", "retry", str(job_a))
    assert one.returncode == 0, one.stderr
    every = run_cli(settings, "jobs", "retry", "--failed")
    assert every.returncode == 0, every.stderr
    _, view = watch_json(settings, env)
    assert view["rollout"]["state"] == "paused" and view["phases"] == {"held": 3}
    worker_once(settings, env)  # nothing is claimable while paused
    assert jobs_by_status(database) == {"queued": 3}

    resumed = run_cli(settings, "rollouts", "resume", "1", env=env)
    assert resumed.returncode == 0, resumed.stderr
    assert "3 held job(s) released" in resumed.stdout
    worker_once(settings, env)
    assert rollout_row(database)["state"] == "completed"
    assert all(versions(database, t) == ["t005"] for t in ("pr_a", "pr_b", "pr_c"))
