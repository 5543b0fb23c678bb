"""Fleet upgrade at scale (``python -m bench --only fleet-scale --fleet-scale-tenants 10000``):
a real fleet of N tenants at t004, "who is behind" over all of it, then the whole fleet brought
to a generated t005 (:mod:`bench.fleet`) by ``provisioner upgrade --all`` and one real
``provisioner worker --concurrency 2``.

Provisioning 10,000 tenants one by one through the engine takes ~40 minutes (``make
bench-scale``), so the fleet is built instead with the same end state in bulk: the first tenant
through :func:`provisioner.service.provision` (which also stores the template reference), the
others from it - the template's offline SQL, the grant step's statements and the seed rows
(:func:`bench.provisioning.raw_script`, what the engine's verified replay runs), 100
``audit_events`` rows each, and copies of the first tenant's control rows (tenant, succeeded
provisioning job, its run and its six step records) - in batches, one transaction per batch,
over two sessions. The run checks that a bulk-built tenant's catalog fingerprint equals the
engine-built one's, and reports which path each upgrade took (a fleet that did not look like
engine-made tenants would fall back to Alembic).

Reported: the fleet build's seconds; who is behind (``fleet.upgrade(dry_run=True)``, in
process, repeated, and the CLI's ``upgrade --all --dry-run`` once); the whole upgrade's seconds
(from the ``upgrade --all`` process's start to the last job's finish); per-tenant ms per block
of 1,000 jobs from the job rows' ``finished_at``, the last block against the first; raw SQL per
tenant (one transaction per schema on an open connection, on spare schemas of the same
database, before and after the upgrade). Finally every tenant must be at t005 exactly once:
one succeeded migration step per job for the upgrade's run, every version table at t005.
"""

from __future__ import annotations

import importlib
import os
import statistics
import subprocess
import sys
import threading
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import psycopg
from psycopg import sql

from bench import before, worker_process
from bench.cluster import BenchCluster, BenchDatabase, say
from bench.figures import Figure, Results
from bench.fleet import RAW_UPGRADE, t005_tree, tenant_tree
from bench.provisioning import raw_script
from provisioner import fleet, service
from provisioner.templates import migrations
from provisioner.templates.replay import Template
from provisioner.tenant import schema as tenant_schema
from provisioner.tenant.fingerprint import fingerprint

#: Tenants per bulk transaction: each new relation holds a lock until commit (~45 per tenant),
#: and the server's lock table has room for ~6,400 (64 per connection slot).
BATCH = 20
#: Sessions building the fleet at once (a 2-core machine).
BUILD_SESSIONS = 2
#: Rows of ``audit_events`` per tenant, as in the ``fleet`` scenario (the index has work).
AUDIT_ROWS = 100
#: Spare t004 schemas upgraded by raw SQL before the upgrade, and as many after it.
RAW_SCHEMAS = 100
#: Who-is-behind repetitions (in process).
BEHIND_RUNS = 7
#: Runs of `check --all` over the fleet.
CHECK_RUNS = 3

MODEL = "f00000"

# The first tenant's control rows copied for a batch of new tenant ids: the tenant, its
# succeeded provisioning job (a new id, its own idempotency key), the job's run and its step
# records. The foreign keys are checked at the end of the statement, after every CTE.
COPY_CONTROL_ROWS = """
WITH ids AS (
    SELECT t AS tenant_id, gen_random_uuid() AS job_id FROM unnest(%(tenants)s::text[]) t
), model AS (
    SELECT * FROM control.platform_jobs
     WHERE tenant_id = %(model)s AND job_type = 'provision_tenant'
), new_tenants AS (
    INSERT INTO control.tenants (tenant_id, schema_name, display_name, created_at, updated_at,
                                 state, onboarding_started_at, activated_at, previous_state,
                                 deleted_at)
    SELECT ids.tenant_id, 'tenant_' || ids.tenant_id, m.display_name, now(), now(), m.state,
           CASE WHEN m.onboarding_started_at IS NULL THEN NULL ELSE now() END,
           m.activated_at, m.previous_state, m.deleted_at
      FROM ids, control.tenants m WHERE m.tenant_id = %(model)s
), new_jobs AS (
    INSERT INTO control.platform_jobs (id, tenant_id, job_type, status, progress,
                                       steps_completed, error_detail, created_at, updated_at,
                                       payload, idempotency_key, attempts, max_attempts,
                                       available_at, locked_at, locked_by, finished_at, run)
    SELECT ids.job_id, ids.tenant_id, m.job_type, m.status, m.progress, m.steps_completed,
           m.error_detail, now(), now(), m.payload, 'provision:' || ids.tenant_id, m.attempts,
           m.max_attempts, now(), m.locked_at, m.locked_by, now(), m.run
      FROM ids, model m
), new_runs AS (
    INSERT INTO control.job_runs (job_id, run, job_type, started_by, started_at)
    SELECT ids.job_id, r.run, r.job_type, r.started_by, now()
      FROM ids, control.job_runs r JOIN model m ON m.id = r.job_id
)
INSERT INTO control.job_step_runs (job_id, tenant_id, attempt, step, worker, started_at,
                                   finished_at, outcome, detail, run)
SELECT ids.job_id, ids.tenant_id, s.attempt, s.step, s.worker, now(), now(), s.outcome,
       s.detail, s.run
  FROM ids, control.job_step_runs s JOIN model m ON m.id = s.job_id
 ORDER BY ids.tenant_id, s.id
"""

