"""A move by logical replication killed with SIGKILL once its subscription exists, before the
switch; one killed once its fallback to the dump is committed; and ``pg_dump | pg_restore``
killed mid-copy. A dead run's subscription, slot and
publication are dropped by the next run (whose copy is then whole) or by ``move --abort``; the
children's password files leave nothing on disk. Real clusters (:mod:`tests.logical_servers`)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from psycopg.conninfo import conninfo_to_dict

from provisioner import service
from provisioner.models import TenantId
from provisioner.servers import moves
from provisioner.settings import Settings
from provisioner.tenant import catalog
from tests.conftest import Database, run_cli, settings_env
from tests.integration.test_move_logical import details, on_source
from tests.integration.test_move_logical_fallback import copied_whole, fell_back, source_by_service
from tests.integration.test_moves import app_write, snapshot
from tests.logical_servers import SOURCE, TARGET, LogicalServers
from tests.workers import kill_frozen

CHILD = Path(__file__).with_name("move_child.py")
NONE_LEFT = {"subscriptions": [], "slots": [], "publications": []}


def subscribed(
    settings: Settings, database: Database, servers: LogicalServers, tenant: str
) -> dict:
    """The tenant on the source (100 rows), then a move to the target SIGKILLed once its
    pre-copy (and the subscription) is done (``repaired``: the tenant's job is the one of its
    first move, opened again); returns the source's catalog inventory."""
    on_source(settings, database, servers, tenant, 100)
    with servers.owner(SOURCE) as conn:
        before = catalog.read(conn, f"tenant_{tenant}")
    assert before is not None
    kill_frozen(settings, CHILD, tenant, TARGET, "precopy_schema", "repaired", env=servers.env)
    left = servers.leftovers()
    counts = [len(left[k]) for k in ("subscriptions", "slots", "publications")]
    precopy = [d for s, d in details(database, tenant) if s == "precopy_schema"]
    assert counts == [1, 1, 1], "\n".join(precopy)  # why it fell back to the dump, in full
    return before


def test_killed_after_subscribing_then_moved_again_leaves_no_replication(
    settings: Settings, database: Database, logical_servers: LogicalServers
) -> None:
    servers = logical_servers
    before = subscribed(settings, database, servers, "sub")
    out = run_cli(settings, "move", "sub", "--to", TARGET, "--json", env=servers.env)
    assert out.returncode == 0, out.stdout + out.stderr
    assert json.loads(out.stdout)["phase"] == "switched"
    assert service.locate(settings, "sub").server == TARGET
    copy = [d for s, d in details(database, "sub") if s == "copy_schema"][-1]
    assert "copied whole" in copy and "subscription" in copy, copy
    assert servers.leftovers() == NONE_LEFT
    with servers.owner(TARGET) as conn:
        assert catalog.read(conn, "tenant_sub") == before
        rows = conn.execute("SELECT count(*) FROM tenant_sub.audit_events").fetchone()
    assert rows == (100,)
    assert app_write(servers.app_url(TARGET), "sub") == "ok"
    assert app_write(servers.app_url(SOURCE), "sub") == "denied"


def test_killed_after_subscribing_then_aborted_leaves_no_replication(
    settings: Settings, database: Database, logical_servers: LogicalServers
) -> None:
    servers = logical_servers
    subscribed(settings, database, servers, "gone")
    out = run_cli(settings, "move", "gone", "--abort", env=servers.env)
    assert out.returncode == 0, out.stdout + out.stderr
    assert servers.leftovers() == NONE_LEFT
    with servers.owner(TARGET) as conn:
        found = conn.execute("SELECT 1 FROM pg_namespace WHERE nspname = 'tenant_gone'")
        assert found.fetchone() is None
    assert service.locate(settings, "gone").server == SOURCE
    assert app_write(servers.app_url(SOURCE), "gone") == "ok"


