"""The worker's loop: check and start, then wait on one selector for signals, wake-ups, the
children's pipes and the pool's builds; do the database work that is due; drain and stop.

Signal handlers only write to a socket the selector waits on: no work runs in a handler. On
SIGTERM or SIGINT the loop stops claiming, lets each running step finish within the drain
timeout, then interrupts it; a second signal ends the drain at once.
"""

from __future__ import annotations

import logging
import selectors
import signal
import time
from contextlib import suppress
from dataclasses import replace
from typing import Any, assert_never

from provisioner.errors import ConfigurationError, DatabaseUnavailable, ProvisionerError
from provisioner.logs import event, job_fields
from provisioner.settings import Settings
from provisioner.version import __version__
from provisioner.worker.concurrency import worker_concurrency
from provisioner.worker.heartbeat import DB_ERRORS
from provisioner.worker.options import (
    CHILD_START_TIMEOUT_SECONDS,
    RECONNECT_CAP_SECONDS,
    WorkerOptions,
)
from provisioner.worker.processes import EngineProcess, Quit, Stop
from provisioner.worker.startup import check_configuration, check_database, storage_status
from provisioner.worker.state import Source, Wakeup
from provisioner.worker.supervisor import Supervisor


def run_worker(settings: Settings, options: WorkerOptions, log: logging.Logger) -> int:
    """Check, start and run the worker until it is stopped (or, with ``once``, drained)."""
    check_configuration(settings)
    options = replace(options, concurrency=worker_concurrency(options.concurrency, settings))
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


class Worker(Supervisor):
    """The parent process: runs until stopped (or, with ``once``, until the queue is drained)."""

    # -- lifecycle --------------------------------------------------------------------------

    def run(self) -> int:
        self._start_metrics()
        previous = self._install_signals()
        try:
            for _ in range(self.options.concurrency):
                self._spawn()
            if self._wait_until_children_ready():
                self.state = "running"
                self._heartbeat.beat()  # every holder beats before the first claim
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
            if self.metrics is not None:
                self.metrics.stop()

    def _start_metrics(self) -> None:
        """Serve the Prometheus metrics when asked to; a port that cannot be bound stops the
        start, in one line."""
        if self.metrics is None:
            return
        try:
            host, port = self.metrics.start()
        except OSError as exc:
            where = f"{self.settings.metrics_host}:{self.settings.metrics_port}"
            raise ConfigurationError(
                f"cannot serve metrics on {where}: {exc.strerror or exc}"
            ) from None
        event(self.log, "metrics_listening", host=host, port=port, path="/metrics")

    def _install_signals(self) -> dict[int, Any]:
        """Signals only write to a socket the loop waits on: no work in a signal handler."""
        self._wake_r.setblocking(False)
        self._wake_w.setblocking(False)
        self._selector.register(self._wake_r, selectors.EVENT_READ, Wakeup.SIGNAL)
        self._built_r.setblocking(False)
        self._built_w.setblocking(False)
        self._selector.register(self._built_r, selectors.EVENT_READ, Wakeup.BUILT)
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
        self._heartbeat.beat(last=True)  # the last beat says so: health reports "stopped cleanly"
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
            source: Source = key.data
            match source:
                case Wakeup.SIGNAL:
                    self._on_signal()
                case Wakeup.LISTEN:
                    self._on_wake_up()
                case Wakeup.BUILT:
                    self._warm_idle_children()
                case EngineProcess():
                    self._on_child(source)
                case _:
                    assert_never(source)
        if self._pending is None and time.monotonic() >= self._next_poll:
            self._pending = "poll"

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
