"""A sign-up burst: 60 tenants enqueued in one transaction (``provisioner.enqueue``, as
``app_rw``), then drained by one real ``provisioner worker --once``, against the raw limit
measured in the same run, and where the time goes.

Three drains, each in a fresh database: the worker at its defaults (no ``--concurrency``),
with one child, and with as many children as cores. The raw limit is the full end state in one
transaction per tenant on open connections, by one session (the serial limit) and by as many
sessions as cores (what the machine allows in parallel), measured **in the drain's own
database right before and right after it** (after one discarded warm-up round), and each drain
is divided by the mean of its two (:attr:`bench.figures.Figure.pairs`): the same raw SQL cost
23-56 ms a tenant in runs seconds apart, and a baseline measured elsewhere or earlier made the
ratios swing. A drain's time is the server's: from the first step's start
to the last job's finish, divided by the tenants (child start-up is left out, as in
:mod:`bench.workers`); the template's reference is computed before it (the tenant ``shape``
the raw SQL's grants are read from), as in a running deployment.

Where the time goes comes from the server's own counters, read after every session closed (a
backend flushes its statistics at exit): transactions that wrote (transaction ids assigned,
a savepoint that wrote included; read-only ones take none) and WAL flushes to disk per tenant
(``pg_stat_wal``), the time the database's sessions spent running
statements (``active_time``) and inside a transaction waiting for the client (round trips and
Python: ``idle_in_transaction_time``), and a 5 ms sample of ``pg_stat_activity`` that says
which wait the running statements were in (locks, the WAL's disk writes, CPU).
"""

from __future__ import annotations

import os
import statistics
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

import psycopg

import provisioner
from bench import worker_process
from bench.cluster import BenchCluster, BenchDatabase, say
from bench.figures import Figure, Results
from bench.provisioning import raw_script
from provisioner import service
from provisioner.templates.replay import Template
from provisioner.tenant import schema as tenant_schema

TENANTS = 60
SAMPLE_SECONDS = 0.005

COUNTERS = """
SELECT pg_snapshot_xmax(pg_current_snapshot())::text::bigint, w.wal_sync, w.wal_bytes::bigint,
       coalesce(d.active_time, 0), coalesce(d.idle_in_transaction_time, 0)
FROM pg_stat_database d, pg_stat_wal w
WHERE d.datname = current_database()
"""

#: What each session of the database is doing, one row per backend but this one.
ACTIVITY = """
SELECT state, wait_event_type, wait_event FROM pg_stat_activity
WHERE datname = current_database() AND pid <> pg_backend_pid() AND backend_type = 'client backend'
  AND state <> 'idle'
"""


def cores() -> int:
    return os.cpu_count() or 1


@dataclass
class Breakdown:
    """Per-tenant server counters and the sampled states of one run."""

    tenants: int
    counters: tuple[float, ...] = ()
    states: Counter[str] = field(default_factory=Counter)

    def per_tenant(self) -> dict[str, float]:
        writes, syncs, wal, active, idle_tx = self.counters
        n = self.tenants
        return {
            "write_transactions": writes / n,
            "wal_flushes": syncs / n,
            "wal_kb": wal / n / 1024,
            "server_ms": active / n,
            "idle_in_tx_ms": idle_tx / n,
        }

    def shares(self) -> dict[str, float]:
        total = sum(self.states.values()) or 1
        return {state: count / total for state, count in self.states.most_common()}


class Sampler(threading.Thread):
    """Samples the database's sessions every 5 ms until stopped (its own connection)."""

    def __init__(self, url: str) -> None:
        super().__init__(daemon=True)
        self.url = url
        self.states: Counter[str] = Counter()
        self.halt = threading.Event()

    def run(self) -> None:
        with psycopg.connect(self.url, autocommit=True) as conn:
            while not self.halt.wait(SAMPLE_SECONDS):
                for state, kind, event in conn.execute(ACTIVITY).fetchall():
                    self.states[_label(state, kind, event)] += 1

    def stop(self) -> Sampler:
        self.halt.set()
        self.join(10)
        return self


