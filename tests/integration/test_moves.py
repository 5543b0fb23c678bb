"""``provisioner move`` (issue 29, step 4) between two real clusters: the control database's
and a second one as tenant server ``east`` (:mod:`tests.extra_clusters`), each command a real
child process, the application a concurrent process writing all along."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import psycopg
import pytest

from provisioner import servers, service
from provisioner.engine import sessions as engine_sessions
from provisioner.errors import InvalidInput
from provisioner.fleet import move as fleet_move
from provisioner.kinds import move_copy, move_precopy
from provisioner.models import JobStatus
from provisioner.settings import Settings
from provisioner.tenant import catalog
from tests.conftest import Database, run_cli, settings_env
from tests.extra_clusters import TenantServer
from tests.workers import kill_frozen, wait_until

WRITER = Path(__file__).resolve().parent.parent / "move_writer.py"
CHILD = Path(__file__).resolve().parent.parent / "crash" / "move_child.py"


def provision_with_rows(settings: Settings, database: Database, tenant: str, rows: int) -> None:
    """A tenant on the control database, ``rows`` audit events in it (before any server)."""
    service.provision(settings, tenant)
    with database.app() as conn:
        conn.execute(
            f"INSERT INTO tenant_{tenant}.audit_events (action) "
            "SELECT 'seed ' || g FROM generate_series(1, %s) g",
            (rows,),
        )


def add_east(database: Database, east: TenantServer, **flags: int) -> None:
    with database.owner() as conn:
        servers.add(conn, "east", east.reference, **flags)


def move_cli(
    settings: Settings, east: TenantServer, *args: str
) -> subprocess.CompletedProcess[str]:
    return run_cli(settings, "move", *args, env=east.env)


def snapshot(conn: psycopg.Connection, tenant: str) -> move_copy.Snapshot | None:
    with psycopg.connect(conn.info.dsn, password=conn.info.password, autocommit=True) as own:
        return move_copy.snapshot(own, f"tenant_{tenant}")


def app_write(url: str, tenant: str) -> str:
    """One write as app_rw: 'ok', or the error's SQLSTATE class ('denied', 'missing')."""
    try:
        with psycopg.connect(url, autocommit=True) as conn:
            conn.execute(f"INSERT INTO tenant_{tenant}.audit_events (action) VALUES ('probe')")
    except psycopg.errors.InsufficientPrivilege:
        return "denied"
    except psycopg.errors.UndefinedTable:
        return "missing"
    return "ok"


def start_writers(
    settings: Settings, database: Database, tenant: str, routes: dict[str, str], tmp_path: Path
) -> tuple[list[subprocess.Popen[bytes]], dict[str, Path], Path]:
    """Two application writers (tests/move_writer.py) on ``tenant``: ``router`` follows the
    directory, ``stale`` keeps its first route; (the processes, their logs by name, the file
    whose creation stops them)."""
    stop = tmp_path / "stop"
    logs = {name: tmp_path / f"{name}.log" for name in ("router", "stale")}
    writers = [
        subprocess.Popen(
            [sys.executable, str(WRITER), database.app_url, tenant, json.dumps(routes), str(log)]
            + [str(stop)]
            + (["stale"] if name == "stale" else []),
            env=settings_env(settings),
        )
        for name, log in logs.items()
    ]
    return writers, logs, stop


def written(log: Path, outcome: str, server: str = "control") -> bool:
    """Has the writer logged a write with ``outcome`` on ``server`` (see tests/move_writer.py)?"""
    whole = log.read_text().split("\n")[:-1] if log.exists() else []  # the last may be partial
    return any(line.split()[0] == outcome and line.split()[-1] == server for line in whole)


def moves_row(database: Database, tenant: str) -> tuple | None:
    with database.owner() as conn:
        return conn.execute(
            "SELECT source, target, phase FROM control.tenant_moves WHERE tenant_id = %s",
            (tenant,),
        ).fetchone()


