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
import uuid
from pathlib import Path

from provisioner import servers as directory
from provisioner import service
from provisioner.models import TenantId
from provisioner.servers import moves
from provisioner.settings import Settings
from provisioner.tenant import catalog
from tests.conftest import Database, run_cli
from tests.integration.test_move_logical import details, on_source
from tests.integration.test_moves import app_write, provision_with_rows, snapshot
from tests.logical_servers import SOURCE, TARGET, LogicalServers

NONE_LEFT = {"subscriptions": [], "slots": [], "publications": []}


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
    records = dict(details(database, "fall")[-5:])
    assert (
        "method dump (logical replication failed: the target's server could not subscribe "
        "to the source (SQLSTATE 08" in records["precopy_schema"]
    ), records
    assert "subscribed" not in records["precopy_schema"]
    assert "rows copied from " in records["copy_schema"], records
    with database.owner() as conn:
        job = moves.get_move(conn, TenantId("fall"))
        assert job is not None
        assert moves.fallback(conn, job.job_id) is not None

    # rows (the application's 3 too), sequences, catalog and grants equal; nothing left
    assert servers.leftovers() == NONE_LEFT
    with servers.owner(TARGET) as conn:
        assert catalog.read(conn, "tenant_fall") == before
        target = snapshot(conn, "fall")
    assert target is not None
    assert (target.rows, target.sequences) == (source.rows, source.sequences)
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
    records = dict(details(database, "slots")[-5:])
    assert (
        "method dump (logical replication failed: the subscription's workers reported "
        in records["precopy_schema"]
    ), records
    assert "rows copied from " in records["copy_schema"], records
    assert servers.leftovers() == NONE_LEFT
    with servers.owner(TARGET) as conn:
        assert catalog.read(conn, "tenant_slots") == before
        target = snapshot(conn, "slots")
    assert target is not None
    assert (target.rows, target.sequences) == (source.rows, source.sequences)
    assert service.locate(settings, "slots").server == TARGET
    assert servers.password not in shown(database, "slots", out)
