"""The worker's engine processes: one step engine per child process, and the parent's handle.

Alembic keeps module-level state and is not thread-safe, so the worker gets concurrency from
processes, started with the "spawn" method (no psycopg connection or thread crosses a fork).
Each child has its own lease holder id, ``worker:<host>:<pid>``, which is also the
``application_name`` of its sessions, and dies with its parent (``PR_SET_PDEATHSIG``, with a
watchdog thread as the fallback): a SIGKILLed worker leaves no engine running behind it.

The parent and a child talk over one pipe, in frozen dataclasses (matched with ``match`` and
closed with ``assert_never`` on both ends):

    parent -> child   ClaimNext(job_types)  claim the oldest ready job of these kinds, run it,
                                       and go on claiming until the queue has none
                      Stop()           finish the running step, then release the job
                      Quit()           exit when idle
                      Warm()           idle: the warm pool built a spare; reload the
                                       sessions' catalog caches now
    child -> parent   Ready(holder)
                      Claimed(job, more)  the child claimed this job and runs it; more:
                                       the claim saw other jobs queued
                      StepReport(...)  each StepEvent of the running job
                      Batch(messages)  step reports held back, then the message that
                                       followed them (see below)
                      JobEnded(outcome, claiming)
                                       the job's :data:`~provisioner.engine.runner.Outcome`: settled
                                       (also a job the child released after the drain timeout
                                       cut its step short), lease lost, or unsettled (the
                                       database was down: the parent settles it), nothing
                                       queued, or claim failed; ``claiming``: the child goes
                                       on to its next job without being asked

**A finished step's report rides with the child's next message** (:meth:`_ChildLoop.progress`):
a step's ``done`` (or ``skipped``, ``repaired``; and ``on_server``, a tenant server's commit of
the step, which control's checkpoint follows at once) is held and sent in one :class:`Batch`
with the next report or message, which follows it without waiting on anything but, at most, the
opening of the next step's transaction (usually begun already by the commit): the next step's
``started``, a failure, the job's end. Invariant: every report reaches the parent, in the order
the engine gave them, before the child's next ``started``, ``failed``, ``Claimed`` or
``JobEnded``; what the parent must know while it happens (which step runs, a failure, the job's
end) is never held. Pinned by
``tests/integration/test_worker.py::test_a_childs_finished_step_reports_ride_with_its_next_message``.
It halves the messages of a job (8 where 14 were sent for a six-step provisioning): each costs
the child a pickle and a write, and wakes the parent to read, unpickle and dispatch it.

A child drains the queue on its own once asked: a settled job's last step has already claimed
the next one (:meth:`~provisioner.engine.Engine.run`), so a busy child costs its parent no
message per job and waits for none. It stops at the first claim that finds nothing, at a stop
request, or when a job could not be settled; only then does the parent ask it again. Every
``ClaimNext`` is answered, in the end, by exactly one ``JobEnded`` with ``claiming`` false.

Children ignore SIGINT and SIGTERM: the parent decides when a step stops. When the drain timeout
expires the parent sends SIGUSR1, which raises :class:`Interrupted` (a ``KeyboardInterrupt``,
so psycopg cancels the running query) and the step's transaction rolls back.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import signal
import sys
import threading
import time
from contextlib import suppress
from dataclasses import dataclass
from multiprocessing.connection import Connection
from multiprocessing.context import SpawnContext
from multiprocessing.process import BaseProcess
from typing import assert_never
from uuid import UUID

from provisioner.engine import Engine, StepEvent, StepOutcome, describe, runner
from provisioner.engine.holder import holder_id
from provisioner.models import Job
from provisioner.queue import Claim
from provisioner.settings import Settings

# -- messages -------------------------------------------------------------------------------------


@dataclass(frozen=True)
class ClaimNext:
    """Parent -> child: claim the oldest ready job of these kinds, run it, settle it, and go
    on with the next until none is left (or a stop request)."""

    job_types: tuple[str, ...]


@dataclass(frozen=True)
class Stop:
    """Parent -> child: finish the running step, then release the job."""


@dataclass(frozen=True)
class Quit:
    """Parent -> child: exit when idle."""


@dataclass(frozen=True)
class Warm:
    """Parent -> child, idle: the warm pool just built a spare; run one cheap statement on each
    open session (:meth:`Engine.warm`), so that the next job does not reload the server's
    catalog caches that the build's invalidations emptied."""


ToChild = ClaimNext | Stop | Quit | Warm


@dataclass(frozen=True)
class Ready:
    """Child -> parent: the engine is up; its lease holder id."""

    holder: str


