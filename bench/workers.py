"""Throughput: N tenants enqueued, then drained by a real ``provisioner worker --once`` with 1, 2
and 4 worker children (``--concurrency``), each child a process with its own engine.

Tenants per minute are counted from the database, from the first step's start to the last job's
finish, so interpreter and child start-up are left out (they are reported as the wall time
beside it). Runs with 1, 2 and 4 children alternate, so load drifting on a shared machine hits
each alike; each run gets a fresh database.
"""

from __future__ import annotations

import threading
import time
from collections import defaultdict

import psycopg

from bench import worker_process
from bench.cluster import BenchCluster, BenchDatabase, say
from bench.figures import Figure, Results
from bench.provisioning import raw_script
from provisioner import service
from provisioner.kinds.provision import ensure_provision_job
from provisioner.models import TenantId
from provisioner.templates.replay import Template
from provisioner.tenant import schema as tenant_schema

CONCURRENCY = (1, 2, 4)


def _drain(cluster: BenchCluster, concurrency: int, tenants: int) -> tuple[float, float]:
    """(tenants per minute between first step and last finish, wall seconds incl. start-up)."""
    with cluster.database(f"worker{concurrency}") as database:
        with psycopg.connect(database.app_url) as conn:
            for i in range(tenants):
                ensure_provision_job(conn, TenantId(f"w{concurrency}_{i}"))
            conn.commit()
        began = time.monotonic()
        worker = worker_process.WorkerProcess(database, "--once", "--concurrency", str(concurrency))
        try:
            code = worker.wait(timeout=300)
        finally:
            worker.close()
        wall = time.monotonic() - began
        if code != 0:
            raise RuntimeError(f"worker exited {code}: {worker.log()[-2000:]}")
        with psycopg.connect(database.owner_url) as conn:
            row = conn.execute(
                "SELECT count(*) FILTER (WHERE status = 'succeeded'), "
                "extract(epoch FROM max(finished_at) - "
                "(SELECT min(started_at) FROM control.job_step_runs)) "
                "FROM control.platform_jobs"
            ).fetchone()
        assert row is not None
        done, seconds = int(row[0]), float(row[1])
        if done != tenants:
            raise RuntimeError(f"{done} of {tenants} tenants succeeded: {worker.log()[-2000:]}")
        return done / seconds * 60, wall


def _raw_rate(database: BenchDatabase, sessions: int, tenants: int, tag: str) -> float:
    """Tenants per minute of the raw-SQL baseline run by ``sessions`` connections at once:
    what the machine itself allows for parallel DDL."""
    template = Template.capture()
    with psycopg.connect(database.owner_url) as conn:
        tables, sequences = tenant_schema.relations(conn, "tenant_shape")
    errors: list[BaseException] = []

    def stream(k: int) -> None:
        try:
            with psycopg.connect(database.owner_url) as conn:
                for i in range(tenants):
                    schema = f"tenant_{tag}_{k}_{i}"
                    conn.execute(raw_script(conn, schema, template, tables, sequences))
                    conn.commit()
        except BaseException as exc:  # reported below, in the main thread
            errors.append(exc)

    threads = [threading.Thread(target=stream, args=(k,)) for k in range(sessions)]
    began = time.perf_counter()
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    elapsed = time.perf_counter() - began
    if errors:
        raise errors[0]
    return sessions * tenants / elapsed * 60


def run(cluster: BenchCluster, results: Results, tenants: int, runs: int) -> None:
    if not worker_process.worker_available():
        results.notes["worker"] = "not measured: this tree has no `provisioner worker --once`"
        return
    rates: dict[int, list[float]] = defaultdict(list)
    walls: dict[int, list[float]] = defaultdict(list)
    raw: dict[int, list[float]] = defaultdict(list)
    with cluster.database("rawpar") as database:
        service.provision(database.settings(), "shape")
        for run_no in range(runs):
            for sessions in (1, 2):
                raw[sessions].append(
                    _raw_rate(database, sessions, tenants // 2, f"r{run_no}{sessions}")
                )
    say(f"  worker: raw SQL, 2 sessions vs 1: {raw[2]} vs {raw[1]} tenants/min")
    results.add(
        Figure(
            "raw_par_1",
            "raw SQL (full end state), 1 session",
            "tenants/min",
            raw[1],
            note="baseline",
        )
    )
    results.add(
        Figure(
            "raw_par_2",
            "raw SQL (full end state), 2 sessions at once",
            "tenants/min",
            raw[2],
            baseline="raw_par_1",
        )
    )
    for run_no in range(runs):
        for concurrency in CONCURRENCY:
            rate, wall = _drain(cluster, concurrency, tenants)
            rates[concurrency].append(rate)
            walls[concurrency].append(wall)
            say(f"  worker: run {run_no + 1}, {concurrency} -> {rate:.0f} tenants/min")
    for concurrency in CONCURRENCY:
        results.add(
            Figure(
                f"worker_{concurrency}",
                f"worker: {tenants} tenants drained by {concurrency} worker(s)",
                "tenants/min",
                rates[concurrency],
                baseline=None if concurrency == 1 else "worker_1",
                note="baseline" if concurrency == 1 else "",
            )
        )
    results.notes["worker"] = (
        "real `provisioner worker --once --concurrency K` (K child processes); rate counted "
        "from the first step's start to the last finish. Wall time of a run including process "
        "start-up, median: "
        + ", ".join(
            f"{k} worker(s) {sorted(walls[k])[len(walls[k]) // 2]:.1f} s" for k in CONCURRENCY
        )
    )
