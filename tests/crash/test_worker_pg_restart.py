"""PostgreSQL restarted under a running worker: it logs the outage once, reconnects, finishes;
the job whose session the restart cut is retried at once (no backoff: not its fault).

The test runs its own throwaway cluster (never the session's shared server) and restarts it
with ``pg_ctl`` (stop, two seconds down, start) while a job is in the middle of a step.
"""

from __future__ import annotations

import shlex
import shutil
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest

from provisioner import service
from provisioner.local import cluster as local_pg
from provisioner.settings import Settings
from provisioner.templates import migrations
from tests.workers import running_workers, wait_until

TENANTS = ["after_a", "after_b", "after_c", "after_d", "after_e"]


@pytest.fixture
def cluster() -> Iterator[local_pg.Cluster]:
    # Its own top-level temporary folder, reachable by the unprivileged server user.
    server = local_pg.Cluster(Path(tempfile.mkdtemp(prefix="provisioner-restart-")), durable=False)
    server.ensure_running()
    try:
        yield server
    finally:
        server.stop()
        shutil.rmtree(server.root, ignore_errors=True)


def restart(server: local_pg.Cluster, downtime: float) -> None:
    """Stop the server (fast: every session is cut), wait, start it again on the same port.

    ``pg_ctl`` runs through the cluster's own runner (``runuser`` when we are root); the start
    reuses the exact server options recorded in ``postmaster.opts``.
    """
    args = shlex.split((server.data / "postmaster.opts").read_text())[1:]
    data = args.index("-D")
    options = shlex.join(args[:data] + args[data + 2 :])
    stopped = server._run("pg_ctl", "-D", str(server.data), "-m", "fast", "-w", "stop")
    assert stopped.returncode == 0, stopped.stderr
    time.sleep(downtime)
    started = server._run(
        "pg_ctl", "-D", str(server.data), "-w", "-l", str(server.root / "postgres.log"),
        "-o", options, "start",
    )  # fmt: skip
    assert started.returncode == 0, started.stderr


def statuses(admin_url: str) -> dict[str, str]:
    with psycopg.connect(admin_url) as conn:
        return dict(conn.execute("SELECT tenant_id, status FROM control.platform_jobs").fetchall())


def test_worker_survives_a_postgresql_restart_and_finishes_the_queue(
    cluster: local_pg.Cluster, tmp_path: Path
) -> None:
    local_pg.bootstrap_database(cluster.superuser_url(), "provisioner")
    owner = cluster.url("provisioner_owner", "provisioner")
    migrations.upgrade_control(owner)
    objects = tmp_path / "objects"
    objects.mkdir()
    settings = Settings(
        migrations_database_url=owner,
        app_database_url=cluster.url("app_rw", "provisioner"),
        object_store_path=objects,
        state_dir=tmp_path / "state",
        heartbeat_seconds=0.5,
        job_stale_after_seconds=30.0,
    )
    admin = cluster.superuser_url("provisioner")
    service.enqueue(settings, "during")
    blocker = psycopg.connect(admin)  # holds the tenant mid-step until the restart cuts it
    blocker.execute("SELECT 1 FROM control.tenants WHERE tenant_id = 'during' FOR UPDATE")

    with running_workers(settings, tmp_path) as workers:
        worker = workers.start()
        wait_until(lambda: statuses(admin).get("during") == "running", 60, "the claim")
        for tenant in TENANTS:
            service.enqueue(settings, tenant)
        pid = worker.pid

        restart(cluster, downtime=2.0)
        blocker.close()

        wait_until(
            lambda: (
                set(statuses(admin).values()) == {"succeeded"}
                and len(statuses(admin)) == len(TENANTS) + 1
            ),
            90,
            "every job to succeed after the restart",
        )
        assert worker.proc.poll() is None and worker.pid == pid  # the same process, alive
        down = worker.events("database_unavailable")
        assert 1 <= len(down) <= 2, down  # one line per outage (from the queue or heartbeat)
        worker.wait_for("database_reconnected")
        # the job cut mid-step was retried (or handed back) and then finished
        with psycopg.connect(admin) as conn:
            attempts = conn.execute(
                "SELECT attempts FROM control.platform_jobs WHERE tenant_id = 'during'"
            ).fetchone()
        assert attempts is not None and attempts[0] >= 2
        # The restart cut its session: no fault of the job, so no backoff before its retry.
        cut = [r for r in worker.events("retry_scheduled") if r.get("tenant_id") == "during"]
        assert cut and all(r["delay_seconds"] == 0 for r in cut), cut
        assert worker.stop() == 0, worker.output()