AUDIT_INSERT = (
    "INSERT INTO {}.audit_events (action) SELECT 'event ' || g FROM generate_series(1, {}) g"
)

# The upgrade's jobs: every provisioning job re-opened by the rollout, by finish time.
UPGRADE_FINISHES = """
SELECT j.finished_at FROM control.platform_jobs j
  JOIN control.rollout_tenants r ON r.job_id = j.id
 WHERE j.status = 'succeeded' ORDER BY j.finished_at
"""

# One row per job of the rollout: its status, and how many migration steps succeeded (and ran
# at all) in the job's current run.
UPGRADE_STEPS = """
SELECT j.status, count(s.id) FILTER (WHERE s.outcome = 'succeeded') AS succeeded,
       count(s.id) AS steps
  FROM control.rollout_tenants r JOIN control.platform_jobs j ON j.id = r.job_id
  LEFT JOIN control.job_step_runs s
    ON s.job_id = j.id AND s.run = j.run AND s.step = 'run_tenant_migrations'
 GROUP BY j.id, j.status
"""

# The upgrade's migration steps (their own transaction, from the journal), by finish time.
UPGRADE_STEP_MS = """
SELECT extract(epoch FROM s.finished_at - s.started_at) * 1000
  FROM control.rollout_tenants r JOIN control.platform_jobs j ON j.id = r.job_id
  JOIN control.job_step_runs s
    ON s.job_id = j.id AND s.run = j.run AND s.step = 'run_tenant_migrations'
 WHERE s.outcome = 'succeeded' ORDER BY s.finished_at
"""

UPGRADE_PATHS = """
SELECT split_part(split_part(s.detail, 'path=', 2), ' ', 1), count(*)
  FROM control.rollout_tenants r JOIN control.platform_jobs j ON j.id = r.job_id
  JOIN control.job_step_runs s
    ON s.job_id = j.id AND s.run = j.run AND s.step = 'run_tenant_migrations'
 WHERE s.outcome = 'succeeded' GROUP BY 1
"""

# Schemas (of the fleet) whose audit_events has t005's column.
WITH_SOURCE_COLUMN = r"""
SELECT count(*) FROM pg_attribute a JOIN pg_class c ON c.oid = a.attrelid
  JOIN pg_namespace n ON n.oid = c.relnamespace
 WHERE n.nspname LIKE 'tenant\_%' AND c.relname = 'audit_events' AND a.attname = 'source'
   AND NOT a.attisdropped
"""


CHECKPOINTS = "SELECT checkpoints_timed + checkpoints_req FROM pg_stat_bgwriter"


