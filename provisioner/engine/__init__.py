"""The step engine: check the checkpoint, run, record; classify failures; report progress.

For one claimed job it
1. reads ``steps_completed`` and asks the catalog whether each recorded step's effect is still
   there, forgetting the ones that vanished (they run again, and the step record says why);
2. runs every missing step in order, each in ONE transaction together with its entry in
   ``steps_completed`` and the new ``progress`` (PostgreSQL DDL is transactional): a crash leaves
   a step done and recorded, or neither. The transaction holds the tenant's advisory lock, so two
   engines never run a step of one tenant at the same time, whatever the jobs' kinds (and the
   queue never claims a job while another job of its tenant runs). A step may ask for the steps
   after it to join its transaction (:attr:`kinds.RunMemo.one_transaction`: a spare taken from
   the warm pool); each still records its own entry, and they commit together or not at all;
3. completes the job in the transaction of its last step (so a job is never left with every
   step done but not complete), or hands the failure to the queue (backoff, or failed at once
   when the error is permanent). A worker child's engine also claims its next job in that
   transaction (:meth:`Engine.claim`).

Every step but a job's last commits asynchronously; the last one commits durably, and that
flush makes the earlier ones durable with it (see ``LOCK_ASYNC_COMMIT``).

Every write to the job row is fenced by the lease: if recovery, a take-over or a cancel changed
the row, the step's transaction rolls back and :class:`LeaseLost` propagates.
"""

from __future__ import annotations

import select
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from contextlib import AbstractContextManager, contextmanager, suppress
from dataclasses import dataclass
from typing import Any
from uuid import UUID

import psycopg
from psycopg import sql

from provisioner import db, kinds, pool, queue
from provisioner.errors import (
    InvalidInput,
    LeaseLost,
    PermanentError,
    ProvisionerError,
    WrongState,
)
from provisioner.kinds import JobKind, KindRegistry, Step, StepContext
from provisioner.models import PROVISION_JOB_TYPE, Job, JobStatus, Lease, TenantId
from provisioner.settings import Settings
from provisioner.storage import ObjectStore, store_from_settings
from provisioner.templates import migrations
from provisioner.templates import upgrade as upgrade_replay
from provisioner.templates.replay import TemplateCache
from provisioner.tenant import row as tenants

#: First key of the two-key advisory lock that serialises steps of one tenant ('prov').
TENANT_LOCK_CLASS = 0x70726F76


class Unread:
    """The type of :data:`UNREAD`: a value the caller did not read (the engine reads it)."""


#: ``Engine.run(tenant_state=UNREAD)``: the claim did not read the tenant's state.
UNREAD = Unread()


@dataclass(frozen=True)
class StepEvent:
    """One thing the engine did, for progress output and logs."""

    job: Job
    step: str
    #: 'started', 'done', 'repaired' (ran again: its effect was gone), 'skipped', 'failed'
    outcome: str
    seconds: float = 0.0
    detail: str | None = None


class StepFailed(Exception):
    """A step (or the resume check before the steps) raised; the cause is chained."""

    def __init__(self, step: str) -> None:
        super().__init__(step)
        self.step = step


ProgressCallback = Callable[[StepEvent], None]
StopRequested = Callable[[], bool]


def ignore_progress(event: StepEvent) -> None:
    """The default progress callback: report nothing."""
    return None


def never_stop() -> bool:
    """The default stop request: run every step."""
    return False


def idle_timeout_ms(stale_after_seconds: float) -> int:
    """How long the server lets a step transaction sit idle before ending it.

    A frozen or partitioned holder must not keep the tenant's lock for ever; a live one is never
    idle inside a step for long. Half the stale threshold, between 10 s and 60 s.
    """
    return int(min(60.0, max(10.0, stale_after_seconds / 2)) * 1000)


# A step's transaction starts by taking its tenant's lock, in the same simple query as its
# BEGIN (db.Database.transaction): the values are composed as literals. It also sets the
# transaction to commit without waiting for its WAL flush. Safe: WAL is replayed in order, so a
# server crash can lose only a tail of such commits, each one atomically (the step's work
# together with its checkpoint): the job then resumes from an earlier, consistent checkpoint
# (its claim is asynchronous too). The statement that completes the job, in its last step's
# transaction, sets the commit back to durable (queue.RECORD_LAST_STEP): what a caller is told
# succeeded is durable, and that flush makes every earlier step of the job durable with it.
LOCK_ASYNC_COMMIT = sql.SQL(
    "SELECT pg_advisory_xact_lock({}, hashtext({})), set_config('synchronous_commit', 'off', true)"
)


