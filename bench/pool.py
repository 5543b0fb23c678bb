"""Enqueue -> succeeded through a running worker, with and without the warm pool, for the
9-table template and a generated large one (200 tables, 400 indexes), against the raw limit.

The large template is a generated revision (``t005``) on top of the shipped tree, written into a
copy of the package under the run's temporary folder (never committed); the worker runs that
copy (``PYTHONPATH``), and the raw baseline replays the same tree's offline SQL.

Each tenant is enqueued alone (one transaction, as ``app_rw``, on one open connection as an
application's pool would hold it) while the worker is idle, and its latency is the server's own
``finished_at - created_at`` of the job row (the enqueue's statements included). With the
pool, the next tenant waits until the pool is full again and one more second, so every sample
is "a spare was ready". Raw
SQL (the full end state in one transaction on an open connection) is measured interleaved with
the tenants provisioned without the pool, in the same database, and not between the takes: one
transaction of the large template's DDL sends more catalog invalidations than the server's
shared queue holds, so every idle session of the cluster (the application's, the worker's)
resets its caches, and the next take would pay for the baseline's own DDL.
"""

from __future__ import annotations

import shutil
import time
from collections import defaultdict
from pathlib import Path

import psycopg

from bench import worker_process
from bench.cluster import BenchCluster, BenchDatabase, say
from bench.figures import Figure, Results
from bench.provisioning import raw_script
from provisioner.kinds.provision import ensure_provision_job
from provisioner.models import TenantId
from provisioner.templates import migrations
from provisioner.templates.replay import Template
from provisioner.tenant import schema as tenant_schema

POOL_SIZE = 4
#: Pause between the pool being full again and the next sign-up (and between no-pool tenants).
SETTLE_SECONDS = 1.0
LARGE_TABLES = 200

LARGE_REVISION = '''"""Bench only: {tables} generated tables with two secondary indexes each.

Revision ID: t005
Revises: t004
"""

from alembic import op

revision = "t005"
down_revision = "t004"
branch_labels = None
depends_on = None


def upgrade() -> None:
    for i in range({tables}):
        op.execute(
            f"CREATE TABLE bench_t{{i:03d}} (id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY, "
            f"name text NOT NULL, amount numeric(12, 2) NOT NULL DEFAULT 0, "
            f"created_at timestamptz NOT NULL DEFAULT now())"
        )
        op.execute(f"CREATE INDEX bench_t{{i:03d}}_name_idx ON bench_t{{i:03d}} (name)")
        op.execute(f"CREATE INDEX bench_t{{i:03d}}_created_idx ON bench_t{{i:03d}} (created_at)")


def downgrade() -> None:
    for i in range({tables}):
        op.execute(f"DROP TABLE bench_t{{i:03d}}")
'''


def large_package(work: Path, tables: int = LARGE_TABLES) -> Path:
    """A copy of the package whose tenant tree has the generated revision of ``tables`` tables;
    its import root."""
    root = work / f"large_template_package_{tables}"
    if root.exists():
        return root
    source = Path(__file__).resolve().parent.parent
    ignore = shutil.ignore_patterns("__pycache__")
    shutil.copytree(source / "provisioner", root / "provisioner", ignore=ignore)
    shutil.copytree(
        migrations.tenant_tree(), root / "provisioner" / "tenant_template", ignore=ignore
    )
    shutil.copytree(
        source / "control_migrations", root / "provisioner" / "control_migrations", ignore=ignore
    )
    revision = root / "provisioner" / "tenant_template" / "versions" / "t005_bench_large.py"
    revision.write_text(LARGE_REVISION.format(tables=tables))
    return root


def _pool_ready(database: BenchDatabase) -> int:
    with psycopg.connect(database.owner_url) as conn:
        row = conn.execute("SELECT count(*) FROM control.tenant_pool").fetchone()
    return int(row[0]) if row else 0


def _wait_full(database: BenchDatabase, size: int) -> bool:
    return worker_process.wait_for(lambda: _pool_ready(database) >= size, 300, 0.05)


def _latency(conn: psycopg.Connection, tenant: str) -> float:
    """Enqueue one tenant as ``app_rw`` on the application's open connection (an application
    enqueues from its connection pool), wait for success; the job's finished_at - created_at
    in ms, so the enqueue's own statements are counted, not the connection's start-up."""
    job = ensure_provision_job(conn, TenantId(tenant)).job
    conn.commit()
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        row = conn.execute(
            "SELECT status, extract(epoch FROM finished_at - created_at) * 1000 "
            "FROM control.platform_jobs WHERE id = %s",
            (job.id,),
        ).fetchone()
        conn.commit()
        assert row is not None
        if row[0] == "succeeded":
            return float(row[1])
        if row[0] == "failed":
            raise RuntimeError(f"tenant {tenant} failed")
        time.sleep(0.002)
    raise RuntimeError(f"tenant {tenant} did not finish")


# Median time of each step of the measured tenants (t0, t1, ...), from the step journal.
STEP_MEDIANS = """
SELECT step, percentile_cont(0.5) WITHIN GROUP (
           ORDER BY extract(epoch FROM finished_at - started_at) * 1000) AS ms
  FROM control.job_step_runs
 WHERE tenant_id ~ '^t[0-9]+$' AND outcome = 'succeeded'
 GROUP BY step ORDER BY min(started_at)
"""


