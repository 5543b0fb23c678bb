"""The provisioner worker: recover, heartbeat, listen, claim, run, finish, drain.

One parent process and ``concurrency`` engine processes (:mod:`provisioner.worker.processes`).

* The **parent** supervises: stale recovery at start and every quarter of the stale
  threshold; ``LISTEN provisioner_jobs`` on its own autocommit connection, with polling as the
  backstop for a lost notification; asking each idle child to drain the queue (at most
  ``concurrency`` jobs at once); settling only what a child could not (the child died, or the
  database was down when the step failed) and handing back a dead child's claim it never
  reported; signals and the drain.
* Each **engine process** owns its jobs' lives (:mod:`provisioner.engine.runner`): it claims a job
  under its own holder id, runs its kind's steps, settles it, and reports a typed outcome; the
  job's last step claims the next one, and the child goes on unasked until a claim finds
  nothing (:mod:`provisioner.worker.processes`).
* A **heartbeat thread**, on its own connection, upserts the component's row in
  ``control.runtime_heartbeats`` every interval and, in the same transaction, renews
  ``locked_at`` of every job the children hold: a long step on a live worker is never taken for
  abandoned, and a worker that stops beating loses its jobs to recovery once the lease expires.
  Every write of the engine is fenced by the lease, so a worker that was presumed dead (frozen,
  partitioned) and wakes up records nothing.

Each claim is logged with how the worker woke: ``start``, ``notify`` (an enqueue's NOTIFY),
``poll`` (the backstop timer), ``drain`` (the last claim or job end: the queue may hold more),
``reconnect`` (after a database outage, when wake-ups may have been lost).

A database outage is logged once (and once more when it is over); the parent reconnects with a
capped backoff, the engine's pool reconnects on its own, and a job whose failure could not be
recorded is settled as soon as the database answers.

On SIGTERM or SIGINT the worker stops claiming and lets each running step finish (the engine
releases the job between steps, progress kept), bounded by the drain timeout; then it
interrupts the step (its transaction rolls back) and releases the job. A second signal ends the
drain at once. The last heartbeat says ``stopped``; the exit code is 0.
"""

from __future__ import annotations

import logging
import multiprocessing
import os
import select
import selectors
import signal
import socket
import threading
import time
from collections import Counter
from contextlib import suppress
from dataclasses import dataclass
from datetime import UTC, datetime
from multiprocessing.connection import Connection
from typing import Any, assert_never
from uuid import UUID

import psycopg

from provisioner import db, kinds, logs, pool, queue, service
from provisioner.control import heartbeats
from provisioner.engine import describe, runner
from provisioner.errors import (
    ConfigurationError,
    DatabaseUnavailable,
    LeaseLost,
    ProvisionerError,
)
from provisioner.logs import event, job_fields
from provisioner.models import Job
from provisioner.settings import Settings
from provisioner.version import __version__
from provisioner.worker.heartbeat import DB_ERRORS, Heartbeat, Outage
from provisioner.worker.processes import (
    Claimed,
    ClaimNext,
    EngineProcess,
    FromChild,
    JobEnded,
    Quit,
    Ready,
    StepReport,
    Stop,
    Warm,
)
from provisioner.worker.startup import check_configuration, check_database, storage_status

#: Longest wait between two reconnection attempts after the database went away.
RECONNECT_CAP_SECONDS = 5.0
#: How long the children get to start (imports, engine) before the worker gives up.
CHILD_START_TIMEOUT_SECONDS = 120.0
#: After the drain timeout, how long an interrupted child gets to roll back and report.
INTERRUPT_GRACE_SECONDS = 5.0


@dataclass(frozen=True)
class WorkerOptions:
    once: bool = False
    concurrency: int = 1
    allow_superuser: bool = False