def test_a_tenant_moves_under_live_writes_and_loses_nothing(
    settings: Settings, database: Database, tenant_server: TenantServer, tmp_path: Path
) -> None:
    """10,000 rows and a writer routing by the directory all along, another writer keeping
    its stale route: the copy's rows, sequence, catalog and grants equal the source's, every
    acknowledged write is on the target, the stale route is refused once frozen, the writer
    that follows the directory goes on writing on the target."""
    provision_with_rows(settings, database, "big", 10_000)
    add_east(database, tenant_server)
    with database.owner() as conn:
        granted_before = catalog.read(conn, "tenant_big")
    routes = {"control": database.app_url, "east": tenant_server.app_url}
    writers, logs, stop = start_writers(settings, database, "big", routes, tmp_path)
    try:
        # both writers acknowledged writes on control before the move, and after it the router
        # on east and the stale one refused on control (waited for: never a fixed sleep)
        wait_until(lambda: all(written(log, "ok") for log in logs.values()), 60, "writes")
        out = move_cli(settings, tenant_server, "big", "--to", "east", "--json")
        assert out.returncode == 0, out.stderr
        wait_until(lambda: written(logs["router"], "ok", "east"), 60, "a write on east")
        wait_until(lambda: written(logs["stale"], "denied", "control"), 60, "a refused write")
    finally:
        stop.touch()
        for writer in writers:
            assert writer.wait(timeout=30) == 0
    assert out.returncode == 0, out.stderr
    secret = psycopg.conninfo.conninfo_to_dict(database.owner_url).get("password")
    assert not secret or secret not in out.stdout + out.stderr
    result = json.loads(out.stdout)
    assert (result["from"], result["to"], result["phase"]) == ("control", "east", "switched")
    assert result["job"]["steps_completed"] == [
        "precopy_schema",
        "freeze_writes",
        "copy_schema",
        "verify_copy",
        "switch_server",
    ]
    assert service.locate(settings, "big").server == "east"

    router = [line.split() for line in logs["router"].read_text().splitlines()]
    stale = [line.split() for line in logs["stale"].read_text().splitlines()]
    acknowledged = [r for r in router + stale if r[0] == "ok"]
    assert acknowledged
    # every write the application was told succeeded, wherever it went, is on the target
    with tenant_server.owner() as conn:
        on_target = dict(conn.execute("SELECT id, action FROM tenant_big.audit_events").fetchall())
    assert all(on_target.get(int(r[2])) == f"w{r[1]}" for r in acknowledged)
    # the stale route was refused once frozen; the router went on on the target
    assert any(r[0] == "denied" and r[2] == "control" for r in stale)
    assert not any(r[0] == "ok" and r[3] != "control" for r in stale)
    assert any(r[0] == "ok" and r[3] == "east" for r in router)
    assert app_write(database.app_url, "big") == "denied"
    assert app_write(tenant_server.app_url, "big") == "ok"

    # the copy equals the source: rows, sequence, catalog and, granted again, the grants
    with database.owner() as conn:
        source = snapshot(conn, "big")
    with tenant_server.owner() as conn:
        after_move = catalog.read(conn, "tenant_big")
    assert granted_before == after_move
    with tenant_server.owner() as conn, conn.transaction():
        conn.execute("DELETE FROM tenant_big.audit_events WHERE action = 'probe'")
    with tenant_server.owner() as conn:
        target = snapshot(conn, "big")
    assert source is not None and target is not None
    assert source.rows == {**target.rows, "audit_events": source.rows["audit_events"]}
    assert source.rows["audit_events"] == 10_000 + len(
        {int(r[2]) for r in router + stale if r[0] == "ok" and r[3] == "control"}
    )
    assert target.sequences["audit_events_id_seq"][0] >= source.sequences["audit_events_id_seq"][0]

    # the directory's counts followed; the old copy stays until --finish, after the grace
    with database.owner() as conn:
        placed = conn.execute("SELECT placed FROM control.tenant_servers").fetchone()
    assert placed == (1,)
    early = move_cli(settings, tenant_server, "big", "--finish")
    assert early.returncode == 2 and "grace period" in early.stderr
    assert early.stderr.count("\n") == 1
    done = move_cli(settings, tenant_server, "big", "--finish", "--grace", "0", "--json")
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["phase"] == "finished"
    assert app_write(database.app_url, "big") == "missing"
    assert moves_row(database, "big") == (None, "east", "finished")


