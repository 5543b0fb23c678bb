"""A move whose probe passes but whose logical replication then fails: the target's server
cannot reach the source at the directory's reference (:mod:`provisioner.kinds.move_logical`'s
:class:`ReplicationFailed`). Real servers (:mod:`tests.logical_servers`), each command a real
child process.

The source is registered by a libpq service name that this process's service file
(``PGSERVICEFILE``) defines and the cluster's server has never heard of: the tool, and so the
probe, reach the source; the target's server, given the same reference by the subscription,
cannot (``CREATE SUBSCRIPTION`` fails to connect), as when a reference makes sense only from
the tool's machine. In ``auto`` the move falls back to the dump by itself; ``--method
logical`` fails the job with one line saying what to do.

And a source with a single replication slot (:func:`tests.logical_servers.one_slot_cluster`):
the probe finds it free, the move's slot takes it, the subscription's table synchronisations
cannot make theirs: its workers' errors, seen in ``pg_stat_subscription_stats``."""

from __future__ import annotations

import json
import subprocess
import sys
import uuid
from pathlib import Path
from typing import Any

import psycopg

from provisioner import servers as directory
from provisioner import service
from provisioner.models import TenantId
from provisioner.servers import moves
from provisioner.settings import Settings
from provisioner.tenant import catalog
from tests.conftest import Database, run_cli, settings_env
from tests.integration.test_move_logical import details, on_source
from tests.integration.test_moves import app_write, provision_with_rows, snapshot
from tests.logical_servers import SOURCE, TARGET, LogicalServers
from tests.workers import wait_until

CHILD = Path(__file__).resolve().parent.parent / "crash" / "move_child.py"

NONE_LEFT = {"subscriptions": [], "slots": [], "publications": []}


def fell_back(database: Database, tenant: str, reason: str) -> dict[str, str]:
    """The move's last records, asserting its pre-copy fell back to the dump for ``reason``
    (the start of the record's phrase) and its rows were then copied by ``COPY``."""
    records = dict(details(database, tenant)[-5:])
    assert f"method dump (logical replication failed: {reason}" in records["precopy_schema"], (
        records
    )
    assert "rows copied from " in records["copy_schema"], records
    return records


def copied_whole(servers: LogicalServers, tenant: str, before: Any, source: Any) -> None:
    """Nothing of the replication left on either server, and the tenant on the target as it
    was on the source: catalog (grants with it), rows and sequences."""
    assert servers.leftovers() == NONE_LEFT
    with servers.owner(TARGET) as conn:
        assert catalog.read(conn, f"tenant_{tenant}") == before
        target = snapshot(conn, tenant)
    assert target is not None
    assert (target.rows, target.sequences) == (source.rows, source.sequences)


def source_by_service(
    settings: Settings, database: Database, servers: LogicalServers, tmp_path: Path, tenant: str
) -> dict[str, str]:
    """The source registered by a service only this process knows, the target by its
    reference; the tenant (50 rows) moved from control to the source by dump, then written to
    there by the application (3 rows, its sequence advanced); the environment of the commands
    that reach the servers."""
    name = f"lsrc_{uuid.uuid4().hex[:12]}"
    services = tmp_path / "pg_service.conf"
    services.write_text(
        f"[{name}]\nhost=127.0.0.1\nport={servers.cluster.port}\n"
        f"dbname={servers.databases[SOURCE]}\n"
    )
    env = {**servers.env, "PGSERVICEFILE": str(services)}
    provision_with_rows(settings, database, tenant, 50)
    with database.owner() as conn:
        directory.add(conn, SOURCE, name)
        directory.add(conn, TARGET, servers.reference(TARGET))
    for args in (("--to", SOURCE), ("--finish", "--grace", "0")):
        out = run_cli(settings, "move", tenant, *args, env=env)
        assert out.returncode == 0, out.stdout + out.stderr
    for _ in range(3):
        assert app_write(servers.app_url(SOURCE), tenant) == "ok"
    return env


def shown(database: Database, tenant: str, *outs: subprocess.CompletedProcess[str]) -> str:
    """Everything the tool showed or recorded: the commands' output, the step records, the
    jobs' errors and payloads."""
    text = " ".join(out.stdout + out.stderr for out in outs)
    text += " ".join(d for _, d in details(database, tenant))
    with database.owner() as conn:
        jobs = conn.execute(
            "SELECT coalesce(error_detail, '') || payload::text FROM control.platform_jobs"
            " WHERE tenant_id = %s",
            (tenant,),
        ).fetchall()
    return text + " ".join(str(j[0]) for j in jobs)


