"""A tenant server that commits without waiting for the disk by default
(``synchronous_commit = off``, a throughput setting some deployments choose) crashes right after
a step's commit there returned, before control's checkpoint: the step and its journal row must
survive it, or control would go on to record a step the server no longer has (the job's last
step: a job told succeeded whose change is gone).

The server is a cluster of this test's own, durable (``fsync`` on), whose WAL writer waits
10 s between rounds, so an asynchronous commit's WAL stays in memory over the test's few
milliseconds; its crash is an immediate shutdown (SIGQUIT to the postmaster: no WAL flushed,
crash recovery at the next start).
"""

from __future__ import annotations

import os
import shutil
import signal
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from provisioner import servers, service
from provisioner.local import cluster as local_pg
from provisioner.models import JobStatus
from provisioner.settings import Settings
from provisioner.tenant.fingerprint import fingerprint
from tests.conftest import Database
from tests.extra_clusters import TenantServerDb, create_database
from tests.workers import alive, kill_frozen

KILL_CHILD = Path(__file__).with_name("provision_child.py")


@pytest.fixture
def async_server() -> Iterator[TenantServerDb]:
    """A database on a durable cluster of the test's own that commits asynchronously by
    default (its own top-level folder: as root the server runs as an unprivileged user)."""
    cluster = local_pg.Cluster(
        Path(tempfile.mkdtemp(prefix="provisioner-pg-")),
        durable=True,
        conf=("synchronous_commit = off", "wal_writer_delay = 10s"),
    )
    try:
        cluster.ensure_running()
        yield TenantServerDb(cluster, create_database(cluster, "ts"))
    finally:
        cluster.stop()
        shutil.rmtree(cluster.root, ignore_errors=True)


def crash(cluster: local_pg.Cluster) -> None:
    """An immediate shutdown (the postmaster's SIGQUIT), waited for; then a start, which
    recovers from the WAL on disk."""
    postmaster = int((cluster.data / "postmaster.pid").read_text().split()[0])
    port = cluster.port
    os.kill(postmaster, signal.SIGQUIT)
    deadline = time.monotonic() + 60
    while alive(postmaster):
        assert time.monotonic() < deadline, "the postmaster outlived its immediate shutdown"
        time.sleep(0.01)
    cluster.start()
    # on its port of before, whatever its crash left in TIME_WAIT: the directory names it
    assert cluster.port == port


def test_a_step_committed_on_a_tenant_server_survives_its_crash_before_the_checkpoint(
    settings: Settings,
    database: Database,
    async_server: TenantServerDb,
    clean_fingerprint: dict,
) -> None:
    async_server.add_to(database)
    assert [m.server for m in servers.migrate_servers(settings.owner_url)] == ["east"]
    kill_frozen(settings, KILL_CHILD, "kept", "create_schema", "on_server")
    crash(async_server.cluster)

    assert list(async_server.journal("kept")) == ["create_schema"]
    assert async_server.schema_exists("tenant_kept")
    result = service.provision(settings, "kept")
    outcome = (result.job.status, result.job.attempts)
    assert outcome == (JobStatus.SUCCEEDED, 2), result.job.error_detail
    with async_server.owner() as conn:
        assert fingerprint(conn, "tenant_kept") == clean_fingerprint