class CpuSampler:
    """CPU time sampled twice a second while the upgrade runs: the machine's busy jiffies and
    those of the run's own processes (the bench cluster's server processes, the worker and its
    children), so a block's cost can be told apart from other work on the machine."""

    def __init__(self, postmaster_pid_file: Path, worker_pid: int, admin_url: str) -> None:
        self.roots = [int(postmaster_pid_file.read_text().split()[0]), worker_pid]
        self.samples: list[tuple[float, int, int]] = []  # (time.time(), machine busy, ours)
        #: (time.time(), what the autovacuum workers were doing), at each sample
        self.autovacuum: list[tuple[float, list[str]]] = []
        self.admin_url = admin_url
        self._checkpoints: int | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True)
        self.tick = os.sysconf("SC_CLK_TCK")

    def __enter__(self) -> CpuSampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()

    def _loop(self) -> None:
        with psycopg.connect(self.admin_url, autocommit=True) as conn:
            while not self._stop.is_set():
                self.samples.append((time.time(), _machine_busy(), self._ours()))
                rows = conn.execute(
                    "SELECT query FROM pg_stat_activity WHERE backend_type = 'autovacuum worker'"
                ).fetchall()
                seen = [str(row[0]) for row in rows]
                # A checkpoint makes the next change of every page write it whole to the WAL.
                row = conn.execute(CHECKPOINTS).fetchone()
                checkpoints = int(row[0]) if row else 0
                if self._checkpoints is not None and checkpoints > self._checkpoints:
                    seen.append("a checkpoint began")
                self._checkpoints = checkpoints
                self.autovacuum.append((time.time(), seen))
                self._stop.wait(0.5)

    def vacuumed(self, start: float, end: float) -> list[str]:
        """What autovacuum was seen working on between two epoch times, by how often."""
        seen = Counter(
            query.removeprefix("autovacuum: ")
            for at, queries in self.autovacuum
            if start <= at <= end
            for query in queries
        )
        return [f"{query} x{count}" for query, count in seen.most_common(3)]

    def _ours(self) -> int:
        children: dict[int, list[int]] = {}
        cpu: dict[int, int] = {}
        for entry in os.listdir("/proc"):
            if entry.isdigit():
                try:
                    text = Path(f"/proc/{entry}/stat").read_text()
                except OSError:
                    continue
                fields = text[text.rfind(")") + 2 :].split()
                children.setdefault(int(fields[1]), []).append(int(entry))
                cpu[int(entry)] = int(fields[11]) + int(fields[12])
        total, todo = 0, list(self.roots)
        while todo:
            pid = todo.pop()
            total += cpu.get(pid, 0)
            todo.extend(children.get(pid, []))
        return total

    def between(self, start: float, end: float) -> tuple[float, float]:
        """(machine busy cores, the run's own CPU seconds) between two epoch times."""
        first = min(self.samples, key=lambda sample: abs(sample[0] - start))
        last = min(self.samples, key=lambda sample: abs(sample[0] - end))
        span = max(last[0] - first[0], 1e-9)
        return (last[1] - first[1]) / self.tick / span, (last[2] - first[2]) / self.tick


def _machine_busy() -> int:
    with open("/proc/stat") as stat:
        fields = [int(v) for v in stat.readline().split()[1:]]
    return sum(fields) - fields[3] - fields[4]  # all but idle and iowait


def tenant_name(i: int) -> str:
    return f"f{i:05d}"


def raw_name(i: int) -> str:
    return f"bench_raw_{i:05d}"


class FleetBuilder:
    """Builds tenants with the end state of the engine's first one, in bulk."""

    def __init__(self, database: BenchDatabase) -> None:
        self.database = database
        self.template = Template.capture()
        with psycopg.connect(database.owner_url) as conn:
            self.tables, self.sequences = tenant_schema.relations(conn, f"tenant_{MODEL}")

    def _schema_sql(self, conn: psycopg.Connection[Any], schema: str, *, full: bool) -> str:
        script = raw_script(
            conn, schema, self.template, self.tables, self.sequences, ddl_only=not full
        )
        audit = sql.SQL(AUDIT_INSERT).format(sql.Identifier(schema), sql.Literal(AUDIT_ROWS))
        return script + ";\n" + audit.as_string(conn)

    def build(self, conn: psycopg.Connection[Any], ids: list[str]) -> None:
        """One transaction: the tenants' schemas, grants, seeds, audit rows, control rows;
        then their audit tables analysed (so autovacuum has nothing to catch up on)."""
        script = ";\n".join(self._schema_sql(conn, f"tenant_{t}", full=True) for t in ids)
        conn.execute(script.encode())
        conn.execute(COPY_CONTROL_ROWS, {"tenants": ids, "model": MODEL})
        conn.commit()
        self.analyse(conn, [f"tenant_{t}" for t in ids])

    def build_raw(self, conn: psycopg.Connection[Any], schemas: list[str]) -> None:
        """Spare t004 schemas (template DDL and audit rows, no control rows) for raw SQL."""
        conn.execute(";\n".join(self._schema_sql(conn, s, full=False) for s in schemas).encode())
        conn.commit()
        self.analyse(conn, schemas)

    @staticmethod
    def analyse(conn: psycopg.Connection[Any], schemas: list[str]) -> None:
        conn.execute(
            sql.SQL("ANALYZE {}").format(
                sql.SQL(", ").join(sql.Identifier(s, "audit_events") for s in schemas)
            )
        )
        conn.commit()


