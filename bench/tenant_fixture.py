"""The pytest plugin's ``tenant`` fixture: what a fresh tenant costs a test, on a warm session.

Each round measures, round-robin so drifting load affects them alike:

* ``fixture``: the fixture's work for one test, setup and teardown - a spare handed out by
  schema rename (:meth:`provisioner.testing.TenantFactory.create`) and dropped afterwards -
  including any wait for the factory's builder thread, which builds the spares in the
  background (a test waits only when the builder has not caught up: for one spare, never a
  batch).
* ``fixture_provision``: the same tenant provisioned through the engine
  (:func:`provisioner.service.provision`) and dropped, which is what a fixture without spares
  would cost.
* ``fixture_raw`` (the baseline): the tenant's end state as plain SQL in one round trip, then
  dropped.

All three run where the plugin runs: on a throwaway cluster started as the plugin starts it
(:meth:`provisioner.testing.PgServer.start`, ``fsync=off``), not on the benchmark's durable
cluster, and in a database made as the plugin makes it.
"""

from __future__ import annotations

import shutil
import statistics
import tempfile
import time
from collections import defaultdict
from pathlib import Path

import psycopg

from bench.cluster import BenchCluster, say
from bench.figures import Figure, Results
from bench.provisioning import raw_script
from provisioner import service
from provisioner.templates.replay import Template
from provisioner.tenant import schema as tenant_schema
from provisioner.testing import PgServer, ProvisionerDatabase, TenantFactory


def run(cluster: BenchCluster, results: Results, rounds: int) -> None:
    del cluster  # the plugin's own kind of server instead (see the module docstring)
    server = PgServer.start(None)
    work = Path(tempfile.mkdtemp(prefix="bench-fixture-"))
    try:
        plugin_db = ProvisionerDatabase.create(server, work)
        _run(plugin_db, results, rounds)
    finally:
        server.stop()
        shutil.rmtree(work, ignore_errors=True)


def _run(plugin_db: ProvisionerDatabase, results: Results, rounds: int) -> None:
    factory = TenantFactory(plugin_db)
    # Warm session: the first batch of spares (and the process's reference schema) is built.
    factory.drop(factory.create("warm"))
    service.provision(plugin_db.settings, "reference")
    with psycopg.connect(plugin_db.owner_url) as conn:
        tables, sequences = tenant_schema.relations(conn, "tenant_reference")
    template = Template.capture()
    raw_conn = psycopg.connect(plugin_db.owner_url)
    samples: dict[str, list[float]] = defaultdict(list)

    def fixture(i: int) -> None:
        started = time.perf_counter()
        factory.drop(factory.create(f"fx_{i}"))
        samples["fixture"].append((time.perf_counter() - started) * 1000)

    def provision(i: int) -> None:
        started = time.perf_counter()
        service.provision(plugin_db.settings, f"pv_{i}")
        factory.drop(f"pv_{i}")
        samples["fixture_provision"].append((time.perf_counter() - started) * 1000)

    def raw(i: int) -> None:
        schema = f"tenant_rw_{i}"
        script = raw_script(raw_conn, schema, template, tables, sequences)
        started = time.perf_counter()
        raw_conn.execute(script)
        raw_conn.commit()
        raw_conn.execute(f'DROP SCHEMA "{schema}" CASCADE')
        raw_conn.commit()
        samples["fixture_raw"].append((time.perf_counter() - started) * 1000)

    try:
        for i in range(rounds):
            for variant in (fixture, provision, raw):
                variant(i)
            if (i + 1) % 20 == 0:
                say(f"  fixture: round {i + 1}/{rounds}")
    finally:
        raw_conn.close()
        factory.close()

    results.add(
        Figure(
            "fixture_raw",
            "raw SQL tenant end state + DROP SCHEMA, per test",
            "ms",
            samples["fixture_raw"],
            note="baseline",
        )
    )
    results.add(
        Figure(
            "fixture_provision",
            "tenant fixture without spares: service.provision + drop",
            "ms",
            samples["fixture_provision"],
            baseline="fixture_raw",
        )
    )
    mean = statistics.fmean(samples["fixture"])
    results.add(
        Figure(
            "fixture",
            "tenant fixture (spare by rename, drop after), per test",
            "ms",
            samples["fixture"],
            baseline="fixture_raw",
            note=(
                f"mean {mean:.1f} ms, p90 {statistics.quantiles(samples['fixture'], n=10)[-1]:.1f}"
                f" ms; {factory.batch} spares kept ready by a background thread"
            ),
            percentiles=True,
        )
    )