def _label(state: str | None, kind: str | None, event: str | None) -> str:
    """A sampled busy session, by what it waits on (sessions idle between transactions are
    not sampled: a worker keeps several connections open that do nothing during a drain)."""
    if state == "active":
        if kind is None:
            return "running (CPU)"
        if kind in ("Lock", "LWLock"):
            return f"lock {event}"
        if kind == "IO":
            return f"disk {event}"
        return f"{kind} {event}"
    return "in a transaction, waiting for the client"


def _counters(database: BenchDatabase) -> tuple[float, ...]:
    with psycopg.connect(database.admin_url, autocommit=True) as conn:
        conn.execute("SELECT pg_stat_clear_snapshot()")
        row = conn.execute(COUNTERS).fetchone()
    assert row is not None
    return tuple(float(v) for v in row)


def _delta(before: tuple[float, ...], after: tuple[float, ...]) -> tuple[float, ...]:
    return tuple(b - a for a, b in zip(before, after, strict=True))


def _settled_counters(database: BenchDatabase) -> tuple[float, ...]:
    """The counters once every other session of the database has exited and flushed."""
    with psycopg.connect(database.admin_url, autocommit=True) as conn:
        for _ in range(400):
            row = conn.execute(
                "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
                "AND pid <> pg_backend_pid() AND backend_type = 'client backend'"
            ).fetchone()
            if row is not None and row[0] == 0:
                break
            time.sleep(0.025)
    return _counters(database)


def drain(
    database: BenchDatabase, label: str, args: tuple[str, ...], tenants: int
) -> tuple[float, Breakdown]:
    """(ms per tenant from the first step's start to the last finish, its breakdown): ``tenants``
    sign-ups enqueued at once, drained by ``provisioner worker --once ARGS``."""
    with psycopg.connect(database.app_url) as conn:
        for i in range(tenants):
            provisioner.enqueue(conn, f"b{label}_{i}")
        conn.commit()
    before = _settled_counters(database)
    sampler = Sampler(database.admin_url)
    sampler.start()
    worker = worker_process.WorkerProcess(database, "--once", *args)
    try:
        code = worker.wait(timeout=600)
    finally:
        worker.close()
        sampler.stop()
    if code != 0:
        raise RuntimeError(f"worker exited {code}: {worker.log()[-2000:]}")
    after = _settled_counters(database)
    pattern = f"b{label}_%"
    with psycopg.connect(database.owner_url) as conn:
        row = conn.execute(
            "SELECT count(*) FILTER (WHERE j.status = 'succeeded'), "
            "extract(epoch FROM max(j.finished_at) - "
            "  (SELECT min(s.started_at) FROM control.job_step_runs s"
            "   JOIN control.platform_jobs o ON o.id = s.job_id WHERE o.tenant_id LIKE %s)) "
            "FROM control.platform_jobs j WHERE j.tenant_id LIKE %s",
            (pattern, pattern),
        ).fetchone()
    assert row is not None
    if int(row[0]) != tenants:
        raise RuntimeError(f"{row[0]} of {tenants} tenants succeeded: {worker.log()[-2000:]}")
    breakdown = Breakdown(tenants, _delta(before, after), sampler.states)
    return float(row[1]) * 1000 / tenants, breakdown


