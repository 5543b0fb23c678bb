"""Lists and bulk (issue 28 item 5), against real PostgreSQL and real ``provisioner`` processes:
``tenants list`` and its filters, ``jobs list --tenant/--kind`` with whole error text, purged
tenants out of fleet views unless ``--include-deleted``, and lifecycle commands over several
tenants, a file of ids or a state, queued as ONE batch (one transaction) and drained.
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from psycopg.rows import dict_row

from provisioner.settings import Settings
from provisioner.testing import Tenant
from tests.conftest import Database, run_cli, settings_env
from tests.integration import test_fleet_upgrade as fleet_upgrade
from tests.integration.test_rollout_report import ADD_SOURCE


@pytest.fixture
def fleet(settings: Settings, tenant_factory: Callable[..., Tenant]) -> Callable[[list[str]], None]:
    def provision(tenants: list[str]) -> None:
        for tenant in tenants:
            tenant_factory(tenant, settings=settings)

    return provision


def use_t005(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> dict[str, str]:
    """A copy of the tenant tree with a t005 adding a column, for this process and the children."""
    return fleet_upgrade.use_tree(monkeypatch, fleet_upgrade.make_tree(tmp_path, ADD_SOURCE))


def kind_job(database: Database, tenant: str, job_type: str) -> dict[str, Any]:
    """The tenant's job of ``job_type`` (a tenant has one per kind)."""
    with database.owner() as conn, conn.cursor(row_factory=dict_row) as cur:
        row = cur.execute(
            "SELECT * FROM control.platform_jobs WHERE tenant_id = %s AND job_type = %s",
            (tenant, job_type),
        ).fetchone()
    assert row is not None, f"no {job_type} job for tenant {tenant}"
    return dict(row)


def states(database: Database) -> dict[str, str]:
    with database.owner() as conn:
        rows = conn.execute("SELECT tenant_id, state FROM control.tenants").fetchall()
    return dict(rows)


def job_count(database: Database) -> tuple[int, int]:
    with database.owner() as conn:
        row = conn.execute(
            "SELECT (SELECT count(*) FROM control.platform_jobs), "
            "(SELECT count(*) FROM control.job_runs)"
        ).fetchone()
    assert row is not None
    return int(row[0]), int(row[1])


def listed(settings: Settings, *args: str, env: dict[str, str] | None = None) -> list[Any]:
    shown = run_cli(settings, "tenants", "list", "--json", *args, env=env)
    assert shown.returncode == 0, shown.stderr
    return list(json.loads(shown.stdout))


