"""A sign-up burst against the warm pool: ``PROVISIONER_POOL_SIZE=N``, N sign-ups enqueued in one
transaction to a running worker at its defaults, then the keeper's refill, then sign-ups that
arrive one by one while the keeper rebuilds; against the raw build measured in the same run.

* **Burst:** every sign-up should be served from a spare (its ``create_schema`` step record says
  ``taken from the warm pool``); the figure is each job's ``finished_at - created_at``.
* **Refill:** from the burst's last finish to the pool being full again, per spare rebuilt,
  against as many raw serial builds (the full end state in one transaction on an open
  connection) made right after it in the same database, while the worker is idle; and, beside
  it, raw SQL on as many sessions as the keeper has builders (one per core). Every raw baseline
  of a round is measured in the round's own database, and each figure is divided by its own
  round's (:attr:`bench.figures.Figure.pairs`): the same DDL cost up to 2x more from one run
  to the next, and the refill's ratio to raw builds in another database, minutes apart, swung
  between 0.9x and 2.3x.
* **A spare's build alone**, interleaved with the raw build in one database: on a session that
  waits for the disk at each commit and on one that does not (the keeper's).
* **During a refill:** a second burst empties the pool; as soon as the keeper has started
  rebuilding, sign-ups are enqueued one at a time (each after the previous one finished). None
  should wait behind the keeper's build: a job's wait before its first step starts is
  reported beside its latency. Most find the pool empty and are whole builds: those are
  compared with the same sign-ups on a worker with no pool (no keeper), made in the same
  database before the round (against the raw SQL they pay the engine's steps, not the keeper).
"""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass

import psycopg

import provisioner
from bench import burst, worker_process
from bench.cluster import BenchCluster, BenchDatabase, say
from bench.figures import Figure, Results
from provisioner import db, pool, service
from provisioner.roles import DEFAULT_APP_ROLES
from provisioner.worker.concurrency import machine_default

POOL_SIZE = 10
#: How often the bench looks at the database while it waits, on one open session (a new
#: connection per look loaded the two cores the measured refill runs on).
POLL_SECONDS = 0.02
DURING_REFILL = 5
#: Raw serial builds before and after each round, in its database.
RAW_TENANTS = 20
#: The keeper's builders at the worker's defaults: one per engine child, one child per core.
BUILDERS = machine_default()

# Each sign-up of a group: latency, wait before its claim, and whether a spare served it.
SIGNUPS = """
SELECT extract(epoch FROM j.finished_at - j.created_at) * 1000,
       extract(epoch FROM (SELECT min(s.started_at) FROM control.job_step_runs s
                            WHERE s.job_id = j.id) - j.created_at) * 1000,
       EXISTS (SELECT 1 FROM control.job_step_runs s
                WHERE s.job_id = j.id AND s.step = 'create_schema'
                  AND s.detail LIKE 'taken from the warm pool%%')
  FROM control.platform_jobs j
 WHERE j.tenant_id LIKE %(prefix)s AND j.status = 'succeeded'
"""


def _ready(watch: psycopg.Connection) -> int:
    row = watch.execute("SELECT count(*) FROM control.tenant_pool").fetchone()
    return int(row[0]) if row else 0


def _building(watch: psycopg.Connection) -> bool:
    row = watch.execute(
        "SELECT count(*) FROM control.tenant_pool_schemas s WHERE NOT EXISTS "
        "(SELECT 1 FROM control.tenant_pool p WHERE p.schema_name = s.schema_name)"
    ).fetchone()
    return bool(row and row[0])


def _wait(condition: object, what: str, worker: worker_process.WorkerProcess) -> None:
    if not worker_process.wait_for(condition, 600, POLL_SECONDS):
        raise RuntimeError(f"{what} did not happen: {worker.log()[-2000:]}")


def _signups(watch: psycopg.Connection, prefix: str) -> list[tuple[float, float, bool]]:
    rows = watch.execute(SIGNUPS, {"prefix": f"{prefix}%"}).fetchall()
    return [(float(a), float(b), bool(c)) for a, b, c in rows]


def _burst(app: psycopg.Connection, watch: psycopg.Connection, prefix: str, n: int) -> None:
    for i in range(n):
        provisioner.enqueue(app, f"{prefix}{i}")
    app.commit()
    deadline = time.monotonic() + 600
    while len(_signups(watch, prefix)) < n:
        if time.monotonic() > deadline:
            raise RuntimeError(f"the burst {prefix} did not finish")
        time.sleep(POLL_SECONDS)


def _one(app: psycopg.Connection, watch: psycopg.Connection, tenant: str) -> None:
    provisioner.enqueue(app, tenant)
    app.commit()
    deadline = time.monotonic() + 600
    while not _signups(watch, tenant):
        if time.monotonic() > deadline:
            raise RuntimeError(f"{tenant} did not finish")
        time.sleep(POLL_SECONDS)


