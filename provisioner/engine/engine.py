"""The step engine: check the checkpoint, run, record; classify failures; report progress.

For one claimed job it
1. reads ``steps_completed`` and asks the catalog whether each recorded step's effect is still
   there, forgetting the ones that vanished (they run again, and the step record says why),
   unless the kind's scope trusts the recorded steps for this job (:class:`kinds.Scope`);
2. runs every missing step in order, each in ONE transaction together with its entry in
   ``steps_completed`` and the new ``progress`` (PostgreSQL DDL is transactional): a crash leaves
   a step done and recorded, or neither. The transaction holds the tenant's lock, so two
   engines never run a step of one tenant at the same time, whatever the jobs' kinds (and the
   queue never claims a job while another job of its tenant runs). A step may ask for the steps
   after it to join its transaction (:attr:`kinds.RunMemo.one_transaction`: a spare taken from
   the warm pool); each still records its own entry, and they commit together or not at all;
3. completes the job in the transaction of its last step (so a job is never left with every
   step done but not complete), or hands the failure to the queue (backoff, or failed at once
   when :func:`errors.is_permanent` says so). A worker child's engine also claims its next job
   in that transaction (:meth:`Engine.claim`), opens that job's first journal row and begins its
first transaction (:mod:`provisioner.engine.handoff`).

The engine knows no kind by name: a job's kind (:class:`kinds.JobKind`) gives its steps, the
states it refuses, its scope, its memo and its plans made ahead.

Every step but a job's last commits asynchronously; the last one commits durably, and that
flush makes the earlier ones durable with it (see :mod:`provisioner.engine.step_lock`). Each
step's journal row is opened by the step before it (the first one by the job before it, or
just before its transaction), and each commit begins the next step's transaction (one round
trip fewer per step each): pinned by
``tests/integration/test_job_kinds.py::
test_each_step_after_the_first_starts_in_the_journal_when_the_one_before_finished`` and
``tests/integration/test_pool.py::test_a_taken_spares_steps_commit_together_or_leave_the_spare``.

Every write to the job row is fenced by the lease: if recovery, a take-over or a cancel changed
the row, the step's transaction rolls back and :class:`LeaseLost` propagates.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable
from contextlib import suppress
from typing import Any
from uuid import UUID

import psycopg

from provisioner import db, kinds, queue
from provisioner.engine import remote, step_transaction
from provisioner.engine.events import (
    ProgressCallback,
    StepEvent,
    StepOutcome,
    StopRequested,
    describe,
    ignore_progress,
    never_stop,
)
from provisioner.engine.handoff import HandOff, first_steps, usable
from provisioner.engine.job_run import (
    UNREAD,
    ClaimRead,
    JobRun,
    RunState,
    Unread,
)
from provisioner.engine.sessions import EngineSessions
from provisioner.engine.step_lock import tenant_lock
from provisioner.errors import (
    ConnectionLost,
    LeaseLost,
    LockNotAvailable,
    PermanentError,
    ProvisionerError,
    StepFailed,
    TenantElsewhere,
    WrongState,
    is_permanent,
)
from provisioner.kinds import JobKind, KindRegistry, Scope, Step, StepContext
from provisioner.models import Job, JobStatus, Lease, TenantId
from provisioner.roles import DEFAULT_APP_ROLES, AppRoles
from provisioner.servers.sessions import ServerSessions
from provisioner.settings import Settings
from provisioner.storage import ObjectStore, store_from_settings
from provisioner.templates import migrations
from provisioner.templates import upgrade as upgrade_replay
from provisioner.templates.replay import TemplateCache
from provisioner.tenant import fingerprint
from provisioner.tenant import row as tenants
from provisioner.tenant.state import TenantState


class Engine:
    """Runs jobs of every kind in its registry for one lease holder (a CLI process or a worker
    child); the steps of a job are its kind's (:mod:`provisioner.kinds`)."""

    def __init__(
        self,
        owner_url: str,
        *,
        holder: str,
        app_roles: AppRoles = DEFAULT_APP_ROLES,
        store: ObjectStore,
        stale_after_seconds: float = 900.0,
        job_kinds: KindRegistry = kinds.BUILTIN,
        lock_timeout_seconds: float = 5.0,
        seeds: tuple[str, ...] = (),
        pool: bool = True,
    ) -> None:
        self.holder = holder
        #: the warm pool is on (PROVISIONER_POOL_SIZE > 0): a take on a tenant server claims
        self.pool = pool
        self.owner_url = owner_url
        #: the project's declared seeds (PROVISIONER_SEEDS), resolved by the seed step
        self.seeds = seeds
        self.lock_timeout_ms = max(1, int(lock_timeout_seconds * 1000))
        #: the application roles granted in each tenant (each with its privilege set)
        self.app_roles = app_roles
        self.store = store
        self.kinds = job_kinds
        #: the verified template replay's references, read once per engine (see the module)
        self.templates = TemplateCache(holder=holder)
        #: the fleet upgrade replay's scripts and references (see upgrade_replay)
        self.upgrades = upgrade_replay.UpgradeCache()
        self.sessions = EngineSessions(
            owner_url, holder=holder, stale_after_seconds=stale_after_seconds
        )
        #: the owner's pools on the tenant servers, opened on first use (engine/remote.py)
        self.servers = ServerSessions(
            owner_url,
            holder=holder,
            idle_in_transaction_timeout_ms=self.sessions.idle_ms,
            plans=(fingerprint.PLAN_AHEAD,),  # every verified replay there binds it
        )
        #: the next job, claimed by the last step of the previous one (``claim_next``)
        self._claimed: HandOff | None = None
        #: the journal row that claim opened for the claimed job's first step, until it runs
        self._opened: queue.OpenedRun | None = None
        self._last: queue.Claim | None = None  #: its last claim (remote.claimed_token)
        #: the job whose last step's commit failed after claiming the next one (unknown fate)
        self._unsure_after: UUID | None = None

    @classmethod
    def from_settings(cls, settings: Settings, holder: str) -> Engine:
        """The engine a worker child or a one-off provisioning runs, from the settings."""
        return cls(
            settings.owner_url,
            holder=holder,
            app_roles=settings.app_roles,
            store=store_from_settings(settings),
            stale_after_seconds=settings.job_stale_after_seconds,
            job_kinds=kinds.for_settings(settings),
            lock_timeout_seconds=settings.lock_timeout_seconds,
            seeds=settings.seeds,
            pool=settings.pool_size > 0,
        )

    # -- sessions (engine/sessions.py) ---------------------------------------------------------

    @property
    def control(self) -> psycopg.Connection[Any]:
        """The engine's autocommit owner session (:attr:`EngineSessions.control`)."""
        return self.sessions.control

    def refresh_sessions(self) -> None:
        """Reopen the sessions the server dropped since the last job
        (:meth:`EngineSessions.refresh`)."""
        self.sessions.refresh()

    def warm(self) -> None:
        """Warm the idle sessions after a spare build, best effort
        (:meth:`EngineSessions.warm`), with every kind's plans made ahead."""
        self.sessions.warm(self.kinds.prepared_plans, self.kinds.warm_touches)

    def load_tree(self) -> None:
        """Read the tenant tree now (Alembic's import, ~0.3 s, and the heads) and its template
        reference (read, or computed and stored the first time the database meets this tree
        state). A worker child does it before it says it is ready, so that neither its first
        job nor its sibling children, waiting on the reference's lock, pay for it inside a
        burst. A tree or reference that cannot be had is left for the job to report. Then the
        fingerprint's plan: a catalog read, it waits on no lock a build holds (:meth:`warm`'s)."""
        with suppress(Exception):
            tree = migrations.tenant_tree_state()
            with self.sessions.transaction() as tx:
                self.templates.reference(tx, tree)
        # after the reference, whose computation rolls back: psycopg forgets its plans then
        self.sessions.plan_ahead((fingerprint.PLAN_AHEAD,))

    def open_servers(self) -> None:
        """Open the pool of every tenant server in service now (a login, the driver's set-up and
        the tool schema's check each: :meth:`ServerSessions.open_ahead`). A worker child does
        it with :meth:`load_tree`, before it says it is ready, so that its first job on each
        server does not pay for it inside a burst or a fleet upgrade. Best effort: a server
        that cannot be opened is left for its first job to report."""
        with suppress(Exception):
            self.servers.open_ahead(self.control)

    def connect_ahead(self) -> threading.Thread:
        """The steps' session opened in a thread, and the template's stored reference read on
        it; a one-off provisioning joins it before its first step. A reference that cannot be
        read is left for the migration step to meet."""
        return self.sessions.connect_ahead(
            lambda tx: self.templates.reference(tx, migrations.tenant_tree_state())
        )

    # -- claims ---------------------------------------------------------------------------------

    def holds_claim(self) -> bool:
        """True when the last job's final step claimed a next job that has not been taken."""
        return self._claimed is not None

    def claim(self, job_types: tuple[str, ...]) -> queue.Claim | None:
        """This holder's next job of ``job_types`` (a worker child's): the one the previous
        job's last step claimed with its commit (see :meth:`run`), else one claimed now on the
        control session (asynchronous, unless the tenant is on a tenant server: the claim
        gives its run's fencing token, queue/fence.py). A job whose claim rode on a last step's
        failed commit (committed or not) is handed back first, untouched: it never sits claimed
        by a live holder that does not know it."""
        if self._claimed is not None:
            handed, self._claimed = self._claimed, None
            self._opened, self._last = handed.opened, handed.claim
            return handed.claim
        with db.translated():
            if self._unsure_after is not None:
                queue.release_unreported(self.control, self.holder, [self._unsure_after])
                self._unsure_after = None
            self._last = queue.claim_next_with_state(self.control, job_types, self.holder)
            return self._last

    def close(self) -> None:
        if self._claimed is not None:  # claimed by the last job, never started: hand it back
            handed, self._claimed = self._claimed, None
            self._opened = handed.opened
            with suppress(ProvisionerError):
                self.release(handed.claim.job)
        self.servers.close()
        self.sessions.close()

    def __enter__(self) -> Engine:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- catalog --------------------------------------------------------------------------------

    def missing_effects(self, tenant: TenantId, job_type: str) -> list[str]:
        """Steps of the kind whose effect the catalog does not show."""
        kind = self.kinds[job_type]
        placed = remote.missing_placed(self, kind, self._context(tenant, kind))
        if placed is not None:  # the tenant lives on a tenant server
            return placed
        with self.sessions.transaction() as tx:
            return _vanished(tx, self._context(tenant, kind), kind.steps, kind.step_names)

    # -- running --------------------------------------------------------------------------------

    def run(
        self,
        job: Job,
        *,
        on_progress: ProgressCallback = ignore_progress,
        should_stop: StopRequested = never_stop,
        tenant_state: str | Unread | None = UNREAD,
        tenant_server: str | Unread | None = UNREAD,
        claim_next: tuple[str, ...] = (),
    ) -> Job:
        """Run the job's missing steps, then complete it; on failure, retry or fail it.

        Returns the job as the queue left it (succeeded, queued again, or failed). If
        ``should_stop`` turns true between steps, the job is released back to the queue with its
        progress. Raises :class:`LeaseLost` if the job stopped being ours.

        ``tenant_state`` is the tenant's state as the claim read it (else it is read here),
        ``tenant_server`` the tenant server it lives on (likewise): such a job's steps run there
        (:mod:`provisioner.engine.remote`), or it fails at once when its kind has none.
        With ``claim_next``, the transaction of the job's last step also claims this holder's
        next job of those kinds (:meth:`claim`): the claim commits with the step, and a
        worker child goes on to it without a round trip or a commit of its own.
        """
        if job.tenant_id is None:
            raise PermanentError(f"job {job.id} has no tenant_id")
        tenant = TenantId(job.tenant_id)
        lease = job.lease
        journal = self.control
        with self.sessions.job():
            try:
                kind = self.kinds[job.job_type]
                run = JobRun(
                    kind=kind,
                    lease=lease,
                    context=self._context(tenant, kind),
                    journal=journal,
                    on_progress=on_progress,
                    should_stop=should_stop,
                    claim_next=claim_next,
                    first_steps=first_steps(self.kinds, claim_next),
                    lock=tenant_lock(tenant.value),
                )
                return self._run_steps(run, job, (tenant_state, tenant_server))
            except LeaseLost:
                raise
            except Exception as exc:
                where, cause = (
                    (exc.step, exc.__cause__) if isinstance(exc, StepFailed) else ("", exc)
                )
                permanent = is_permanent(cause or exc)
                # A lock timeout (an application's transaction holds the lock) is waited out:
                # queued again without spending an attempt (queue.FAIL_OR_RETRY).
                contended = isinstance(cause or exc, LockNotAvailable)
                # A session lost under the step (a failover, a restart) is no fault of the
                # job: it is retried at once, not after the backoff.
                cut = isinstance(cause or exc, ConnectionLost)
                message = f"{where or 'start'}: {describe(cause or exc)}"
                return self._finish(
                    lambda c: queue.fail_or_retry(
                        c, lease, message, permanent=permanent, contended=contended, at_once=cut
                    )
                )

    def _run_steps(self, run: JobRun, job: Job, claimed: tuple[ClaimRead, ClaimRead]) -> Job:
        current = "resume check"
        opened = self._take_opened(job.id)
        state = RunState(job, opened=None if opened is None else opened.run_id)
        try:
            server = self._check_state(run, *claimed)
            if server is not None:  # the tenant lives on a tenant server: engine/remote.py
                state.opened = None  # the claim's row: the run's there, to use or discard
                return remote.run_placed(self, run, job, server, opened)
            # A scope of the pending steps alone (a fleet upgrade's job: its migration step)
            # leaves the recorded steps unchecked and unreported: five messages and log lines
            # per tenant of a rollout would say what the claim's ``steps_done`` already says.
            scope = run.kind.scope(job)
            if scope is Scope.ALL:
                self._forget_vanished(run, state)
            recorded = set(state.job.steps_completed)
            pending = [step for step in run.kind.steps if step.name not in recorded]
            if state.opened is not None and not usable(opened, pending):
                self._discard_run(run.journal, state.opened)  # the run begins elsewhere
                state.opened = None
            for step in run.kind.steps:
                if step.name in recorded:
                    if scope is Scope.ALL:
                        run.on_progress(StepEvent(state.job, step.name, StepOutcome.SKIPPED))
                    continue
                if not pending or pending[0] is not step:
                    continue  # it ran in the transaction of a step before it
                if run.should_stop():
                    return self._release(run.lease, state.opened)
                current = step.name
                pending = pending[step_transaction.run_transaction(self, run, state, pending) :]
            if state.job.status is JobStatus.SUCCEEDED:
                return state.job  # the last step's transaction completed it
            current = "complete"
            return self._finish(lambda c: queue.complete(c, run.lease))
        except BaseException as exc:
            if state.opened is not None:  # the next step's journal row, opened ahead: unused
                self._discard_run(run.journal, state.opened)
            if isinstance(exc, LeaseLost | StepFailed) or not isinstance(exc, Exception):
                raise
            raise StepFailed(current) from exc

    @staticmethod
    def _check_state(run: JobRun, claimed: ClaimRead, server: ClaimRead) -> str | None:
        """The tenant server whose steps the run takes (None: the control database's). WrongState
        (the job fails at once) when the tenant's state refuses the kind, and TenantElsewhere
        when it lives on a tenant server and the kind has no steps for one (a kind with
        :attr:`JobKind.any_server`, a move, runs here: its steps open their own sessions). The
        claim's state is the column's text (the queue knows no tenant): typed here. Read here
        only when the claim did not."""
        kind, tenant = run.kind, run.context.tenant
        if isinstance(claimed, Unread) or isinstance(server, Unread):
            with db.translated():
                found = tenants.get_tenant(run.journal, tenant)
            claimed = None if found is None else found.state.value
            server = None if found is None else found.server
        if kind.any_server:
            server = None
        if server is not None and kind.placed_steps is None:
            raise TenantElsewhere(
                f"tenant {tenant} lives on tenant server {server}: {kind.name} runs on the "
                "control database only (it has no steps for a tenant server yet)"
            )
        state = None if claimed is None else TenantState(claimed)
        if state in kind.refused_states:
            raise WrongState(f"tenant {tenant} is {state}: {kind.name} leaves it alone")
        return server

    def _context(self, tenant: TenantId, kind: JobKind) -> StepContext:
        return StepContext(
            tenant=tenant,
            app_roles=self.app_roles,
            store=self.store,
            templates=self.templates,
            upgrades=self.upgrades,
            lock_timeout_ms=self.lock_timeout_ms,
            seeds=self.seeds,
            memo=kind.memo(),
            owner_url=self.owner_url,
            pool=self.pool,
        )

    def _forget_vanished(self, run: JobRun, state: RunState) -> None:
        """Drop from the checkpoint the recorded steps whose effect is gone; they are repaired."""
        job, kind = state.job, run.kind
        if not job.steps_completed:
            return
        with self.sessions.transaction() as tx:
            gone = _vanished(tx, run.context, kind.steps, job.steps_completed)
            if not gone:
                return
            kept = kind.ordered(s for s in job.steps_completed if s not in gone)
            state.job = queue.record_step(tx.pg, run.lease, kept, kind.progress(kept))
        state.repaired = frozenset(gone)

    # -- records --------------------------------------------------------------------------------

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
        journal: psycopg.Connection[Any], run_id: int, outcome: queue.StepRunOutcome, detail: str
    ) -> None:
        try:
            with db.translated():
                queue.finish_step_run(journal, run_id, outcome, detail)
        except ProvisionerError:
            pass  # the journal is best effort when the database itself is failing

    def release(self, job: Job) -> Job:
        """Hand the held job back to the queue, untouched (its attempt is not counted), with
        the journal row its claim opened."""
        opened = self._take_opened(job.id)
        return self._release(job.lease, None if opened is None else opened.run_id)

    def _take_opened(self, job_id: UUID) -> queue.OpenedRun | None:
        """The journal row the claim of ``job_id`` opened for its first step, taken once."""
        opened, self._opened = self._opened, None
        return opened if opened is not None and opened.job_id == job_id else None

    def _finish(self, write: Callable[[psycopg.Connection[Any]], Job]) -> Job:
        with self.sessions.transaction() as tx:
            return write(tx.pg)


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