def build_fleet(database: BenchDatabase, tenants: int) -> float:
    """Seconds to build ``tenants`` tenants (the first through the engine) and the spares."""
    began = time.perf_counter()
    service.provision(database.settings(), MODEL)
    with psycopg.connect(database.owner_url) as conn:
        conn.execute(
            sql.SQL(AUDIT_INSERT)
            .format(sql.Identifier(f"tenant_{MODEL}"), sql.Literal(AUDIT_ROWS))
            .as_string(conn)
        )
        conn.commit()
        FleetBuilder.analyse(conn, [f"tenant_{MODEL}"])
    builder = FleetBuilder(database)
    names = [tenant_name(i) for i in range(1, tenants)]
    batches: list[tuple[str, list[str]]] = [
        ("tenants", names[i : i + BATCH]) for i in range(0, len(names), BATCH)
    ]
    spares = [raw_name(i) for i in range(2 * RAW_SCHEMAS)]
    batches += [("raw", spares[i : i + BATCH]) for i in range(0, len(spares), BATCH)]
    done = [0]

    def session(share: list[tuple[str, list[str]]]) -> None:
        with psycopg.connect(database.owner_url) as conn:
            for kind, ids in share:
                if kind == "tenants":
                    builder.build(conn, ids)
                    done[0] += len(ids)
                    if done[0] % 1000 < BATCH:
                        say(
                            f"  fleet-scale: {done[0] + 1} tenants built, "
                            f"{time.perf_counter() - began:.0f} s"
                        )
                else:
                    builder.build_raw(conn, ids)

    shares = [batches[k::BUILD_SESSIONS] for k in range(BUILD_SESSIONS)]
    with ThreadPoolExecutor(BUILD_SESSIONS) as pool:
        for result in [pool.submit(session, share) for share in shares]:
            result.result()
    _check_same_as_engine(database, [tenant_name(1), tenant_name(tenants - 1)])
    return time.perf_counter() - began


def _check_same_as_engine(database: BenchDatabase, names: list[str]) -> None:
    """A bulk-built tenant's catalog equals the engine-built one's (names abstracted)."""
    with psycopg.connect(database.owner_url) as conn:
        model = fingerprint(conn, f"tenant_{MODEL}")
        for name in names:
            if name != MODEL and fingerprint(conn, f"tenant_{name}") != model:
                raise RuntimeError(f"tenant {name} differs from the engine-built {MODEL}")


def wait_for_autovacuum(database: BenchDatabase, timeout: float = 300.0) -> float:
    """Seconds waited until no autovacuum worker runs (a fleet's tables are normally old:
    autovacuum's catalog updates right after a bulk build reset every session's caches)."""
    began = time.perf_counter()
    with psycopg.connect(database.admin_url, autocommit=True) as conn:

        def quiet() -> bool:
            row = conn.execute(
                "SELECT count(*) FROM pg_stat_activity WHERE backend_type = 'autovacuum worker'"
            ).fetchone()
            return bool(row and row[0] == 0)

        calm = 0
        while time.perf_counter() - began < timeout and calm < 3:
            calm = calm + 1 if quiet() else 0
            time.sleep(1.0)
    return time.perf_counter() - began


def raw_loop(database: BenchDatabase, schemas: list[str]) -> float:
    """Ms per schema: t004 -> t005 by raw SQL, one transaction each, on an open connection."""
    with psycopg.connect(database.owner_url) as conn:
        statements = [
            sql.SQL(RAW_UPGRADE).format(schema=sql.Identifier(s)).as_string(conn).encode()
            for s in schemas
        ]
        began = time.perf_counter()
        for statement in statements:
            conn.execute(statement)
            conn.commit()
        return (time.perf_counter() - began) * 1000 / len(schemas)


