"""``provisioner move`` by logical replication (:mod:`provisioner.kinds.move_logical`) between
two databases of a PostgreSQL 16 cluster with ``wal_level = logical``
(:mod:`tests.logical_servers`), each command a real child process, the application writing
all along. The tenant first reaches the source by a dump move from the control database
(whose server has no ``wal_level = logical``: ``auto`` falls back there, and says why)."""

from __future__ import annotations

import json
import subprocess
import threading
from pathlib import Path

import psycopg
import pytest

from provisioner import service
from provisioner.fleet import move as fleet_move
from provisioner.kinds import move_logical
from provisioner.local.cluster import OWNER_ROLE
from provisioner.models import JobStatus
from provisioner.servers import moves
from provisioner.settings import Settings
from provisioner.tenant import catalog
from tests.conftest import Database, run_cli
from tests.integration.test_moves import (
    app_write,
    provision_with_rows,
    snapshot,
    start_writers,
    written,
)
from tests.logical_servers import SOURCE, TARGET, LogicalServers
from tests.workers import wait_until

WRITER = Path(__file__).resolve().parent.parent / "move_writer.py"


def details(database: Database, tenant: str) -> list[tuple[str, str]]:
    """Every step record of the tenant's jobs: (step, detail)."""
    with database.owner() as conn:
        rows = conn.execute(
            "SELECT step, coalesce(detail, '') FROM control.job_step_runs WHERE tenant_id = %s"
            " ORDER BY id",
            (tenant,),
        ).fetchall()
    return [(str(s), str(d)) for s, d in rows]


def on_source(
    settings: Settings, database: Database, servers: LogicalServers, tenant: str, rows: int
) -> subprocess.CompletedProcess[str]:
    """The tenant built on control with ``rows`` events, then moved to the source (auto)."""
    provision_with_rows(settings, database, tenant, rows)
    servers.register(database, SOURCE, TARGET)
    out = run_cli(settings, "move", tenant, "--to", SOURCE, env=servers.env)
    assert out.returncode == 0, out.stdout + out.stderr
    done = run_cli(settings, "move", tenant, "--finish", "--grace", "0", env=servers.env)
    assert done.returncode == 0, done.stdout + done.stderr
    return out


def test_a_tenant_moves_by_logical_replication_under_live_writes(
    settings: Settings, database: Database, logical_servers: LogicalServers, tmp_path: Path
) -> None:
    servers = logical_servers
    first = on_source(settings, database, servers, "big", 10_000)
    # control's server has no wal_level=logical: auto fell back to the dump, and said why
    precopy = [d for s, d in details(database, "big") if s == "precopy_schema"]
    assert "method dump (logical replication not possible: " in precopy[-1], precopy
    assert "wal_level=" in precopy[-1]
    with servers.owner(SOURCE) as conn:
        granted_before = catalog.read(conn, "tenant_big")
    routes = {
        "control": database.app_url,
        SOURCE: servers.app_url(SOURCE),
        TARGET: servers.app_url(TARGET),
    }
    writers, logs, stop = start_writers(settings, database, "big", routes, tmp_path)
    try:
        wait_until(lambda: all(written(log, "ok", SOURCE) for log in logs.values()), 60, "writes")
        out = run_cli(settings, "move", "big", "--to", TARGET, "--json", env=servers.env)
        assert out.returncode == 0, out.stdout + out.stderr
        wait_until(lambda: written(logs["router"], "ok", TARGET), 60, "a write on the target")
        wait_until(lambda: written(logs["stale"], "denied", SOURCE), 60, "a refused write")
    finally:
        stop.touch()
        for writer in writers:
            assert writer.wait(timeout=30) == 0
    result = json.loads(out.stdout)
    assert (result["from"], result["to"], result["phase"]) == (SOURCE, TARGET, "switched")
    assert result["job"]["status"] == "succeeded"
    assert service.locate(settings, "big").server == TARGET
    records = dict(details(database, "big")[-5:])
    assert "method logical; " in records["precopy_schema"], records
    assert "subscribed to" in records["precopy_schema"]
    assert "logical replication caught up in " in records["copy_schema"], records

    # every write the application was told succeeded is on the target; the stale route refused
    router = [line.split() for line in logs["router"].read_text().splitlines()]
    stale = [line.split() for line in logs["stale"].read_text().splitlines()]
    acknowledged = [r for r in router + stale if r[0] == "ok"]
    assert any(r[3] == SOURCE for r in acknowledged)
    with servers.owner(TARGET) as conn:
        on_target = dict(conn.execute("SELECT id, action FROM tenant_big.audit_events").fetchall())
    assert all(on_target.get(int(r[2])) == f"w{r[1]}" for r in acknowledged)
    assert any(r[0] == "denied" and r[2] == SOURCE for r in stale)
    assert app_write(servers.app_url(SOURCE), "big") == "denied"
    assert app_write(servers.app_url(TARGET), "big") == "ok"

    # rows, sequences, catalog and grants equal the source's
    with servers.owner(TARGET) as conn:
        assert catalog.read(conn, "tenant_big") == granted_before
        conn.execute("DELETE FROM tenant_big.audit_events WHERE action = 'probe'")
        target = snapshot(conn, "big")
    with servers.owner(SOURCE) as conn:
        source = snapshot(conn, "big")
    assert source is not None and target is not None
    # (the router went on writing on the target after the switch)
    assert source.rows == {**target.rows, "audit_events": source.rows["audit_events"]}
    assert source.rows["audit_events"] == 10_000 + len(
        {int(r[2]) for r in acknowledged if r[3] == SOURCE}
    )
    seq = "audit_events_id_seq"
    assert target.sequences[seq][0] >= source.sequences[seq][0] > 10_000

    # nothing of the replication is left, and its password is in no record nor output
    assert servers.leftovers() == {"subscriptions": [], "slots": [], "publications": []}
    shown = first.stdout + first.stderr + out.stdout + out.stderr
    shown += " ".join(d for _, d in details(database, "big"))
    with database.owner() as conn:
        jobs = conn.execute(
            "SELECT coalesce(error_detail, '') || payload::text FROM control.platform_jobs"
            " WHERE tenant_id = 'big'"
        ).fetchall()
    shown += " ".join(str(j[0]) for j in jobs)
    assert servers.password not in shown


