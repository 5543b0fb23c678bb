"""One tenant at a time: the raw-SQL limit, Alembic, the template replay, and provisioning end
to end through the ``provisioner provision`` logic (:func:`provisioner.service.provision`).

The variants run round-robin, one tenant each per round, so machine load drifting during the run
affects them alike and the ratios hold.

* ``raw`` (the baseline): the same end state as provisioning - schema, the template's tables,
  indexes and version row, the grants and default privileges, the seed rows - as plain SQL
  prepared in advance, sent in one round trip and committed once, on an open connection.
* ``raw_ddl``: the schema and the template's DDL only (baseline of the migration-step figures).
* ``alembic``: the schema, then the four revisions through Alembic, in one transaction.
* ``replay``: the schema, then the verified template replay (fingerprint check included).
* ``provision``: one tenant through every step, job row and checkpoint, fast path on (after a
  first tenant gave the process its reference schema).
* ``provision_alembic``: the same with the fast path off (what it cost before).
* ``engine``: one tenant as a worker child runs it - enqueue, claim and
  :meth:`provisioner.engine.Engine.run` on a long-lived engine and connection - which leaves out
  the connections ``service.provision`` opens for each call.
* ``fingerprint``: the fast path's check alone, on a fresh and on an open connection, and the
  former six-query form (:mod:`bench.before`) on an open connection.
* ``grants``: the grant step's work on a fresh schema (rolled back), now and as it was before.
"""

from __future__ import annotations

import os
import statistics
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

import psycopg
from psycopg import sql

from bench import before
from bench.cluster import BenchCluster, BenchDatabase, say
from bench.figures import Figure, Results
from provisioner import db, queue, service
from provisioner.engine import Engine
from provisioner.kinds.provision import STEPS, ensure_provision_job
from provisioner.local import cluster as local_pg
from provisioner.models import JobStatus, TenantId
from provisioner.roles import AppRole, Privileges
from provisioner.storage import store_from_settings
from provisioner.templates import migrations, seeds
from provisioner.templates.replay import Template, TemplateCache
from provisioner.tenant import fingerprint as tenant_fingerprint
from provisioner.tenant import schema as tenant_schema


def raw_script(
    conn: psycopg.Connection[Any],
    schema: str,
    template: Template,
    tables: list[str],
    sequences: list[str],
    *,
    ddl_only: bool = False,
) -> str:
    """Plain SQL that builds the tenant's end state in one transaction."""
    ident = sql.Identifier(schema)
    parts: list[sql.Composable] = [
        sql.SQL("CREATE SCHEMA {} AUTHORIZATION CURRENT_USER").format(ident),
        sql.SQL("SET LOCAL search_path TO {}").format(ident),
        sql.SQL(template.script.rstrip().rstrip(";")),
    ]
    if not ddl_only:
        parts += [
            *tenant_schema.grant_statements(schema, AppRole(local_pg.APP_ROLE), tables, sequences),
            *(  # the shipped seeds, under the search_path set above
                sql.SQL(seed.sql.strip().rstrip(";"))
                for seed in seeds.declared((), migrations.tenant_tree())
                if seed.sql is not None
            ),
        ]
    return sql.SQL(";\n").join(parts).as_string(conn)


#: The second application role of the grant step's two-role figure.
READONLY = AppRole("app_ro", Privileges.READONLY)


def run(cluster: BenchCluster, results: Results, rounds: int) -> None:
    with cluster.database("provision") as database:
        _run(database, results, rounds)