def test_tenants_list_filters_and_leaves_purged_tenants_out_of_fleet_views(
    settings: Settings,
    database: Database,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    fleet: Callable[[list[str]], None],
) -> None:
    fleet(["ls_head", "ls_paused", "ls_gone", "ls_old"])
    assert run_cli(settings, "suspend", "ls_paused").returncode == 0
    assert run_cli(settings, "deprovision", "--purge", "--yes", "ls_gone").returncode == 0
    env = use_t005(tmp_path, monkeypatch)
    assert run_cli(settings, "upgrade", "ls_head", env=env).returncode == 0
    assert run_cli(settings, "worker", "--once", env=env).returncode == 0

    every = {t["tenant_id"]: t for t in listed(settings, env=env)}
    assert sorted(every) == ["ls_head", "ls_old", "ls_paused"]  # the purged one has left
    assert every["ls_head"] | {"updated_at": None} == {
        "tenant_id": "ls_head",
        "state": "onboarding",
        "revision": "t005",
        "behind": False,
        "provisioning": "succeeded",
        "drifted": None,
        "updated_at": None,
    }
    assert (every["ls_paused"]["state"], every["ls_paused"]["revision"]) == ("suspended", "t004")
    assert every["ls_old"]["behind"] and every["ls_paused"]["behind"]
    with_deleted = {t["tenant_id"]: t for t in listed(settings, "--include-deleted", env=env)}
    assert with_deleted["ls_gone"]["state"] == "deleted"
    assert with_deleted["ls_gone"]["revision"] is None
    assert [t["tenant_id"] for t in listed(settings, "--state", "deleted", env=env)] == ["ls_gone"]
    behind = listed(settings, "--behind", "--state", "onboarding", env=env)
    assert [t["tenant_id"] for t in behind] == ["ls_old"]

    with database.owner() as conn:  # a hand-made index on the tenant at the head
        conn.execute("CREATE INDEX hand_made_idx ON tenant_ls_head.audit_events (action)")
    # --drifted reads the stored checks: nothing checked yet, so every tenant is listed as
    # never checked, not guessed clean.
    unread = listed(settings, "--drifted", env=env)
    assert [(t["tenant_id"], t["drifted"], t["checked_at"]) for t in unread] == [
        ("ls_head", None, None),
        ("ls_old", None, None),
        ("ls_paused", None, None),
    ]
    said = run_cli(settings, "tenants", "list", "--drifted", env=env)
    assert "ls_head" in said.stdout and "never checked" in said.stdout
    assert "no stored check; 3 tenant(s) never checked" in said.stdout
    # --check-now runs today's full check of those at the head first (and records it).
    drifted = listed(settings, "--drifted", "--check-now", env=env)
    assert [(t["tenant_id"], t["drifted"]) for t in drifted] == [("ls_head", True)]
    assert drifted[0]["checked_at"] is not None
    stored = listed(settings, "--drifted", env=env)
    assert [(t["tenant_id"], t["drifted"]) for t in stored] == [
        ("ls_head", True),
        ("ls_old", None),
        ("ls_paused", None),
    ]
    assert stored[0]["checked_at"] == drifted[0]["checked_at"]
    with database.owner() as conn:  # repaired by hand: the stored result still says drifted
        conn.execute("DROP INDEX tenant_ls_head.hand_made_idx")
    assert next(t["tenant_id"] for t in listed(settings, "--drifted", env=env)) == "ls_head"
    assert run_cli(settings, "check", "--all", env=env).returncode == 0
    assert listed(settings, "--drifted", env=env) == []  # all checked, none drifted
    said = run_cli(settings, "tenants", "list", "--drifted", env=env)
    assert "no tenants" in said.stdout
    refused = run_cli(settings, "tenants", "list", "--check-now", env=env)
    assert refused.returncode == 2 and "--check-now goes with --drifted" in refused.stderr
    text = run_cli(settings, "tenants", "list", env=env)
    assert text.returncode == 0, text.stderr
    assert "ls_gone" not in text.stdout and "3 tenant(s)" in text.stdout
    assert run_cli(settings, "tenants", "list", "--state", "gone").returncode == 2

    # The upgrade's report: the purged tenant is not among the skipped unless asked for.
    plain = json.loads(run_cli(settings, "upgrade", "--all", "--dry-run", "--json", env=env).stdout)
    assert plain["skipped"] == [{"tenant_id": "ls_paused", "state": "suspended"}]
    full = run_cli(
        settings, "upgrade", "--all", "--dry-run", "--json", "--include-deleted", env=env
    )
    assert [s["tenant_id"] for s in json.loads(full.stdout)["skipped"]] == ["ls_gone", "ls_paused"]
    watched = run_cli(settings, "upgrade", "--watch", env=env)
    assert "tenants per head: t004 2, t005 1" in watched.stdout  # no "(none) 1" for ls_gone


def test_jobs_list_by_tenant_and_kind_with_the_whole_error_wrapped(
    settings: Settings, database: Database, fleet: Callable[[list[str]], None]
) -> None:
    fleet(["jl_a", "jl_b"])
    assert run_cli(settings, "suspend", "jl_a").returncode == 0
    error = (
        "run_tenant_migrations: database error: column target_type of relation audit_events "
        "contains null values; the tenant stays at its old head until a retry succeeds"
    )
    with database.owner() as conn:
        conn.execute(
            "UPDATE control.platform_jobs SET status = 'failed', error_detail = %s, "
            "finished_at = now() WHERE tenant_id = 'jl_b' AND job_type = 'provision_tenant'",
            (error,),
        )
    mine = json.loads(run_cli(settings, "jobs", "list", "--tenant", "jl_a", "--json").stdout)
    assert sorted(j["job_type"] for j in mine) == ["provision_tenant", "suspend_tenant"]
    kind = json.loads(
        run_cli(settings, "jobs", "list", "--kind", "suspend_tenant", "--json").stdout
    )
    assert [(j["tenant_id"], j["job_type"]) for j in kind] == [("jl_a", "suspend_tenant")]
    both = run_cli(settings, "jobs", "list", "--tenant", "jl_b", "--kind", "suspend_tenant")
    assert both.stdout.strip() == "no jobs"

    env = {**settings_env(settings), "COLUMNS": "72"}
    text = subprocess.run(
        [sys.executable, "-m", "provisioner", "jobs", "list", "--tenant", "jl_b"],
        capture_output=True,
        text=True,
        env=env,
        check=False,
        timeout=60,
    )
    assert text.returncode == 0, text.stderr
    wrapped = [line for line in text.stdout.splitlines() if line.startswith("    ")]
    assert len(wrapped) > 1 and all(len(line) < 72 for line in wrapped)
    assert " ".join(line.strip() for line in wrapped) == f"error: {error}"  # whole, every word
    bad = run_cli(settings, "jobs", "list", "--tenant", "Not-An-Id")
    assert bad.returncode == 2 and len(bad.stderr.strip().splitlines()) == 1