def who_is_behind(database: BenchDatabase, tenants: int) -> dict[str, list[float]]:
    """``fleet.upgrade(dry_run=True)`` over the fleet, alternating the package's version reader
    with the former one (:func:`bench.before.union_read_versions`), run by run."""
    # The upgrade reads through its own module's name (the package's ``upgrade`` is the function).
    upgrades = importlib.import_module("provisioner.fleet.upgrade")
    readers = {"now": fleet.read_versions, "before": before.union_read_versions}
    assert readers["now"](database.owner_url, None) == readers["before"](database.owner_url, None)
    samples: dict[str, list[float]] = {name: [] for name in readers}
    try:
        for _ in range(BEHIND_RUNS):
            for name, reader in readers.items():
                setattr(upgrades, "read_versions", reader)  # noqa: B010 (a module swapped in)
                began = time.perf_counter()
                report = fleet.upgrade(database.settings(), dry_run=True)
                samples[name].append((time.perf_counter() - began) * 1000)
                if len(report.behind) != tenants:
                    raise RuntimeError(f"{len(report.behind)} of {tenants} tenants behind")
    finally:
        setattr(upgrades, "read_versions", readers["now"])  # noqa: B010
    return samples


def drift_check(database: BenchDatabase, tenants: int) -> list[float]:
    """``check --all`` in process (the head's inventory built once, then one catalog statement
    and one version read per tenant), ms per tenant, run by run; every tenant must be clean."""
    samples = []
    for _ in range(CHECK_RUNS):
        began = time.perf_counter()
        report = service.check(database.settings())
        samples.append((time.perf_counter() - began) * 1000 / tenants)
        states = Counter(t.state.value for t in report.tenants)
        if states != {"clean": tenants}:
            raise RuntimeError(f"check --all over the bulk-built fleet: {dict(states)}")
    return samples


def _cli(database: BenchDatabase, tree: Path, *args: str) -> tuple[float, str]:
    began = time.perf_counter()
    out = subprocess.run(
        [sys.executable, "-m", "provisioner", "upgrade", *args],
        env=database.env(**{migrations.TENANT_TREE_ENV: str(tree)}),
        capture_output=True,
        text=True,
        check=False,
    )
    seconds = time.perf_counter() - began
    if out.returncode != 0:
        raise RuntimeError(f"upgrade {' '.join(args)} failed: {out.stderr[-2000:]}")
    return seconds, out.stdout


def upgrade_fleet(
    database: BenchDatabase, tenants: int, tree: Path, pid_file: Path
) -> tuple[dict[str, float], CpuSampler]:
    """``upgrade --all`` (a process) drained by one running worker with two children."""
    worker = worker_process.WorkerProcess(
        database,
        "--concurrency",
        "2",
        env={migrations.TENANT_TREE_ENV: str(tree), "PROVISIONER_POLL_SECONDS": "0.2"},
    )
    try:
        if not worker_process.wait_for(lambda: '"idle"' in worker.log(), 60, step=0.05):
            raise RuntimeError(f"worker never idle: {worker.log()[-2000:]}")
        sampler = CpuSampler(pid_file, worker.process.pid, database.admin_url).__enter__()
        began = time.perf_counter()
        command, out = _cli(database, tree, "--all")
        say(f"  fleet-scale: upgrade --all returned in {command:.1f} s: {out.strip()[:200]}")
        with psycopg.connect(database.owner_url, autocommit=True) as conn:
            last_say = time.perf_counter()
            while True:
                row = conn.execute(
                    "SELECT count(*) FILTER (WHERE status IN ('queued', 'running')), "
                    "count(*) FILTER (WHERE status NOT IN ('queued', 'running', 'succeeded')) "
                    "FROM control.platform_jobs"
                ).fetchone()
                assert row is not None
                if row[1]:
                    raise RuntimeError(f"{row[1]} jobs did not succeed: {worker.log()[-2000:]}")
                if row[0] == 0:
                    break
                if time.perf_counter() - began > 3600:
                    raise RuntimeError(f"upgrade did not finish: {worker.log()[-2000:]}")
                if time.perf_counter() - last_say > 30:
                    say(f"  fleet-scale: {row[0]} jobs left, {time.perf_counter() - began:.0f} s")
                    last_say = time.perf_counter()
                time.sleep(0.5)
        seconds = time.perf_counter() - began
        sampler.__exit__()
        return {"seconds": seconds, "command_seconds": command}, sampler
    finally:
        worker.close()


