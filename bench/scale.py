"""Opt-in (``make bench-scale``): provision up to 10,000 tenants in one database, one after the
other through :func:`provisioner.service.provision`, and report the per-tenant time by block of
1,000 against the first block.

At the end of each block the run also probes what grows with the catalog: the fingerprint
check of the fast path, the grant check, the named grant the step issues, and - for contrast,
in a transaction rolled back - ``GRANT ... ON ALL TABLES IN SCHEMA``, which scans every table of
the database. A raw-SQL tenant is created in each block too, so drift of the machine's load
can be told apart from growth (``vs raw`` column).
"""

from __future__ import annotations

import os
import re
import statistics
import time
from typing import Any

import psycopg
from psycopg import sql

from bench import before, fleet
from bench.cluster import BenchCluster, BenchDatabase, say
from bench.figures import Figure, Results
from bench.provisioning import raw_script
from provisioner import service
from provisioner.models import JobStatus
from provisioner.roles import DEFAULT_APP_ROLES
from provisioner.templates.replay import Template
from provisioner.tenant import schema as tenant_schema
from provisioner.tenant.fingerprint import FINGERPRINT, fingerprint

PROBES = 5


def _probe_ms(conn: psycopg.Connection[Any], action: Any) -> float:
    samples = []
    for _ in range(PROBES):
        began = time.perf_counter()
        action()
        samples.append((time.perf_counter() - began) * 1000)
        conn.rollback()
    return statistics.median(samples)


def _probes(database: BenchDatabase, schema: str) -> dict[str, float]:
    with psycopg.connect(database.owner_url) as conn:
        tables, _ = tenant_schema.relations(conn, schema)
        named = sql.SQL("GRANT SELECT, INSERT, UPDATE, DELETE ON TABLE {} TO app_rw").format(
            sql.SQL(", ").join(sql.Identifier(schema, t) for t in tables)
        )
        on_all = sql.SQL(
            "GRANT SELECT, INSERT, UPDATE, DELETE ON ALL TABLES IN SCHEMA {} TO app_rw"
        ).format(sql.Identifier(schema))
        count = conn.execute("SELECT count(*) FROM pg_class").fetchone()
        conn.rollback()
        return {
            "fingerprint_ms": _probe_ms(conn, lambda: fingerprint(conn, schema)),
            "plain_fingerprint_ms": _probe_ms(conn, lambda: before.fingerprint(conn, schema)),
            "grant_check_ms": _probe_ms(
                conn, lambda: tenant_schema.missing_app_grants(conn, schema, DEFAULT_APP_ROLES)
            ),
            "named_grant_ms": _probe_ms(conn, lambda: conn.execute(named)),
            "grant_on_all_ms": _probe_ms(conn, lambda: conn.execute(on_all)),
            "pg_class_rows": float(count[0]) if count else 0.0,
        }


def seq_scans(database: BenchDatabase, schema: str) -> str:
    """The catalog lookups of the steps and the fast path, EXPLAINed on the last tenant: any
    sequential scan of a catalog would grow with the number of schemas."""
    checks: dict[str, tuple[str, dict[str, Any]]] = {
        "fingerprint": (FINGERPRINT, {"schema": schema}),
        "grant check": (
            tenant_schema.APP_ROLE_PRIVILEGES,
            {
                "schema": schema,
                "role": "app_rw",
                "privileges": ["SELECT"],
                "sequence_privileges": ["SELECT"],
                "table_forbidden": [],
                "sequence_forbidden": [],
                "version_table": "alembic_version",
                "version_writes": ["INSERT"],
            },
        ),
        "relations": (tenant_schema.RELATIONS, {"schema": schema}),
        "object count": (tenant_schema.SCHEMA_OBJECT_COUNT, {"schema": schema}),
    }
    lines = []
    with psycopg.connect(database.owner_url) as conn:
        for name, (query, params) in checks.items():
            plan = [
                row[0] for row in conn.execute("EXPLAIN (COSTS OFF) " + query, params).fetchall()
            ]
            scans = sorted(
                {m.group(1) for line in plan for m in [re.search(r"Seq Scan on (\w+)", line)] if m}
            )
            found = "sequential scans of " + ", ".join(scans) if scans else "index lookups only"
            lines.append(f"{name}: {found}")
    return "\n".join(lines)


