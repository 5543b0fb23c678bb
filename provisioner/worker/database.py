"""The parent's own database work: its two connections (one autocommit, for ``LISTEN``), stale
recovery, asking idle children to claim, settling what no child will, and the capped backoff
after an outage (logged once, by :class:`~provisioner.worker.heartbeat.Outage`).

The parent never claims or runs a job itself: each child claims under its own holder id.
"""

from __future__ import annotations

import logging
import selectors
import time
from contextlib import suppress

from provisioner import db, queue
from provisioner.engine import describe
from provisioner.errors import LeaseLost, ProvisionerError
from provisioner.logs import event, job_fields
from provisioner.settings import Settings
from provisioner.worker.heartbeat import DB_ERRORS
from provisioner.worker.options import RECONNECT_CAP_SECONDS
from provisioner.worker.processes import ClaimNext
from provisioner.worker.state import Wakeup, WorkerState
from provisioner.worker.wakeups import next_to_ask


def recovery_interval(settings: Settings) -> float:
    """How often the parent looks for abandoned jobs: every heartbeat (a dead holder's jobs
    are queued again at most one interval after its lease ran out), or a quarter of the stale
    threshold when that is shorter."""
    return min(settings.heartbeat_seconds, settings.job_stale_after_seconds / 4)


class DatabaseWork(WorkerState):
    """Everything the parent does on its own connection, between two waits of the loop."""

    def _database_work(self, now: float) -> None:
        try:
            self._ensure_connection()
            self._settle_orphans()
            if now >= self._next_recovery:
                self._recover()
                self._next_recovery = now + recovery_interval(self.settings)
            if self._deadline is None:
                self._claim()
        except DB_ERRORS as exc:
            self._database_down(exc, "queue")
            self._queue_failed(str(exc))
            return
        self._db_delay = 0.5
        self.outage.recovered()

    def _queue_failed(self, error: str) -> None:
        """Remember since when the queue work keeps failing (the heartbeat reports it); a claim
        that comes back, with a job or with nothing to do, clears it."""
        if self.queue_failure is None:
            self.queue_failure = (time.monotonic(), error)

    def _ensure_connection(self) -> None:
        if self._conn is not None:
            return
        # The owner's URL: app_rw may not claim or settle provisioning rows (control c005).
        name, url = self.instance_id, self.settings.owner_url
        self._conn = db.connect(url, application_name=name)
        self._listen = db.connect(url, application_name=f"{name}:listen", autocommit=True)
        with db.translated():
            queue.listen(self._listen)
        self._listen_fd = self._listen.fileno()
        self._selector.register(self._listen_fd, selectors.EVENT_READ, Wakeup.LISTEN)
        if self._pending is None:
            self._pending = "reconnect"  # wake-ups sent while we were away are lost

    def _database_down(self, exc: ProvisionerError, where: str) -> None:
        self._close_connections()
        self._db_retry_at = time.monotonic() + self._db_delay
        self.outage.failed(exc, where, self._db_delay)
        self._db_delay = min(self._db_delay * 2, RECONNECT_CAP_SECONDS)

    def _close_connections(self) -> None:
        if self._listen_fd is not None:
            with suppress(KeyError, ValueError, OSError):
                self._selector.unregister(self._listen_fd)
            self._listen_fd = None
        for conn in (self._conn, self._listen):
            if conn is not None:
                with suppress(Exception):
                    conn.close()
        self._conn = self._listen = None

    def _recover(self) -> None:
        assert self._conn is not None
        with db.translated():
            jobs = queue.recover_stale(
                self._conn,
                self.settings.job_stale_after_seconds,
                self.application_kinds,
            )
            queue.forget_silent_holders(self._conn)
            self._conn.commit()
        for job in jobs:
            self.stats["recovered"] += 1
            event(
                self.log,
                "recovered",
                logging.WARNING,
                **job_fields(job),
                status=job.status.value,
                steps_done=len(job.steps_completed),
            )
        if jobs and self._pending is None:
            self._pending = "drain"

    def _claim(self) -> None:
        """Ask one idle engine process to claim a job (it claims, runs and settles it); the
        pending reason is consumed by the ask (worker/wakeups.py)."""
        if self._pending is None:
            return
        child = next_to_ask(self._children)
        if child is None:
            return
        child.asking, child.asked_at_claim = self._pending, self._claims
        self._pending = None
        self._next_poll = time.monotonic() + self.settings.poll_interval_seconds
        self.stats["claims_asked"] += 1
        if not child.send(ClaimNext(tuple(self.job_types))):
            child.asking = None  # gone: its exit is handled when its pipe closes
            self._pending = "drain"

    def _settle_orphans(self) -> None:
        assert self._conn is not None
        for dead in list(self._dead):
            reported = [dead.reported] if dead.reported else []
            with db.translated():
                jobs = queue.release_unreported(self._conn, dead.holder, reported)
                self._conn.commit()
            for job in jobs:
                self._log_outcome(job, released=True, seconds=None)
            if jobs and self._pending is None:
                self._pending = "drain"  # handed back without a NOTIFY
            self._dead.remove(dead)
        for orphan in list(self._orphans):
            lease = orphan.job.lease
            try:
                with db.translated():
                    # Its process gave the job up: a step run it opened stays open otherwise
                    # (the step's end could not be recorded, e.g. across a failover).
                    queue.abandon_step_runs(
                        self._conn,
                        lease,
                        queue.PROCESS_DIED if orphan.child_gone else queue.UNRECORDED,
                    )
                    if orphan.release:
                        job = queue.release(self._conn, lease)
                    else:
                        job = queue.fail_or_retry(
                            self._conn,
                            lease,
                            orphan.reason,
                            permanent=orphan.permanent,
                            at_once=orphan.cut,
                        )
                    self._conn.commit()
            except LeaseLost as exc:
                with db.translated():
                    self._conn.rollback()
                self._log_lease_lost(orphan.job, describe(exc))
            else:
                self._log_outcome(job, released=orphan.release, seconds=None)
            with self._lock:
                self._orphans.remove(orphan)

    def _on_wake_up(self) -> None:
        if self._listen is None:
            return
        try:
            with db.translated():
                types = queue.wake_ups(self._listen)
        except DB_ERRORS as exc:
            self._database_down(exc, "listen")
            return
        if self._pending is None and any(t in self.job_types for t in types):
            self._pending = "notify"