@dataclass(frozen=True)
class Claimed:
    """Child -> parent: the child claimed this job and runs it now; ``more``: the claim saw
    another ready job queued (the parent then asks its next idle child: worker/wakeups.py)."""

    job: Job
    more: bool = True


@dataclass(frozen=True)
class StepReport:
    """Child -> parent: one StepEvent of the running job."""

    job_id: UUID
    step: str
    outcome: StepOutcome
    seconds: float
    detail: str | None


@dataclass(frozen=True)
class JobEnded:
    """Child -> parent: how the job's run ended; with ``claiming``, the child goes on to claim
    (or already holds) its next job, else it is free again."""

    outcome: runner.Outcome
    claiming: bool = False


@dataclass(frozen=True)
class Batch:
    """Child -> parent: step reports held back (a finished step's), then the message that
    followed them; the parent handles them in this order, as if sent one by one."""

    messages: tuple[Ready | Claimed | StepReport | JobEnded, ...]


FromChild = Ready | Claimed | StepReport | JobEnded | Batch

#: The step reports a child holds until its next message (see the module): the step is over,
#: or, for ``on_server``, its tenant server's commit is, and control's follows at once; the next
#: message follows without waiting.
HELD_OUTCOMES = frozenset(
    {StepOutcome.DONE, StepOutcome.SKIPPED, StepOutcome.REPAIRED, StepOutcome.ON_SERVER}
)

PR_SET_PDEATHSIG = 1


class Interrupted(KeyboardInterrupt):
    """Raised in a child when the drain timeout expires; psycopg cancels the running query.

    Outside the :class:`~provisioner.errors.ProvisionerError` tree on purpose: a
    ``KeyboardInterrupt`` is what makes psycopg cancel the query, and what every ``except
    Exception`` lets through (the engine would otherwise record it as the step's failure). It
    is caught only here, in :meth:`_ChildLoop.run` and :meth:`_ChildLoop.serve`."""


def _interrupt(signum: int, frame: object) -> None:
    raise Interrupted("step interrupted: the worker's drain timeout expired")


def _die_with_parent(parent_pid: int) -> None:
    """Have the kernel kill this process when the parent dies; a watchdog as the fallback."""
    if sys.platform.startswith("linux"):
        with suppress(OSError, AttributeError):
            libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
            libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    if os.getppid() != parent_pid:  # the parent died before prctl took effect
        os._exit(1)

    def watch() -> None:
        while os.getppid() == parent_pid:
            time.sleep(1.0)
        os._exit(1)

    threading.Thread(target=watch, name="parent-watchdog", daemon=True).start()


def child_main(conn: Connection, settings: Settings, parent_pid: int) -> None:
    """A child's life: build the engine, announce the holder id, run what the parent sends."""
    _die_with_parent(parent_pid)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    signal.signal(signal.SIGUSR1, _interrupt)
    holder = holder_id("worker")
    engine = Engine.from_settings(settings, holder)
    try:
        engine.load_tree()  # Alembic imported before the child says it is ready
        engine.open_servers()  # and a session open on each tenant server in service
        child = _ChildLoop(conn, engine)
        child.send(Ready(holder))
        child.serve()
    finally:
        engine.close()