def test_auto_falls_back_to_dump_when_the_target_cannot_replicate(
    settings: Settings, database: Database, logical_servers: LogicalServers, tmp_path: Path
) -> None:
    servers = logical_servers
    env = source_by_service(settings, database, servers, tmp_path, "fall")
    with servers.owner(SOURCE) as conn:
        before = catalog.read(conn, "tenant_fall")
        source = snapshot(conn, "fall")
    assert before is not None and source is not None
    out = run_cli(settings, "move", "fall", "--to", TARGET, "--json", env=env)
    assert out.returncode == 0, out.stdout + out.stderr
    result = json.loads(out.stdout)
    assert (result["phase"], result["job"]["status"]) == ("switched", "succeeded")
    assert service.locate(settings, "fall").server == TARGET
    reason = "the target's server could not subscribe to the source (SQLSTATE 08"
    records = fell_back(database, "fall", reason)
    assert "subscribed" not in records["precopy_schema"]
    with database.owner() as conn:
        job = moves.get_move(conn, TenantId("fall"))
        assert job is not None
        assert moves.fallback(conn, job.job_id) is not None

    # rows (the application's 3 too), sequences, catalog and grants equal; nothing left
    copied_whole(servers, "fall", before, source)
    assert source.rows["audit_events"] == 53
    assert app_write(servers.app_url(TARGET), "fall") == "ok"
    assert app_write(servers.app_url(SOURCE), "fall") == "denied"
    assert servers.password not in shown(database, "fall", out)


def test_logical_forced_fails_in_one_line_and_abort_leaves_nothing(
    settings: Settings, database: Database, logical_servers: LogicalServers, tmp_path: Path
) -> None:
    servers = logical_servers
    env = source_by_service(settings, database, servers, tmp_path, "forced")
    out = run_cli(settings, "move", "forced", "--to", TARGET, "--method", "logical", env=env)
    assert out.returncode == 1, out.stdout + out.stderr
    with database.owner() as conn:
        error = conn.execute(
            "SELECT error_detail FROM control.platform_jobs WHERE tenant_id = 'forced'"
            " AND job_type = 'move_tenant'"
        ).fetchone()
    assert error is not None and "\n" not in error[0], error
    assert "logical replication failed: the target's server could not subscribe" in error[0]
    assert "--method dump" in error[0] and "--abort" in error[0], error
    assert error[0] in out.stdout, out.stdout
    assert servers.leftovers() == NONE_LEFT  # dropped at once: a slot left would hold WAL
    assert service.locate(settings, "forced").server == SOURCE

    aborted = run_cli(settings, "move", "forced", "--abort", env=env)
    assert aborted.returncode == 0, aborted.stdout + aborted.stderr
    assert servers.leftovers() == NONE_LEFT
    with servers.owner(TARGET) as conn:
        found = conn.execute("SELECT 1 FROM pg_namespace WHERE nspname = 'tenant_forced'")
        assert found.fetchone() is None
    assert app_write(servers.app_url(SOURCE), "forced") == "ok"
    assert servers.password not in shown(database, "forced", out, aborted)


def test_auto_falls_back_to_dump_on_the_subscription_workers_errors(
    settings: Settings, database: Database, one_slot_servers: LogicalServers
) -> None:
    servers = one_slot_servers
    on_source(settings, database, servers, "slots", 100)
    with servers.owner(SOURCE) as conn:
        before = catalog.read(conn, "tenant_slots")
        source = snapshot(conn, "slots")
    assert before is not None and source is not None
    out = run_cli(settings, "move", "slots", "--to", TARGET, env=servers.env, timeout=60)
    assert out.returncode == 0, out.stdout + out.stderr
    fell_back(database, "slots", "the subscription's workers reported ")
    copied_whole(servers, "slots", before, source)
    assert service.locate(settings, "slots").server == TARGET
    assert servers.password not in shown(database, "slots", out)


