"""Issue 11's operator-facing items: a stalled queue shows in health, two ``provision T`` at
once, and the smaller refusals (one line, documented exit code, nothing created)."""

from __future__ import annotations

import json
import subprocess
import sys
import uuid
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import psycopg
import pytest
from psycopg import sql

from provisioner import service
from provisioner.models import JobStatus
from provisioner.settings import Settings
from tests.conftest import (
    Database,
    Server,
    _run_bootstrap,
    drop_database,
    run_cli,
    settings_env,
)
from tests.workers import Workers, tenant_row_locked, wait_blocked_mid_step, wait_until


@pytest.fixture
def fast(settings: Settings) -> Settings:
    return replace(settings, heartbeat_seconds=0.5, job_stale_after_seconds=30.0)


def one_line(result: subprocess.CompletedProcess[str]) -> str:
    assert "Traceback" not in result.stdout + result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), result.stderr
    return lines[0]


def nothing_created(database: Database) -> bool:
    with database.owner() as conn:
        jobs = conn.execute("SELECT count(*) FROM control.platform_jobs").fetchone()
        tenants = conn.execute("SELECT count(*) FROM control.tenants").fetchone()
        schemas = conn.execute(
            "SELECT count(*) FROM pg_namespace WHERE nspname LIKE 'tenant\\_%'"
        ).fetchone()
    return jobs == tenants == schemas == (0,)


# -- a worker that cannot claim says so, and health exits 1 (item 1) ------------------------------

REFUSE_CLAIMS = """
CREATE FUNCTION public.refuse_claims() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF OLD.status = 'queued' AND NEW.status = 'running' THEN
        RAISE EXCEPTION 'claims refused by the test';
    END IF;
    RETURN NEW;
END $$;
CREATE TRIGGER refuse_claims BEFORE UPDATE ON control.platform_jobs
    FOR EACH ROW EXECUTE FUNCTION public.refuse_claims();
"""


@pytest.mark.slow
def test_a_worker_that_cannot_claim_is_not_ready(
    fast: Settings, database: Database, workers: Workers
) -> None:
    service.enqueue(fast, "stuck")
    with psycopg.connect(database.admin_url, autocommit=True) as conn:
        conn.execute(REFUSE_CLAIMS)
    worker = workers.start()

    def stalled() -> str | None:
        report = service.health(fast)
        reason = report.components[0].reason
        return reason if "cannot claim jobs for" in reason else None

    reason = wait_until(stalled, 60, "health to report the stalled queue")
    assert "claims refused by the test" in reason
    result = run_cli(fast, "health")
    assert result.returncode == 1 and "NOT READY (cannot claim jobs for" in result.stdout

    with psycopg.connect(database.admin_url, autocommit=True) as conn:
        conn.execute("DROP TRIGGER refuse_claims ON control.platform_jobs")
    wait_until(lambda: service.health(fast).ready, 60, "health to be ready again")
    wait_until(
        lambda: service.status(fast, "stuck").job.status is JobStatus.SUCCEEDED,
        60,
        "the job to be claimed and provisioned",
    )
    assert worker.stop() == 0, worker.output()


# -- two `provision T` at the same instant (item 6) --------------------------------------------


@pytest.mark.slow
def test_a_second_provision_waits_and_reports_the_true_outcome(
    settings: Settings, database: Database
) -> None:
    service.enqueue(settings, "duo")
    command = [sys.executable, "-m", "provisioner", "provision", "duo", "--json"]
    env = settings_env(settings)
    with tenant_row_locked(database, "duo") as lock:
        procs = [
            subprocess.Popen(command, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
            for _ in range(2)
        ]
        try:
            wait_blocked_mid_step(database, "duo")

            def both_connected() -> bool:
                with psycopg.connect(database.admin_url) as conn:
                    row = conn.execute(
                        "SELECT count(DISTINCT application_name) FROM pg_stat_activity "
                        "WHERE application_name LIKE 'cli:%%'"
                    ).fetchone()
                return bool(row and row[0] >= 2)

            wait_until(both_connected, 60, "the second provision to wait for the first")
            lock.commit()
            outputs = [proc.communicate(timeout=120) for proc in procs]
        finally:
            for proc in procs:
                proc.kill() if proc.poll() is None else None
    for proc, (out, err) in zip(procs, outputs, strict=True):
        assert proc.returncode == 0, err.decode()
        view = json.loads(out)
        assert view["status"] == "succeeded" and view["tenant_id"] == "duo", out
    with database.owner() as conn:
        assert conn.execute("SELECT count(*) FROM control.platform_jobs").fetchone() == (1,)
        runs = conn.execute(
            "SELECT count(*) FROM control.job_step_runs WHERE step = 'seed_role_profiles'"
        ).fetchone()
        assert runs == (1,)  # the second one ran nothing


# -- smaller items (item 8) -------------------------------------------------------------------


@pytest.fixture
def unmigrated(pg_server: Server, settings: Settings) -> Iterator[Settings]:
    """A database set up by the bootstrap, its control schema never migrated."""
    name = f"t_bare_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(pg_server.admin_url, autocommit=True) as conn:
        conn.execute(
            sql.SQL("CREATE DATABASE {} OWNER provisioner_owner").format(sql.Identifier(name))
        )
    try:
        _run_bootstrap(pg_server.admin_url, name)
        yield replace(
            settings,
            migrations_database_url=pg_server.url("provisioner_owner", name),
            app_database_url=pg_server.url("app_rw", name),
        )
    finally:
        drop_database(pg_server, name)


@pytest.mark.parametrize(
    "args",
    [
        ("provision", "acme"),
        ("provision", "acme", "--reuse-deleted"),
        ("enqueue", "acme"),
        ("status", "acme"),
        ("jobs", "list"),
        ("health",),
    ],
)
def test_commands_on_an_unmigrated_control_schema_say_so(
    unmigrated: Settings, args: tuple[str, ...]
) -> None:
    result = run_cli(unmigrated, *args)
    assert result.returncode == 2
    assert "control schema is not migrated" in one_line(result)
    assert "run `provisioner migrate`" in result.stderr


def test_a_file_as_object_store_path_is_refused_before_anything_is_created(
    settings: Settings, database: Database, tmp_path: Path
) -> None:
    path = tmp_path / "not-a-folder"
    path.write_text("x")
    result = run_cli(replace(settings, object_store_path=path), "provision", "acme")
    assert result.returncode == 2
    assert "is a file, not a folder" in one_line(result)
    assert nothing_created(database)


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (("jobs", "list", "--limit", "-1"), "Invalid value for '--limit': -1 is not in the range"),
        (("jobs", "list", "--limit", "0"), "Invalid value for '--limit': 0 is not in the range"),
        (
            ("status", "acme", "--watch", "--interval", "-1"),
            "Invalid value for '--interval': -1.0 is not in the range",
        ),
    ],
)
def test_bad_flag_values_exit_2_with_one_line(
    settings: Settings, args: tuple[str, ...], says: str
) -> None:
    service.enqueue(settings, "acme")
    result = run_cli(settings, *args)
    assert result.returncode == 2
    assert says in one_line(result)


@pytest.mark.parametrize("command", ["provision", "enqueue", "status"])
def test_a_huge_tenant_id_is_not_echoed_whole(
    settings: Settings, database: Database, command: str
) -> None:
    huge = "a" * 10_000 + "X"
    result = run_cli(settings, command, huge)
    assert result.returncode == 2
    line = one_line(result)
    assert len(line) < 400 and "(10001 characters)" in line
    assert nothing_created(database)
