"""``provisioner move`` killed with SIGKILL before and after each of its steps, then run
again: the move resumes (the dead holder's job taken over) and ends as an uninterrupted move
does; a second move while one runs is refused. Two real clusters: the control database's and
a tenant server (:mod:`tests.extra_clusters`)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psycopg
import pytest

from provisioner import kinds, servers, service
from provisioner.kinds.move import MOVE_JOB_TYPE
from provisioner.settings import Settings
from provisioner.tenant import catalog
from tests.conftest import Database, run_cli, settings_env
from tests.extra_clusters import TenantServer
from tests.workers import kill_frozen

CHILD = Path(__file__).with_name("move_child.py")
ROWS = 500

CASES = [
    (step, outcome)
    for step in kinds.BUILTIN[MOVE_JOB_TYPE].step_names
    for outcome in ("started", "done")
]


def seeded(settings: Settings, database: Database, east: TenantServer, tenant: str) -> dict:
    """A tenant with ROWS audit events on the control database, then server east added;
    returns its catalog inventory (with its grants)."""
    service.provision(settings, tenant)
    with database.app() as conn:
        conn.execute(
            f"INSERT INTO tenant_{tenant}.audit_events (action) "
            "SELECT 'seed ' || g FROM generate_series(1, %s) g",
            (ROWS,),
        )
    with database.owner() as conn:
        servers.add(conn, "east", east.reference)
        found = catalog.read(conn, f"tenant_{tenant}")
    assert found is not None
    return found


def app_count(url: str, tenant: str) -> object:
    try:
        with psycopg.connect(url, autocommit=True) as conn:
            return conn.execute(f"SELECT count(*) FROM tenant_{tenant}.audit_events").fetchone()
    except psycopg.errors.InsufficientPrivilege:
        return "denied"
    except psycopg.errors.UndefinedTable:
        return "missing"


@pytest.mark.parametrize(("step", "outcome"), CASES, ids=[f"{s}-{o}" for s, o in CASES])
def test_sigkill_at_each_step_then_move_again_ends_as_one_move(
    settings: Settings,
    database: Database,
    tenant_server: TenantServer,
    step: str,
    outcome: str,
) -> None:
    before = seeded(settings, database, tenant_server, "victim")
    kill_frozen(settings, CHILD, "victim", "east", step, outcome, env=tenant_server.env)
    # at most one copy serves: never both
    serving = [
        url
        for url in (database.app_url, tenant_server.app_url)
        if isinstance(app_count(url, "victim"), tuple)
    ]
    assert len(serving) <= 1
    out = run_cli(settings, "move", "victim", "--to", "east", "--json", env=tenant_server.env)
    assert out.returncode == 0, out.stdout + out.stderr
    result = json.loads(out.stdout)
    assert (result["phase"], result["resumed"]) == ("switched", True)
    assert result["job"]["status"] == "succeeded"
    assert service.locate(settings, "victim").server == "east"
    assert app_count(tenant_server.app_url, "victim") == (ROWS,)
    assert app_count(database.app_url, "victim") == "denied"
    with tenant_server.owner() as conn:
        assert catalog.read(conn, "tenant_victim") == before
    with database.owner() as conn:
        assert conn.execute("SELECT placed FROM control.tenant_servers").fetchone() == (1,)


def test_a_second_move_while_one_runs_is_refused(
    settings: Settings, database: Database, tenant_server: TenantServer
) -> None:
    seeded(settings, database, tenant_server, "twice")
    with database.owner() as conn:
        servers.add(conn, "west", tenant_server.reference)
    with subprocess.Popen(
        [sys.executable, str(CHILD), "twice", "east", "copy_schema", "started"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**settings_env(settings), **tenant_server.env},
    ) as first:
        assert first.stdout is not None
        assert first.stdout.readline().strip() == "FROZEN copy_schema started"
        same = run_cli(settings, "move", "twice", "--to", "east", env=tenant_server.env)
        other = run_cli(settings, "move", "twice", "--to", "west", env=tenant_server.env)
        abort = run_cli(settings, "move", "twice", "--abort", env=tenant_server.env)
        first.kill()
        first.communicate(timeout=10)
    assert same.returncode == 1 and "by another process" in same.stderr, same.stderr
    assert other.returncode == 2 and "is being moved from control to east" in other.stderr
    assert abort.returncode == 1 and "is running under" in abort.stderr
    for refused in (same, other, abort):
        assert refused.stderr.count("\n") == 1
    out = run_cli(settings, "move", "twice", "--to", "east", env=tenant_server.env)
    assert out.returncode == 0, out.stdout + out.stderr
    assert service.locate(settings, "twice").server == "east"


def test_sigkill_in_the_middle_of_the_restore_leaves_nothing_on_the_target(
    settings: Settings, database: Database, tenant_server: TenantServer
) -> None:
    """The process killed while it copies the rows (in the freeze, onto the DDL restored before
    it): its sessions die with it, the copy's one transaction rolls back on the target, and the
    move run again drops what it finds there and copies from scratch."""
    before = seeded(settings, database, tenant_server, "midway")
    with database.app() as conn:  # enough rows for the restore to be caught under way
        conn.execute(
            "INSERT INTO tenant_midway.audit_events (action) "
            "SELECT repeat('x', 200) FROM generate_series(1, 50000)"
        )
    restoring = (
        "SELECT count(*) FROM pg_stat_activity WHERE state <> 'idle' "
        "AND datname = current_database() AND query LIKE 'COPY %FROM STDIN'"
    )
    with (
        subprocess.Popen(
            [sys.executable, str(CHILD), "midway", "east", "never", "reported"],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            env={**settings_env(settings), **tenant_server.env},
        ) as child,
        tenant_server.owner() as watch,
    ):
        deadline = time.monotonic() + 120
        while watch.execute(restoring).fetchone() == (0,):
            assert child.poll() is None and time.monotonic() < deadline, "no restore seen"
            time.sleep(0.005)
        os.kill(child.pid, signal.SIGKILL)
        child.communicate(timeout=10)
        deadline = time.monotonic() + 30
        while watch.execute(restoring).fetchone() != (0,):
            assert time.monotonic() < deadline, "the copy outlived the process"
            time.sleep(0.05)
        # the DDL restored before the freeze is there, the rows' transaction left nothing
        rows = watch.execute("SELECT count(*) FROM tenant_midway.audit_events")
        assert rows.fetchone() == (0,)
    assert app_count(database.app_url, "midway") == "denied"  # frozen, not lost
    out = run_cli(settings, "move", "midway", "--to", "east", "--json", env=tenant_server.env)
    assert out.returncode == 0, out.stdout + out.stderr
    assert app_count(tenant_server.app_url, "midway") == (ROWS + 50_000,)
    with tenant_server.owner() as conn:
        assert catalog.read(conn, "tenant_midway") == before
