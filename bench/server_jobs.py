"""Provisioning through a running worker on a tenant server vs on the control database (opt-in:
``python -m bench --only server-jobs``).

Two deployments on the bench cluster, each with its own control database and its own running
``provisioner worker``: ``one`` keeps its tenants on the control database (a single-server
deployment, the baseline); ``two`` has one tenant server (a third database of the same cluster,
reached through its reference and the cluster's password file), where every new tenant is
placed, so each step commits there with its journal row and fence, then its checkpoint in
control (:mod:`provisioner.engine.remote`). The tenant server is on the same cluster: the figure
is the tool's own cost of the second server (two commits per step, the server's pool), not a
network's.

Each tenant is enqueued alone as ``app_rw`` while its worker is idle, one tenant of each setup
in turn; its latency is the job row's ``finished_at - created_at``, as in the pool scenario.
"""

from __future__ import annotations

import time

import psycopg

from bench import worker_process
from bench.cluster import BenchCluster, BenchDatabase, say
from bench.figures import Figure, Results
from bench.pool import SETTLE_SECONDS, _latency
from provisioner import servers

TENANTS = 15


def _reference(cluster: BenchCluster, database: BenchDatabase) -> str:
    return (
        f"host=127.0.0.1 port={cluster.cluster.port} dbname={database.name} "
        f"passfile={cluster.cluster.passfile}"
    )


def _wait_idle(database: BenchDatabase) -> None:
    """Until the worker's heartbeat says it is ready (its start-up checks done)."""
    with psycopg.connect(database.owner_url, autocommit=True) as conn:
        worker_process.wait_for(
            lambda: (
                conn.execute("SELECT EXISTS (SELECT FROM control.runtime_heartbeats)").fetchone()
                == (True,)
            ),
            120,
            0.1,
        )


def run(cluster: BenchCluster, results: Results, tenants: int = TENANTS) -> None:
    with (
        cluster.database("sj_one") as one,
        cluster.database("sj_two") as two,
        cluster.database("sj_server") as server,
    ):
        with psycopg.connect(two.owner_url, autocommit=True) as conn:
            servers.add(conn, "east", _reference(cluster, server))
        servers.migrate_servers(two.owner_url)
        workers = [worker_process.WorkerProcess(db) for db in (one, two)]
        samples: dict[str, list[float]] = {"one": [], "two": []}
        try:
            for database in (one, two):
                _wait_idle(database)
            time.sleep(SETTLE_SECONDS)
            with psycopg.connect(one.app_url) as app_one, psycopg.connect(two.app_url) as app_two:
                for n in range(tenants + 1):  # the first of each: the engines' first job
                    for label, conn in (("one", app_one), ("two", app_two)):
                        ms = _latency(conn, f"t{n}")
                        if n:
                            samples[label].append(ms)
                        time.sleep(SETTLE_SECONDS / 4)
        finally:
            for worker in workers:
                worker.stop()
                worker.close()
        with psycopg.connect(server.owner_url) as conn:
            placed = conn.execute(
                "SELECT count(*) FROM pg_namespace WHERE nspname LIKE 'tenant_t%'"
            ).fetchone()
        if placed is None or placed[0] != tenants + 1:
            raise RuntimeError(f"the tenant server holds {placed} tenants, not {tenants + 1}")
    say(
        f"  server-jobs: median one {sorted(samples['one'])[tenants // 2]:.1f} ms, "
        f"two {sorted(samples['two'])[tenants // 2]:.1f} ms"
    )
    results.add(
        Figure(
            "server_jobs_one",
            "enqueue -> succeeded through a running worker, tenant on the control database",
            "ms",
            samples["one"],
            note="baseline",
        )
    )
    results.add(
        Figure(
            "server_jobs_two",
            "enqueue -> succeeded through a running worker, tenant on a tenant server",
            "ms",
            samples["two"],
            baseline="server_jobs_one",
        )
    )
