"""``provisioner jobs prune --older-than DAYS`` (queue/retention.py) against a real control
database, as an operator runs it: what ended before the cutoff goes, what a worker reads stays
(the jobs, their current runs, an open step record, the newest rollout), a dry run deletes
nothing and counts the same, bad input is one line and exit 2."""

from __future__ import annotations

import json
from typing import Any

import psycopg

from provisioner import queue, service
from provisioner.models import JobStatus
from provisioner.settings import Settings
from tests.conftest import Database, run_cli

AGED = "10 days"


def _count(database: Database, query: str, *params: Any) -> int:
    with database.owner() as conn:
        row = conn.execute(query, params).fetchone()
    assert row is not None
    return int(row[0])


def _rollout(conn: psycopg.Connection, job_id: Any = None, tenant: str = "") -> int:
    row = conn.execute(
        "INSERT INTO control.rollouts (head, state) VALUES ('t001', 'completed') RETURNING id"
    ).fetchone()
    assert row is not None
    if job_id is not None:
        conn.execute(
            "INSERT INTO control.rollout_tenants (rollout_id, tenant_id, job_id, wave) "
            "VALUES (%s, %s, %s, 'main')",
            (row[0], tenant, job_id),
        )
    return int(row[0])


def _aged_history(settings: Settings, database: Database) -> dict[str, Any]:
    """Two tenants provisioned, one of them twice (its job re-opened: run 2), an open step
    record, two finished rollouts: all of it made 10 days old; then a third tenant, today."""
    first = service.provision(settings, "pa").job
    second = service.provision(settings, "pb").job
    with database.owner() as conn:
        queue.reopen(conn, first.id, started_by="test")
    assert service.provision(settings, "pa").job.status is JobStatus.SUCCEEDED
    with database.owner() as conn:
        conn.execute(
            "INSERT INTO control.job_step_runs (job_id, tenant_id, attempt, step, worker) "
            "VALUES (%s, 'pb', 1, 'create_schema', 'a live engine')",
            (second.id,),
        )
        old = _rollout(conn, second.id, "pb")
        newest = _rollout(conn)
        conn.execute(
            f"UPDATE control.job_step_runs SET started_at = started_at - interval '{AGED}', "
            f"finished_at = finished_at - interval '{AGED}'"
        )
        conn.execute(f"UPDATE control.job_runs SET started_at = started_at - interval '{AGED}'")
        conn.execute(f"UPDATE control.rollouts SET updated_at = updated_at - interval '{AGED}'")
    service.provision(settings, "pc")
    ended = _count(
        database,
        "SELECT count(*) FROM control.job_step_runs WHERE tenant_id IN ('pa', 'pb') "
        "AND outcome <> 'running'",
    )
    assert ended >= 12  # six steps each, and whatever pa's second run recorded
    return {"ended": ended, "old": old, "newest": newest}


def test_prune_deletes_what_ended_before_the_cutoff_and_keeps_what_a_worker_reads(
    settings: Settings, database: Database
) -> None:
    made = _aged_history(settings, database)
    tables = (
        "control.platform_jobs",
        "control.job_runs",
        "control.job_step_runs",
        "control.rollouts",
        "control.rollout_tenants",
    )
    before = {t: _count(database, f"SELECT count(*) FROM {t}") for t in tables}
    expected = {
        "step_records": made["ended"],
        "runs": 1,  # pa's first run
        "rollouts": 1,  # the older one; the newest stays
        "rollout_tenants": 1,
    }

    dry = run_cli(settings, "jobs", "prune", "--older-than", "7", "--dry-run", "--json")
    assert dry.returncode == 0, dry.stderr
    counted = json.loads(dry.stdout)
    assert {k: counted[k] for k in expected} == expected and counted["dry_run"] is True
    assert {t: _count(database, f"SELECT count(*) FROM {t}") for t in tables} == before

    done = run_cli(settings, "jobs", "prune", "--older-than", "7")
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith(
        f"deleted {made['ended']} step records, 1 earlier runs and 1 rollouts "
        "(1 rollout tenants) that ended before "
    ), done.stdout
    assert "step records deleted" in done.stderr  # its progress
    after = {t: _count(database, f"SELECT count(*) FROM {t}") for t in tables}
    assert after["control.platform_jobs"] == before["control.platform_jobs"]  # never a job
    left = _count(
        database,
        "SELECT count(*) FROM control.job_step_runs WHERE tenant_id IN ('pa', 'pb')",
    )
    assert left == 1  # the open record: a live engine's
    assert _count(database, "SELECT count(*) FROM control.job_step_runs "
                            "WHERE tenant_id = 'pc'") >= 6  # fmt: skip
    runs = _count(
        database,
        "SELECT count(*) FROM control.job_runs r JOIN control.platform_jobs j ON j.id = r.job_id "
        "WHERE r.run = j.run",
    )
    assert runs == after["control.job_runs"] == before["control.job_runs"] - 1
    assert _count(database, "SELECT count(*) FROM control.rollouts WHERE id = %s",
                  made["newest"]) == 1  # fmt: skip
    assert _count(database, "SELECT count(*) FROM control.rollouts WHERE id = %s",
                  made["old"]) == 0  # fmt: skip
    for tenant in ("pa", "pb", "pc"):
        status = json.loads(run_cli(settings, "status", tenant, "--json").stdout)
        assert status["status"] == "succeeded"

    again = run_cli(settings, "jobs", "prune", "--older-than", "7", "--json")
    assert json.loads(again.stdout)["step_records"] == 0  # nothing left to prune


def test_prune_refuses_bad_input_in_one_line_and_deletes_nothing(
    settings: Settings, database: Database
) -> None:
    service.provision(settings, "kept")
    before = _count(database, "SELECT count(*) FROM control.job_step_runs")
    for bad in (["--older-than", "-1"], ["--older-than", "soon"], []):
        refused = run_cli(settings, "jobs", "prune", *bad)
        assert refused.returncode == 2, refused.stderr
        assert "--older-than" in refused.stderr
    assert _count(database, "SELECT count(*) FROM control.job_step_runs") == before
