"""A fleet upgrade across two servers vs on one (issue 29: "a fleet upgrade across two servers
at no more per tenant than on one").

Two deployments on the bench cluster, each with its own control database and N tenants at t004:
``one`` keeps every tenant on its control database; ``two`` has half of them on control and
half on a tenant server (a third database of the same cluster, reached through its reference
and the cluster's password file), where each job's migration step commits with its journal
row and fence, then its checkpoint in control (:mod:`provisioner.engine.remote`). Each is
brought to the bench's t005 (:mod:`bench.fleet`) by ``upgrade --all`` and one running worker
with one child; the time counts from the upgrade call (the versions read on each server, the
rollout queued) to the last job's finish, with the worker idle before it. Runs turn the order
of the deployments; each run builds them all again. Opt-in (``python -m bench --only
fleet-servers``): 6 runs build 24 x 60 tenants, 3-4 minutes on a quiet machine. Two runs
(the default before) gave 1.00x to 1.33x from one bench to the next: a median of six moves less.

The tenant server is on the same cluster: the figure is the tool's own cost of the second
server (two commits per step, the server's pool, the fan-out's read), not a network's.

Within each two-server run, the median interval between two jobs finishing on the same side
(control's tenants, then the server's) is each side's per-job cost measured side by side
(``fleet_servers_job_to_job_ms``): no fixed cost (the call's reads, each side's first job)
and none of the run-to-run spread.

Two more deployments split that figure in two: every tenant on one tenant server (``east``),
and half on each of two tenant servers (``east_west``). Every job of both commits twice, so
``east_west`` over ``east`` is the spread's own cost (the fan-out's reads, a second server's
pool and first jobs), and ``east`` over ``one`` the two commits' cost alone.

Each deployment's figure is divided by its own baseline (:attr:`bench.figures.Figure.pairs`):
right after its upgrade, raw SQL sends the same shape of upgrade (a column and its index, the
version row) to the same schemas in the same databases, one transaction per schema on one
open connection per database. The same DDL costs up to 2x more from one run to the next; the
ratio of two deployments' medians carried that spread.
"""

from __future__ import annotations

import itertools
import statistics
import time
from collections import Counter

import psycopg
from psycopg import sql

from bench.cluster import BenchCluster, BenchDatabase, say
from bench.figures import Figure, Results
from bench.fleet import RAW_UPGRADE, t005_tree, tenant_tree, upgrade_by_worker
from bench.server_jobs import _reference
from provisioner import servers, service

TENANTS = 60
RUNS = 6

#: The baseline's upgrade, after the measured one: the same statements under other names.
RAW_AFTER = RAW_UPGRADE.replace("source", "source_raw").replace(
    "version_num = 't004'", "version_num = 't005'"
)


#: Where each deployment's tenants live, in equal parts and in this order: the control database
#: or tenant servers (databases of the bench cluster, added to the directory as their part
#: begins; placement puts a part on the server added for it, the least loaded).
LAYOUTS: dict[str, tuple[str, ...]] = {
    "one": ("control",),
    "two": ("control", "east"),
    "east": ("east",),
    "east_west": ("east", "west"),
}


def _deploy(
    cluster: BenchCluster, label: str, tenants: int
) -> tuple[BenchDatabase, list[tuple[BenchDatabase, list[str]]]]:
    """A control database with ``tenants`` provisioned at t004 as :data:`LAYOUTS` says, and
    each part's database with its schemas (the control database for its part)."""
    control = cluster.create_database(f"fs_{label}")
    settings = control.settings()
    parts = LAYOUTS[label]
    size = tenants // len(parts)
    where: list[tuple[BenchDatabase, list[str]]] = []
    for index, place in enumerate(parts):
        database = control
        if place != "control":
            database = cluster.create_database(f"fs_{place}")
            with psycopg.connect(control.owner_url, autocommit=True) as conn:
                servers.add(conn, place, _reference(cluster, database))
            servers.migrate_servers(control.owner_url)
        names = [f"u{i:04d}" for i in range(index * size, (index + 1) * size)]
        for name in names:
            service.provision(settings, name)
        where.append((database, [f"tenant_{name}" for name in names]))
    return control, where


def _raw_after(databases: list[tuple[BenchDatabase, list[str]]]) -> float:
    """Seconds of :data:`RAW_AFTER` on each database's schemas, one transaction per schema on
    one open connection per database."""
    seconds = 0.0
    for database, schemas in databases:
        with psycopg.connect(database.owner_url) as conn:
            began = time.perf_counter()
            for schema in schemas:
                conn.execute(
                    sql.SQL(RAW_AFTER)
                    .format(schema=sql.Identifier(schema))
                    .as_string(conn)
                    .encode()
                )
                conn.commit()
            seconds += time.perf_counter() - began
    return seconds


def _paths(control: BenchDatabase) -> Counter[str]:
    """How each tenant's migration step ran (replay / alembic), from control's journal (a
    step on the tenant server closes there too, with its detail)."""
    with psycopg.connect(control.owner_url) as conn:
        rows = conn.execute(
            "SELECT split_part(split_part(detail, 'path=', 2), ' ', 1) "
            "FROM control.job_step_runs WHERE detail LIKE '%%from=t004%%'"
        ).fetchall()
    return Counter(str(r[0]) for r in rows)