class _ChildLoop:
    def __init__(self, conn: Connection, engine: Engine) -> None:
        self.conn = conn
        self.engine = engine
        self.stopping = False
        self.quitting = False
        self.job: Job | None = None
        #: finished steps' reports, sent with the next message (see the module)
        self.held: list[StepReport] = []

    def send(self, message: Ready | Claimed | StepReport | JobEnded) -> None:
        """Send whole, with the reports held before it: an interrupt arriving meanwhile is
        delivered after the message."""
        out: FromChild = message
        if self.held:
            out, self.held = Batch((*self.held, message)), []
        blocked = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGUSR1})
        try:
            self.conn.send(out)
        finally:
            signal.pthread_sigmask(signal.SIG_SETMASK, blocked)

    def serve(self) -> None:
        while not self.quitting:
            try:
                _allow_interrupts()  # one held since the last job ended lands here, harmlessly
                message = self.conn.recv()
            except EOFError:
                return
            except Interrupted:
                continue  # it raced with the end of a job: nothing runs now
            match message:
                case Quit():
                    return
                case Stop():
                    continue  # no job runs: nothing to stop
                case Warm():
                    self.engine.warm()
                case ClaimNext(job_types=job_types):
                    self.stopping = False
                    self.engine.servers.close_idle()  # a retired server's session let go
                    self.drain(job_types)
                case _:
                    assert_never(message)

    def drain(self, job_types: tuple[str, ...]) -> None:
        """Run jobs until one ends the drain; the parent hears exactly one final ``JobEnded``
        (``claiming`` false).

        The drain timeout's interrupt is held from the end of a job until the next one is
        announced (:meth:`claimed`): it can then neither fall between a claim and its
        announcement (a job held that nobody knows of) nor between a job's end and its report.
        """
        _hold_interrupts()
        claiming = True
        while claiming:
            outcome = self.run(job_types)
            _hold_interrupts()
            claiming = self.goes_on(outcome)
            self.send(JobEnded(outcome, claiming))

    def goes_on(self, outcome: runner.Outcome) -> bool:
        """Go on to the next job after a settled one, unless asked to stop; a job the last one
        claimed is always taken up (a stop request then releases it before its first step)."""
        if self.engine.holds_claim():
            return True
        match outcome:
            case runner.Settled(stopped=stopped):
                return not stopped and not self.should_stop()
            case runner.LostLease():
                return not self.should_stop()
            case _:
                return False

    def should_stop(self) -> bool:
        try:
            while self.conn.poll():
                message: ToChild = self.conn.recv()
                match message:
                    case Quit():
                        self.stopping = self.quitting = True
                    case Stop():
                        self.stopping = True
                    case ClaimNext() | Warm():
                        pass  # sent to idle children only: nothing to do while draining
                    case _:
                        assert_never(message)
        except EOFError:
            self.stopping = self.quitting = True
        return self.stopping

    def progress(self, ev: StepEvent) -> None:
        """Report the event: a finished step's is held for the next message (see the
        module), the others go now."""
        report = StepReport(ev.job.id, ev.step, ev.outcome, round(ev.seconds, 3), ev.detail)
        if report.outcome in HELD_OUTCOMES:
            self.held.append(report)
        else:
            self.send(report)

    def claimed(self, claim: Claim) -> None:
        """Announce the job, then let the drain timeout interrupt its steps (one held since
        the last job lands here, and the job is released)."""
        self.job = claim.job
        self.send(Claimed(claim.job, claim.more))
        _allow_interrupts()

    def run(self, job_types: tuple[str, ...]) -> runner.Outcome:
        self.job = None
        try:
            return runner.claim_next_and_run(
                self.engine,
                job_types,
                on_claimed=self.claimed,
                on_progress=self.progress,
                should_stop=self.should_stop,
            )
        except Interrupted as exc:
            if self.job is None:
                return runner.NothingQueued()  # cut short before a claim: nothing held
            return runner.release(self.engine, self.job, describe(exc))


def _hold_interrupts() -> None:
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGUSR1})


def _allow_interrupts() -> None:
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGUSR1})


@dataclass
class EngineProcess:
    """The parent's handle on one child: its pipe, holder id, and the job it runs."""

    process: BaseProcess
    conn: Connection
    holder: str | None = None
    job: Job | None = None
    #: why the child was asked to claim (start, notify, poll, drain...), while it claims
    asking: str | None = None
    #: the parent's claim count when the child was asked (a later claim voids "nothing queued")
    asked_at_claim: int = 0
    step: str | None = None
    #: "<step>: <detail>" of the last failed step of the running job, for error messages
    failure: str | None = None
    claimed_at: float = 0.0
    interrupted_at: float | None = None

    @classmethod
    def spawn(cls, context: SpawnContext, settings: Settings) -> EngineProcess:
        parent_end, child_end = context.Pipe()
        process = context.Process(
            target=child_main,
            args=(child_end, settings, os.getpid()),
            name="provisioner-engine",
            daemon=True,
        )
        process.start()
        child_end.close()
        return cls(process=process, conn=parent_end)

    @property
    def pid(self) -> int | None:
        return self.process.pid

    @property
    def ready(self) -> bool:
        return self.holder is not None

    @property
    def idle(self) -> bool:
        return self.ready and self.job is None and self.asking is None

    @property
    def busy(self) -> bool:
        """Claiming, or running a job."""
        return self.job is not None or self.asking is not None

    def send(self, message: ToChild) -> bool:
        """False when the child is gone."""
        try:
            self.conn.send(message)
        except OSError:
            return False
        return True

    def assign(self, job: Job | None) -> None:
        self.job, self.step, self.failure, self.interrupted_at = job, None, None, None
        self.claimed_at = time.monotonic()

    def interrupt(self) -> None:
        """Cut the running step short (its transaction rolls back)."""
        self.interrupted_at = time.monotonic()
        if self.pid:
            with suppress(ProcessLookupError):
                os.kill(self.pid, signal.SIGUSR1)

    def reap(self, timeout: float) -> int | None:
        """Wait for the process to end, killing it after ``timeout``; its exit code."""
        self.process.join(timeout)
        if self.process.is_alive():
            self.process.kill()
            self.process.join(5)
        return self.process.exitcode