def test_logical_forced_without_what_it_needs_is_refused_and_creates_nothing(
    settings: Settings, database: Database, logical_servers: LogicalServers
) -> None:
    provision_with_rows(settings, database, "forced", 10)
    logical_servers.register(database, SOURCE)
    out = run_cli(
        settings, "move", "forced", "--to", SOURCE, "--method", "logical", env=logical_servers.env
    )
    assert out.returncode == 2, out.stdout + out.stderr
    assert out.stderr.count("\n") == 1, out.stderr
    assert "logical replication cannot be used" in out.stderr
    assert "wal_level=" in out.stderr
    with database.owner() as conn:
        assert conn.execute(
            "SELECT count(*) FROM control.tenant_moves WHERE tenant_id = 'forced'"
        ).fetchone() == (0,)
        assert conn.execute(
            "SELECT count(*) FROM control.platform_jobs WHERE job_type = 'move_tenant'"
        ).fetchone() == (0,)
    with logical_servers.owner(SOURCE) as conn:
        found = conn.execute("SELECT 1 FROM pg_namespace WHERE nspname = 'tenant_forced'")
        assert found.fetchone() is None
    assert logical_servers.leftovers() == {"subscriptions": [], "slots": [], "publications": []}
    assert app_write(database.app_url, "forced") == "ok"


def test_dump_asked_for_between_capable_servers_copies_by_dump(
    settings: Settings, database: Database, logical_servers: LogicalServers
) -> None:
    on_source(settings, database, logical_servers, "plain", 100)
    out = run_cli(
        settings, "move", "plain", "--to", TARGET, "--method", "dump", env=logical_servers.env
    )
    assert out.returncode == 0, out.stdout + out.stderr
    records = dict(details(database, "plain")[-5:])
    assert "method dump (asked for); " in records["precopy_schema"], records
    assert "rows copied from " in records["copy_schema"], records
    with logical_servers.owner(TARGET) as conn:
        rows = conn.execute("SELECT count(*) FROM tenant_plain.audit_events").fetchone()
    assert rows == (100,)


def test_auto_falls_back_to_dump_for_a_table_without_a_key(
    settings: Settings, database: Database, logical_servers: LogicalServers
) -> None:
    """Published, a table without a primary key or replica identity would refuse the
    application's updates and deletes on the source: auto copies by dump, and says why."""
    servers = logical_servers
    on_source(settings, database, servers, "nokey", 10)
    with servers.owner(SOURCE) as conn:
        conn.execute("CREATE TABLE tenant_nokey.loose (note text)")
        conn.execute("INSERT INTO tenant_nokey.loose VALUES ('a'), ('b')")
    out = run_cli(settings, "move", "nokey", "--to", TARGET, env=servers.env)
    assert out.returncode == 0, out.stdout + out.stderr
    records = dict(details(database, "nokey")[-5:])
    assert (
        "method dump (logical replication not possible: tables without a primary key or "
        "replica identity: loose)" in records["precopy_schema"]
    ), records
    assert servers.leftovers() == {"subscriptions": [], "slots": [], "publications": []}
    with servers.owner(TARGET) as conn:
        assert conn.execute("SELECT count(*) FROM tenant_nokey.loose").fetchone() == (2,)


