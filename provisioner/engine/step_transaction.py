"""A job's steps on the control database: each step transaction with its checkpoint.

:func:`run_transaction` runs the first of a job's pending steps in ONE transaction, on the
engine's steps session, with the tenant's lock, the step's journal close and its fenced
checkpoint (the job's last step completes the job there, and claims a worker child's next job:
:mod:`provisioner.engine.handoff`); the steps after it join that transaction while a step asks
for it (:attr:`provisioner.kinds.RunMemo.one_transaction`). A job of a tenant on a tenant
server runs its steps through :mod:`provisioner.engine.remote` instead. The invariants are the
engine's (:mod:`provisioner.engine.engine`): a step and its checkpoint commit together or not
at all, and every write to the job row is fenced by the lease.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

from provisioner import db, queue
from provisioner.engine.events import StepEvent, StepOutcome, describe
from provisioner.engine.handoff import HandOff
from provisioner.engine.job_run import InFlight, JobRun, RunState, Turn
from provisioner.engine.step_lock import next_lock
from provisioner.errors import LeaseLost, StepFailed
from provisioner.kinds import Step
from provisioner.models import Job

if TYPE_CHECKING:
    from provisioner.engine.engine import Engine


def run_transaction(engine: Engine, run: JobRun, state: RunState, pending: list[Step]) -> int:
    """Run the first of the job's ``pending`` steps in one transaction with its checkpoint,
    and the steps after it in the same transaction while a step asks for it
    (:attr:`kinds.RunMemo.one_transaction`). Updates ``state`` (the job as the last
    checkpoint left it, the journal row opened for the step after the transaction's last
    one) and returns how many steps ran. The job's last step completes the job in its
    transaction (and, with ``claim_next``, claims the holder's next job).

    The first step's journal row is the one the step before it opened (``state.opened``);
    otherwise the row is committed on its own just before the transaction begins, in the
    same round trip. Each step's close opens the next one's row (inside the transaction),
    and the commit begins the next transaction with its tenant lock (one round trip fewer
    per step). Progress events of finished steps are reported once the commit made them
    true; a failure raises :class:`StepFailed` naming the step that failed (or the
    commit's last step, when the commit failed)."""
    # The step's own now: it closes it, come what may.
    run_id, state.opened = state.opened, None
    trace = InFlight(first=pending[0], step=pending[0], committed_run=run_id)
    # The journal's start row, committed before the step's work begins, so that a step
    # killed mid-work still leaves its run for recovery to mark abandoned; sent with the
    # transaction's BEGIN. Later steps find their row opened by the step before them
    # (queue.CLOSE_STEP_OPEN_NEXT).
    opening = (
        None
        if run_id is not None
        else queue.step_run_opening(run.lease, run.context.tenant.value, trace.step.name)
    )
    finished: list[StepEvent] = []
    job = state.job
    then = run.lock if len(pending) > 1 else None
    try:
        with engine.sessions.transaction(run.lock, then, opening) as tx:
            if tx.before_row is not None:
                run_id = trace.committed_run = int(tx.before_row[0])
            for index, step in enumerate(pending):
                trace.step, trace.started = step, time.monotonic()
                following = pending[index + 1].name if index + 1 < len(pending) else None
                assert run_id is not None  # written above, or opened by the step before
                repairing = step.name in state.repaired
                closed, detail = _step_in(tx, run, Turn(job, step, run_id, following, repairing))
                trace.claim_sent = following is None and bool(run.claim_next)
                job, run_id = closed.job, closed.next_run_id
                outcome = StepOutcome.REPAIRED if repairing else StepOutcome.DONE
                seconds = time.monotonic() - trace.started
                finished.append(StepEvent(job, step.name, outcome, seconds, detail))
                if following is None or not run.context.memo.one_transaction:
                    break
            # the job's next step, or the next job's first (engine/handoff.py)
            tx.begin_next_with(run.lock if following else next_lock(closed.claimed))
            # leaving the block commits
        engine._claimed = HandOff.of(closed)
    except BaseException as exc:
        _failed(engine, run, job, trace, exc)
        if isinstance(exc, LeaseLost) or not isinstance(exc, Exception):
            raise
        raise StepFailed(trace.step.name) from exc
    state.job = job
    try:
        for event in finished:
            run.on_progress(event)
    except BaseException:
        if run_id is not None:  # the next step will not begin
            engine._discard_run(run.journal, run_id)
        raise
    state.opened = run_id
    return len(finished)


def _failed(engine: Engine, run: JobRun, job: Job, trace: InFlight, exc: BaseException) -> None:
    """A step transaction rolled back: the journal's account on the row it began with (the
    rows of the steps after it rolled back with it), and the failed event."""
    if trace.claim_sent:  # the commit failed: the next job's claim may have committed
        engine._unsure_after = job.id
    lost = isinstance(exc, LeaseLost)
    outcome = queue.StepRunOutcome.LEASE_LOST if lost else queue.StepRunOutcome.FAILED
    if trace.committed_run is not None:
        detail = _failure(exc, trace.step, trace.first)
        engine._close_run(run.journal, trace.committed_run, outcome, detail)
    seconds = time.monotonic() - trace.started
    run.on_progress(StepEvent(job, trace.step.name, StepOutcome.FAILED, seconds, describe(exc)))


def _step_in(tx: db.Transaction, run: JobRun, turn: Turn) -> tuple[queue.ClosedStep, str | None]:
    """One step's work and its end in ``tx``: the journal's close and the fenced checkpoint
    in one statement, which commit together with the step's work, or not at all. A step
    before the last opens the next step's journal row in it too (one round trip fewer per
    step). The last step completes the job with it: one commit fewer per job, and the step,
    its checkpoint and the job's success are one atomic change. The next job's claim rides
    on that commit too (a LeaseLost rolls it back with the rest)."""
    job, step, kind, ctx = turn.job, turn.step, run.kind, run.context
    run.on_progress(StepEvent(job, step.name, StepOutcome.STARTED))
    if step.works_elsewhere:
        with db.kept_alive(tx.pg):
            detail = step.run(tx, ctx)
    else:
        detail = step.run(tx, ctx)
    if turn.repairing:
        detail = "; ".join(
            filter(None, ["re-ran: its effect was missing from the catalog", detail])
        )
    done = kind.ordered([*job.steps_completed, step.name])
    following = turn.following
    closed = run.close(tx.pg, turn.run_id, detail, done, following, last=following is None)
    return closed, detail


def _failure(exc: BaseException, failed: Step, first: Step) -> str:
    """The journal's account of a failed transaction, on the row it began with (the rows of
    the steps after it rolled back with the transaction): the error, and which step of the
    transaction raised it when that was a later one."""
    if failed is first:
        return describe(exc)
    return queue.bounded_error(
        f"rolled back with {failed.name}, in the same transaction: {describe(exc)}"
    )
