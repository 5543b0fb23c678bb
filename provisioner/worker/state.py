"""The worker parent's state: what it knows, what its heartbeat reports, how it logs an outcome.

The parent is one object whose concerns live in one module each, stacked as base classes over
this state (one object, so the loop, the database work and the children's messages share it
without callbacks between them):

    WorkerState   state.py       the fields, the heartbeat's snapshot, outcome logging
    DatabaseWork  database.py    the parent's connections, recovery, claims, settling orphans
    Supervisor    supervisor.py  the engine processes: spawning, their messages, their exits
    Worker        loop.py        start, the event loop, signals and the drain, shutdown
"""

from __future__ import annotations

import logging
import multiprocessing
import os
import selectors
import socket
import threading
from collections import Counter
from contextlib import suppress
from datetime import UTC, datetime
from enum import Enum
from typing import Any

import psycopg

from provisioner import kinds, logs, pool
from provisioner.control import heartbeats
from provisioner.engine.holder import holder_id
from provisioner.logs import event, job_fields
from provisioner.models import Job
from provisioner.settings import Settings
from provisioner.version import __version__
from provisioner.worker.heartbeat import Heartbeat, Outage
from provisioner.worker.metrics import WorkerMetrics
from provisioner.worker.options import WorkerOptions
from provisioner.worker.orphans import DeadHolder, Orphan
from provisioner.worker.processes import EngineProcess


class Wakeup(Enum):
    """What the parent's selector woke up for, besides an engine process's pipe (whose key is
    the :class:`EngineProcess` itself)."""

    #: a SIGTERM or SIGINT (written by ``signal.set_wakeup_fd``)
    SIGNAL = "signal"
    #: a NOTIFY on the listen connection
    LISTEN = "listen"
    #: the warm pool built a spare
    BUILT = "built"


#: The data of a key of the parent's selector.
Source = Wakeup | EngineProcess


class WorkerState:
    """The parent's fields; the heartbeat thread reads them under ``_lock``."""

    def __init__(
        self,
        settings: Settings,
        options: WorkerOptions,
        log: logging.Logger,
        storage: dict[str, Any],
    ) -> None:
        self.settings = settings
        self.options = options
        self.log = log
        self.storage = storage
        self.job_types = list(kinds.worker_job_types(settings))
        #: the kinds the application runs: their jobs keep no step journal to close on recovery
        self.application_kinds = kinds.for_settings(settings).application_kinds
        self.instance_id = holder_id("worker")
        self.started_at = datetime.now(UTC).isoformat(timespec="seconds")
        self.stats: Counter[str] = Counter()
        self.woke: Counter[str] = Counter()
        self.last_woke: str | None = None
        self.state = "starting"
        self.outage = Outage(log)
        #: since when (monotonic) and why the queue work keeps failing; None while it works
        self.queue_failure: tuple[float, str] | None = None
        self._lock = threading.Lock()  # children's jobs and orphans, read by the heartbeat
        self._mp = multiprocessing.get_context("spawn")
        self._children: list[EngineProcess] = []
        self._orphans: list[Orphan] = []
        self._dead: list[DeadHolder] = []
        self._selector = selectors.DefaultSelector()
        self._conn: psycopg.Connection[Any] | None = None
        self._listen: psycopg.Connection[Any] | None = None
        self._listen_fd: int | None = None
        self._pending: str | None = "start"  # why the next claim happens; None: queue empty
        self._was_idle = False
        self._claims = 0  # claims the children reported, to tell a stale "nothing queued"
        self._next_poll = 0.0
        self._next_recovery = 0.0
        self._db_retry_at = 0.0
        self._db_delay = 0.5
        self._signals = 0
        self._deadline: float | None = None  # set when draining
        self._wake_r, self._wake_w = socket.socketpair()
        #: the pool keeper's thread writes a byte here after the spare that fills the pool
        self._built_r, self._built_w = socket.socketpair()
        self._heartbeat = Heartbeat(settings, self.instance_id, self.snapshot, self.outage)
        #: the Prometheus metrics (None unless PROVISIONER_METRICS_PORT is set)
        self.metrics: WorkerMetrics | None = None
        if settings.metrics_port is not None:
            self.metrics = WorkerMetrics(settings, self.instance_id)
        self._pool: pool.PoolKeeper | None = None
        if settings.pool_size > 0:
            self._pool = pool.PoolKeeper(
                settings.owner_url,
                settings.pool_size,
                f"{self.instance_id}:pool",
                self.idle,
                log,
                app_roles=settings.app_roles,  # spares carry their grants, all but USAGE
                on_built=self._spare_built,
                builders=options.concurrency or 1,  # while idle, as many builds as children
                alive_seconds=settings.holder_lease_seconds,  # placement's trust in the beat
            )

    def idle(self) -> bool:
        """No job running, none waiting to be claimed, not draining: the warm pool may build."""
        with self._lock:
            busy = any(c.busy for c in self._children)
        return self._pending is None and self._deadline is None and not busy

    def _spare_built(self) -> None:
        """In the pool keeper's thread: wake the loop (which alone talks to the children)."""
        with suppress(OSError):  # a full socket already holds a wake-up; a closed one: stopping
            self._built_w.send(b"b")

    # -- logging and heartbeat ---------------------------------------------------------------

    def _log_outcome(self, job: Job, *, released: bool, seconds: float | None) -> None:
        self.stats["done"] += 1
        outcome = logs.job_outcome(self.log, job, released=released, seconds=seconds)
        self.stats[outcome] += 1
        if self.metrics is not None:
            self.metrics.job_ended(job.job_type, outcome)

    def _log_lease_lost(self, job: Job, detail: str) -> None:
        self.stats["lease_lost"] += 1
        if self.metrics is not None:
            self.metrics.job_ended(job.job_type, "lease_lost")
        event(
            self.log,
            "lease_lost",
            logging.WARNING,
            **job_fields(job),
            detail=detail,
            message="another worker took the job over; nothing was recorded",
        )

    def snapshot(self) -> tuple[dict[str, Any], list[str]]:
        """The heartbeat's detail, and the lease holders whose jobs it renews."""
        with self._lock:
            current = [
                {**job_fields(c.job), "job_id": str(c.job.id), "step": c.step, "holder": c.holder}
                for c in self._children
                if c.job is not None
            ]
            holders = {c.holder for c in self._children if c.holder}
            holders |= {o.job.locked_by for o in self._orphans if o.job.locked_by}
        detail = {
            "state": self.state,
            "job_types": sorted(self.job_types),
            "version": __version__,
            "pid": os.getpid(),
            "started_at": self.started_at,
            "concurrency": self.options.concurrency,
            "current_jobs": current,
            "jobs_done": self.stats["done"],
            "jobs_succeeded": self.stats["succeeded"],
            "jobs_recovered": self.stats["recovered"],
            "claims_asked": self.stats["claims_asked"],
            "woke": dict(self.woke),
            "last_woke": self.last_woke,
            "storage": self.storage,
            "queue_error": heartbeats.queue_error(self.queue_failure),
        }
        if self._pool is not None:
            detail["pool"] = self._pool.status()
        return detail, sorted(holders)
