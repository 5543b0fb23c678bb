"""The worker's Prometheus metrics: a real worker with ``PROVISIONER_METRICS_PORT`` set runs
real jobs, the endpoint is scraped over HTTP, and every figure is checked against the rows of
``control.platform_jobs`` and ``control.job_step_runs``."""

from __future__ import annotations

import socket
import urllib.request
from collections import Counter
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

import psycopg
import pytest
from prometheus_client.parser import text_string_to_metric_families
from psycopg.rows import dict_row

from provisioner import queue, service
from provisioner.servers import ServerStatus
from provisioner.settings import Settings
from provisioner.templates import migrations
from provisioner.testing import Tenant
from provisioner.worker.metrics import WorkerMetrics
from tests.conftest import Database, run_cli
from tests.integration.test_fleet_upgrade import make_tree
from tests.workers import Workers, wait_until

TENANTS = ["met_a", "met_b"]
UPGRADED = ["met_up_a", "met_up_b", "met_up_c"]

Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]


@pytest.fixture
def fast(settings: Settings) -> Settings:
    return replace(settings, heartbeat_seconds=0.5, job_stale_after_seconds=30.0)


def scrape(port: int) -> Samples:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as response:
        text = response.read().decode()
    return {
        (sample.name, tuple(sorted(sample.labels.items()))): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    }


def labelled(samples: Samples, name: str) -> dict[tuple[tuple[str, str], ...], float]:
    return {labels: value for (n, labels), value in samples.items() if n == name}


def rows(database: Database, statement: str) -> list[dict]:
    with psycopg.connect(database.owner_url, row_factory=dict_row) as conn:
        return conn.execute(statement).fetchall()


@pytest.mark.slow
def test_a_scrape_while_the_worker_runs_jobs_matches_the_queue_rows(
    fast: Settings,
    database: Database,
    workers: Workers,
    tmp_path: Path,
    tenant_factory: Callable[..., Tenant],
) -> None:
    # Three tenants at the packaged head, queued for an upgrade to a new revision (a rollout);
    # two more queued for provisioning: the worker runs all five.
    for tenant in UPGRADED:
        tenant_factory(tenant, settings=fast)
    tree = {migrations.TENANT_TREE_ENV: str(make_tree(tmp_path))}
    assert run_cli(fast, "upgrade", "--all", env=tree).returncode == 0
    for tenant in TENANTS:
        service.enqueue(fast, tenant)
    # A kind no worker here drains: it waits in the queue, the oldest ready job.
    with psycopg.connect(database.owner_url) as conn:
        queue.enqueue(conn, "not_drained_here", idempotency_key="z")
        cancelled = queue.enqueue(conn, "not_drained_here", idempotency_key="y").job
        queue.cancel(conn, cancelled.id)

    worker = workers.start(env={"PROVISIONER_METRICS_PORT": "0", **tree})
    listening = worker.wait_for("metrics_listening")
    assert listening["host"] == "127.0.0.1"
    port = int(listening["port"])

    def all_done() -> bool:
        found = rows(database, "SELECT status FROM control.platform_jobs")
        return Counter(r["status"] for r in found)["succeeded"] == len(TENANTS) + len(UPGRADED)

    wait_until(all_done, 60, "the worker to provision and upgrade every tenant")
    wait_until(lambda: labelled(scrape(port), "provisioner_jobs_total"), 30, "the outcomes counted")
    samples = scrape(port)

    by_status = rows(
        database,
        "SELECT job_type, status, count(*) AS n FROM control.platform_jobs GROUP BY 1, 2",
    )
    assert labelled(samples, "provisioner_queue_jobs") == {
        (("kind", r["job_type"]), ("status", r["status"])): float(r["n"]) for r in by_status
    }
    assert labelled(samples, "provisioner_jobs_total") == {
        (("kind", "provision_tenant"), ("outcome", "succeeded")): float(
            len(TENANTS) + len(UPGRADED)
        )
    }
    oldest = labelled(samples, "provisioner_queue_oldest_age_seconds")
    assert oldest[(("kind", "not_drained_here"),)] > 0
    assert oldest[(("kind", "provision_tenant"),)] == 0

    steps = rows(
        database,
        "SELECT step, count(*) AS n FROM control.job_step_runs WHERE outcome = 'succeeded' "
        "AND worker LIKE 'worker:%%' GROUP BY step",
    )
    counts = labelled(samples, "provisioner_step_duration_seconds_count")
    assert counts == {
        (("kind", "provision_tenant"), ("step", r["step"])): float(r["n"]) for r in steps
    }
    sums = labelled(samples, "provisioner_step_duration_seconds_sum")
    assert all(value > 0 for value in sums.values())

    assert labelled(samples, "provisioner_tenants") == {
        (("state", r["state"]),): float(r["n"])
        for r in rows(database, "SELECT state, count(*) AS n FROM control.tenants GROUP BY 1")
    }
    assert labelled(samples, "provisioner_pool_spares") == {
        (("state", "ready"),): 0.0,
        (("state", "stale"),): 0.0,
        (("state", "unfinished"),): 0.0,
    }
    phases = rows(
        database,
        "SELECT CASE WHEN j.status = 'succeeded' THEN 'done' ELSE j.status END AS phase, "
        "count(*) AS n FROM control.rollout_tenants t "
        "JOIN control.platform_jobs j ON j.id = t.job_id GROUP BY 1",
    )
    assert (
        labelled(samples, "provisioner_rollout_tenants")
        == {(("state", r["phase"]),): float(r["n"]) for r in phases}
        == {(("state", "done"),): float(len(UPGRADED))}
    )
    beats = labelled(samples, "provisioner_worker_heartbeat_age_seconds")
    assert set(beats) == {(("component", "provisioner-worker"),)}
    assert samples[("provisioner_database_up", ())] == 1.0
    assert worker.stop() == 0