class Engine:
    """Runs jobs of every kind in its registry for one lease holder (a CLI process or a worker
    child); the steps of a job are its kind's (:mod:`provisioner.kinds`)."""

    def __init__(
        self,
        owner_url: str,
        *,
        holder: str,
        app_role: str,
        store: ObjectStore,
        stale_after_seconds: float = 900.0,
        job_kinds: KindRegistry = kinds.BUILTIN,
        lock_timeout_seconds: float = 5.0,
    ) -> None:
        self.holder = holder
        self.lock_timeout_ms = max(1, int(lock_timeout_seconds * 1000))
        self.app_role = app_role
        self.store = store
        self.kinds = job_kinds
        #: the verified template replay's references, read once per engine (see the module)
        self.templates = TemplateCache(holder=holder)
        #: the fleet upgrade replay's scripts and references (see upgrade_replay)
        self.upgrades = upgrade_replay.UpgradeCache()
        self._db = db.Database(
            owner_url,
            application_name=holder,
            idle_in_transaction_timeout_ms=idle_timeout_ms(stale_after_seconds),
        )
        self._control: psycopg.Connection[Any] | None = None
        #: the steps' session while a job runs (:meth:`_job_session`)
        self._session: db.Session | None = None
        #: the next job, claimed by the last step of the previous one (``claim_next``)
        self._claimed: queue.Claim | None = None
        #: the job whose last step's commit failed after claiming the next one (unknown fate)
        self._unsure_after: UUID | None = None

    @property
    def control(self) -> psycopg.Connection[Any]:
        """The engine's autocommit owner session, (re)opened on demand: a worker child's
        claims, the step journal's closes after a failure, and the claim and bookkeeping of a
        one-off provisioning.

        Its commits are asynchronous (``synchronous_commit = off``): what it writes is either
        a diagnostic trace or a claim that a server crash may undo harmlessly (the job is then
        queued again, and fenced writes refuse the lost lease). The steps' own transactions
        keep full durability.
        """
        if self._control is None or self._control.closed or self._control.broken:
            self._control = self._open_control()
        return self._control

    def _open_control(self) -> psycopg.Connection[Any]:
        if self._control is not None:
            self._control.close()
        return db.connect(
            self._db.url,
            application_name=self.holder,
            autocommit=True,
            # Generic plans: the claim's, made ready by the warm-up, is still there when the
            # next sign-up wakes the engine (see :meth:`warm`).
            options={"synchronous_commit": "off", "plan_cache_mode": "force_generic_plan"},
        )

    @classmethod
    def from_settings(cls, settings: Settings, holder: str) -> Engine:
        """The engine a worker child or a one-off provisioning runs, from the settings."""
        return cls(
            settings.owner_url,
            holder=holder,
            app_role=settings.app_role,
            store=store_from_settings(settings),
            stale_after_seconds=settings.job_stale_after_seconds,
            job_kinds=settings.job_kinds,
            lock_timeout_seconds=settings.lock_timeout_seconds,
        )

    def refresh_sessions(self) -> None:
        """Before each job of a long-lived worker child: reopen the sessions the server dropped
        since the last job (it restarted), without a round trip while they are fine.

        An idle session has nothing to read; one the server ended has its goodbye (an error,
        then end of file) waiting on the socket. So the control session's socket is looked at
        without blocking, and only when something is there is it pinged (one round trip),
        reopened if dead, and the steps' pooled session (which a restart drops too) checked
        with it. A steps session dropped on its own (``pg_terminate_backend``) fails the job's
        first transaction, which is retried like any failed attempt.
        """
        if self._control is None:
            return  # opened on first use
        if not _has_input(self._control) and not self._control.broken:
            return
        if not db.is_alive(self._control):
            self._control = self._open_control()
        self._db.ensure_alive()

    def warm(self) -> None:
        """Run :func:`queue.warm` on the open sessions (none opened for it), best effort: the
        control session plans the claim ahead and keeps that plan (:func:`queue.plan_claim`),
        the steps' session plans the steps' ends and a take.

        A spare of a large template sends more catalog invalidations than the server's queue
        holds, so every idle session empties its catalog caches and reloads them at its next
        statement: the next sign-up's claim and steps would pay for it (docs/PERFORMANCE.md).
        Reloading them now, while idle, costs the same and nobody waits for it. A session that
        fails here is left for the next job to meet (and reopen).
        """
        with suppress(ProvisionerError):
            if self._control is not None and not self._control.closed:
                with db.translated():
                    queue.plan_claim(self.control, self.holder)
                    queue.warm(self.control)
            self._db.on_idle_session(_warm_steps_session)

    def connect_ahead(self) -> threading.Thread:
        """The steps' session opened in a thread, and the template's stored reference read on
        it (see :meth:`db.Database.connect_ahead`); a one-off provisioning joins it before its
        first step. A reference that cannot be read is left for the migration step to meet."""
        return self._db.connect_ahead(
            lambda tx: self.templates.reference(tx, migrations.tenant_tree_state())
        )

    def holds_claim(self) -> bool:
        """True when the last job's final step claimed a next job that has not been taken."""
        return self._claimed is not None

    def claim(self, job_types: tuple[str, ...]) -> queue.Claim | None:
        """This holder's next job of ``job_types`` (a worker child's): the one the previous
        job's last step claimed with its commit (see :meth:`run`), else one claimed now on the
        control session (its commit is asynchronous, see :attr:`control`).

        When that last step's commit failed after the claim was sent, the server may or may not
        have committed it: such a job is handed back first (untouched), so it never sits
        claimed by a live holder that does not know it.
        """
        if self._claimed is not None:
            claimed, self._claimed = self._claimed, None
            return claimed
        with db.translated():
            if self._unsure_after is not None:
                queue.release_unreported(self.control, self.holder, [self._unsure_after])
                self._unsure_after = None
            return queue.claim_next_with_state(self.control, job_types, self.holder)

    def close(self) -> None:
        if self._claimed is not None:  # claimed by the last job, never started: hand it back
            claimed, self._claimed = self._claimed, None
            with suppress(ProvisionerError):
                self.release(claimed.job)
        if self._control is not None:
            self._control.close()
        self._db.close()

    def __enter__(self) -> Engine:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- catalog ------------------------------------------------------------------------------

    def missing_effects(self, tenant: TenantId, job_type: str = PROVISION_JOB_TYPE) -> list[str]:
        """Steps of the kind whose effect the catalog does not show."""
        kind = self.kinds[job_type]
        with self._db.transaction() as tx:
            return _vanished(tx, self._context(tenant), kind.steps, kind.step_names)

    # -- running ------------------------------------------------------------------------------

    def run(
        self,
        job: Job,
        *,
        on_progress: ProgressCallback = ignore_progress,
        should_stop: StopRequested = never_stop,
        tenant_state: str | Unread | None = UNREAD,
        claim_next: tuple[str, ...] = (),
    ) -> Job:
        """Run the job's missing steps, then complete it; on failure, retry or fail it.

        Returns the job as the queue left it (succeeded, queued again, or failed). If
        ``should_stop`` turns true between steps, the job is released back to the queue with its
        progress. Raises :class:`LeaseLost` if the job stopped being ours.

        ``tenant_state`` is the tenant's state as the claim read it (else it is read here).
        With ``claim_next``, the transaction of the job's last step also claims this holder's
        next job of those kinds (:meth:`claim`): the claim commits with the step, and a
        worker child goes on to it without a round trip or a commit of its own.
        """
        if job.tenant_id is None:
            raise PermanentError(f"job {job.id} has no tenant_id")
        tenant = TenantId(job.tenant_id)
        lease = job.lease
        ctx = self._context(tenant)
        journal = self.control
        with self._job_session():
            try:
                kind = self.kinds[job.job_type]
                return self._run_steps(
                    kind, job, lease, ctx, journal, on_progress, should_stop, tenant_state,
                    claim_next,
                )  # fmt: skip
            except LeaseLost:
                raise
            except Exception as exc:
                where, cause = (
                    (exc.step, exc.__cause__) if isinstance(exc, StepFailed) else ("", exc)
                )
                permanent = isinstance(cause, PermanentError | InvalidInput | WrongState)
                message = f"{where or 'start'}: {describe(cause or exc)}"
                return self._finish(
                    lambda c: queue.fail_or_retry(c, lease, message, permanent=permanent)
                )

    @contextmanager
    def _job_session(self) -> Iterator[None]:
        """The steps' pooled session, checked out once for the whole job: its transactions
        cost no pool checkout each (see :meth:`_transaction`)."""
        with self._db.session() as session:
            self._session = session
            try:
                yield
            finally:
                self._session = None

    def _transaction(
        self,
        first: sql.Composable | None = None,
        then: sql.Composable | None = None,
        before: sql.Composable | None = None,
    ) -> AbstractContextManager[db.Transaction]:
        """A transaction on the running job's session, or on a session of its own outside one.
        On the job's session, ``then`` is the first statement of its next transaction, begun
        by this one's commit; ``before`` is committed on its own just before this one begins
        (:meth:`db.Session.transaction`; steps run only on the job's session)."""
        if self._session is not None:
            return self._session.transaction(first, then=then, before=before)
        assert before is None, "a step's journal row is opened on the job's session"
        return self._db.transaction(first)

    def _run_steps(
        self,
        kind: JobKind,
        job: Job,
        lease: Lease,
        ctx: StepContext,
        journal: psycopg.Connection[Any],
        on_progress: ProgressCallback,
        should_stop: StopRequested,
        tenant_state: str | Unread | None,
        claim_next: tuple[str, ...],
    ) -> Job:
        current = "resume check"
        # the journal row the last step opened for the next one (close_step's ``open_next``)
        opened: int | None = None
        try:
            self._check_state(kind, ctx.tenant, journal, tenant_state)
            # A fleet upgrade's job runs the migration step alone (see upgrade_replay); the
            # steps it leaves alone are not part of its run, so they are not reported as
            # skipped either (five messages and log lines per tenant of a rollout, saying
            # what the claim's ``steps_done`` already says).
            upgrade_only = upgrade_replay.upgrade_only(job)
            if upgrade_only:
                repaired: set[str] = set()
            else:
                job, repaired = self._forget_vanished(kind, job, lease, ctx)
            recorded = set(job.steps_completed)
            pending = [step for step in kind.steps if step.name not in recorded]
            for step in kind.steps:
                if step.name in recorded:
                    if not upgrade_only:
                        on_progress(StepEvent(job, step.name, "skipped"))
                    continue
                if not pending or pending[0] is not step:
                    continue  # it ran in the transaction of a step before it
                if should_stop():
                    return self._release(lease, opened)
                current = step.name
                run_id, opened = opened, None  # the step's own now: it closes it, come what may
                job, opened, ran = self._run_transaction(
                    kind,
                    job,
                    lease,
                    pending,
                    ctx,
                    journal,
                    on_progress,
                    repaired,
                    run_id=run_id,
                    claim_next=claim_next,
                )
                pending = pending[ran:]
            if job.status is JobStatus.SUCCEEDED:
                return job  # the last step's transaction completed it
            current = "complete"
            return self._finish(lambda c: queue.complete(c, lease))
        except BaseException as exc:
            if opened is not None:  # the next step's journal row, opened ahead: it never began
                self._discard_run(journal, opened)
            if isinstance(exc, LeaseLost | StepFailed) or not isinstance(exc, Exception):
                raise
            raise StepFailed(current) from exc

    @staticmethod
    def _check_state(
        kind: JobKind,
        tenant: TenantId,
        journal: psycopg.Connection[Any],
        state: str | Unread | None,
    ) -> None:
        """WrongState (the job fails at once) when the tenant's state refuses the kind."""
        if not kind.refused_states:
            return
        if isinstance(state, Unread):
            with db.translated():
                state = tenants.state_of(journal, tenant)
        if state in kind.refused_states:
            raise WrongState(f"tenant {tenant} is {state}: {kind.name} leaves it alone")

    def _context(self, tenant: TenantId) -> StepContext:
        return StepContext(
            tenant=tenant,
            app_role=self.app_role,
            store=self.store,
            templates=self.templates,
            upgrades=self.upgrades,
            lock_timeout_ms=self.lock_timeout_ms,
        )

    def _forget_vanished(
        self, kind: JobKind, job: Job, lease: Lease, ctx: StepContext
    ) -> tuple[Job, set[str]]:
        if not job.steps_completed:
            return job, set()
        with self._transaction() as tx:
            gone = _vanished(tx, ctx, kind.steps, job.steps_completed)
            if not gone:
                return job, set()
            kept = kind.ordered(s for s in job.steps_completed if s not in gone)
            job = queue.record_step(tx.pg, lease, kept, kind.progress(kept))
        return job, set(gone)

    def _run_transaction(
        self,
        kind: JobKind,
        job: Job,
        lease: Lease,
        pending: list[Step],
        ctx: StepContext,
        journal: psycopg.Connection[Any],
        on_progress: ProgressCallback,
        repaired: set[str],
        *,
        run_id: int | None = None,
        claim_next: tuple[str, ...] = (),
    ) -> tuple[Job, int | None, int]:
        """Run the first of the job's ``pending`` steps in one transaction with its checkpoint,
        and the steps after it in the same transaction while a step asks for it
        (:attr:`kinds.RunMemo.one_transaction`). Returns the job as the last checkpoint left it,
        the journal row opened for the step after the transaction's last one, and how many steps
        ran. The job's last step completes the job in its transaction (and, with
        ``claim_next``, claims the holder's next job).

        ``run_id`` is the first step's journal row when the step before it opened it; otherwise
        the row is committed on its own just before the transaction begins, in the same round
        trip. Each step's close opens the next one's row (inside the transaction), and the
        commit begins the next transaction with its tenant lock (one round trip fewer per
        step). Progress events of finished steps are reported once the commit made them true;
        a failure raises :class:`StepFailed` naming the step that failed (or the commit's
        last step, when the commit failed)."""
        lock = _tenant_lock(ctx.tenant)
        finished: list[StepEvent] = []
        step, started = pending[0], time.monotonic()
        committed_run = run_id  # the journal row committed before this transaction began
        claim_sent = False
        # The journal's start row, committed before the step's work begins, so that a step
        # killed mid-work still leaves its run for recovery to mark abandoned; sent with the
        # transaction's BEGIN. Later steps find their row opened by the step before them
        # (queue.CLOSE_STEP_OPEN_NEXT).
        opening = (
            None
            if run_id is not None
            else queue.step_run_opening(lease, ctx.tenant.value, step.name)
        )
        try:
            with self._transaction(lock, lock if len(pending) > 1 else None, opening) as tx:
                if tx.before_row is not None:
                    run_id = committed_run = int(tx.before_row[0])
                for index, step in enumerate(pending):
                    started = time.monotonic()
                    following = pending[index + 1].name if index + 1 < len(pending) else None
                    assert run_id is not None  # written above, or opened by the step before
                    closed, detail = self._step_in(
                        tx, kind, job, lease, step, ctx, on_progress, step.name in repaired,
                        run_id, following, claim_next,
                    )  # fmt: skip
                    claim_sent = following is None and bool(claim_next)
                    job, run_id = closed.job, closed.next_run_id
                    finished.append(
                        StepEvent(
                            job,
                            step.name,
                            "repaired" if step.name in repaired else "done",
                            time.monotonic() - started,
                            detail,
                        )
                    )
                    if following is None or not ctx.memo.one_transaction:
                        break
                tx.then = None if following is None else lock
                # leaving the block commits
            self._claimed = closed.claimed
        except BaseException as exc:
            if claim_sent:  # the commit failed: the next job's claim may have committed
                self._unsure_after = job.id
            outcome = "lease_lost" if isinstance(exc, LeaseLost) else "failed"
            if committed_run is not None:  # the rows the transaction opened rolled back with it
                self._close_run(journal, committed_run, outcome, _failure(exc, step, pending[0]))
            on_progress(
                StepEvent(job, step.name, "failed", time.monotonic() - started, describe(exc))
            )
            if isinstance(exc, LeaseLost) or not isinstance(exc, Exception):
                raise
            raise StepFailed(step.name) from exc
        try:
            for event in finished:
                on_progress(event)
        except BaseException:
            if run_id is not None:  # the next step will not begin
                self._discard_run(journal, run_id)
            raise
        return job, run_id, len(finished)

    @staticmethod
    def _step_in(
        tx: db.Transaction,
        kind: JobKind,
        job: Job,
        lease: Lease,
        step: Step,
        ctx: StepContext,
        on_progress: ProgressCallback,
        repairing: bool,
        run_id: int,
        following: str | None,
        claim_next: tuple[str, ...],
    ) -> tuple[queue.ClosedStep, str | None]:
        """One step's work and its end in ``tx``: the journal's close and the fenced checkpoint
        in one statement, which commit together with the step's work, or not at all. A step
        before the last opens the next step's journal row in it too (one round trip fewer per
        step). The last step completes the job with it: one commit fewer per job, and the step,
        its checkpoint and the job's success are one atomic change. The next job's claim rides
        on that commit too (a LeaseLost rolls it back with the rest)."""
        on_progress(StepEvent(job, step.name, "started"))
        detail = step.run(tx, ctx)
        if repairing:
            detail = "; ".join(
                filter(None, ["re-ran: its effect was missing from the catalog", detail])
            )
        done = kind.ordered([*job.steps_completed, step.name])
        closed = queue.close_step(
            tx.pg,
            run_id,
            detail,
            lease,
            done,
            kind.progress(done),
            last=following is None,
            claim_next=claim_next if following is None else (),
            open_next=None if following is None else queue.NextStep(ctx.tenant.value, following),
        )
        return closed, detail

    @staticmethod
    def _discard_run(journal: psycopg.Connection[Any], run_id: int) -> None:
        """Remove a journal row opened ahead for a step that will not begin (best effort: left
        open, recovery marks it abandoned)."""
        try:
            with db.translated():
                queue.discard_step_run(journal, run_id)
        except ProvisionerError:
            pass

    def _release(self, lease: Lease, opened: int | None) -> Job:
        """Hand the job back, untouched or between two steps; the journal row opened ahead for
        a step that now does not begin (``opened``) goes with it, in the same transaction."""

        def release(conn: psycopg.Connection[Any]) -> Job:
            if opened is not None:
                queue.discard_step_run(conn, opened)
            return queue.release(conn, lease)

        return self._finish(release)

    @staticmethod
    def _close_run(
        journal: psycopg.Connection[Any], run_id: int, outcome: str, detail: str
    ) -> None:
        try:
            with db.translated():
                queue.finish_step_run(journal, run_id, outcome, detail)
        except ProvisionerError:
            pass  # the journal is best effort when the database itself is failing

    def release(self, job: Job) -> Job:
        """Hand the held job back to the queue, untouched (its attempt is not counted)."""
        return self._release(job.lease, None)

    def _finish(self, write: Callable[[psycopg.Connection[Any]], Job]) -> Job:
        with self._transaction() as tx:
            return write(tx.pg)