def run(cluster: BenchCluster, results: Results, tenants: int) -> None:
    block = max(1, tenants // 10)
    with cluster.database("scale") as database:
        settings = database.settings()
        template = Template.capture()
        service.provision(settings, "scale_warmup")  # computes the stored reference
        with psycopg.connect(database.owner_url) as conn:
            tables, sequences = tenant_schema.relations(conn, "tenant_scale_warmup")
        raw_conn = psycopg.connect(database.owner_url)
        blocks: list[dict[str, Any]] = []
        times: list[float] = []
        began = time.monotonic()
        try:
            for i in range(tenants):
                started = time.perf_counter()
                result = service.provision(settings, f"s{i}")
                times.append((time.perf_counter() - started) * 1000)
                assert result.job.status is JobStatus.SUCCEEDED, result.job
                if (i + 1) % block == 0:
                    raws = []
                    for k in range(3):
                        script = raw_script(
                            raw_conn, f"tenant_scale_raw_{i}_{k}", template, tables, sequences
                        )
                        t0 = time.perf_counter()
                        raw_conn.execute(script)
                        raw_conn.commit()
                        raws.append((time.perf_counter() - t0) * 1000)
                    chunk = times[-block:]
                    entry = {
                        "tenants": i + 1,
                        "median_ms": statistics.median(chunk),
                        "min_ms": min(chunk),
                        "max_ms": max(chunk),
                        "raw_ms": statistics.median(raws),
                        **_probes(database, f"tenant_s{i}"),
                        "load_1min": os.getloadavg()[0],
                    }
                    blocks.append(entry)
                    say(
                        f"  scale: {i + 1} tenants, block median {entry['median_ms']:.1f} ms, "
                        f"{time.monotonic() - began:.0f} s so far"
                    )
            results.notes["catalog lookups at the end (EXPLAIN)"] = seq_scans(
                database, f"tenant_s{tenants - 1}"
            )
        finally:
            raw_conn.close()
        # The same fleet, upgraded to a generated t005: who is behind, and the per-tenant cost
        # of the first and the last block of the upgrade.
        fleet.run_scale(database, results, tenants, block)
    first, last = blocks[0], blocks[-1]
    results.add(
        Figure(
            "scale_first",
            f"scale: per tenant, first block of {block}",
            "ms",
            times[:block],
            note="baseline",
        )
    )
    results.add(
        Figure(
            "scale_last",
            f"scale: per tenant, block ending at tenant {last['tenants']:,}",
            "ms",
            times[-block:],
            baseline="scale_first",
        )
    )
    lines = [
        f"{'tenants':>8} {'median':>8} {'min':>7} {'max':>8} {'x first':>8} {'raw':>7} "
        f"{'vs raw':>7} {'fprint':>7} {'plain':>7} {'grchk':>7} {'named':>7} {'ON ALL':>7} "
        f"{'pg_class':>9} {'load':>5}"
    ]
    for entry in blocks:
        lines.append(
            f"{entry['tenants']:>8,} {entry['median_ms']:>8.1f} {entry['min_ms']:>7.1f} "
            f"{entry['max_ms']:>8.1f} {entry['median_ms'] / first['median_ms']:>7.2f}x "
            f"{entry['raw_ms']:>7.1f} {entry['median_ms'] / entry['raw_ms']:>6.2f}x "
            f"{entry['fingerprint_ms']:>7.2f} {entry['plain_fingerprint_ms']:>7.2f} "
            f"{entry['grant_check_ms']:>7.2f} "
            f"{entry['named_grant_ms']:>7.2f} {entry['grant_on_all_ms']:>7.2f} "
            f"{entry['pg_class_rows']:>9,.0f} {entry['load_1min']:>5.1f}"
        )
    lines.append(
        "(ms; fprint = fingerprint, plain = the same sections by the former "
        "pg_class.relnamespace joins, grchk = the grant check, named = the named "
        "GRANT the step issues, ON ALL = GRANT ... ON ALL TABLES IN SCHEMA, rolled back; "
        "load = the machine's 1-minute load average)"
    )
    results.notes["scale by block"] = "\n".join(lines)
    results.extra["scale_blocks"] = blocks