def one_line_exit_2(result: subprocess.CompletedProcess[str]) -> str:
    assert result.returncode == 2, (result.returncode, result.stdout, result.stderr)
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in result.stderr, result.stderr
    return lines[0]


def test_an_unknown_job_kind_is_refused_not_matched_by_nothing(
    settings: Settings, database: Database
) -> None:
    assert run_cli(settings, "enqueue", "uk_a").returncode == 0
    with database.owner() as conn:
        conn.execute(
            "UPDATE control.platform_jobs SET status = 'failed', finished_at = now() "
            "WHERE tenant_id = 'uk_a'"
        )
    listed_ = one_line_exit_2(run_cli(settings, "jobs", "list", "--kind", "nosuch"))
    assert "unsupported job type(s) nosuch" in listed_ and "provision_tenant" in listed_
    retried = one_line_exit_2(run_cli(settings, "jobs", "retry", "--failed", "--kind", "nosuch"))
    assert "unsupported job type(s) nosuch" in retried
    huge = one_line_exit_2(run_cli(settings, "jobs", "list", "--kind", "k" * 5000))
    assert len(huge) < 600, len(huge)
    assert kind_job(database, "uk_a", "provision_tenant")["status"] == "failed"  # not requeued
    again = run_cli(settings, "jobs", "retry", "--failed", "--kind", "provision_tenant")
    assert again.returncode == 0 and "1 failed job(s) queued again" in again.stdout, again.stderr


@pytest.mark.parametrize("command", ["suspend", "restore", "deprovision"])
def test_a_file_of_ids_that_is_not_text_is_one_line_and_queues_nothing(
    settings: Settings, database: Database, tmp_path: Path, command: str
) -> None:
    assert run_cli(settings, "enqueue", "nt_a").returncode == 0
    before = job_count(database)
    ids = tmp_path / "ids.txt"
    ids.write_bytes(b"nt_a\n\xff\xfe\n")
    line = one_line_exit_2(run_cli(settings, command, "--from-file", str(ids)))
    assert str(ids) in line and "0xff" in line and "nothing was queued" in line, line
    piped = subprocess.run(
        [sys.executable, "-m", "provisioner", command, "--from-file", "-"],
        input=b"nt_a\n\xff\n",
        capture_output=True,
        env=settings_env(settings),
        check=False,
        timeout=60,
    )
    assert piped.returncode == 2 and b"Traceback" not in piped.stderr, piped.stderr
    assert len(piped.stderr.strip().splitlines()) == 1, piped.stderr
    assert job_count(database) == before


def batch_runs(database: Database, started_by: str) -> list[Any]:
    """The runs a batch started: job, tenant, and the time its transaction began."""
    with database.owner() as conn:
        return conn.execute(
            "SELECT j.tenant_id, r.started_at FROM control.job_runs r "
            "JOIN control.platform_jobs j ON j.id = r.job_id WHERE r.started_by = %s "
            "ORDER BY 1",
            (started_by,),
        ).fetchall()