def test_a_tenant_moves_back_to_the_control_database(
    settings: Settings, database: Database, tenant_server: TenantServer
) -> None:
    provision_with_rows(settings, database, "back", 100)
    add_east(database, tenant_server)
    assert move_cli(settings, tenant_server, "back", "--to", "east").returncode == 0
    assert move_cli(settings, tenant_server, "back", "--finish", "--grace", "0").returncode == 0
    # queued, and run by a worker: the engine runs a move of a tenant on a tenant server
    queued = move_cli(settings, tenant_server, "back", "--to", "control", "--queue")
    assert queued.returncode == 0, queued.stderr
    assert service.locate(settings, "back").server == "east"
    # (the tool's schema is on east already: `move --to` refuses a server without it)
    migrated = run_cli(settings, "migrate", env=tenant_server.env)
    assert migrated.returncode == 0, migrated.stderr
    drained = run_cli(
        settings,
        "worker",
        "--once",
        env={**tenant_server.env, "PROVISIONER_WORKER_JOB_TYPES": "move_tenant"},
    )
    assert drained.returncode == 0, drained.stderr
    status = json.loads(run_cli(settings, "status", "back", "--json").stdout)
    assert (status["job_type"], status["status"]) == ("move_tenant", "succeeded")
    assert service.locate(settings, "back").server == "control"
    assert app_write(database.app_url, "back") == "ok"
    assert app_write(tenant_server.app_url, "back") == "denied"
    with database.owner() as conn:
        assert conn.execute("SELECT placed FROM control.tenant_servers").fetchone() == (0,)


def test_bad_input_is_one_line_with_its_exit_code_and_changes_nothing(
    settings: Settings, database: Database, tenant_server: TenantServer
) -> None:
    provision_with_rows(settings, database, "stay", 10)
    add_east(database, tenant_server)
    with database.owner() as conn:
        servers.add(conn, "gone", tenant_server.reference)
        servers.set_status(conn, "gone", servers.ServerStatus.RETIRED)
        servers.add(conn, "busy", tenant_server.reference)
        servers.set_status(conn, "busy", servers.ServerStatus.FULL)
        servers.add(conn, "emptying", tenant_server.reference)
        servers.set_status(conn, "emptying", servers.ServerStatus.DRAINING)
        servers.add(conn, "small", tenant_server.reference, capacity=0)
    cases = [
        (("stay", "--to", "nowhere"), 3, "no tenant server named nowhere"),
        (("stay", "--to", "Bad-Name"), 2, "invalid server name"),
        (("stay", "--to", "gone"), 2, "is retired"),
        (("stay", "--to", "busy"), 2, "is full"),
        (("stay", "--to", "emptying"), 2, "is draining"),
        (("stay", "--to", "small"), 2, "at its capacity"),
        (("stay", "--to", "control"), 2, "already lives on control"),
        (("nobody", "--to", "east"), 3, "unknown tenant nobody"),
        (("Bad", "--to", "east"), 2, "invalid tenant id"),
        (("stay",), 2, "exactly one of"),
        (("stay", "--finish"), 2, "no switched move"),
        (("stay", "--abort"), 2, "no move under way"),
        # a grace PostgreSQL's interval cannot hold, and flags the action would ignore
        (("stay", "--finish", "--grace", "nan"), 2, "'nan' is not a finite number of seconds"),
        (("stay", "--finish", "--grace", "inf"), 2, "Invalid value for '--grace'"),
        (("stay", "--finish", "--grace", "1e15"), 2, "Invalid value for '--grace'"),
        (("stay", "--finish", "--grace", "-1"), 2, "Invalid value for '--grace'"),
        (("stay", "--to", "east", "--grace", "5"), 2, "--grace does not apply to move --to"),
        (("stay", "--abort", "--grace", "0"), 2, "--grace does not apply to move --abort"),
        (("stay", "--finish", "--method", "dump"), 2, "--method does not apply to move --finish"),
        (("stay", "--abort", "--queue"), 2, "--queue does not apply to move --abort"),
    ]
    for args, code, text in cases:
        out = move_cli(settings, tenant_server, *args)
        assert (out.returncode, out.stderr.count("\n")) == (code, 1), (args, out.stderr)
        assert text in out.stderr, (args, out.stderr)
    with tenant_server.owner() as conn:
        conn.execute("CREATE SCHEMA tenant_stay")
    out = move_cli(settings, tenant_server, "stay", "--to", "east")
    assert out.returncode == 2 and "already has a schema tenant_stay" in out.stderr
    assert moves_row(database, "stay") is None
    with database.owner() as conn:
        jobs = conn.execute(
            "SELECT count(*) FROM control.platform_jobs WHERE job_type = 'move_tenant'"
        ).fetchone()
        placed = conn.execute("SELECT sum(placed) FROM control.tenant_servers").fetchone()
    assert jobs == (0,) and placed == (0,)
    assert service.locate(settings, "stay").server == "control"
    assert app_write(database.app_url, "stay") == "ok"


