"""The worker's Prometheus metrics, served on ``PROVISIONER_METRICS_PORT`` (off by default;
``PROVISIONER_METRICS_HOST``, the loopback unless the operator says otherwise).

Two sources, one registry (the worker's own, not the library's global one):

* **Counted in the parent** as the children's typed messages arrive
  (:mod:`provisioner.worker.supervisor`): ``provisioner_jobs_total{kind,outcome}`` at each
  outcome the parent logs (a child's settled job, or one the parent settled itself), and
  ``provisioner_step_duration_seconds{kind,step}`` at each step a child reports done or failed.
  The children already tell the parent everything, so no multiprocess mode (and no shared
  directory of files) is needed: one process owns every counter.
* **Read from the database at each scrape** by :class:`FleetCollector`, on its own connection:
  the queue by kind and status and the oldest ready job's wait (one statement for every kind),
  the warm pool's spares, the newest rollout's tenants by phase, each component's heartbeat
  age, the tenants by their last recorded drift check, each server's tenants, capacity and
  status (:func:`provisioner.fleet.overview.read`). A scrape while the database is down still
  answers: the counters, and ``provisioner_database_up 0``.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import suppress
from typing import Any

import psycopg
from prometheus_client import CollectorRegistry, Counter, Histogram, start_http_server
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from provisioner import db
from provisioner.errors import ProvisionerError
from provisioner.fleet import overview
from provisioner.servers.directory import CONTROL, Placement
from provisioner.settings import Settings

#: Step durations run from milliseconds (a grant) to minutes (a big migration).
STEP_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0)


class FleetCollector(Collector):
    """The gauges read from the database at each scrape (in the HTTP server's thread)."""

    def __init__(self, settings: Settings, application_name: str) -> None:
        self._url = settings.owner_url
        self._app_roles = settings.app_roles
        self._name = application_name
        self._conn: psycopg.Connection[Any] | None = None
        self._lock = threading.Lock()  # one scrape at a time on the one connection

    def collect(self) -> Iterator[Metric]:
        with self._lock:
            try:
                found = self._read()
            except (ProvisionerError, psycopg.Error):
                self.close()
                found = None
        up = GaugeMetricFamily(
            "provisioner_database_up", "1 when the last scrape could read the control schema"
        )
        up.add_metric([], 0 if found is None else 1)
        yield up
        if found is not None:
            yield from _families(found)

    def _read(self) -> overview.Overview:
        if self._conn is None:
            self._conn = db.connect(self._url, application_name=self._name, autocommit=True)
        with db.translated(), self._conn.transaction():
            return overview.read(self._conn, self._app_roles)

    def close(self) -> None:
        if self._conn is not None:
            with suppress(Exception):
                self._conn.close()
            self._conn = None


def _families(found: overview.Overview) -> Iterator[Metric]:
    jobs = GaugeMetricFamily(
        "provisioner_queue_jobs", "Jobs in control.platform_jobs", labels=["kind", "status"]
    )
    oldest = GaugeMetricFamily(
        "provisioner_queue_oldest_age_seconds",
        "How long the oldest job a worker could claim now has waited (0: none waits)",
        labels=["kind"],
    )
    for figure in found.queue:
        jobs.add_metric([figure.job_type, figure.status.value], figure.jobs)
    for kind in sorted({f.job_type for f in found.queue}):
        waits = [f.oldest_ready_seconds for f in found.queue if f.job_type == kind]
        oldest.add_metric([kind], max((w for w in waits if w is not None), default=0.0))
    tenants = GaugeMetricFamily(
        "provisioner_tenants", "Tenants by lifecycle state", labels=["state"]
    )
    for state, count in found.tenants.items():
        tenants.add_metric([state], count)
    spares = GaugeMetricFamily(
        "provisioner_pool_spares", "Warm pool spare schemas", labels=["state"]
    )
    spares.add_metric(["ready"], found.pool.ready)
    spares.add_metric(["stale"], found.pool.stale)
    spares.add_metric(["unfinished"], found.pool.unfinished)
    rollout = GaugeMetricFamily(
        "provisioner_rollout_tenants",
        "The newest rollout's tenants by phase",
        labels=["state"],
    )
    for phase, count in sorted(found.rollout_phases.items()):
        rollout.add_metric([phase], count)
    beats = GaugeMetricFamily(
        "provisioner_worker_heartbeat_age_seconds",
        "Seconds since each component's last heartbeat, by the database clock",
        labels=["component"],
    )
    for component, age in found.heartbeats.items():
        beats.add_metric([component], age)
    checked = GaugeMetricFamily(
        "provisioner_tenants_checked",
        "Tenants (not purged) by the outcome of their last drift check ('never checked': none)",
        labels=["outcome"],
    )
    for outcome, count in found.drift.tenants.items():
        checked.add_metric([outcome], count)
    last_check = GaugeMetricFamily(
        "provisioner_drift_last_check_timestamp_seconds",
        "When the newest recorded drift check ran (Unix time; absent: never)",
    )
    if found.drift.last_checked_at is not None:
        last_check.add_metric([], found.drift.last_checked_at.timestamp())
    yield from (jobs, oldest, tenants, spares, rollout, beats, checked, last_check)
    yield from _server_families(found.servers)


def _server_families(placed: Placement) -> Iterator[Metric]:
    """Each server's tenants (the control database's as ``control``), capacity (a server
    without a limit has none) and status (1 for its current one; tenant servers only)."""
    tenants = GaugeMetricFamily(
        "provisioner_server_tenants",
        "Tenants (not purged) on each server; the control database is 'control'",
        labels=["server"],
    )
    capacity = GaugeMetricFamily(
        "provisioner_server_capacity",
        "Each tenant server's capacity in tenants (absent: no limit)",
        labels=["server"],
    )
    status = GaugeMetricFamily(
        "provisioner_server_status",
        "1 for each tenant server's current status (active, draining, full, retired)",
        labels=["server", "status"],
    )
    tenants.add_metric([CONTROL], placed.on_control)
    for server in placed.servers:
        tenants.add_metric([server.name], server.placed)
        if server.capacity is not None:
            capacity.add_metric([server.name], server.capacity)
        status.add_metric([server.name, server.status.value], 1)
    yield from (tenants, capacity, status)


class WorkerMetrics:
    """The worker's registry, its counters, and the HTTP server that serves them."""

    def __init__(self, settings: Settings, instance_id: str) -> None:
        self.registry = CollectorRegistry()
        self.jobs = Counter(
            "provisioner_jobs",
            "Job runs this worker ended, by kind and outcome",
            ["kind", "outcome"],
            registry=self.registry,
        )
        self.steps = Histogram(
            "provisioner_step_duration_seconds",
            "Time each step took in this worker's engine processes (done or failed)",
            ["kind", "step"],
            buckets=STEP_BUCKETS,
            registry=self.registry,
        )
        self.collector = FleetCollector(settings, f"{instance_id}:metrics")
        self.registry.register(self.collector)
        self._host = settings.metrics_host
        self._port = settings.metrics_port or 0
        self._server: Any = None

    def start(self) -> tuple[str, int]:
        """Listen; the address and port bound (the port chosen when 0 was asked for)."""
        self._server, _ = start_http_server(self._port, self._host, registry=self.registry)
        host, port = self._server.server_address[:2]
        return str(host), int(port)

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None
        self.collector.close()

    def job_ended(self, kind: str, outcome: str) -> None:
        self.jobs.labels(kind, outcome).inc()

    def step_timed(self, kind: str, step: str, seconds: float) -> None:
        self.steps.labels(kind, step).observe(seconds)
