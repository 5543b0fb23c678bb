"""``provisioner jobs prune --older-than DAYS`` (queue/retention.py) against a real control
database, as an operator runs it: what ended before the cutoff goes, what a worker reads stays
(the jobs, their current runs, an open step record, the newest rollout), a dry run deletes
nothing and counts the same, bad input is one line and exit 2."""

from __future__ import annotations

import json
from typing import Any

import psycopg

from provisioner import queue, servers, service
from provisioner.models import JobStatus
from provisioner.settings import Settings
from tests.conftest import Database, run_cli
from tests.extra_clusters import TenantServerDb, refusing_port

AGED = "10 days"
TENANTS = ("ja", "jb", "jc", "jd")


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


def test_prune_deletes_a_tenant_servers_dead_journal_rows_and_reports_a_server_down(
    settings: Settings, database: Database, jobs_server: TenantServerDb
) -> None:
    """The tenant servers' journals (servers/retention.py): rows of ended jobs' runs and of
    earlier runs go; the rows of a live run (its job queued again after a crash between its
    two commits: adoptable) stay, and so do rows newer than the cutoff; a server that is down
    is reported in one line, exit 1, after the others were pruned."""
    jobs_server.add_to(database)
    assert run_cli(settings, "migrate").returncode == 0
    done = service.provision(settings, "ja").job
    live = service.provision(settings, "jb").job
    service.provision(settings, "jc")  # ended, its current run
    service.provision(settings, "jd")  # today's: newer than the cutoff
    journal = "SELECT count(*) FROM provisioner_server.step_journal WHERE tenant_id = %s"
    with jobs_server.owner() as conn:
        conn.execute(
            "UPDATE provisioner_server.step_journal SET finished_at = finished_at - %s::interval "
            "WHERE tenant_id IN ('ja', 'jb', 'jc')",
            (AGED,),
        )
        # ja's first run, as a run before its current one: a retry began run 2
        conn.execute(
            "INSERT INTO provisioner_server.step_journal (tenant_id, job_id, step, token, run, "
            "finished_at) VALUES ('ja', %s, 'old_step', 1, 1, now() - %s::interval)",
            (done.id, AGED),
        )
        # a row of the journal's version 1 (no run) of an ended job
        conn.execute(
            "INSERT INTO provisioner_server.step_journal (tenant_id, job_id, step, token, "
            "finished_at) VALUES ('ja', %s, 'v1_step', 1, now() - %s::interval)",
            (done.id, AGED),
        )
        counts = {t: int(conn.execute(journal, (t,)).fetchone()[0]) for t in TENANTS}
    assert counts == {"ja": 6, "jb": 4, "jc": 4, "jd": 4}
    with database.owner() as conn:
        conn.execute("UPDATE control.platform_jobs SET run = 2 WHERE id = %s", (done.id,))
        # jb's job queued again with its current run: its rows are what a resume adopts
        conn.execute(
            "UPDATE control.platform_jobs SET status = 'queued', finished_at = NULL WHERE id = %s",
            (live.id,),
        )

    dry = run_cli(settings, "jobs", "prune", "--older-than", "7", "--dry-run", "--json")
    assert dry.returncode == 0, dry.stderr
    assert json.loads(dry.stdout)["servers"] == [{"server": "east", "rows": 10, "problem": None}]
    pruned = run_cli(settings, "jobs", "prune", "--older-than", "7")
    assert pruned.returncode == 0, pruned.stderr
    assert "server east: deleted 10 journal rows" in pruned.stdout.splitlines()
    assert "server east: 10 journal rows" in pruned.stderr  # its progress
    with jobs_server.owner() as conn:
        left = {t: int(conn.execute(journal, (t,)).fetchone()[0]) for t in TENANTS}
        fences = int(conn.execute("SELECT count(*) FROM provisioner_server.fences").fetchone()[0])
    assert left == {"ja": 0, "jb": 4, "jc": 0, "jd": 4}
    assert fences == 4  # the fences stay

    with database.owner() as conn:
        servers.add(conn, "gone", f"host=127.0.0.1 port={refusing_port()} dbname=x")
    down = run_cli(settings, "jobs", "prune", "--older-than", "7")
    assert down.returncode == 1, down.stdout + down.stderr
    lines = down.stdout.splitlines()
    assert "server east: deleted 0 journal rows" in lines
    gone = [line for line in lines if line.startswith("server gone: ")]
    assert len(gone) == 1 and "DOWN, its journal not pruned" in gone[0], lines