def run_worker(settings: Settings, options: WorkerOptions, log: logging.Logger) -> int:
    """Check, start and run the worker until it is stopped (or, with ``once``, drained)."""
    check_configuration(settings)
    delay = 0.5
    while True:
        try:
            check_database(settings, allow_superuser=options.allow_superuser, log=log)
            break
        except DatabaseUnavailable as exc:
            if options.once:  # a one-shot run that cannot start is refused, not retried
                raise ConfigurationError(f"cannot start: {exc}") from exc
            if delay == 0.5:  # one line, however long the wait
                event(log, "database_unavailable", logging.WARNING, error=str(exc), where="start")
            time.sleep(delay)
            delay = min(delay * 2, RECONNECT_CAP_SECONDS)
    storage = storage_status(settings)
    if not storage["ready"]:
        event(log, "storage_not_ready", logging.WARNING, **storage)
    return Worker(settings, options, log, storage).run()


@dataclass(frozen=True)
class DeadHolder:
    """An engine process that died: a job it claimed but never reported (it died between the
    claim and the report) goes back to the queue untouched, without waiting for the lease."""

    holder: str
    #: the job it reported and did not end (settled as an :class:`Orphan`)
    reported: UUID | None


@dataclass
class Orphan:
    """A claimed job no child will finish: release it, or retry/fail it, once the DB answers."""

    job: Job
    reason: str
    release: bool = False
    permanent: bool = False
    #: the child died: close the attempt's open step runs first
    child_gone: bool = False


def _readable(conn: Connection) -> bool:
    """True when the pipe holds more (a message, or the end of file); never waits. A bare
    ``select`` where ``Connection.poll`` builds a selector per call (a draining child sends
    several messages per job)."""
    readable, _, _ = select.select([conn.fileno()], [], [], 0)
    return bool(readable)


# -- the parent ---------------------------------------------------------------------------------