def test_a_recorded_fallback_is_kept_by_the_next_run_and_forgotten_by_a_new_move(
    settings: Settings, database: Database, logical_servers: LogicalServers
) -> None:
    """A run killed after committing its fallback but before its step's record (the window
    between the two): the next run copies by dump, though replication would work here. The
    tenant's next move (its job reopened) tries replication again."""
    servers = logical_servers
    on_source(settings, database, servers, "kept", 20)
    queued = run_cli(settings, "move", "kept", "--to", TARGET, "--queue", env=servers.env)
    assert queued.returncode == 0, queued.stdout + queued.stderr
    with database.owner() as conn:
        move = moves.get_move(conn, TenantId("kept"))
        assert move is not None and move.job_id is not None
        moves.set_fallback(conn, move.job_id, "as a dead run left it")
    out = run_cli(settings, "move", "kept", "--to", TARGET, env=servers.env)
    assert out.returncode == 0, out.stdout + out.stderr
    fell_back(database, "kept", "as a dead run left it); ")
    assert servers.leftovers() == NONE_LEFT

    done = run_cli(settings, "move", "kept", "--finish", "--grace", "0", env=servers.env)
    assert done.returncode == 0, done.stdout + done.stderr
    back = run_cli(settings, "move", "kept", "--to", SOURCE, env=servers.env)
    assert back.returncode == 0, back.stdout + back.stderr
    records = dict(details(database, "kept")[-5:])
    assert "method logical; " in records["precopy_schema"], records
    assert servers.leftovers() == NONE_LEFT


def test_auto_falls_back_in_the_freeze_when_the_catch_up_fails(
    settings: Settings, database: Database, logical_servers: LogicalServers, tmp_path: Path
) -> None:
    """Subscribed, then a row on the target that the source's next write collides with (as
    the owner: a key taken there): the apply worker fails on it, the catch-up in the freeze
    sees its error, and the copy falls back to the whole schema by dump; the rows written
    before the freeze, that one too, are on the target."""
    servers = logical_servers
    on_source(settings, database, servers, "late", 20)
    with servers.owner(SOURCE) as conn:
        before = catalog.read(conn, "tenant_late")  # granted: as the target will be
    go, log = tmp_path / "go", tmp_path / "child.log"
    with (
        log.open("w") as stderr,
        subprocess.Popen(
            [sys.executable, str(CHILD), "late", TARGET, "precopy_schema", "repaired", str(go)],
            stdout=subprocess.PIPE,
            stderr=stderr,
            text=True,
            env={**settings_env(settings), **servers.env},
        ) as child,
    ):
        try:
            assert child.stdout is not None
            assert child.stdout.readline().strip() == "FROZEN precopy_schema repaired"
            key = _collide(servers)
            go.touch()
            out, _ = child.communicate(timeout=120)
        finally:
            child.kill()  # (gone already, unless the test failed above)
    errors = log.read_text()
    assert child.returncode == 0, out + errors
    assert out.splitlines()[-1] == "FINISHED succeeded", out + errors
    records = dict(details(database, "late")[-5:])
    assert "method logical; " in records["precopy_schema"], records
    assert (
        "method dump (logical replication failed: the subscription's workers reported "
        in records["copy_schema"]
    ), records
    assert "copied whole from " in records["copy_schema"], records
    assert servers.leftovers() == NONE_LEFT
    with servers.owner(SOURCE) as conn:
        source = snapshot(conn, "late")
    with servers.owner(TARGET) as conn:
        target = snapshot(conn, "late")
        assert catalog.read(conn, "tenant_late") == before
        mine = conn.execute("SELECT action FROM tenant_late.audit_events WHERE id = %s", key)
        assert mine.fetchone() == ("probe",)
    assert source is not None and target is not None
    assert (target.rows, target.sequences) == (source.rows, source.sequences)
    assert service.locate(settings, "late").server == TARGET


def _collide(servers: LogicalServers) -> tuple[int]:
    """A row on the target with the key of the source's next write, then that write: the
    apply worker fails on it (its error counted); the key."""
    with servers.owner(SOURCE) as conn:
        taken = conn.execute("SELECT last_value + 1 FROM tenant_late.audit_events_id_seq")
        key = taken.fetchone()
    assert key is not None
    with servers.owner(TARGET) as conn:
        conn.execute(
            "INSERT INTO tenant_late.audit_events (id, action) OVERRIDING SYSTEM VALUE"
            " VALUES (%s, 'collides')",
            key,
        )
        assert app_write(servers.app_url(SOURCE), "late") == "ok"
        wait_until(lambda: _apply_errors(conn) > 0, 60, "the apply worker's error")
    return (int(key[0]),)


def _apply_errors(conn: psycopg.Connection) -> int:
    """The errors of the subscriptions of ``conn``'s database, so far."""
    row = conn.execute(
        "SELECT coalesce(sum(t.apply_error_count + t.sync_error_count), 0)"
        " FROM pg_stat_subscription_stats t JOIN pg_subscription s ON s.oid = t.subid"
        " WHERE s.subdbid = (SELECT oid FROM pg_database WHERE datname = current_database())"
    ).fetchone()
    return int(row[0]) if row else 0
