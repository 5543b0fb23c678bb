"""The engine's two sessions: the control session (claims, the journal's closes, bookkeeping)
and the steps' pooled session (every step's transaction), and the warm-up of both while idle.

Each holds a latency trick, with its invariant and the test that pins it:

* **The control session commits asynchronously** (``synchronous_commit = off``) and keeps
  generic plans: what it writes alone is a diagnostic trace or a claim that a server crash may
  undo harmlessly (the job is queued again, and fenced writes refuse the lost lease); the steps'
  own transactions keep full durability.
* **The steps' session is checked out once per job** (:meth:`EngineSessions.job`): its
  transactions cost no pool checkout each, and each step's first statement rides on its BEGIN
  (:mod:`provisioner.db.sessions`).
* **A long-lived session is checked without a round trip** (:meth:`EngineSessions.refresh`):
  only a socket with something to read (the server's goodbye) is pinged
  (``tests/integration/test_db.py::test_a_session_the_server_dropped_reconnects_at_its_next_transaction``).
* **Both are warmed while idle after a spare build** (:meth:`EngineSessions.warm`): a spare of
  a large template sends more catalog invalidations than the server's queue holds, so every
  idle session empties its catalog caches; reloading them now costs the same and nobody waits.
  The control session prepares the claim (its generic plan kept), the steps' session the
  kinds' plans ahead and the steps' ends
  (``tests/integration/test_pool.py::test_a_spare_build_warms_the_idle_engine_sessions``,
  ``test_the_warm_up_keeps_the_claims_plan_for_the_next_sign_up``,
  ``test_a_take_binds_the_plans_made_before_it``).
"""

from __future__ import annotations

import select
import threading
from collections.abc import Callable, Iterator, Sequence
from contextlib import AbstractContextManager, ExitStack, contextmanager, suppress
from typing import Any

import psycopg
from psycopg import sql

from provisioner import db, queue
from provisioner.db.plans import GENERIC_PLANS, PlanAhead, prepare_ahead
from provisioner.errors import ProvisionerError


def idle_timeout_ms(stale_after_seconds: float) -> int:
    """How long the server lets a step transaction sit idle before ending it.

    A frozen or partitioned holder must not keep the tenant's lock for ever; a live one is never
    idle inside a step for long. Half the stale threshold, between 10 s and 60 s.
    """
    return int(min(60.0, max(10.0, stale_after_seconds / 2)) * 1000)