def _run(database: BenchDatabase, results: Results, rounds: int) -> None:
    settings = database.settings()
    template = Template.capture()
    # The first tenant of the database computes and stores the shared reference.
    first = time.perf_counter()
    service.provision(settings, "warmup")
    cold_ms = (time.perf_counter() - first) * 1000
    with psycopg.connect(database.owner_url) as conn:
        tables, sequences = tenant_schema.relations(conn, "tenant_warmup")
    tree = migrations.tenant_tree_state()

    raw_conn = psycopg.connect(database.owner_url)
    engine = db.engine(database.owner_url)
    owner = db.Database(database.owner_url)
    replay_cache = TemplateCache()
    # Enqueue and claim as the worker does: as the owner (app_rw may not claim, control c005).
    engine_app = psycopg.connect(database.owner_url)
    long_lived = Engine(
        database.owner_url,
        holder="bench-engine",
        app_roles=(AppRole(local_pg.APP_ROLE),),
        store=store_from_settings(settings),
    )
    fingerprint_conn = psycopg.connect(database.owner_url)
    samples: dict[str, list[float]] = defaultdict(list)

    def raw(i: int) -> None:
        script = raw_script(raw_conn, f"tenant_raw_{i}", template, tables, sequences)
        started = time.perf_counter()
        raw_conn.execute(script)
        raw_conn.commit()
        samples["raw"].append((time.perf_counter() - started) * 1000)

    def raw_ddl(i: int) -> None:
        script = raw_script(raw_conn, f"tenant_rawddl_{i}", template, [], [], ddl_only=True)
        started = time.perf_counter()
        raw_conn.execute(script)
        raw_conn.commit()
        samples["raw_ddl"].append((time.perf_counter() - started) * 1000)

    def alembic(i: int) -> None:
        schema = f"tenant_alembic_{i}"
        started = time.perf_counter()
        with engine.begin() as conn:
            conn.exec_driver_sql(f'CREATE SCHEMA "{schema}" AUTHORIZATION CURRENT_USER')
            migrations.upgrade_tenant(conn, schema)
        samples["alembic"].append((time.perf_counter() - started) * 1000)

    def replay(i: int) -> None:
        schema = f"tenant_replay_{i}"
        started = time.perf_counter()
        with owner.transaction() as tx:
            tenant_schema.create_schema(tx.pg, schema)
            outcome = replay_cache.migrate(tx, schema)
        elapsed = (time.perf_counter() - started) * 1000
        assert outcome.path == "template", outcome.detail
        if i > 0:  # the first one reads the stored reference
            samples["replay"].append(elapsed)

    def provision(i: int) -> None:
        started = time.perf_counter()
        result = service.provision(settings, f"fast_{i}")
        samples["provision"].append((time.perf_counter() - started) * 1000)
        assert result.job.status is JobStatus.SUCCEEDED, result.job

    def provision_alembic(i: int) -> None:
        # A one-off run's engine, with its template cache's fast path switched off.
        started = time.perf_counter()
        with Engine.from_settings(settings, "bench-alembic") as off:
            off.templates.disabled[tree.digest] = "switched off by the benchmark"
            job = ensure_provision_job(off.control, TenantId(f"slow_{i}")).job
            claimed = queue.claim_job(off.control, job.id, "bench-alembic")
            assert claimed is not None
            done = off.run(claimed)
        samples["provision_alembic"].append((time.perf_counter() - started) * 1000)
        assert done.status is JobStatus.SUCCEEDED, done

    def engine_run(i: int) -> None:
        backends = _backend_pids(database, engine_app)
        server_cpu = _cpu_seconds(backends)
        own_cpu = time.process_time()
        started = time.perf_counter()
        job = ensure_provision_job(engine_app, TenantId(f"engine_{i}")).job
        engine_app.commit()
        claimed = queue.claim_job(engine_app, job.id, "bench-engine")
        assert claimed is not None
        done = long_lived.run(claimed)
        samples["engine"].append((time.perf_counter() - started) * 1000)
        samples["engine_python_cpu"].append((time.process_time() - own_cpu) * 1000)
        samples["engine_server_cpu"].append((_cpu_seconds(backends) - server_cpu) * 1000)
        assert done.status is JobStatus.SUCCEEDED, done

    def fingerprint_check(i: int) -> None:
        schema = f"tenant_fast_{i}"
        started = time.perf_counter()
        with psycopg.connect(database.owner_url) as conn:
            connected = time.perf_counter()
            tenant_fingerprint.fingerprint(conn, schema)
        samples["fingerprint_fresh"].append((time.perf_counter() - connected) * 1000)
        del started
        started = time.perf_counter()
        tenant_fingerprint.fingerprint(fingerprint_conn, schema)
        # Ended as a worker's session ends its transactions: psycopg forgets its prepared
        # statements on rollback(), so a rollback here would re-plan the query every time.
        fingerprint_conn.commit()
        samples["fingerprint_open"].append((time.perf_counter() - started) * 1000)
        started = time.perf_counter()
        before.fingerprint(fingerprint_conn, schema)
        fingerprint_conn.rollback()
        samples["fingerprint_before"].append((time.perf_counter() - started) * 1000)

    def grants(i: int) -> None:
        schema = f"tenant_grants_{i}"
        raw_conn.execute(raw_script(raw_conn, schema, template, [], [], ddl_only=True))
        raw_conn.commit()
        pair = [
            ("grants_now", lambda c, s, r: tenant_schema.grant_app_roles(c, s, (AppRole(r),))),
            ("grants_before", before.grant_app_role),
            (
                "grants_two_roles",
                lambda c, s, r: tenant_schema.grant_app_roles(c, s, (AppRole(r), READONLY)),
            ),
        ]
        for key, grant in pair if i % 2 else reversed(pair):
            started = time.perf_counter()
            grant(raw_conn, schema, local_pg.APP_ROLE)
            samples[key].append((time.perf_counter() - started) * 1000)
            raw_conn.rollback()

    variants = (
        raw,
        raw_ddl,
        alembic,
        replay,
        provision,
        provision_alembic,
        engine_run,
        fingerprint_check,
        grants,
    )
    try:
        replay(0)
        for i in range(1, rounds + 1):
            for variant in variants:
                variant(i)
            if i % 5 == 0:
                say(f"  provisioning: round {i}/{rounds}")
    finally:
        raw_conn.close()
        engine.dispose()
        owner.close()
        long_lived.close()
        engine_app.close()
        fingerprint_conn.close()

    results.add(
        Figure(
            "raw",
            "raw SQL, full end state (schema+DDL+grants+seeds), 1 tx",
            "ms",
            samples["raw"],
            note="baseline",
        )
    )
    results.add(
        Figure("raw_ddl", "raw SQL, schema + template DDL only, 1 tx", "ms", samples["raw_ddl"])
    )
    results.add(
        Figure(
            "alembic",
            "schema + 4 revisions through Alembic, 1 tx",
            "ms",
            samples["alembic"],
            baseline="raw_ddl",
        )
    )
    results.add(
        Figure(
            "replay",
            "schema + verified template replay, 1 tx",
            "ms",
            samples["replay"],
            baseline="raw_ddl",
        )
    )
    results.add(
        Figure(
            "provision",
            "provision: 6 steps, job row, checkpoints (fast path)",
            "ms",
            samples["provision"],
            baseline="raw",
        )
    )
    results.add(
        Figure(
            "provision_alembic",
            "provision with the fast path off (Alembic)",
            "ms",
            samples["provision_alembic"],
            baseline="raw",
        )
    )
    results.add(
        Figure(
            "engine",
            "  one tenant as a worker child runs it (long-lived engine)",
            "ms",
            samples["engine"],
            baseline="raw",
        )
    )
    results.add(
        Figure(
            "fingerprint_fresh",
            "  fast path's fingerprint check, fresh connection",
            "ms",
            samples["fingerprint_fresh"],
            baseline="raw_ddl",
        )
    )
    results.add(
        Figure(
            "fingerprint_open",
            "  fast path's fingerprint check, open connection",
            "ms",
            samples["fingerprint_open"],
            baseline="raw_ddl",
        )
    )
    results.add(
        Figure(
            "fingerprint_before",
            "  the same check as before (6 queries), open connection",
            "ms",
            samples["fingerprint_before"],
            baseline="fingerprint_open",
        )
    )
    results.add(
        Figure(
            "grants_before",
            "grant step's work as before (7 round trips + 3 checks)",
            "ms",
            samples["grants_before"],
            note="baseline",
        )
    )
    results.add(
        Figure(
            "grants_now",
            "grant step's work now (3 round trips, same check)",
            "ms",
            samples["grants_now"],
            baseline="grants_before",
        )
    )
    results.add(
        Figure(
            "grants_two_roles",
            "grant step's work now for two roles (app_rw readwrite, app_ro readonly)",
            "ms",
            samples["grants_two_roles"],
            baseline="grants_now",
        )
    )
    results.add(
        Figure(
            "provision_cold",
            "provision, first tenant of the database (computes the stored reference)",
            "ms",
            [cold_ms],
            baseline="raw",
            note="one sample",
        )
    )
    results.notes["provision steps"] = _step_breakdown(database)
    wall = statistics.median(samples["engine"])
    python_cpu = statistics.mean(samples["engine_python_cpu"])
    server_cpu = statistics.mean(samples["engine_server_cpu"])
    results.extra["cpu_per_tenant_ms"] = {
        "wall": round(wall, 1),
        "python": round(python_cpu, 1),
        "server": round(server_cpu, 1),
    }
    results.notes["CPU per tenant (worker path)"] = (
        f"{python_cpu:.0f} ms in the Python process + {server_cpu:.0f} ms in its PostgreSQL "
        f"backends, of {wall:.0f} ms wall (means; /proc ticks of 10 ms): one worker keeps "
        f"{(python_cpu + server_cpu) / wall:.2f} cores busy, so two need "
        f"{2 * (python_cpu + server_cpu) / wall:.2f} free cores to double the rate"
    )