def per_block(
    database: BenchDatabase, block: int, sampler: CpuSampler
) -> list[tuple[float, float, float, list[str]]]:
    """For each block of ``block`` finished upgrade jobs: per-tenant ms (from the previous
    block's last finish, the first block from its own first, to the block's last finish), the
    machine's busy cores and the run's own CPU ms per tenant over that span."""
    with psycopg.connect(database.owner_url) as conn:
        finished = [row[0] for row in conn.execute(UPGRADE_FINISHES)]
    out = []
    for end in range(block, len(finished) + 1, block):
        start = finished[end - block - 1] if end > block else finished[0]
        intervals = block if end > block else block - 1
        busy, ours = sampler.between(start.timestamp(), finished[end - 1].timestamp())
        out.append(
            (
                (finished[end - 1] - start).total_seconds() * 1000 / intervals,
                busy,
                ours * 1000 / intervals,
                sampler.vacuumed(start.timestamp(), finished[end - 1].timestamp()),
            )
        )
    return out


def step_medians(database: BenchDatabase, block: int) -> list[float]:
    """The median migration step (ms) of each block of ``block`` upgrade jobs: the job's own
    work, without the worker's hand-over between jobs."""
    with psycopg.connect(database.owner_url) as conn:
        steps = [float(row[0]) for row in conn.execute(UPGRADE_STEP_MS)]
    return [statistics.median(steps[i : i + block]) for i in range(0, len(steps), block)]


def check_exactly_once(database: BenchDatabase, tenants: int) -> dict[str, Any]:
    """Every tenant at t005, by exactly one succeeded migration step in the upgrade's run."""
    with psycopg.connect(database.owner_url) as conn:
        rows = conn.execute(UPGRADE_STEPS).fetchall()
        paths = {str(p): int(n) for p, n in conn.execute(UPGRADE_PATHS).fetchall()}
        column = conn.execute(WITH_SOURCE_COLUMN).fetchone()
    jobs_ok = sum(1 for status, ok, steps in rows if status == "succeeded" and ok == 1)
    retried = sum(1 for _, _, steps in rows if steps > 1)
    versions = fleet.read_versions(database.owner_url, None)
    at_head = sum(1 for v in versions.values() if v == frozenset({"t005"}))
    found = {
        "jobs": len(rows),
        "jobs_succeeded_once": jobs_ok,
        "jobs_with_more_than_one_step_run": retried,
        "version_tables": len(versions),
        "at_t005": at_head,
        "audit_events_with_source": int(column[0]) if column else 0,
        "paths": paths,
    }
    if not (
        len(rows)
        == jobs_ok
        == len(versions)
        == at_head
        == found["audit_events_with_source"]
        == tenants
    ):
        raise RuntimeError(f"not every tenant at t005 exactly once: {found}")
    return found