def test_lifecycle_commands_take_many_tenants_as_one_batch(
    settings: Settings,
    database: Database,
    tmp_path: Path,
    fleet: Callable[[list[str]], None],
) -> None:
    tenants = [f"bk_{i}" for i in range(6)]
    fleet(tenants)
    done = run_cli(settings, "suspend", "bk_0", "bk_1", "bk_2")
    assert done.returncode == 0, done.stderr
    assert "suspend: 3 tenant(s), 3 queued in one batch" in done.stdout
    assert "3 succeeded, 0 failed" in done.stdout
    runs = batch_runs(database, "suspend (batch)")
    assert [r[0] for r in runs] == ["bk_0", "bk_1", "bk_2"]
    assert len({r[1] for r in runs}) == 1  # now() of one transaction: queued as one batch

    ids = tmp_path / "ids.txt"
    ids.write_text("# more to suspend\nbk_3\n\nbk_4  # a comment\n")
    assert run_cli(settings, "suspend", "--from-file", str(ids)).returncode == 0
    assert {t: s for t, s in states(database).items()} == {
        **{f"bk_{i}": "suspended" for i in range(5)},
        "bk_5": "onboarding",
    }
    again = run_cli(settings, "suspend", "bk_0", "bk_5", "--json")  # one already there
    view = json.loads(again.stdout)
    assert again.returncode == 0 and view["already"] == 1 and view["batch_size"] == 1
    restored = run_cli(settings, "restore", "--state", "suspended")
    assert restored.returncode == 0, restored.stderr
    assert set(states(database).values()) == {"onboarding"}

    before = job_count(database)
    bad = run_cli(settings, "suspend", "bk_0", "BAD", "bad-2", "bk_1")
    assert bad.returncode == 2
    assert bad.stderr.strip().splitlines() == [bad.stderr.strip()]
    assert "'BAD', 'bad-2'" in bad.stderr and "nothing was queued" in bad.stderr
    unknown = run_cli(settings, "suspend", "bk_0", "ghost_1", "ghost_2")
    assert unknown.returncode == 3 and "ghost_1, ghost_2" in unknown.stderr
    assert job_count(database) == before  # no job, no run
    assert run_cli(settings, "suspend", "bk_0").returncode == 0  # one tenant: as before
    before = job_count(database)
    wrong = run_cli(settings, "restore", "bk_0", "bk_1")  # bk_1 is not suspended
    assert wrong.returncode == 2 and "not bk_1 (onboarding): nothing was queued" in wrong.stderr
    assert job_count(database) == before
    assert states(database)["bk_0"] == "suspended" and states(database)["bk_1"] == "onboarding"

    # Purge from stdin; purged tenants are then out of the list.
    purge = subprocess.run(
        [
            sys.executable,
            "-m",
            "provisioner",
            "deprovision",
            "--purge",
            "--yes",
            "--from-file",
            "-",
        ],
        input="bk_4\nbk_5\n",
        capture_output=True,
        text=True,
        env=settings_env(settings),
        check=False,
        timeout=120,
    )
    assert purge.returncode == 0, purge.stderr
    assert "2 succeeded, 0 failed" in purge.stdout
    with database.owner() as conn:
        gone = conn.execute(
            "SELECT count(*) FROM pg_namespace WHERE nspname IN ('tenant_bk_4', 'tenant_bk_5')"
        ).fetchone()
    assert gone == (0,)
    assert "bk_4" not in [t["tenant_id"] for t in listed(settings)]
    refused = run_cli(settings, "deprovision", "--purge", "bk_2", "bk_3")  # off a terminal
    assert refused.returncode == 2 and "--yes" in refused.stderr


def test_a_batch_queued_for_the_workers_is_one_transaction_and_workers_drain_it(
    settings: Settings, database: Database, fleet: Callable[[list[str]], None]
) -> None:
    tenants = [f"wq_{i}" for i in range(4)]
    fleet(tenants)
    queued = run_cli(settings, "deprovision", *tenants, "--queue", "--json")
    assert queued.returncode == 0, queued.stderr
    view = json.loads(queued.stdout)
    assert view["queued"] and view["batch_size"] == 4
    assert {kind_job(database, t, "deprovision_tenant")["status"] for t in tenants} == {"queued"}
    runs = batch_runs(database, "deprovision (batch)")
    assert len(runs) == 4 and len({r[1] for r in runs}) == 1
    env = {"PROVISIONER_WORKER_JOB_TYPES": "provision_tenant,deprovision_tenant"}
    worker = run_cli(settings, "worker", "--once", env=env)
    assert worker.returncode == 0, worker.stderr
    assert {states(database)[t] for t in tenants} == {"archived"}