def _alone(database: BenchDatabase, during: int) -> list[float]:
    """The baseline of a sign-up mid-refill that no spare served: the same sign-ups, one at a
    time, on a worker with no pool (no keeper), in the same database before the round. A
    sign-up the pool cannot serve is a whole build (``run_tenant_migrations`` most of it);
    against the raw SQL it pays the engine's steps, not the keeper."""
    worker = worker_process.WorkerProcess(database, env={"PROVISIONER_POOL_SIZE": "0"})
    app = psycopg.connect(database.app_url)
    watch = psycopg.connect(database.owner_url, autocommit=True)
    try:
        _one(app, watch, "warmup_alone")
        for i in range(during):
            _one(app, watch, f"alone_{i}")
        return [r[0] for r in _signups(watch, "alone_") if not r[2]][:during]
    finally:
        watch.close()
        app.close()
        worker.close()


def _round(cluster: BenchCluster, size: int, run_no: int, sizes: Sizes) -> dict[str, list[float]]:
    """One round, in a fresh database that also holds its raw baselines (see the module): the
    raw serial build before the round and after it, and, right after the refill (the worker
    idle, its pool full), as many raw builds as the refill built, serial and side by side."""
    out: dict[str, list[float]] = {k: [] for k in ("burst", "served", "refill", "during", "wait")}
    with cluster.database(f"poolburst{run_no}") as database:
        service.provision(database.settings(), "shape")  # the raw SQL's grants are read there
        if sizes.warm_up:
            burst.raw(database, 1, sizes.warm_up, "warm", counted=False)
        before, _ = burst.raw(database, 1, sizes.raw_tenants, "before", counted=False)
        out["alone"] = _alone(database, sizes.during)
        env = {"PROVISIONER_POOL_SIZE": str(size)}
        worker = worker_process.WorkerProcess(database, env=env)
        app = psycopg.connect(database.app_url)
        watch = psycopg.connect(database.owner_url, autocommit=True)
        try:
            _one(app, watch, "warmup")  # the children and the reference
            _wait(lambda: _ready(watch) >= size, "the pool filling", worker)
            time.sleep(1.0)
            _burst(app, watch, "burst_", size)
            rows = _signups(watch, "burst_")
            out["burst"] = [r[0] for r in rows]
            out["served"] = [float(sum(r[2] for r in rows))]
            row = watch.execute(
                "SELECT extract(epoch FROM clock_timestamp() - max(finished_at)) "
                "FROM control.platform_jobs"
            ).fetchone()
            assert row is not None
            began = time.monotonic() - float(row[0])
            _wait(lambda: _ready(watch) >= size, "the refill", worker)
            out["refill"] = [(time.monotonic() - began) * 1000 / size]
            ms, _ = burst.raw(database, 1, size, "refilled", counted=False)
            out["refill_raw"] = [ms]
            # The keeper builds on as many sessions as the worker has children: raw SQL on
            # as many, for comparison (not the goal's baseline, which is the serial build).
            ms, _ = burst.raw(database, BUILDERS, size, "refilled_side_by_side", counted=False)
            out["refill_raw_parallel"] = [ms]
            time.sleep(1.0)
            _burst(app, watch, "again_", size)
            _wait(lambda: _building(watch), "a rebuild starting", worker)
            for i in range(sizes.during):
                _one(app, watch, f"during_{i}")
            rows = _signups(watch, "during_")
            out["during"] = [r[0] for r in rows]
            out["during_built"] = [r[0] for r in rows if not r[2]]
            out["wait"] = [r[1] for r in rows]
            out["during_served"] = [float(sum(r[2] for r in rows))]
        finally:
            watch.close()
            app.close()
            worker.close()
        after, _ = burst.raw(database, 1, sizes.raw_tenants, "after", counted=False)
    out["raw"] = [before, after]
    return out


def _builds(database: BenchDatabase, rounds: int) -> dict[str, list[float]]:
    """ms per spare built by :func:`provisioner.pool.build_spare` with and without
    ``synchronous_commit = off``, and per raw build, interleaved."""
    out: dict[str, list[float]] = {"sync": [], "async": [], "raw": []}
    owner = database.owner_url
    keepers = {
        "sync": db.Database(owner, application_name="bench:sync"),
        "async": db.Database(
            owner, application_name="bench:async", settings={"synchronous_commit": "off"}
        ),
    }
    try:
        for i in range(rounds):
            for key, database_ in keepers.items():
                began = time.perf_counter()
                with database_.session() as session, pool.builder_lock(session) as locked:
                    assert locked
                    pool.build_spare(session, "bench", DEFAULT_APP_ROLES)
                out[key].append((time.perf_counter() - began) * 1000)
            ms, _ = burst.raw(database, 1, 1, f"b{i}", counted=False)
            out["raw"].append(ms)
    finally:
        for database_ in keepers.values():
            database_.close()
    return out