def run(cluster: BenchCluster, results: Results, tenants: int) -> None:
    block = 1000 if tenants >= 5000 else max(10, tenants // 10)
    with t005_tree() as tree, cluster.database("fleetscale") as database:
        say(f"  fleet-scale: building {tenants} tenants at t004")
        built = build_fleet(database, tenants)
        say(f"  fleet-scale: built in {built:.0f} s")
        waited = wait_for_autovacuum(database)
        checked = drift_check(database, tenants)
        say(f"  fleet-scale: check --all {[round(ms, 2) for ms in checked]} ms per tenant")
        with tenant_tree(tree):
            behinds = who_is_behind(database, tenants)
            behind = behinds["now"]
            for name, samples in behinds.items():
                say(f"  fleet-scale: who is behind ({name}): {[round(ms) for ms in samples]} ms")
            dry_cli, _ = _cli(database, tree, "--all", "--dry-run")
            spares = [raw_name(i) for i in range(2 * RAW_SCHEMAS)]
            raw_before = raw_loop(database, spares[:RAW_SCHEMAS])
            pid_file = cluster.cluster.data / "postmaster.pid"
            upgraded, sampler = upgrade_fleet(database, tenants, tree, pid_file)
            say(f"  fleet-scale: upgraded {tenants} tenants in {upgraded['seconds']:.0f} s")
            raw_after = raw_loop(database, spares[RAW_SCHEMAS:])
            timed = per_block(database, block, sampler)
            blocks = [ms for ms, _, _, _ in timed]
            steps = step_medians(database, block)
            found = check_exactly_once(database, tenants)
    raw_ms = statistics.mean([raw_before, raw_after])
    results.add(
        Figure(
            "fleet_scale_raw",
            f"fleet scale: raw SQL upgrade per schema, at {tenants:,} tenants",
            "ms",
            [raw_before, raw_after],
            note=f"baseline; {RAW_SCHEMAS} schemas before and {RAW_SCHEMAS} after the upgrade",
        )
    )
    results.add(
        Figure(
            "fleet_scale_behind_before",
            f"fleet scale: who is behind, {tenants:,} tenants, former UNION ALL reader",
            "ms",
            behinds["before"],
            note="baseline (bench/before.py), alternated run by run with the next row",
        )
    )
    results.add(
        Figure(
            "fleet_scale_behind",
            f"fleet scale: who is behind, {tenants:,} tenants (in process)",
            "ms",
            behind,
            baseline="fleet_scale_behind_before",
            note=f"goal < 1 s; `upgrade --all --dry-run` process: {dry_cli * 1000:.0f} ms",
        )
    )
    results.add(
        Figure(
            "fleet_scale_check",
            f"fleet scale: check --all per tenant, {tenants:,} tenants (in process)",
            "ms",
            checked,
            baseline="fleet_scale_raw",
            note="every object kind compared; one catalog statement and one version read each",
        )
    )
    results.add(
        Figure(
            "fleet_scale_first",
            f"fleet scale: upgrade per tenant, first block of {block:,}",
            "ms",
            blocks[:1],
            baseline="fleet_scale_raw",
        )
    )
    results.add(
        Figure(
            "fleet_scale_last",
            f"fleet scale: upgrade per tenant, last block of {block:,}",
            "ms",
            blocks[-1:],
            baseline="fleet_scale_first",
        )
    )
    results.add(
        Figure(
            "fleet_scale_all",
            f"fleet scale: whole upgrade of {tenants:,} tenants (upgrade --all to last finish)",
            "s",
            [upgraded["seconds"]],
        )
    )
    lines = [
        f"{'block':>12} {'ms/tenant':>10} {'x first':>8} {'x raw':>7} {'step p50':>9} "
        f"{'CPU ms':>7} {'busy':>5}"
    ]
    for k, ((ms, busy, cpu, vacuumed), step) in enumerate(zip(timed, steps, strict=False)):
        lines.append(
            f"{k * block + 1:>5,}-{(k + 1) * block:<6,} {ms:>10.2f} {ms / blocks[0]:>7.2f}x "
            f"{ms / raw_ms:>6.2f}x {step:>9.2f} {cpu:>7.2f} {busy:>5.2f}  {'; '.join(vacuumed)}"
        )
    lines.append(
        "(ms/tenant: wall time per job between block boundaries, from the job rows' finished_at; "
        "step p50: the median migration step of the block, from the step journal; CPU ms: the "
        "run's own CPU per tenant (server processes, worker and children); busy: the machine's "
        "busy cores over the block, of 2; then what autovacuum was seen working on and the "
        "checkpoints that began, sampled twice a second)"
    )
    results.notes["fleet scale by block"] = "\n".join(lines)
    results.notes["fleet scale"] = (
        f"fleet of {tenants:,} built in {built:.0f} s (first tenant by the engine, the rest "
        f"in bulk with the same end state), then {waited:.0f} s waiting for autovacuum; "
        f"`upgrade --all` process {upgraded['command_seconds']:.1f} s; the whole upgrade "
        f"{upgraded['seconds']:.1f} s ({upgraded['seconds'] * 1000 / tenants:.2f} ms per tenant, "
        f"raw SQL {raw_before:.2f} ms before and {raw_after:.2f} ms after); checks: {found}"
    )
    results.extra["fleet_scale"] = {
        "tenants": tenants,
        "build_seconds": round(built, 1),
        "upgrade_seconds": round(upgraded["seconds"], 1),
        "upgrade_command_seconds": round(upgraded["command_seconds"], 2),
        "who_is_behind_ms": [round(ms, 1) for ms in behind],
        "who_is_behind_before_ms": [round(ms, 1) for ms in behinds["before"]],
        "dry_run_process_ms": round(dry_cli * 1000, 1),
        "check_ms_per_tenant": [round(ms, 3) for ms in checked],
        "per_block_ms": [round(ms, 2) for ms in blocks],
        "step_median_ms": [round(ms, 2) for ms in steps],
        "cpu_ms_per_tenant": [round(cpu, 2) for _, _, cpu, _ in timed],
        "busy_cores": [round(busy, 2) for _, busy, _, _ in timed],
        "autovacuum": [vacuumed for _, _, _, vacuumed in timed],
        "raw_ms": [round(raw_before, 2), round(raw_after, 2)],
        "checks": found,
    }