def _job_to_job(control: BenchDatabase) -> dict[str, float]:
    """The median interval between two jobs' finishes, each on the same side (control, the
    tenant server), in ms: the per-job cost of each side measured in the same run, without the
    upgrade's fixed costs (the call's reads, each side's first job) and the run-to-run spread."""
    with psycopg.connect(control.owner_url) as conn:
        rows = conn.execute(
            "SELECT r.finished_at, t.server IS NOT NULL FROM control.job_step_runs r "
            "JOIN control.tenants t USING (tenant_id) "
            "WHERE r.detail LIKE '%%from=t004%%' ORDER BY r.finished_at"
        ).fetchall()
    gaps: dict[str, list[float]] = {"control": [], "server": []}
    for (before, was_placed), (after, placed) in itertools.pairwise(rows):
        if was_placed == placed:
            side = "server" if placed else "control"
            gaps[side].append((after - before).total_seconds() * 1000)
    return {side: statistics.median(v) for side, v in gaps.items() if v}


def run(
    cluster: BenchCluster,
    results: Results,
    tenants: int = TENANTS,
    runs: int = RUNS,
    children: int = 1,
    spread: bool = True,
) -> None:
    """``runs`` rounds of the deployments (``one`` and ``two``; with ``spread``, ``east`` and
    ``east_west`` too), their order turned each round, each upgraded by one worker with
    ``children`` engine children (1 in ``make bench``: the per-job cost, not the overlap)."""
    labels = ["one", "two"] + (["east", "east_west"] if spread else [])
    samples: dict[str, list[float]] = {label: [] for label in labels}
    pairs: dict[str, list[float]] = {label: [] for label in labels}
    paths: Counter[str] = Counter()
    sides: dict[str, list[float]] = {"control": [], "server": []}
    with t005_tree() as tree:
        for run_no in range(runs):
            order = labels if run_no % 2 == 0 else labels[::-1]
            for label in order:
                control, where = _deploy(cluster, label, tenants)
                try:
                    with tenant_tree(tree):
                        seconds = upgrade_by_worker(control, tenants, children, tree)
                        if label == "two":
                            paths = _paths(control)
                            for side, ms in _job_to_job(control).items():
                                sides[side].append(ms)
                    raw_seconds = _raw_after(where)
                finally:
                    for database, _ in where:
                        if database is not control:  # a tenant server's, one per part
                            cluster.drop_database(database)
                    cluster.drop_database(control)
                samples[label].append(seconds / tenants * 1000)
                pairs[label].append(raw_seconds / tenants * 1000)
                per_tenant, raw_ms = samples[label][-1], pairs[label][-1]
                say(
                    f"  fleet-servers: run {run_no + 1}, {label}: {per_tenant:.2f} ms/tenant, "
                    f"raw SQL on the same schemas {raw_ms:.2f} ({per_tenant / raw_ms:.2f}x)"
                )
    results.add(
        Figure(
            "fleet_servers_one",
            f"fleet upgrade t004->t005, {tenants} tenants on the control database, 1 worker",
            "ms",
            samples["one"],
            note="baseline, per tenant",
        )
    )
    results.add(
        Figure(
            "fleet_servers_two",
            f"fleet upgrade t004->t005, {tenants} tenants half on control, half on a tenant "
            "server, 1 worker",
            "ms",
            samples["two"],
            baseline="fleet_servers_one",
            note="per tenant",
        )
    )
    if spread:
        results.add(
            Figure(
                "fleet_servers_east",
                f"fleet upgrade t004->t005, {tenants} tenants all on one tenant server, 1 worker",
                "ms",
                samples["east"],
                baseline="fleet_servers_one",
                note="per tenant: the two commits' cost",
            )
        )
        results.add(
            Figure(
                "fleet_servers_east_west",
                f"fleet upgrade t004->t005, {tenants} tenants half on each of two tenant "
                "servers, 1 worker",
                "ms",
                samples["east_west"],
                baseline="fleet_servers_east",
                note="per tenant: the spread's cost",
            )
        )
    # Each deployment against raw SQL on its own schemas, then the two ratios' ratio.
    one = [w / r for w, r in zip(samples["one"], pairs["one"], strict=True)]
    two = [w / r for w, r in zip(samples["two"], pairs["two"], strict=True)]
    results.extra["fleet_servers_paired"] = {
        "one_over_raw": [round(v, 3) for v in one],
        "two_over_raw": [round(v, 3) for v in two],
        "two_over_one": round(statistics.median(two) / statistics.median(one), 3),
    }
    # Within each two-server run: job to job on control against on the tenant server.
    steady = {side: round(statistics.median(v), 2) for side, v in sides.items() if v}
    results.extra["fleet_servers_job_to_job_ms"] = steady
    results.notes["fleet_servers"] = (
        f"migration step paths over both servers in the last two-server run: {dict(paths)}. "
        "Per-tenant figures are seconds from the upgrade call to the last job's finish / tenants. "
        f"Job to job within the two-server runs (median ms): {steady}."
    )