class Worker:
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
        self.instance_id = service.holder_id("worker")
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
        #: the pool keeper's thread writes a byte here after each spare it builds
        self._built_r, self._built_w = socket.socketpair()
        self._heartbeat = Heartbeat(settings, self.instance_id, self.snapshot, self.outage)
        self._pool: pool.PoolKeeper | None = None
        if settings.pool_size > 0:
            self._pool = pool.PoolKeeper(
                settings.owner_url,
                settings.pool_size,
                f"{self.instance_id}:pool",
                self.idle,
                log,
                app_role=settings.app_role,  # spares carry its grants, all but USAGE
                on_built=self._spare_built,
            )

    # -- lifecycle --------------------------------------------------------------------------

    def run(self) -> int:
        previous = self._install_signals()
        try:
            for _ in range(self.options.concurrency):
                self._spawn()
            if self._wait_until_children_ready():
                self.state = "running"
                self._heartbeat.start()
                if self._pool is not None:
                    self._pool.start()
                info: dict[str, Any] = {"worker": self.instance_id, "job_types": self.job_types}
                info.update(concurrency=self.options.concurrency, once=self.options.once)
                event(self.log, "started", **info, version=__version__)
                self._loop()
            return self._shutdown()
        finally:
            for child in self._children:
                if child.process.is_alive():
                    child.reap(0)
            self._close_connections()
            self._restore_signals(previous)

    def _install_signals(self) -> dict[int, Any]:
        """Signals only write to a socket the loop waits on: no work in a signal handler."""
        self._wake_r.setblocking(False)
        self._wake_w.setblocking(False)
        self._selector.register(self._wake_r, selectors.EVENT_READ, "signal")
        self._built_r.setblocking(False)
        self._built_w.setblocking(False)
        self._selector.register(self._built_r, selectors.EVENT_READ, "built")
        previous: dict[int, Any] = {
            signum: signal.signal(signum, lambda *_: None)
            for signum in (signal.SIGTERM, signal.SIGINT)
        }
        previous[-1] = signal.set_wakeup_fd(self._wake_w.fileno(), warn_on_full_buffer=False)
        return previous

    def _restore_signals(self, previous: dict[int, Any]) -> None:
        signal.set_wakeup_fd(previous.pop(-1))
        for signum, handler in previous.items():
            signal.signal(signum, handler)
        self._wake_r.close()
        self._wake_w.close()
        self._built_r.close()
        self._built_w.close()

    def _spawn(self) -> None:
        child = EngineProcess.spawn(self._mp, self.settings)
        with self._lock:
            self._children.append(child)
        self._selector.register(child.conn, selectors.EVENT_READ, child)

    def _wait_until_children_ready(self) -> bool:
        deadline = time.monotonic() + CHILD_START_TIMEOUT_SECONDS
        while not all(c.ready for c in self._children):
            if self._signals:
                return False
            if time.monotonic() > deadline:
                raise ProvisionerError("the worker's engine processes did not start in time")
            self._wait(1.0)
        return True

    def _shutdown(self) -> int:
        self.state = "stopping"
        if self._pool is not None and self._pool.is_alive():
            self._pool.stop()
        for child in self._children:
            child.send(Quit())
        for child in self._children:
            child.reap(10)
        self._settle_at_exit()
        if self._heartbeat.is_alive():
            self._heartbeat.halt.set()
            self._heartbeat.join(10)
        self.state = "stopped"
        self._heartbeat.beat()  # the last beat says so: health reports "stopped cleanly"
        self._heartbeat.close()
        event(
            self.log,
            "stopped",
            worker=self.instance_id,
            jobs_done=self.stats["done"],
            jobs_succeeded=self.stats["succeeded"],
            jobs_recovered=self.stats["recovered"],
            unsettled=len(self._orphans) or None,
        )
        return 1 if self._orphans else 0

    def _settle_at_exit(self) -> None:
        deadline = time.monotonic() + 10.0
        while (self._orphans or self._dead) and time.monotonic() < deadline:
            try:
                self._ensure_connection()
                self._settle_orphans()
            except DB_ERRORS as exc:
                self._database_down(exc, "shutdown")
                time.sleep(min(self._db_delay, max(0.0, deadline - time.monotonic())))
        for orphan in self._orphans:
            event(
                self.log,
                "unsettled",
                logging.ERROR,
                **job_fields(orphan.job),
                message="could not release the job; stale recovery will re-queue it",
            )

    # -- the loop ---------------------------------------------------------------------------

    def _loop(self) -> None:
        while True:
            now = time.monotonic()
            if self._deadline is not None:
                if not any(c.busy for c in self._children):
                    return
                if now >= self._deadline:
                    self._interrupt_busy(now)
            if now >= self._db_retry_at:
                self._database_work(now)
            if self.options.once and self._drained():
                return
            self._wait(self._timeout(time.monotonic()))

    def idle(self) -> bool:
        """No job running, none waiting to be claimed, not draining: the warm pool may build."""
        with self._lock:
            busy = any(c.job for c in self._children)
        return self._pending is None and self._deadline is None and not busy

    def _drained(self) -> bool:
        busy = any(c.busy for c in self._children)
        return self._pending is None and not self._orphans and not self._dead and not busy

    def _timeout(self, now: float) -> float:
        wake_at = [self._next_recovery]
        if self._pending is None:
            wake_at.append(self._next_poll)
        if self._conn is None or self._orphans or self._dead:
            wake_at.append(self._db_retry_at)
        if self._deadline is not None:
            wake_at += [self._deadline, now + 0.5]  # interrupted children are checked on
        return max(0.0, min(wake_at) - now)

    def _wait(self, timeout: float) -> None:
        for key, _ in self._selector.select(timeout):
            source = key.data
            if source == "signal":
                self._on_signal()
            elif source == "listen":
                self._on_wake_up()
            elif source == "built":
                self._warm_idle_children()
            elif isinstance(source, EngineProcess):
                self._on_child(source)
        if self._pending is None and time.monotonic() >= self._next_poll:
            self._pending = "poll"

    def _spare_built(self) -> None:
        """In the pool keeper's thread: wake the loop (which alone talks to the children)."""
        with suppress(OSError):  # a full socket already holds a wake-up; a closed one: stopping
            self._built_w.send(b"b")

    def _warm_idle_children(self) -> None:
        """After a spare build: each idle child reloads its sessions' catalog caches now
        (:class:`Warm`), not at the next sign-up's claim."""
        with suppress(BlockingIOError):
            while self._built_r.recv(64):
                pass
        for child in self._children:
            if child.idle:
                child.send(Warm())

    def _on_signal(self) -> None:
        with suppress(BlockingIOError):
            while received := self._wake_r.recv(64):
                self._signals += len(received)
        if not self._signals:
            return
        now = time.monotonic()
        if self._deadline is None:
            self.state = "draining"
            self._deadline = now + self.settings.drain_timeout_seconds
            busy = [c for c in self._children if c.busy]
            event(
                self.log,
                "stopping",
                worker=self.instance_id,
                running=len(busy),
                drain_timeout=self.settings.drain_timeout_seconds,
            )
            for child in busy:
                child.send(Stop())
        elif self._signals > 1:
            self._deadline = min(self._deadline, now)

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

    # -- database work ----------------------------------------------------------------------

    def _database_work(self, now: float) -> None:
        try:
            self._ensure_connection()
            self._settle_orphans()
            if now >= self._next_recovery:
                self._recover()
                self._next_recovery = now + self.settings.job_stale_after_seconds / 4
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
        self._selector.register(self._listen_fd, selectors.EVENT_READ, "listen")
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
            jobs = queue.recover_stale(self._conn, self.settings.job_stale_after_seconds)
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
        """Ask each idle engine process to claim a job (it claims, runs and settles it)."""
        if self._pending is None:
            return
        for child in self._children:
            if not child.idle:
                continue
            child.asking, child.asked_at_claim = self._pending, self._claims
            if not child.send(ClaimNext(tuple(self.job_types))):
                child.asking = None  # gone: its exit is handled when its pipe closes

    def _on_claimed(self, child: EngineProcess, job: Job) -> None:
        woke = child.asking or "drain"
        self._claims += 1
        self._pending, self._was_idle = "drain", False  # the queue may hold more
        self.woke[woke] += 1
        self.last_woke = woke
        with self._lock:
            child.asking = None
            child.assign(job)
        event(
            self.log,
            "claimed",
            **job_fields(job),
            woke=woke,
            max_attempts=job.max_attempts,
            holder=child.holder,
            steps_done=len(job.steps_completed),
        )

    def _nothing_queued(self, child: EngineProcess) -> None:
        child.asking = None
        if child.asked_at_claim != self._claims:
            return  # another child claimed meanwhile: the queue may still hold more
        self._pending = None
        self._next_poll = time.monotonic() + self.settings.poll_interval_seconds
        if not self._was_idle:
            self._was_idle = True
            event(
                self.log,
                "idle",
                listen=queue.NOTIFY_CHANNEL,
                poll_interval=self.settings.poll_interval_seconds,
            )

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
                    if orphan.child_gone:
                        queue.abandon_step_runs(self._conn, lease)
                    if orphan.release:
                        job = queue.release(self._conn, lease)
                    else:
                        reason, permanent = orphan.reason, orphan.permanent
                        job = queue.fail_or_retry(self._conn, lease, reason, permanent=permanent)
                    self._conn.commit()
            except LeaseLost as exc:
                with db.translated():
                    self._conn.rollback()
                self._log_lease_lost(orphan.job, describe(exc))
            else:
                self._log_outcome(job, released=orphan.release, seconds=None)
            with self._lock:
                self._orphans.remove(orphan)

    # -- engine processes --------------------------------------------------------------------

    def _on_child(self, child: EngineProcess) -> None:
        try:
            while True:
                self._on_message(child, child.conn.recv())
                if not _readable(child.conn):
                    return
        except (EOFError, OSError):
            self._on_child_exit(child)

    def _on_message(self, child: EngineProcess, message: FromChild) -> None:
        job = child.job
        match message:
            case Ready(holder=holder):
                child.holder = holder
                event(self.log, "child_started", pid=child.pid, holder=child.holder)
            case Claimed(job=claimed):
                self.queue_failure = None
                self._on_claimed(child, claimed)
            case StepReport() if job is not None:
                self._on_step(child, job, message)
            case JobEnded(outcome=runner.NothingQueued()):
                self.queue_failure = None
                self._nothing_queued(child)
            case JobEnded(outcome=runner.ClaimFailed(detail=detail)):
                child.asking = None
                self._queue_failed(detail)
                self._database_down(DatabaseUnavailable(detail), "claim")
            case JobEnded(outcome=outcome) if job is not None:
                self._on_job_ended(child, job, outcome)
            case StepReport() | JobEnded():
                pass  # a late message about a job the parent already settled
            case _:
                assert_never(message)
        if isinstance(message, JobEnded) and message.claiming:
            # The child goes on to its next job unasked (its last step may have claimed it).
            child.asking, child.asked_at_claim = "drain", self._claims

    def _on_job_ended(self, child: EngineProcess, job: Job, outcome: runner.Outcome) -> None:
        """The child's run ended: log it, or settle what the child could not."""
        match outcome:
            case runner.Settled(job=done, stopped=stopped):
                seconds = round(time.monotonic() - child.claimed_at, 3)
                self._log_outcome(done, released=stopped, seconds=seconds)
            case runner.LostLease(detail=detail):
                self._log_lease_lost(job, detail)
            case runner.Unsettled(detail=detail, permanent=permanent, release=release):
                reason = f"{child.failure}; then {detail}" if child.failure else detail
                self._orphan(child, reason, release=release, permanent=permanent)
                return
            case runner.Busy() | runner.NothingQueued() | runner.ClaimFailed():
                pass  # handled before a job was held
            case _:
                assert_never(outcome)
        with self._lock:
            child.assign(None)
        if self._pending is None and self._deadline is None:
            self._pending = "drain"

    def _on_step(self, child: EngineProcess, job: Job, report: StepReport) -> None:
        step, outcome, seconds, detail = report.step, report.outcome, report.seconds, report.detail
        if outcome == "started":
            with self._lock:
                child.step = step
            return
        if outcome == "failed":
            child.failure = f"{step}: {detail}"
        level = logging.WARNING if outcome == "failed" else logging.INFO
        event(
            self.log,
            f"step_{outcome}",
            level,
            job_id=job.id,
            tenant_id=job.tenant_id,
            step=step,
            seconds=None if outcome == "skipped" else seconds,
            detail=None if outcome == "done" else detail,
        )

    def _on_child_exit(self, child: EngineProcess) -> None:
        with suppress(KeyError, ValueError):
            self._selector.unregister(child.conn)
        child.conn.close()
        code = child.reap(5)
        with self._lock:
            self._children.remove(child)
        event(
            self.log,
            "child_exited",
            logging.WARNING,
            pid=child.pid,
            exit_code=code,
            job_id=child.job.id if child.job else None,
        )
        if not child.ready:
            raise ProvisionerError(
                f"an engine process exited during start-up (exit code {code}); see above"
            )
        if child.holder is not None:
            self._dead.append(DeadHolder(child.holder, child.job.id if child.job else None))
        if child.job is not None:
            reason = f"{child.step or 'step'}: the engine process exited (exit code {code})"
            self._orphan(child, reason, release=self._deadline is not None, gone=True)
        if self._deadline is None:
            self._spawn()

    def _orphan(
        self,
        child: EngineProcess,
        reason: str,
        *,
        release: bool,
        permanent: bool = False,
        gone: bool = False,
    ) -> None:
        """Hand the child's job to the parent to settle; the child is free (or gone)."""
        assert child.job is not None
        orphan = Orphan(child.job, reason, release=release, permanent=permanent, child_gone=gone)
        with self._lock:
            self._orphans.append(orphan)
            child.assign(None)

    def _interrupt_busy(self, now: float) -> None:
        """The drain timeout expired: interrupt running steps; kill a child that ignores it."""
        for child in self._children:
            if child.job is None:
                continue
            if child.interrupted_at is None:
                event(
                    self.log,
                    "drain_timeout",
                    logging.WARNING,
                    **job_fields(child.job),
                    step=child.step,
                    pid=child.pid,
                )
                child.interrupt()
            elif now - child.interrupted_at > INTERRUPT_GRACE_SECONDS:
                child.process.kill()

    # -- logging and heartbeat ---------------------------------------------------------------

    def _log_outcome(self, job: Job, *, released: bool, seconds: float | None) -> None:
        self.stats["done"] += 1
        self.stats[logs.job_outcome(self.log, job, released=released, seconds=seconds)] += 1

    def _log_lease_lost(self, job: Job, detail: str) -> None:
        self.stats["lease_lost"] += 1
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
            "woke": dict(self.woke),
            "last_woke": self.last_woke,
            "storage": self.storage,
            "queue_error": heartbeats.queue_error(self.queue_failure),
        }
        if self._pool is not None:
            detail["pool"] = self._pool.status()
        return detail, sorted(holders)
