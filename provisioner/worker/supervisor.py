"""The parent's side of its engine processes: spawning them, reading their typed messages
(matched and closed with ``assert_never``), noticing a claim or a job's end, and taking over the
job of a child that died or could not settle it. The messages themselves and the child's side
are in :mod:`provisioner.worker.processes`.
"""

from __future__ import annotations

import logging
import select
import selectors
import time
from contextlib import suppress
from multiprocessing.connection import Connection
from typing import assert_never

from provisioner import queue
from provisioner.engine import StepOutcome, runner
from provisioner.errors import DatabaseUnavailable, ProvisionerError
from provisioner.logs import event, job_fields
from provisioner.models import Job
from provisioner.worker.database import DatabaseWork
from provisioner.worker.options import INTERRUPT_GRACE_SECONDS
from provisioner.worker.orphans import DeadHolder, Orphan
from provisioner.worker.processes import (
    Batch,
    Claimed,
    EngineProcess,
    FromChild,
    JobEnded,
    Ready,
    StepReport,
    Warm,
)

#: The step reports whose seconds the step duration histogram counts (the step ran).
TIMED = frozenset({StepOutcome.DONE, StepOutcome.REPAIRED, StepOutcome.FAILED})


def _readable(conn: Connection) -> bool:
    """True when the pipe holds more (a message, or the end of file); never waits. A bare
    ``select`` where ``Connection.poll`` builds a selector per call (a draining child sends
    several messages per job)."""
    readable, _, _ = select.select([conn.fileno()], [], [], 0)
    return bool(readable)


class Supervisor(DatabaseWork):
    """The children: one engine process each, talking over its pipe."""

    def _spawn(self) -> None:
        child = EngineProcess.spawn(self._mp, self.settings)
        with self._lock:
            self._children.append(child)
        self._selector.register(child.conn, selectors.EVENT_READ, child)

    def _warm_idle_children(self) -> None:
        """After a spare build: each idle child reloads its sessions' catalog caches now
        (:class:`Warm`), not at the next sign-up's claim."""
        with suppress(BlockingIOError):
            while self._built_r.recv(64):
                pass
        for child in self._children:
            if child.idle:
                child.send(Warm())

    def _on_claimed(self, child: EngineProcess, job: Job, more: bool) -> None:
        woke = child.asking or "drain"
        self._claims += 1
        self._was_idle = False
        if more and self._pending is None:
            self._pending = "drain"  # another job was queued: ask the next idle child
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
        """A claim found nothing. The ask consumed the reason to claim: a wake-up since then
        set it again (it stays), and a claim another child made meanwhile re-armed it when it
        saw more queued (worker/wakeups.py)."""
        child.asking = None
        self._next_poll = time.monotonic() + self.settings.poll_interval_seconds
        if child.asked_at_claim != self._claims or self._pending is not None:
            return
        if not self._was_idle:
            self._was_idle = True
            event(
                self.log,
                "idle",
                listen=queue.NOTIFY_CHANNEL,
                poll_interval=self.settings.poll_interval_seconds,
            )

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
            case Batch(messages=messages):
                for each in messages:  # held step reports, then the message after them
                    self._on_message(child, each)
                return
            case Ready(holder=holder):
                child.holder = holder
                event(self.log, "child_started", pid=child.pid, holder=child.holder)
            case Claimed(job=claimed, more=more):
                self.queue_failure = None
                self._on_claimed(child, claimed, more)
            case StepReport() if job is not None:
                self._on_step(child, job, message)
            case JobEnded(outcome=runner.NothingQueued()):
                self.queue_failure = None
                self._nothing_queued(child)
            case JobEnded(outcome=runner.ClaimFailed(detail=detail)):
                child.asking = None
                self._pending = self._pending or "drain"  # asked again once it answers
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
        elif isinstance(message, JobEnded) and self._pool is not None and self.idle():
            self._pool.wake.set()  # the refill starts now, not at the keeper's next look

    def _on_job_ended(self, child: EngineProcess, job: Job, outcome: runner.Outcome) -> None:
        """The child's run ended: log it, or settle what the child could not."""
        match outcome:
            case runner.Settled(job=done, stopped=stopped):
                seconds = round(time.monotonic() - child.claimed_at, 3)
                self._log_outcome(done, released=stopped, seconds=seconds)
            case runner.LostLease(detail=detail):
                self._log_lease_lost(job, detail)
            case runner.Unsettled(detail=detail, permanent=permanent, release=release, cut=cut):
                reason = f"{child.failure}; then {detail}" if child.failure else detail
                self._orphan(child, reason, release=release, permanent=permanent, cut=cut)
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
        if outcome is StepOutcome.STARTED:
            with self._lock:
                child.step = step
            return
        if outcome is StepOutcome.FAILED:
            child.failure = f"{step}: {detail}"
        if self.metrics is not None and outcome in TIMED:
            self.metrics.step_timed(job.job_type, step, seconds)
        level = logging.WARNING if outcome is StepOutcome.FAILED else logging.INFO
        event(
            self.log,
            f"step_{outcome}",
            level,
            job_id=job.id,
            tenant_id=job.tenant_id,
            step=step,
            seconds=None if outcome is StepOutcome.SKIPPED else seconds,
            detail=None if outcome is StepOutcome.DONE else detail,
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
        cut: bool = False,
    ) -> None:
        """Hand the child's job to the parent to settle; the child is free (or gone)."""
        assert child.job is not None
        orphan = Orphan(
            child.job, reason, release=release, permanent=permanent, child_gone=gone, cut=cut
        )
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