SERVER_GAUGES = (
    "provisioner_server_tenants",
    "provisioner_server_capacity",
    "provisioner_server_status",
)


def server_gauges(samples: Samples) -> dict[str, dict[tuple[tuple[str, str], ...], float]]:
    return {name: labelled(samples, name) for name in SERVER_GAUGES}


def test_the_server_gauges_count_each_servers_tenants_capacity_and_status(
    settings: Settings, database: Database
) -> None:
    """Scraped over HTTP from the worker's registry (no worker process needed: the gauges are
    read at each scrape). The directory's servers are never contacted, so their references
    name services that need not exist."""
    service.enqueue(settings, "srv_home")  # no server yet: the control database
    service.enqueue(settings, "srv_gone")
    with database.owner() as conn:  # purged: counted nowhere
        conn.execute("UPDATE control.tenants SET state = 'deleted' WHERE tenant_id = 'srv_gone'")
    metrics = WorkerMetrics(settings, "test-servers")
    _, port = metrics.start()
    try:
        assert server_gauges(scrape(port)) == {
            "provisioner_server_tenants": {(("server", "control"),): 1.0},
            "provisioner_server_capacity": {},
            "provisioner_server_status": {},
        }
        service.add_server(settings, "east", "service=east_unused", capacity=4)
        service.add_server(settings, "west", "service=west_unused", weight=2)
        service.enqueue(settings, "srv_east", server="east")
        service.set_server_status(settings, "west", ServerStatus.DRAINING)
        samples = scrape(port)
    finally:
        metrics.stop()
    assert server_gauges(samples) == {
        "provisioner_server_tenants": {
            (("server", "control"),): 1.0,
            (("server", "east"),): 1.0,
            (("server", "west"),): 0.0,
        },
        "provisioner_server_capacity": {(("server", "east"),): 4.0},
        "provisioner_server_status": {
            (("server", "east"), ("status", "active")): 1.0,
            (("server", "west"), ("status", "draining")): 1.0,
        },
    }
    assert samples[("provisioner_database_up", ())] == 1.0


def test_the_metrics_are_off_unless_a_port_is_set_and_a_bad_port_is_refused() -> None:
    assert Settings.from_env({}).metrics_port is None
    assert Settings.from_env({}).metrics_host == "127.0.0.1"
    chosen = Settings.from_env({"PROVISIONER_METRICS_PORT": "9464"})
    assert (chosen.metrics_host, chosen.metrics_port) == ("127.0.0.1", 9464)
    for bad in ("http", "-1", "70000"):
        with pytest.raises(Exception, match="PROVISIONER_METRICS_PORT must be a port number"):
            Settings.from_env({"PROVISIONER_METRICS_PORT": bad})


def test_a_metrics_port_already_taken_stops_the_start_in_one_line(
    fast: Settings, workers: Workers
) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        worker = workers.start(env={"PROVISIONER_METRICS_PORT": str(port)})
        assert worker.wait(60) == 2
    lines = [line for line in worker.output().splitlines() if line.strip()]
    assert lines == [f"error: cannot serve metrics on 127.0.0.1:{port}: Address already in use"]