def test_a_target_whose_tool_schema_was_never_migrated_is_refused_up_front(
    settings: Settings, database: Database, tenant_server: TenantServer
) -> None:
    """As a worker refuses to start with it: every later job of the tenant would fail there."""
    provision_with_rows(settings, database, "early", 10)
    add_east(database, tenant_server)
    with tenant_server.owner() as conn:
        conn.execute("DROP SCHEMA provisioner_server CASCADE")  # never `provisioner migrate`d
    out = move_cli(settings, tenant_server, "early", "--to", "east")
    assert (out.returncode, out.stderr.splitlines()) == (
        2,
        [
            "error: tenant server east: its tool schema is at version 0, this build needs 2: "
            "run `provisioner migrate`"
        ],
    )
    assert moves_row(database, "early") is None
    with database.owner() as conn:
        jobs = conn.execute(
            "SELECT count(*) FROM control.platform_jobs WHERE job_type = 'move_tenant'"
        ).fetchone()
    assert jobs == (0,)
    with tenant_server.owner() as conn:
        found = conn.execute("SELECT 1 FROM pg_namespace WHERE nspname = 'tenant_early'")
        assert found.fetchone() is None
    assert service.locate(settings, "early").server == "control"
    assert run_cli(settings, "migrate", env=tenant_server.env).returncode == 0
    done = move_cli(settings, tenant_server, "early", "--to", "east")
    assert done.returncode == 0, done.stdout + done.stderr
    assert service.locate(settings, "early").server == "east"


def test_abort_gives_the_source_back_and_drops_the_copy(
    settings: Settings, database: Database, tenant_server: TenantServer
) -> None:
    """A move stopped after its copy (its process killed) leaves the tenant frozen on the
    source; --abort drops the copy and grants the source again."""
    provision_with_rows(settings, database, "odd", 50)
    add_east(database, tenant_server)
    kill_frozen(settings, CHILD, "odd", "east", "verify_copy", "started", env=tenant_server.env)
    assert app_write(database.app_url, "odd") == "denied"
    assert app_write(tenant_server.app_url, "odd") == "denied"
    aborted = move_cli(settings, tenant_server, "odd", "--abort", "--json")
    assert aborted.returncode == 0, aborted.stderr
    assert json.loads(aborted.stdout)["phase"] == "aborted"
    assert app_write(database.app_url, "odd") == "ok"
    assert app_write(tenant_server.app_url, "odd") == "missing"
    assert service.locate(settings, "odd").server == "control"
    again = move_cli(settings, tenant_server, "odd", "--to", "east")
    assert again.returncode == 0, again.stdout + again.stderr
    assert app_write(tenant_server.app_url, "odd") == "ok"


def test_a_copy_longer_than_the_idle_timeout_keeps_the_steps_transaction(
    settings: Settings,
    database: Database,
    tenant_server: TenantServer,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """db/keepalive.py: a move's steps copy through sessions of their own while the step's
    control transaction (the tenant's lock, the steps' records) waits. A copy longer than the
    engine's idle timeout (1 s here; the rows' copy held back 3 s) used to lose that
    transaction at the step's close, leave the source frozen and copy it all again, as long
    again, attempt after attempt. Now the move succeeds at its first attempt, its rows there;
    and ``--finish``'s grace period counts from the switch, not from the freeze's start."""
    for key, value in tenant_server.env.items():
        monkeypatch.setenv(key, value)
    monkeypatch.setattr(engine_sessions, "idle_timeout_ms", lambda stale: 1000)
    provision_with_rows(settings, database, "slow", 100)
    add_east(database, tenant_server)
    copy_rows = move_precopy.copy_rows
    copies: list[float] = []

    def large(*args: Any, **kwargs: Any) -> move_precopy.RowsCopied:
        copies.append(time.monotonic())
        time.sleep(3.0)
        return copy_rows(*args, **kwargs)

    monkeypatch.setattr(move_precopy, "copy_rows", large)
    moved = fleet_move.move(replace(settings, move_method="dump"), "slow", "east")
    assert moved.job.status is JobStatus.SUCCEEDED, moved.job.error_detail
    assert moved.job.attempts == 1 and len(copies) == 1
    assert service.locate(settings, "slow").server == "east"
    with tenant_server.app() as conn:
        assert conn.execute("SELECT count(*) FROM tenant_slow.audit_events").fetchone() == (100,)
    assert app_write(tenant_server.app_url, "slow") == "ok"
    # The grace period counts from the switch, by the database's clock: the freeze's
    # transaction, which the switch ended, began more than 3 s before it.
    with pytest.raises(InvalidInput, match="grace period of tenant slow's move ends at"):
        fleet_move.finish(settings, "slow", grace_seconds=2.5)
    assert fleet_move.finish(settings, "slow", grace_seconds=0).phase.value == "finished"