def test_a_slot_kept_waiting_by_a_writer_falls_back_to_the_dump_in_bounded_time(
    settings: Settings,
    database: Database,
    logical_servers: LogicalServers,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """kinds/move_logical.py PUBLISH_TIMEOUT_MS: a logical slot is made only once every
    transaction that wrote on the source's cluster has ended; an application idle in such a
    transaction used to hold the move's pre-copy (its tenant locked, its lease renewed) for as
    long as it stayed. Now the wait is bounded (1 s here): the source refuses, and ``auto``
    falls back to the dump, which moves the tenant."""
    servers = logical_servers
    on_source(settings, database, servers, "waited", 20)
    for key, value in servers.env.items():
        monkeypatch.setenv(key, value)
    monkeypatch.setattr(move_logical, "PUBLISH_TIMEOUT_MS", 1000)
    with servers.owner(SOURCE) as writer:
        writer.autocommit = False  # an application's write, its transaction left open
        writer.execute("CREATE TEMP TABLE idle_writer (i int)")
        writer.execute("INSERT INTO idle_writer VALUES (1)")
        release = threading.Timer(20.0, writer.rollback)  # without the bound: 20 s, then logical
        release.start()
        try:
            moved = fleet_move.move(settings, "waited", TARGET)
        finally:
            release.cancel()
            writer.rollback()
    assert moved.job.status is JobStatus.SUCCEEDED, moved.job.error_detail
    records = dict(details(database, "waited")[-5:])
    refused = "method dump (logical replication failed: the source refused"
    assert refused in records["precopy_schema"], records
    assert "(SQLSTATE 57014)" in records["precopy_schema"]
    assert service.locate(settings, "waited").server == TARGET


def _ends(servers: LogicalServers) -> dict[str, moves.End]:
    """The two databases as a move's ends, reached as the owner."""
    return {
        name: moves.End(name, f"{servers.reference(name)} user={OWNER_ROLE}", servers.password)
        for name in (SOURCE, TARGET)
    }


def _schema_on_both(servers: LogicalServers, schema: str) -> None:
    for name in (SOURCE, TARGET):
        with servers.owner(name) as conn:
            conn.execute(f"CREATE SCHEMA {schema}")
            conn.execute(f"CREATE TABLE {schema}.t (id int PRIMARY KEY)")


def test_a_moves_sessions_commit_waiting_for_the_disk_where_the_server_does_not(
    logical_servers: LogicalServers,
) -> None:
    """servers/moves.py End.connect: the move's checkpoint in control follows each of its
    commits on a server (a revoke, a grant, a drop), so they wait for the disk on a server
    whose default does not (the test clusters': ``synchronous_commit = off``)."""
    servers = logical_servers
    with servers.owner(SOURCE) as conn:
        assert conn.execute("SHOW synchronous_commit").fetchone() == ("off",)
    with _ends(servers)[SOURCE].connect() as conn:  # the package's sessions give dict rows
        assert conn.execute("SHOW synchronous_commit").fetchone() == {"synchronous_commit": "on"}


def test_the_probe_names_a_revoked_logical_decoding_message(
    logical_servers: LogicalServers,
) -> None:
    """The catch-up marks the freeze's position with ``pg_logical_emit_message``: a source
    where the owner may not run it is found by the probe (``auto`` then takes the dump)."""
    servers = logical_servers
    ends = _ends(servers)
    _schema_on_both(servers, "unmarked")
    assert move_logical.probe(ends[SOURCE], ends[TARGET], "unmarked").ok
    admin = servers.cluster.superuser_url(servers.databases[SOURCE])
    with psycopg.connect(admin, autocommit=True) as conn:
        conn.execute(
            "REVOKE EXECUTE ON FUNCTION pg_logical_emit_message(boolean, text, text) FROM PUBLIC"
        )
    missing = move_logical.probe(ends[SOURCE], ends[TARGET], "unmarked").missing
    assert missing == (f"the owner may not run pg_logical_emit_message on {SOURCE}",)


def test_the_catch_up_waits_for_writes_committed_without_waiting_for_the_disk(
    logical_servers: LogicalServers,
) -> None:
    """An application that commits with ``synchronous_commit = off`` is told its write
    succeeded before the WAL is written: each such write, made just before the catch-up, is on
    the target when the catch-up returns (the freeze's position is taken past it: its WAL
    flushed first). Called straight, on a schema of the test's own, five times over: the
    position of old (the written one) let most of them through missing."""
    servers = logical_servers
    ends = _ends(servers)
    _schema_on_both(servers, "async_writes")
    capability = move_logical.probe(ends[SOURCE], ends[TARGET], "async_writes")
    assert capability.ok, capability.missing
    name = "provisioner_move_async_writes"
    try:
        started = move_logical.start(
            ends[SOURCE], ends[TARGET], "async_writes", name, capability.conninfo
        )
        with (
            servers.owner(SOURCE) as writer,
            servers.owner(SOURCE) as here,
            servers.owner(TARGET) as there,
        ):
            writer.execute("SET synchronous_commit = off")  # the application's session
            for row in range(5):
                writer.execute("INSERT INTO async_writes.t VALUES (%s)", (row,))
                move_logical.catch_up(here, there, started)
                found = there.execute("SELECT count(*) FROM async_writes.t").fetchone()
                assert found == (row + 1,), f"write {row} not on the target after the catch-up"
    finally:
        move_logical.cleanup(ends[SOURCE], ends[TARGET], name)
    assert servers.leftovers() == {"subscriptions": [], "slots": [], "publications": []}