def _backend_pids(database: BenchDatabase, app: psycopg.Connection[Any]) -> list[int]:
    """The server processes working for the long-lived engine (its pool and journal) and for
    its application connection."""
    with psycopg.connect(database.admin_url, autocommit=True) as admin:
        rows = admin.execute(
            "SELECT pid FROM pg_stat_activity WHERE application_name = 'bench-engine' OR pid = %s",
            (app.info.backend_pid,),
        ).fetchall()
    return [int(row[0]) for row in rows]


def _cpu_seconds(pids: list[int]) -> float:
    """User + system CPU time of local processes, from /proc."""
    ticks = 0
    for pid in pids:
        try:
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        ticks += int(fields[11]) + int(fields[12])
    return ticks / os.sysconf("SC_CLK_TCK")


def _step_breakdown(database: BenchDatabase) -> str:
    """Median time of each step (from control.job_step_runs) and the paths recorded."""
    with psycopg.connect(database.owner_url) as conn:
        rows = conn.execute(
            "SELECT left(tenant_id, 4) AS variant, step, detail, "
            "extract(epoch FROM finished_at - started_at) * 1000 AS ms "
            "FROM control.job_step_runs WHERE outcome = 'succeeded' "
            "AND (tenant_id LIKE 'fast%%' OR tenant_id LIKE 'slow%%')"
        ).fetchall()
    by: dict[tuple[str, str], list[float]] = defaultdict(list)
    paths: dict[str, set[str]] = defaultdict(set)
    for variant, step, detail, ms in rows:
        by[(variant, step)].append(float(ms))
        if step == "run_tenant_migrations":
            paths[variant].add(detail)
    lines = [f"{'step (median ms, from job_step_runs)':<40} {'fast path':>10} {'Alembic':>10}"]
    for step in STEPS:
        fast = statistics.median(by.get(("fast", step), [0.0]))
        slow = statistics.median(by.get(("slow", step), [0.0]))
        lines.append(f"{step:<40} {fast:>10.1f} {slow:>10.1f}")
    for variant, label in (("fast", "fast path"), ("slow", "fast path off")):
        lines.append(f"recorded ({label}): {'; '.join(sorted(paths[variant]))}")
    lines.append(
        "(a step after the first starts when the one before it finished: its time includes "
        "that hand-over)"
    )
    return "\n".join(lines)