class EngineSessions:
    """One engine's control session and steps' pooled session (see the module)."""

    def __init__(self, owner_url: str, *, holder: str, stale_after_seconds: float) -> None:
        self.holder = holder
        #: how long a step transaction may sit idle (the tenant servers' pools use it too)
        self.idle_ms = idle_timeout_ms(stale_after_seconds)
        self.db = db.Database(
            owner_url,
            application_name=holder,
            idle_in_transaction_timeout_ms=self.idle_ms,
        )
        self._control: psycopg.Connection[Any] | None = None
        #: the steps' session while a job runs, or between two handed-off jobs (:meth:`job`)
        self._session: db.Session | None = None
        self._held: ExitStack | None = None

    @property
    def control(self) -> psycopg.Connection[Any]:
        """The autocommit owner session, (re)opened on demand: a worker child's claims, the
        step journal's closes after a failure, and the claim and bookkeeping of a one-off
        provisioning. Its commits are asynchronous (see the module)."""
        if self._control is None or self._control.closed or self._control.broken:
            self._control = self._open_control()
        return self._control

    def _open_control(self) -> psycopg.Connection[Any]:
        if self._control is not None:
            self._control.close()
        return db.connect(
            self.db.url,
            application_name=self.holder,
            autocommit=True,
            # Generic plans: the claim's, made ready by the warm-up, is still there when the
            # next sign-up wakes the engine (see :meth:`warm`).
            session_options={"synchronous_commit": "off", **GENERIC_PLANS},
        )

    def refresh(self) -> None:
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
        self.end_job_session()  # a restart dropped it too, with the transaction begun ahead
        if not db.is_alive(self._control):
            self._control = self._open_control()
        self.db.ensure_alive()

    def warm(self, prepared_plans: Sequence[PlanAhead], touches: Sequence[str] = ()) -> None:
        """Warm the open sessions (none opened for it), best effort: the control session plans
        the claim ahead and keeps that plan (:func:`queue.plan_claim`) and reloads its caches
        (:func:`queue.warm`, with the kinds' ``touches``); the steps' session prepares
        ``prepared_plans`` (the kinds'), then plans the steps' ends (:data:`queue.STEP_PLANS`).
        A session that fails here is left for the next job to meet (and reopen)."""

        def warm_steps_session(conn: psycopg.Connection[Any]) -> None:
            prepare_ahead(conn, prepared_plans)
            queue.warm(conn, queue.STEP_PLANS, touches)

        with suppress(ProvisionerError):
            if self._control is not None and not self._control.closed:
                with db.translated():
                    queue.plan_claim(self.control, self.holder)
                    queue.warm(self.control, (), touches)
            self.db.on_idle_session(warm_steps_session)

    def plan_ahead(self, plans: Sequence[PlanAhead]) -> None:
        """Prepare ``plans`` on the steps' idle session (none opened for it), best effort, as
        :meth:`warm` does with the kinds' plans."""
        with suppress(ProvisionerError):
            self.db.on_idle_session(lambda conn: prepare_ahead(conn, plans))

    def connect_ahead(self, prepare: Callable[[db.Transaction], object]) -> threading.Thread:
        """The steps' session opened in a thread, and ``prepare`` run on it (see
        :meth:`db.Database.connect_ahead`)."""
        return self.db.connect_ahead(prepare)

    @contextmanager
    def job(self) -> Iterator[None]:
        """The steps' pooled session, checked out once for the whole job: its transactions
        cost no pool checkout each (see :meth:`transaction`). A job whose last commit began the
        next job's first transaction (:mod:`provisioner.engine.handoff`) leaves the session
        checked out, that transaction open, for the next job, unless the session served its
        uses (it is then replaced: :data:`provisioner.db.sessions.RECYCLE_AFTER_USES`); any
        other end checks it in (a transaction begun ahead is rolled back then)."""
        if self._session is None:
            self._held = ExitStack()
            self._session = self._held.enter_context(self.db.session())
        else:
            self._session.used()  # one more job on the session held since the last one
        handed_on = False
        try:
            yield
            # a spent session is handed back (and replaced: db/sessions.py), its chain dropped
            handed_on = self._session.driver.chained is not None and not self._session.spent
        finally:
            if not handed_on:
                self.end_job_session()

    def end_job_session(self) -> None:
        """Check the steps' session in (rolling back a transaction begun ahead for a next job);
        nothing when none is checked out."""
        held, self._held, self._session = self._held, None, None
        if held is not None:
            with suppress(ProvisionerError):
                held.close()

    def transaction(
        self,
        first: sql.Composable | None = None,
        then: sql.Composable | None = None,
        before: sql.Composable | None = None,
        deferred: bool = False,
    ) -> AbstractContextManager[db.Transaction]:
        """A transaction on the running job's session, or on a session of its own outside one.
        On the job's session, ``then`` is the first statement of its next transaction, begun
        by this one's commit; ``before`` is committed on its own just before this one begins;
        ``deferred``: its ``BEGIN`` is left to the caller, sent with its first statement
        (:meth:`db.Session.transaction`; steps run only on the job's session)."""
        if self._session is not None:
            return self._session.transaction(first, then=then, before=before, deferred=deferred)
        assert before is None, "a step's journal row is opened on the job's session"
        assert not deferred, "a step's close on control is on the job's session"
        return self.db.transaction(first)

    def close(self) -> None:
        self.end_job_session()
        if self._control is not None:
            self._control.close()
        self.db.close()


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