@dataclass(frozen=True)
class Sizes:
    """A round's raw builds and sign-ups (the module's constants in ``make bench``)."""

    #: raw builds discarded first in the round's fresh database
    warm_up: int = burst.WARM_UP_TENANTS
    #: raw serial builds before and after the round
    raw_tenants: int = RAW_TENANTS
    #: sign-ups one at a time during the refill, and as many with no pool
    during: int = DURING_REFILL


def run(
    cluster: BenchCluster,
    results: Results,
    runs: int,
    size: int = POOL_SIZE,
    sizes: Sizes = Sizes(),
) -> None:
    if not worker_process.worker_available():
        results.notes["pool-burst"] = "not measured: this tree has no `provisioner worker`"
        return
    samples: dict[str, list[float]] = {}
    #: per figure, each sample's own round's raw serial figure (same database)
    pairs: dict[str, list[float]] = {}
    with cluster.database("poolburst_raw") as database:
        service.provision(database.settings(), "shape")
        builds = _builds(database, 8 * runs)
    for run_no in range(runs):
        found = _round(cluster, size, run_no, sizes)
        for key, values in found.items():
            samples.setdefault(key, []).extend(values)
            # the refill's own baseline is the raw build right after it; the others', the round's
            paired = found["refill_raw"] if key.startswith("refill") else found["raw"]
            pairs.setdefault(key, []).extend([statistics.median(paired)] * len(values))
        say(
            f"  pool-burst: run {run_no + 1}: served {samples['served'][-1]:.0f}/{size}, "
            f"refill {samples['refill'][-1]:.0f} ms/spare, its database's raw "
            f"{samples['refill_raw'][-1]:.0f} ms/tenant right after it"
        )
    raw = samples["raw"]
    results.add(
        Figure(
            "poolb_build_raw", "raw SQL, 1 tx (interleaved)", "ms", builds["raw"], note="baseline"
        )
    )
    results.add(
        Figure(
            "poolb_build_sync",
            "  a spare's build, each commit waiting for the disk",
            "ms",
            builds["sync"],
            baseline="poolb_build_raw",
        )
    )
    results.add(
        Figure(
            "poolb_build_async",
            "  a spare's build as the keeper runs it (synchronous_commit off)",
            "ms",
            builds["async"],
            baseline="poolb_build_raw",
        )
    )
    results.add(
        Figure(
            "poolb_raw",
            "raw SQL, 1 session, before and after each round, in its database",
            "ms",
            raw,
            note="baseline",
        )
    )
    results.add(
        Figure(
            "poolb_burst",
            f"burst of {size} sign-ups, pool of {size}: enqueue -> succeeded",
            "ms",
            samples["burst"],
            baseline="poolb_raw",
            pairs=pairs["burst"],
            percentiles=True,
        )
    )
    results.add(
        Figure(
            "poolb_refill_raw",
            "raw SQL, 1 session, as many builds right after the refill, same database",
            "ms",
            samples["refill_raw"],
            note="baseline",
        )
    )
    results.add(
        Figure(
            "poolb_refill",
            "  the keeper's refill after the burst, per spare",
            "ms",
            samples["refill"],
            baseline="poolb_refill_raw",
            pairs=pairs["refill"],
        )
    )
    results.add(
        Figure(
            "poolb_refill_raw_parallel",
            f"  raw SQL, {BUILDERS} sessions (the keeper's builders), as many builds",
            "ms",
            samples["refill_raw_parallel"],
            baseline="poolb_refill_raw",
            pairs=pairs["refill_raw_parallel"],
        )
    )
    results.add(
        Figure(
            "poolb_during",
            "  a sign-up while the keeper rebuilds: enqueue -> succeeded",
            "ms",
            samples["during"],
            baseline="poolb_raw",
            pairs=pairs["during"],
            percentiles=True,
        )
    )
    results.add(
        Figure(
            "poolb_alone",
            "a sign-up built with no pool (no keeper), one at a time, same database",
            "ms",
            samples["alone"],
            note="baseline",
            percentiles=True,
        )
    )
    if samples["during_built"]:  # empty when a spare served every one
        results.add(
            Figure(
                "poolb_during_built",
                "  a sign-up while the keeper rebuilds that no spare served",
                "ms",
                samples["during_built"],
                baseline="poolb_alone",
                percentiles=True,
            )
        )
    results.add(
        Figure(
            "poolb_wait",
            "  ... of which before its first step",
            "ms",
            samples["wait"],
            baseline="poolb_raw",
            pairs=pairs["wait"],
            percentiles=True,
        )
    )
    results.extra["pool_burst"] = {
        "size": size,
        "served_from_spares": samples["served"],
        "during_refill_served_from_spares": samples["during_served"],
        "during_refill_signups": sizes.during,
    }
