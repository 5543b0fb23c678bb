"""A tenant's move to a tenant server, and how long its writes are frozen (in ``make bench``:
``ROUNDS`` moves of a 10,000-row tenant, some 10 s).

Each round moves one tenant of ``ROWS`` audit events from the control database to a tenant
server (another database of the bench cluster, reached through a reference with no password:
the cluster's password file), by :func:`provisioner.fleet.move.move` in this process:

* ``move_freeze``: from the freeze step's start (the revoke) to the switch step's commit (the
  target granted, the directory switched): the time the application's writes are refused.
  The DDL is restored before it (``precopy_schema``); in it, the rows by ``COPY``, the DDL
  that follows the rows, the verification, the switch. Each part's median
  goes to the notes, read from the steps' records;
* ``move_copy_raw``: the same schema's ``pg_dump | pg_restore`` alone, into a third database,
  timed the same round (the baseline: the copy's floor with PostgreSQL's own tools).

Then, when PostgreSQL 16 binaries are here (the ``pgserver`` wheel's, or the machine's), a
second durable cluster with ``wal_level = logical`` (the owner with ``REPLICATION`` and
``pg_create_subscription``), two databases of it as servers ``lsrc`` and ``ldst``; each round's
tenant first reaches ``lsrc`` (a dump move from control), then moves to ``ldst``:

* ``move_freeze_logical``: the freeze of that move by logical replication (the rows arrive
  before it; in it, the catch-up, the sequences and the DDL after the rows);
* ``move_freeze_dump16``: the freeze of the same move by dump (``--method dump``), between
  the same two servers (the baseline).

Goal: ``move_freeze`` median at most 2 s (issue 29).
"""

from __future__ import annotations

import re
import shutil
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import psycopg
from psycopg.conninfo import conninfo_to_dict

from bench.cluster import BenchCluster, BenchDatabase
from bench.figures import Figure, Results
from provisioner import servers, service
from provisioner.engine import StepEvent, StepOutcome
from provisioner.fleet import move as moving
from provisioner.kinds import move_copy
from provisioner.local import cluster as local_pg
from provisioner.servers.moves import End

ROWS = 10_000
ROUNDS = 3

# The parts of the freeze and of the pre-copy, as the steps' records give them (ms).
PARTS = {
    "precopy dump": re.compile(r"\(dump (\d+) ms"),
    "precopy restore": re.compile(r"restore (\d+) ms\)"),
    "revoke": re.compile(r"revoke (\d+) ms"),
    "wait for writes": re.compile(r"writes begun (\d+) ms"),
    "rows by COPY": re.compile(r"rows copied .* in (\d+) ms \("),
    "initial rows by replication": re.compile(r"initial rows in (\d+) ms"),
    "catch-up": re.compile(r"caught up in (\d+) ms"),
    "subscription dropped (alongside)": re.compile(r"publication dropped \((\d+) ms"),
    "DDL after the rows and commit": re.compile(r"the commit in (\d+) ms"),
}


def _reference(cluster: BenchCluster, database: BenchDatabase) -> str:
    params = conninfo_to_dict(database.owner_url)
    return (
        f"host={params['host']} port={params['port']} dbname={database.name} "
        f"user={params['user']} passfile={cluster.cluster.passfile}"
    )


def _marker(marks: dict[str, float]) -> Callable[[StepEvent], None]:
    """A progress callback noting when the freeze began and when the switch committed."""

    def mark(event: StepEvent) -> None:
        # repaired: a step of a job opened again (the tenant's second move) ran again
        done = event.outcome in (StepOutcome.DONE, StepOutcome.REPAIRED)
        if done:
            marks[f"step {event.step}"] = event.seconds * 1000
            for part, pattern in PARTS.items():
                found = pattern.search(event.detail or "")
                if found:
                    marks[f"part {part}"] = float(found.group(1))
        if event.step == "freeze_writes" and event.outcome is StepOutcome.STARTED:
            marks["frozen"] = time.perf_counter()
        if event.step == "switch_server" and done:
            marks["switched"] = time.perf_counter()

    return mark


def run(cluster: BenchCluster, results: Results, rows: int = ROWS, rounds: int = ROUNDS) -> None:
    freeze: list[float] = []
    raw: list[float] = []
    steps: dict[str, list[float]] = {}
    with (
        cluster.database("move_control") as control,
        cluster.database("move_east") as east,
        cluster.database("move_raw") as spare,
    ):
        settings = control.settings()
        tenants = [f"m{n}" for n in range(rounds)]
        for tenant in tenants:
            _provision_with_rows(control, tenant, rows)
        with psycopg.connect(control.owner_url, autocommit=True) as conn:
            servers.add(conn, "east", _reference(cluster, east))
        servers.migrate_servers(control.owner_url)  # a move refuses a server never migrated
        source = End("control", _reference(cluster, control))
        target = End("raw", _reference(cluster, spare))
        for tenant in tenants:
            began = time.perf_counter()
            move_copy.copy_schema(source, target, f"tenant_{tenant}")
            raw.append((time.perf_counter() - began) * 1000)
            marks: dict[str, float] = {}
            mark = _marker(marks)
            result = moving.move(settings, tenant, "east", on_progress=mark)
            assert result.move.phase.value == "switched", result
            freeze.append((marks["switched"] - marks["frozen"]) * 1000)
            for key, value in marks.items():
                if key.startswith(("step ", "part ")):
                    steps.setdefault(key, []).append(value)
    for kind, title in (("step ", "each step's"), ("part ", "the parts'")):
        results.notes[f"move: {title} median (ms)"] = ", ".join(
            f"{key[5:]} {statistics.median(values):.0f}"
            for key, values in steps.items()
            if key.startswith(kind)
        )
    results.add(
        Figure(
            "move_copy_raw",
            f"pg_dump | pg_restore of a {rows:,}-row tenant schema alone",
            "ms",
            raw,
            note="baseline",
        )
    )
    results.add(
        Figure(
            "move_freeze",
            f"move of a {rows:,}-row tenant: writes frozen (revoke -> switch committed)",
            "ms",
            freeze,
            baseline="move_copy_raw",
        )
    )