def raw(
    database: BenchDatabase, sessions: int, tenants: int, tag: str, *, counted: bool = True
) -> tuple[float, Breakdown]:
    """(ms per tenant of the raw script run by ``sessions`` connections at once, breakdown);
    ``tenants`` in all, split between the sessions (one each when fewer). ``counted`` false: no
    breakdown (other sessions of the database stay open)."""
    template = Template.capture()
    with psycopg.connect(database.owner_url) as conn:
        tables, sequences = tenant_schema.relations(conn, "tenant_shape")
    errors: list[BaseException] = []
    each = max(1, tenants // sessions)  # fewer tenants than sessions: one each
    ready = threading.Barrier(sessions + 1)

    def stream(k: int) -> None:
        try:
            with psycopg.connect(database.owner_url) as conn:
                scripts = [
                    raw_script(conn, f"tenant_{tag}_{k}_{i}", template, tables, sequences)
                    for i in range(each)
                ]
                ready.wait()
                for script in scripts:
                    conn.execute(script)
                    conn.commit()
        except BaseException as exc:  # reported below, in the main thread
            ready.abort()
            errors.append(exc)

    threads = [threading.Thread(target=stream, args=(k,)) for k in range(sessions)]
    before = _settled_counters(database) if counted else ()
    for thread in threads:
        thread.start()
    ready.wait()
    sampler = Sampler(database.admin_url)
    sampler.start()
    began = time.perf_counter()
    for thread in threads:
        thread.join()
    elapsed = time.perf_counter() - began
    sampler.stop()
    if errors:
        raise errors[0]
    after = _settled_counters(database) if counted else ()
    return elapsed * 1000 / (each * sessions), Breakdown(
        each * sessions, _delta(before, after), sampler.states
    )


#: The raw rounds discarded in each fresh database before its figures (a fresh database's
#: first builds cost up to 2x).
WARM_UP_TENANTS = 20


def run(
    cluster: BenchCluster,
    results: Results,
    tenants: int,
    runs: int,
    warm_up: int = WARM_UP_TENANTS,
) -> None:
    if not worker_process.worker_available():
        results.notes["burst"] = "not measured: this tree has no `provisioner worker --once`"
        return
    k = cores()
    drains: dict[str, tuple[str, ...]] = {
        "default": (),
        "one": ("--concurrency", "1"),
        f"children_{k}": ("--concurrency", str(k)),
    }
    samples: dict[str, list[float]] = {key: [] for key in ("raw_1", f"raw_{k}", *drains)}
    #: each drain's database's raw serial figure (before and after it, averaged)
    pairs: dict[str, list[float]] = {key: [] for key in drains}
    #: raw SQL's own speed-up from k sessions in each drain's database
    raw_speedups: dict[str, list[float]] = {key: [] for key in drains}
    breakdowns: dict[str, Breakdown] = {}
    for run_no in range(runs):
        for key, args in drains.items():
            with cluster.database(f"burst_{key}{run_no}") as database:
                service.provision(database.settings(), "shape")
                if warm_up:
                    raw(database, 1, warm_up, "warm", counted=False)
                before = _raw_pair(database, tenants, k, "before", breakdowns)
                ms, breakdown = drain(database, f"{key}{run_no}", args, tenants)
                after = _raw_pair(database, tenants, k, "after", None)
            for serial, side_by_side in (before, after):
                samples["raw_1"].append(serial)
                samples[f"raw_{k}"].append(side_by_side)
            samples[key].append(ms)
            pairs[key].append((before[0] + after[0]) / 2)
            raw_speedups[key].append(statistics.mean(s / p for s, p in (before, after)))
            breakdowns.setdefault(key, breakdown)
            say(
                f"  burst: run {run_no + 1}, {key}: {ms:.1f} ms/tenant, its database's raw SQL "
                f"{before[0]:.1f}/{after[0]:.1f} before/after (1 session), "
                f"{before[1]:.1f}/{after[1]:.1f} ({k})"
            )
    _figures(results, samples, pairs, tenants, k)
    _speedups(results, samples, pairs, raw_speedups, k)
    results.notes["burst: where a tenant's time goes (first run)"] = _breakdown_table(breakdowns)
    results.extra["burst_breakdown"] = {
        key: {"per_tenant": b.per_tenant(), "states": b.shares()} for key, b in breakdowns.items()
    }


def _raw_pair(
    database: BenchDatabase,
    tenants: int,
    k: int,
    tag: str,
    breakdowns: dict[str, Breakdown] | None,
) -> tuple[float, float]:
    """(raw SQL by 1 session, by ``k``) in ``database``, ms per tenant; with ``breakdowns``,
    each one's breakdown kept when it is the first."""
    out = []
    for key, sessions in (("raw_1", 1), (f"raw_{k}", k)):
        ms, breakdown = raw(
            database, sessions, tenants, f"{tag}{sessions}", counted=breakdowns is not None
        )
        if breakdowns is not None:
            breakdowns.setdefault(key, breakdown)
        out.append(ms)
    return out[0], out[1]


def _figures(
    results: Results,
    samples: dict[str, list[float]],
    pairs: dict[str, list[float]],
    tenants: int,
    k: int,
) -> None:
    """The figures, each drain divided by its own database's raw serial figure."""
    results.add(
        Figure(
            "burst_raw_1",
            "raw SQL, full end state, 1 session (the serial limit)",
            "ms",
            samples["raw_1"],
            note="baseline (per tenant)",
        )
    )
    results.add(
        Figure(
            f"burst_raw_{k}",
            f"raw SQL, {k} sessions at once (per tenant of wall time)",
            "ms",
            samples[f"raw_{k}"],
            baseline="burst_raw_1",
            pairs=samples["raw_1"],
        )
    )
    labels = {
        "default": f"burst of {tenants} sign-ups, one worker at its defaults (per tenant)",
        "one": f"burst of {tenants}, one worker, --concurrency 1 (per tenant)",
        f"children_{k}": f"burst of {tenants}, one worker, --concurrency {k} (per tenant)",
    }
    for key, label in labels.items():
        results.add(
            Figure(
                f"burst_{key}",
                label,
                "ms",
                samples[key],
                baseline="burst_raw_1",
                pairs=pairs[key],
            )
        )


def _speedups(
    results: Results,
    samples: dict[str, list[float]],
    pairs: dict[str, list[float]],
    raw_speedups: dict[str, list[float]],
    k: int,
) -> None:
    """The children's speed-up over one child's, each drain normalised by its own database's
    raw figure, against raw SQL's own (k sessions over 1) in the same run's databases; per run,
    then their median."""
    per_run = []
    for run_no in range(len(samples["one"])):
        raw_speedup = statistics.median(found[run_no] for found in raw_speedups.values())
        one = samples["one"][run_no] / pairs["one"][run_no]
        children = samples[f"children_{k}"][run_no] / pairs[f"children_{k}"][run_no]
        per_run.append((one / children, raw_speedup))
    results.extra["burst_speedups"] = {
        "cores": k,
        "raw": round(statistics.median(r for _, r in per_run), 3),
        "worker": round(statistics.median(w for w, _ in per_run), 3),
        "worker_over_raw": round(statistics.median(w / r for w, r in per_run), 3),
        "per_run": [
            {"worker": round(w, 3), "raw": round(r, 3), "worker_over_raw": round(w / r, 3)}
            for w, r in per_run
        ],
    }


def _breakdown_table(breakdowns: dict[str, Breakdown]) -> str:
    lines = [
        "| run | write transactions | WAL flushes | WAL kB | server ms "
        "| in a transaction, client ms | sampled sessions' states |",
        "| --- | ---: | ---: | ---: | ---: | ---: | --- |",
    ]
    for key, breakdown in breakdowns.items():
        t = breakdown.per_tenant()
        states = ", ".join(
            f"{name} {share:.0%}" for name, share in breakdown.shares().items() if share >= 0.01
        )
        lines.append(
            f"| {key} | {t['write_transactions']:.1f} | {t['wal_flushes']:.1f} | {t['wal_kb']:.0f} "
            f"| {t['server_ms']:.1f} | {t['idle_in_tx_ms']:.1f} | {states} |"
        )
    return "per tenant:\n" + "\n".join(lines)


def speedups(results: Results) -> dict[str, Any]:
    return dict(results.extra.get("burst_speedups", {}))
