"""A job of a tenant placed on a tenant server: each step commits on the tenant's server, then
its checkpoint in ``control``.

For one run of such a job (:func:`run_placed`):

1. **The token.** The run's fencing token comes with its claim (the claim's own transaction id,
   committed durably: :mod:`provisioner.queue.fence`), or, for a run claimed otherwise, from a
   write to the job row fenced by the lease (:func:`provisioner.queue.fence_token`): larger
   than any token of a run it took over or of an earlier job of the tenant.
2. **Adopt.** On the tenant's server, one transaction raises the tenant's fence to the token
   (from then on an older holder cannot write there) and reads the server's journal of this
   job's run, both sent with its BEGIN: one round trip. When the journal shows nothing to
   adopt (and the run has no recorded step to check), the same transaction goes on to run the
   first missing step (3.): a job's first run costs no server transaction of its own.
   Otherwise it commits, and a step the journal shows done and the checkpoint does not (a
   crash between the step's two commits) is adopted when its effect is there (the catalog says
   so, as a resume checks every recorded step): its control side runs with the checkpoint it
   missed, in one control transaction.
   Recorded steps whose effect vanished are forgotten and run again.
3. **Each missing step**: on the server, ONE transaction runs the step's server side, then
   writes its journal row and raises the fence again in one statement sent with its COMMIT
   (refused: :class:`LeaseLost`, the transaction rolls back, nothing written); then on control, ONE
   transaction with the tenant's lock runs the step's control side and closes the step with
   its fenced checkpoint (the job's last step completes the job there, and claims a worker
   child's next job as on control: :mod:`provisioner.engine.handoff`; a step's close opens the
   next step's row in control's journal, the claim's row serves the first step). A step with
   no control side sends that transaction's BEGIN and the lock with its close: one round trip
   before the COMMIT (``deferred``: :meth:`provisioner.db.Session.transaction`). Between the
   two commits the engine reports :attr:`StepOutcome.ON_SERVER` (the crash tests' seam).

A job whose one missing step runs on the server thus commits twice: its server transaction and
its control transaction (which also claims the next job), where a job on control commits once.

A crash before the server's commit leaves nothing (the step runs again); between the two, the
step is in the server's journal and adopted on resume (its effect is not repeated); after the
control commit, the step is checkpointed. A holder whose lease was taken over cannot write on
control (every write there is lease-fenced) nor, once its successor began, on the server.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from typing import TYPE_CHECKING, Any

import psycopg
from psycopg import sql
from psycopg.rows import tuple_row

from provisioner import db, queue
from provisioner.engine.events import StepEvent, StepOutcome, describe
from provisioner.engine.handoff import HandOff
from provisioner.errors import LeaseLost, ProvisionerError, StepFailed
from provisioner.kinds import JobKind, Scope, StepContext
from provisioner.kinds.placed import ControlAccess, PlacedStep
from provisioner.models import Job, JobStatus, Lease
from provisioner.servers import journal
from provisioner.tenant import row as tenants

if TYPE_CHECKING:
    from provisioner.engine.engine import Engine
    from provisioner.engine.job_run import JobRun


def run_placed(
    engine: Engine, run: JobRun, job: Job, server: str, opened: queue.OpenedRun | None
) -> Job:
    """Run the job's missing steps on tenant server ``server``, then complete it (see the
    module). ``opened``: the journal row the claim opened ahead for the job's first step, used
    when the run begins with that step, else discarded. Raises :class:`LeaseLost` when the job
    stopped being ours, :class:`StepFailed` naming the step that failed; the engine settles both
    as for any job."""
    control = engine.control
    placed = run.kind.placed_steps or ()
    try:
        with db.translated():
            pool = engine.servers.database(control, server)
            token = claimed_token(engine, run.lease) or queue.fence_token(control, run.lease)
        job, begun = _adopt(engine, run, job, pool, token, placed)
    except BaseException:
        if opened is not None:
            engine._discard_run(control, opened.run_id)
        raise
    try:
        pending = [step for step in placed if step.name not in job.steps_completed]
        # the next step's journal row: the claim's for the first, then opened by the step before
        ahead: int | None = None
        if opened is not None and pending and pending[0].name == opened.step:
            ahead = opened.run_id
        elif opened is not None:
            engine._discard_run(control, opened.run_id)
        for index, step in enumerate(pending):
            stop = run.should_stop()
            if stop or step.server is None:  # the adopt's transaction: the fence raised alone
                _end(begun)
                begun = None
            if stop:
                return engine._release(run.lease, ahead)
            following = pending[index + 1].name if index + 1 < len(pending) else None
            held, begun = begun, None  # the step's server transaction from here on
            job, ahead = _run_step(
                engine, run, job, (server, pool), token, step, ahead, following, held
            )
    except BaseException as exc:
        _end(begun, exc)
        raise
    _end(begun)
    if job.status is not JobStatus.SUCCEEDED:
        with engine.sessions.transaction() as tx:
            job = queue.complete(tx.pg, run.lease)
    return job


def claimed_token(engine: Engine, lease: Lease) -> int | None:
    """The fencing token of the engine's claim of the job under ``lease`` (:meth:`Engine.claim`),
    taken once; None: another job's claim, or a claim that gave none (the job was claimed
    otherwise: :mod:`provisioner.queue.fence`)."""
    last, engine._last = engine._last, None
    return last.fence if last is not None and last.job.lease == lease else None


def missing_placed(engine: Engine, kind: JobKind, ctx: StepContext) -> list[str] | None:
    """For a tenant on a tenant server, the steps whose effect the catalogs (the server's,
    control's) do not show (:meth:`Engine.missing_effects`); None for a tenant on the control
    database, or a kind without steps for a tenant server."""
    control = engine.control
    with db.translated():
        found = tenants.get_tenant(control, ctx.tenant)
    placed = kind.placed_steps
    if found is None or found.server is None or placed is None:
        return None
    with db.translated():
        pool = engine.servers.database(control, found.server)
    access = ControlAccess(control, engine.sessions.transaction)
    with pool.transaction() as stx:
        gone = [
            s.name
            for s in placed
            if s.server_effect is not None and not s.server_effect(stx, ctx, access)
        ]
    with engine.sessions.transaction() as tx:
        gone += [
            s.name
            for s in placed
            if s.control_effect is not None and not s.control_effect(tx.pg, ctx)
        ]
    return [name for name in (s.name for s in placed) if name in gone]


class _Begun:
    """A server transaction begun by the adopt (2. of the module), open for the first step."""

    def __init__(self, pool: db.Database, first: sql.Composable) -> None:
        self._stack = ExitStack()
        self.tx = self._stack.enter_context(pool.transaction(first))

    def end(self, exc: BaseException | None = None) -> None:
        """Commit it, or roll it back when ``exc`` is raised."""
        if exc is None:
            self._stack.close()
        else:
            self._stack.__exit__(type(exc), exc, exc.__traceback__)

    @contextmanager
    def continued(self) -> Iterator[db.Transaction]:
        """It, as ``pool.transaction()`` would give one: committed at the block's end."""
        with self._stack:
            yield self.tx


def _end(begun: _Begun | None, exc: BaseException | None = None) -> None:
    """End the adopt's transaction if it is still open (see :meth:`_Begun.end`)."""
    if begun is not None:
        begun.end(exc)


def _adopt(
    engine: Engine,
    run: JobRun,
    job: Job,
    pool: db.Database,
    token: int,
    placed: tuple[PlacedStep, ...],
) -> tuple[Job, _Begun | None]:
    """Step 2 of the module: raise the fence, adopt what the server's journal shows done,
    forget what vanished. Returns the job as its new checkpoint left it, and the server
    transaction still open for the first missing step when there was nothing to adopt or
    check (None: committed)."""
    ctx, kind, tenant = run.context, run.kind, run.context.tenant
    recorded = set(job.steps_completed)
    scope = kind.scope(job)
    access = ControlAccess(engine.control, engine.sessions.transaction)
    reader = journal.FencedRun(tenant, job.id, job.run, token)
    begun = _Begun(pool, journal.fence_opening(reader, ctx.lock_timeout_ms))
    try:
        stx = begun.tx
        shown = journal.fenced_steps(stx, reader)
        looked = (shown - recorded) | (recorded if scope is Scope.ALL else set())
        on_server = {
            s.name: s.server_effect is None or s.server_effect(stx, ctx, access)
            for s in placed
            if s.name in looked and s.server is not None
        }
    except BaseException as exc:
        begun.end(exc)
        raise
    adopt = [s for s in placed if s.name in shown - recorded and on_server.get(s.name, False)]
    if not adopt and not (recorded and scope is Scope.ALL):
        # nothing to adopt, nothing recorded to check (a new job's first run, a fleet
        # upgrade's job): the first missing step runs in this transaction
        return job, begun
    begun.end()
    with engine.sessions.transaction(run.lock) as tx:
        gone = {
            s.name
            for s in placed
            if s.name in recorded
            and scope is Scope.ALL
            and not (
                on_server.get(s.name, True)
                and (s.control_effect is None or s.control_effect(tx.pg, ctx))
            )
        }
        for step in adopt:
            if step.control is not None:
                step.control(tx.pg, ctx)
        kept = (recorded - gone) | {s.name for s in adopt}
        if kept != recorded:
            ordered = kind.ordered(kept)
            job = queue.record_step(tx.pg, run.lease, ordered, kind.progress(ordered))
    for name in sorted(recorded & kept, key=kind.step_names.index):
        if scope is Scope.ALL:
            run.on_progress(StepEvent(job, name, StepOutcome.SKIPPED))
    for step in adopt:
        detail = "adopted: done on the tenant's server, its checkpoint had not followed"
        run.on_progress(StepEvent(job, step.name, StepOutcome.SKIPPED, 0.0, detail))
    return job, None


def _run_step(
    engine: Engine,
    run: JobRun,
    job: Job,
    where: tuple[str, db.Database],
    token: int,
    step: PlacedStep,
    run_id: int | None,
    following: str | None,
    begun: _Begun | None,
) -> tuple[Job, int | None]:
    """Step 3 of the module for one step: the server's transaction (``begun``: the adopt's,
    still open; it is this call's to end), then control's. The step's row in control's journal
    is the one the step before it opened (``run_id``), else committed now; its close opens the
    row of the step ``following`` it, whose id is returned with the job. ``where``: the
    tenant's server's name and its sessions."""
    ctx, kind, tenant = run.context, run.kind, run.context.tenant
    control = engine.control
    server, pool = where
    started = time.monotonic()
    claim_sent = False
    if run_id is None:
        opening = queue.step_run_opening(run.lease, tenant.value, step.name)
        try:
            with db.translated(), control.cursor(row_factory=tuple_row) as cur:
                row = cur.execute(opening).fetchone()
        except BaseException as exc:
            _end(begun, exc)
            raise
        assert row is not None, "the journal's opening returns its row"
        run_id = int(row[0])
    run.on_progress(StepEvent(job, step.name, StepOutcome.STARTED))
    try:
        detail = None
        if step.server is not None:
            server_tx = pool.transaction() if begun is None else begun.continued()
            begun = None
            with server_tx as stx:
                access = ControlAccess(control, engine.sessions.transaction, server)
                detail = step.server(stx, ctx, access)
                writer = journal.FencedRun(tenant, job.id, job.run, token)
                journal.end_step(stx, writer, step.name, detail)  # sent with the COMMIT
            run.on_progress(StepEvent(job, step.name, StepOutcome.ON_SERVER, 0.0, detail))
        # A step with no control side sends the tenant's lock, and the BEGIN, with its close:
        # one round trip (db/sessions.py, ``deferred``); one with a control side takes the
        # lock first, sent with the BEGIN.
        deferred = step.control is None
        with engine.sessions.transaction(None if deferred else run.lock, deferred=deferred) as tx:
            if step.control is not None:
                detail = step.control(tx.pg, ctx) or detail
            done = kind.ordered([*job.steps_completed, step.name])
            last = len(done) == len(kind.step_names)
            # The last step's close claims this holder's next job, as on control
            # (engine/handoff.py): the claim commits with it, no round trip of its own.
            claim_sent = last and bool(run.claim_next)
            begin_with = run.lock if deferred else None
            closed = run.close(
                tx.pg, run_id, detail, done, following, last=last, begin_with=begin_with
            )
        if claim_sent:
            engine._claimed = HandOff.of(closed)
    except BaseException as exc:
        _end(begun, exc)
        if claim_sent:  # the commit failed: the next job's claim may have committed
            engine._unsure_after = job.id
        _failed(control, run_id, exc)
        seconds = time.monotonic() - started
        run.on_progress(StepEvent(job, step.name, StepOutcome.FAILED, seconds, describe(exc)))
        if isinstance(exc, LeaseLost) or not isinstance(exc, Exception):
            raise
        raise StepFailed(step.name) from exc
    seconds = time.monotonic() - started
    run.on_progress(StepEvent(closed.job, step.name, StepOutcome.DONE, seconds, detail))
    return closed.job, closed.next_run_id


def _failed(control: psycopg.Connection[Any], run_id: int, exc: BaseException) -> None:
    """The journal's account of a failed step on control, best effort."""
    lost = isinstance(exc, LeaseLost)
    outcome = queue.StepRunOutcome.LEASE_LOST if lost else queue.StepRunOutcome.FAILED
    try:
        with db.translated():
            queue.finish_step_run(control, run_id, outcome, describe(exc))
    except ProvisionerError:
        pass