def pg16_bin() -> Path | None:
    """PostgreSQL 16 or later server binaries here, or None."""
    for directory in local_pg.bin_candidates():
        if (directory / "initdb").exists() and local_pg.client_major(directory) >= 16:
            return directory
    return None


def run_both(
    cluster: BenchCluster, results: Results, rows: int = ROWS, rounds: int = ROUNDS
) -> None:
    """The move scenario: the dump's freeze, then logical replication's."""
    run(cluster, results, rows, rounds)
    run_logical(cluster, results, rows, rounds)


def run_logical(
    cluster: BenchCluster, results: Results, rows: int = ROWS, rounds: int = ROUNDS
) -> None:
    """``move_freeze_logical`` against ``move_freeze_dump16`` (see the module); nothing when
    no PostgreSQL 16 binaries are here (said in the notes)."""
    bin_dir = pg16_bin()
    if bin_dir is None:
        results.notes["move: logical replication"] = "not measured: no PostgreSQL 16 binaries"
        return
    logical = local_pg.Cluster(
        Path(tempfile.mkdtemp(prefix="provisioner-bench-pg16-")),
        durable=True,
        bin_dir=bin_dir,
        conf=("wal_level = logical",),
    )
    try:
        logical.ensure_running()
        for name in ("lsrc", "ldst"):
            local_pg.bootstrap_database(logical.superuser_url(), name)
        with psycopg.connect(logical.superuser_url(), autocommit=True) as conn:
            conn.execute(f"ALTER ROLE {local_pg.OWNER_ROLE} REPLICATION")
            conn.execute(f"GRANT pg_create_subscription TO {local_pg.OWNER_ROLE}")
        with cluster.database("move_logical") as control:
            _measure_logical(cluster, control, logical, results, rows, rounds)
    finally:
        logical.stop()
        shutil.rmtree(logical.root, ignore_errors=True)


def _provision_with_rows(control: BenchDatabase, tenant: str, rows: int) -> None:
    """A tenant on the control database with ``rows`` audit events, written as the app."""
    service.provision(control.settings(), tenant)
    with psycopg.connect(control.app_url, autocommit=True) as conn:
        conn.execute(
            f"INSERT INTO tenant_{tenant}.audit_events (action) "
            "SELECT 'seed ' || g FROM generate_series(1, %s) g",
            (rows,),
        )


def _measure_logical(
    cluster: BenchCluster,
    control: BenchDatabase,
    logical: local_pg.Cluster,
    results: Results,
    rows: int,
    rounds: int,
) -> None:
    settings = control.settings()
    tenants = [(f"l{m[0]}{n}", m) for n in range(rounds) for m in ("logical", "dump")]
    for tenant, _ in tenants:  # on control: before the servers, which would take them
        _provision_with_rows(control, tenant, rows)
    with psycopg.connect(control.owner_url, autocommit=True) as conn:
        for name in ("lsrc", "ldst"):
            servers.add(
                conn,
                name,
                f"host=127.0.0.1 port={logical.port} dbname={name} "
                f"user={local_pg.OWNER_ROLE} passfile={logical.passfile}",
            )
    servers.migrate_servers(control.owner_url)  # a move refuses a server never migrated
    freezes: dict[str, list[float]] = {"logical": [], "dump": []}
    steps: dict[str, list[float]] = {}
    for tenant, method in tenants:
        # on lsrc by dump (control's server has no wal_level = logical), that move finished
        assert moving.move(settings, tenant, "lsrc").move.phase.value == "switched"
        moving.finish(settings, tenant, grace_seconds=0)
        marks: dict[str, float] = {}
        result = moving.move(settings, tenant, "ldst", on_progress=_marker(marks), method=method)
        assert result.move.phase.value == "switched", result
        freezes[method].append((marks["switched"] - marks["frozen"]) * 1000)
        if method == "logical":
            for key, value in marks.items():
                if key.startswith("part "):
                    steps.setdefault(key, []).append(value)
    results.notes["move by logical replication: the parts' median (ms)"] = ", ".join(
        f"{key[5:]} {statistics.median(values):.0f}" for key, values in steps.items()
    )
    results.add(
        Figure(
            "move_freeze_dump16",
            f"move of a {rows:,}-row tenant between two PostgreSQL 16 servers by dump: frozen",
            "ms",
            freezes["dump"],
            note="baseline",
        )
    )
    results.add(
        Figure(
            "move_freeze_logical",
            "the same move by logical replication: writes frozen (catch-up only)",
            "ms",
            freezes["logical"],
            baseline="move_freeze_dump16",
        )
    )