def _warm_steps_session(conn: psycopg.Connection[Any]) -> None:
    """The steps' idle session after a spare build: its catalog caches reloaded for the steps'
    ends (:func:`queue.warm`), and a take's first statements prepared (:func:`pool.plan_take`)."""
    pool.plan_take(conn)
    queue.warm(conn, queue.STEP_PLANS)


def _tenant_lock(tenant: TenantId) -> sql.Composed:
    """A step's first statement: the tenant's lock and the step's commit mode, in one statement
    (one execute is cheaper for psycopg than a pipeline of two, measured in
    docs/PERFORMANCE.md), sent with the transaction's BEGIN."""
    return LOCK_ASYNC_COMMIT.format(sql.Literal(TENANT_LOCK_CLASS), sql.Literal(tenant.value))


def _failure(exc: BaseException, failed: Step, first: Step) -> str:
    """The journal's account of a failed transaction, on the row it began with (the rows of
    the steps after it rolled back with the transaction): the error, and which step of the
    transaction raised it when that was a later one."""
    if failed is first:
        return describe(exc)
    return queue.bounded_error(
        f"rolled back with {failed.name}, in the same transaction: {describe(exc)}"
    )


def _has_input(conn: psycopg.Connection[Any]) -> bool:
    """True when an idle session's socket has something to read (or is closed): the server
    said something unprompted, usually that it ended the session. Never blocks."""
    if conn.closed:
        return True
    try:
        readable, _, _ = select.select([conn.fileno()], [], [], 0)
    except (OSError, ValueError):
        return True
    return bool(readable)


def _vanished(
    tx: db.Transaction, ctx: StepContext, steps: tuple[Step, ...], names: Iterable[str]
) -> list[str]:
    """Of the steps ``names``, those that use the database and whose effect is gone."""
    wanted = set(names)
    return [
        step.name
        for step in steps
        if step.name in wanted and step.uses_database and not step.effect_present(tx, ctx)
    ]


def describe(exc: BaseException) -> str:
    """A one-line, secret-free account of an error for ``error_detail`` and logs."""
    text = " ".join(str(exc).split())
    if isinstance(exc, ProvisionerError):
        return queue.bounded_error(text or type(exc).__name__)
    return queue.bounded_error(f"{type(exc).__name__}: {text}" if text else type(exc).__name__)
