"""The values of one run of one job, as the step engine passes them between its steps: what
the run is (:class:`JobRun`, built once by :meth:`provisioner.engine.Engine.run`), where it
stands between two step transactions (:class:`RunState`), one step's turn inside a transaction
(:class:`Turn`) and the transaction under way, for its failure handling (:class:`InFlight`).
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import psycopg
from psycopg import sql

from provisioner import queue
from provisioner.engine.events import ProgressCallback, StopRequested
from provisioner.kinds import JobKind, Step, StepContext
from provisioner.models import Job, Lease


class Unread:
    """The type of :data:`UNREAD`: a value the caller did not read (the engine reads it)."""


#: ``Engine.run(tenant_state=UNREAD)``: the claim did not read the tenant's state.
UNREAD = Unread()
#: What a claim read of the tenant's row (its state, its server), or UNREAD.
ClaimRead = str | Unread | None


@dataclass(frozen=True)
class JobRun:
    """One run of one job: everything its steps and their records need besides the job row,
    built once by :meth:`Engine.run`."""

    kind: JobKind
    lease: Lease
    context: StepContext
    #: the control session: the tenant's state, the journal's closes after a failure
    journal: psycopg.Connection[Any]
    on_progress: ProgressCallback
    should_stop: StopRequested
    #: the job types whose next job the last step claims with its commit (empty: none)
    claim_next: tuple[str, ...]
    #: each of those kinds' steps, for the claim to open the next job's first one
    first_steps: Mapping[str, Sequence[str]]
    #: every step transaction's first statement: the tenant's lock, the commit mode
    lock: sql.Composed

    def close(
        self,
        conn: psycopg.Connection[Any],
        run_id: int,
        detail: str | None,
        done: list[str],
        following: str | None,
        *,
        last: bool,
        begin_with: sql.Composed | None = None,
    ) -> queue.ClosedStep:
        """A step's close in its transaction on control (:func:`queue.close_step`): its journal
        row, its fenced checkpoint (``done``), the next step's row opened (``following``); for
        the job's ``last`` step, the job completed and the holder's next job claimed."""
        return queue.close_step(
            conn,
            run_id,
            detail,
            self.lease,
            done,
            self.kind.progress(done),
            last=last,
            claim_next=self.claim_next if last else (),
            open_next=(
                None if following is None else queue.NextStep(self.context.tenant.value, following)
            ),
            first_steps=self.first_steps,
            begin_with=begin_with,
        )


@dataclass
class RunState:
    """Where a run stands between two step transactions."""

    #: the job as its last checkpoint left it
    job: Job
    #: recorded steps whose effect was gone: they run again, and say so
    repaired: frozenset[str] = frozenset()
    #: the journal row the last step opened for the next one (close_step's ``open_next``)
    opened: int | None = None


@dataclass(frozen=True)
class Turn:
    """One step's turn inside a step transaction."""

    job: Job
    step: Step
    #: its journal row (opened before the transaction, or by the step before it)
    run_id: int
    #: the step after it (None: the job's last)
    following: str | None
    repairing: bool


@dataclass
class InFlight:
    """The step transaction under way, for its failure handling: the step it began with, the
    step running, the journal row committed before it."""

    first: Step
    step: Step
    started: float = field(default_factory=time.monotonic)
    #: the journal row committed before the transaction began
    committed_run: int | None = None
    claim_sent: bool = False