def _step_medians(database: BenchDatabase) -> str:
    with psycopg.connect(database.owner_url) as conn:
        rows = conn.execute(STEP_MEDIANS).fetchall()
    return ", ".join(f"{step} {ms:.1f}" for step, ms in rows)


def _scenario(
    cluster: BenchCluster,
    label: str,
    tree: Path | None,
    package: Path | None,
    tenants: int,
    steps: dict[str, str],
    size: int,
    large_tables: int,
) -> dict[str, list[float]]:
    samples: dict[str, list[float]] = defaultdict(list)
    template = Template.capture(tree=tree)
    # Run from the copy's root: `python -m` and the spawned children put the current folder
    # first on sys.path, and the repository's own package must not win.
    extra = {"PYTHONPATH": str(package)} if package else {}
    for pool_size in (0, size):
        with cluster.database(f"pool{label}{pool_size}") as database:
            env = {**extra, "PROVISIONER_POOL_SIZE": str(pool_size)}
            worker = worker_process.WorkerProcess(database, env=env, cwd=package)
            raw_conn = psycopg.connect(database.owner_url)
            app_conn = psycopg.connect(database.app_url)
            try:
                _latency(app_conn, "warmup")  # the worker's children and the reference
                with psycopg.connect(database.owner_url) as conn:
                    tables, sequences = tenant_schema.relations(conn, "tenant_warmup")
                if package is not None and len(tables) <= large_tables:
                    raise RuntimeError(f"the worker built {len(tables)} tables, not the large tree")
                for i in range(tenants):
                    if pool_size and not _wait_full(database, pool_size):
                        raise RuntimeError(f"the pool did not fill: {worker.log()[-2000:]}")
                    # Let the pool settle: spares are built ahead of sign-ups, and the first
                    # transaction of each idle session after a build processes the catalog
                    # invalidations of its DDL (a cost of its own, not the take's).
                    time.sleep(SETTLE_SECONDS)
                    key = "pool" if pool_size else "nopool"
                    samples[key].append(_latency(app_conn, f"t{i}"))
                    if pool_size:
                        continue  # the raw tenant is measured beside the runs without a pool
                    script = raw_script(raw_conn, f"tenant_raw_{i}", template, tables, sequences)
                    started = time.perf_counter()
                    raw_conn.execute(script)
                    raw_conn.commit()
                    samples["raw"].append((time.perf_counter() - started) * 1000)
                steps[f"{label} tables, {'spare taken' if pool_size else 'no pool'}"] = (
                    _step_medians(database)
                )
            finally:
                app_conn.close()
                raw_conn.close()
                worker.close()
        say(f"  pool: {label} template, pool size {pool_size}: done")
    return samples


def run(
    cluster: BenchCluster,
    results: Results,
    tenants: int,
    size: int = POOL_SIZE,
    large_tables: int = LARGE_TABLES,
) -> None:
    """``tenants`` sign-ups each way, with a pool of ``size``, for the 9-table template and one
    of ``large_tables`` generated tables (its figures' keys end in that number: ``_200``)."""
    if not worker_process.worker_available():
        results.notes["pool"] = "not measured: this tree has no `provisioner worker`"
        return
    package = large_package(cluster.work, large_tables)
    large_tree = package / "provisioner" / "tenant_template"
    steps: dict[str, str] = {}
    for label, tree, pkg, name in (
        ("9", None, None, "9-table template"),
        (
            str(large_tables),
            large_tree,
            package,
            f"{large_tables}-table / {2 * large_tables}-index template",
        ),
    ):
        samples = _scenario(cluster, label, tree, pkg, tenants, steps, size, large_tables)
        results.add(
            Figure(
                f"pool_raw_{label}",
                f"raw SQL, full end state, 1 tx ({name})",
                "ms",
                samples["raw"],
                note="baseline",
            )
        )
        results.add(
            Figure(
                f"pool_off_{label}",
                f"  enqueue -> succeeded, running worker, no pool ({name})",
                "ms",
                samples["nopool"],
                baseline=f"pool_raw_{label}",
                percentiles=True,
            )
        )
        results.add(
            Figure(
                f"pool_on_{label}",
                f"  enqueue -> succeeded, running worker, spare taken ({name})",
                "ms",
                samples["pool"],
                baseline=f"pool_raw_{label}",
                percentiles=True,
            )
        )
    results.notes["pool"] = (
        "a running `provisioner worker` (its default children), "
        f"PROVISIONER_POOL_SIZE={size} or 0; "
        "latency is the job row's finished_at - created_at; the raw baseline is measured "
        "between the tenants provisioned without the pool only (its one-transaction DDL would "
        "reset every session's caches before the next take); each tenant is enqueued "
        f"{SETTLE_SECONDS:.0f} s after the previous one finished (with the pool: after it is full "
        "again). The large template is generated into a copy of "
        "the package for the run. Median ms per step (job_step_runs; a step after the first "
        "starts when the one before it finished, so its time includes that hand-over): "
        + "; ".join(f"{case}: {medians}" for case, medians in steps.items())
    )