def test_sigkill_mid_copy_leaves_no_password_file(
    settings: Settings, database: Database, logical_servers: LogicalServers, tmp_path: Path
) -> None:
    """``pg_restore`` under way (the pre-copy's, its password the owner URL's): the process
    killed, nothing in its temporary folder holds the password."""
    servers = logical_servers
    password = str(conninfo_to_dict(settings.owner_url).get("password") or "")
    assert len(password) > 8
    service.provision(settings, "secret")
    servers.register(database, SOURCE)
    scratch = tmp_path / "tmp"
    scratch.mkdir()
    restoring = (
        "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
        "AND application_name = 'pg_restore'"
    )
    with (
        subprocess.Popen(
            [sys.executable, str(CHILD), "secret", SOURCE, "never", "reported"],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            env={**settings_env(settings), **servers.env, "TMPDIR": str(scratch)},
        ) as child,
        servers.owner(SOURCE) as watch,
    ):
        deadline = time.monotonic() + 120
        while watch.execute(restoring).fetchone() == (0,):
            assert child.poll() is None and time.monotonic() < deadline, "no restore seen"
            time.sleep(0.002)
        os.kill(child.pid, signal.SIGKILL)
        child.communicate(timeout=10)
    assert any(scratch.iterdir()), "the copy's temporary folder was not where it was looked for"
    for path in scratch.rglob("*"):
        assert path.is_dir() or password.encode() not in path.read_bytes(), path
    out = run_cli(settings, "move", "secret", "--to", SOURCE, env=servers.env)
    assert out.returncode == 0, out.stdout + out.stderr


def test_killed_after_committing_its_fallback_the_next_run_copies_by_dump(
    settings: Settings, database: Database, logical_servers: LogicalServers, tmp_path: Path
) -> None:
    """The target cannot subscribe (:func:`source_by_service`): a move in ``auto`` commits its
    fallback to the dump, and is SIGKILLed before it drops what its replication made and before
    its step's record. The source's reference is then mended, so that replication would work:
    the next run still keeps the fallback (no second try), drops the dead run's leftovers and
    copies the tenant whole by dump."""
    servers = logical_servers
    env = source_by_service(settings, database, servers, tmp_path, "window")
    with servers.owner(SOURCE) as conn:
        before = catalog.read(conn, "tenant_window")
        source = snapshot(conn, "window")
    assert before is not None and source is not None
    kill_frozen(settings, CHILD, "window", TARGET, "precopy_schema", "fell_back", env=env)
    with database.owner() as conn:
        move = moves.get_move(conn, TenantId("window"))
        assert move is not None and move.job_id is not None
        reason = moves.fallback(conn, move.job_id)
        done = conn.execute(
            "SELECT j.steps_completed, count(s.finished_at) FROM control.platform_jobs j"
            " LEFT JOIN control.job_step_runs s ON s.job_id = j.id AND s.run = j.run"
            " WHERE j.id = %s GROUP BY j.id",
            (move.job_id,),
        ).fetchone()
    assert reason is not None and reason.startswith("the target's server could not subscribe")
    assert done == ([], 0)  # the step's record did not commit
    assert servers.leftovers()["publications"], "the dead run left its publication"
    with servers.owner(TARGET) as conn:  # and the target's copy of the DDL
        found = conn.execute("SELECT 1 FROM pg_namespace WHERE nspname = 'tenant_window'")
        assert found.fetchone() is not None

    with database.owner() as conn:
        conn.execute(
            "UPDATE control.tenant_servers SET conninfo = %s WHERE name = %s",
            (servers.reference(SOURCE), SOURCE),
        )
    out = run_cli(settings, "move", "window", "--to", TARGET, env=env)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "method logical" not in " ".join(d for _, d in details(database, "window")[-5:])
    fell_back(database, "window", f"{reason}); ")
    copied_whole(servers, "window", before, source)
    assert service.locate(settings, "window").server == TARGET
    assert app_write(servers.app_url(TARGET), "window") == "ok"
    assert app_write(servers.app_url(SOURCE), "window") == "denied"
