"""Sessions and transactions of the owner role, and the chained commit.

:class:`Database` is the step engine's pooled session (one kept open for a whole job);
:class:`Session` one checked-out session of it; :class:`Transaction` one open transaction seen
through both drivers. The round trips a transaction saves live here and nowhere else:

* **A transaction's first statement rides on its BEGIN** (:meth:`Session.transaction`'s
  ``first``): the sessions are in psycopg's autocommit mode and each transaction sends its own
  ``BEGIN; <first>`` as one simple query, one round trip where psycopg's implicit ``BEGIN``
  would take two. Invariant: ``first`` runs inside the transaction, and a ``first`` that fails
  rolls it back and leaves the session usable
  (``tests/integration/test_db.py::test_the_first_statement_runs_inside_the_transaction``,
  ``test_a_failing_first_statement_rolls_back_and_the_session_serves_the_next``).
* **A commit begins the next transaction** (:class:`ChainingConnection`, the only override of
  psycopg's ``commit``; asked for with :meth:`Transaction.begin_next_with`): ``COMMIT; BEGIN;
  <next first>`` in one round trip. Invariant: the commit's outcome is a plain commit's, a
  failing next statement never undoes it, and a chained transaction nobody takes is rolled back
  (``tests/integration/test_db.py::test_a_commit_begins_the_next_transaction_with_its_first_statement``,
  ``test_a_transaction_begun_ahead_for_another_statement_is_rolled_back``,
  ``test_a_next_first_statement_that_fails_leaves_the_commit_and_fails_its_own_transaction``,
  ``test_a_commit_that_fails_begins_nothing``).

A commit may also carry the transaction's last statement (:meth:`Transaction.end_with`: a
tenant server's journal row and fence), ``<last>; COMMIT`` in one round trip. Invariant: a
failing last statement commits nothing, and the block raises and rolls back
(``test_a_last_statement_that_fails_commits_nothing``).

A statement may also be committed on its own just before a transaction begins, in the same
round trip (``before``: the step engine's first journal row), pinned by
``test_a_statement_before_a_transaction_commits_on_its_own``.

**A pooled session is replaced after** :data:`RECYCLE_AFTER_USES` **uses** (checkouts, and a
worker child's jobs on its held session: :meth:`Session.used`): its server process keeps every
relation it opened in its catalog caches for its life, one tenant schema after another (10-34
KiB for a 2-table schema, more for a larger template; 0.1-0.35 GB for a session that upgraded
10,000 tenants), and returns that memory only when it exits. Invariant: a spent session is
closed when it is handed back, never under a transaction; the next use opens a new one
(``test_a_pooled_session_is_replaced_after_its_uses``).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager, suppress
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import psycopg
from psycopg import sql
from psycopg.pq import TransactionStatus
from psycopg.rows import dict_row

from provisioner.db import conninfo
from provisioner.db.conninfo import libpq_address
from provisioner.db.plans import GENERIC_PLANS
from provisioner.db.translate import translated

# SQLAlchemy (~0.2 s to import) is for Alembic and the callers' connections; commands that
# only read and write rows start without it (docs/performance.md "Start-up").
if TYPE_CHECKING:
    import sqlalchemy as sa

#: Every connection of the package (psycopg, SQLAlchemy, Alembic) gives up after this long, so
#: a server that accepts connections but never answers (stopped, overloaded) fails a command
#: instead of hanging it. libpq applies it to each host of a multi-host URL.
CONNECT_TIMEOUT_SECONDS = 5
#: The same bound as SQLAlchemy ``connect_args``.
SA_CONNECT_ARGS: dict[str, Any] = {"connect_timeout": CONNECT_TIMEOUT_SECONDS}
#: A pooled session used this long ago or less needs no liveness check before a job.
FRESH_SECONDS = 1.0
#: Uses of a pooled session before it is replaced (see the module): a reconnect costs a few
#: ms once per this many jobs, and bounds what one server process holds of the tenants' catalog.
RECYCLE_AFTER_USES = 200
#: The key of a session's count of uses in its pooled connection's ``info`` (which SQLAlchemy
#: clears when the connection is replaced).
USES = "provisioner_uses"


def connect(
    url: str,
    *,
    application_name: str = "provisioner",
    autocommit: bool = False,
    session_options: dict[str, Any] | None = None,
) -> psycopg.Connection[dict[str, Any]]:
    """A new psycopg connection returning dict rows; close it (``with``) when done.

    ``session_options``: server settings for the whole session, sent as libpq's ``options``
    startup parameter, for the step engine's sessions only. PgBouncer refuses that parameter,
    which is how a command that needs a server session of its own is refused through it in one
    line (:data:`~provisioner.db.translate.POOLER_HINT`). A command that works through PgBouncer
    sends none and sets what it needs in each transaction (:func:`local_settings`)."""
    with translated():
        return psycopg.connect(
            libpq_address(url),
            autocommit=autocommit,
            row_factory=dict_row,
            connect_timeout=CONNECT_TIMEOUT_SECONDS,
            application_name=application_name[:63],
            options=_options(session_options),
            **conninfo.keepalive_args(url),
        )


def local_settings(settings: Mapping[str, str]) -> sql.Composed:
    """``SELECT set_config(name, value, true), ...``: each of ``settings`` for the current
    transaction only, to send first in it (or first in a string of statements, which runs as one
    implicit transaction).

    How a one-off command sets its server parameters (``lock_timeout``...): libpq's ``options``
    startup parameter is refused by PgBouncer (``unsupported startup parameter: options``), and
    a session ``SET`` would, under transaction pooling, stay on a server connection that other
    clients share next while missing from this client's next transaction."""
    calls = sql.SQL(", ").join(
        sql.SQL("set_config({}, {}, true)").format(sql.Literal(name), sql.Literal(value))
        for name, value in settings.items()
    )
    return sql.SQL("SELECT {}").format(calls)


@contextmanager
def transaction_with(
    conn: psycopg.Connection[Any], settings: Mapping[str, str]
) -> Iterator[psycopg.Transaction]:
    """A transaction of ``conn`` whose first statement sets ``settings`` for it alone
    (:func:`local_settings`): works directly and through a pooler in transaction mode."""
    with conn.transaction() as tx:
        conn.execute(local_settings(settings))
        yield tx


def is_alive(conn: psycopg.Connection[Any]) -> bool:
    """One cheap round trip: False when the server or the network dropped the session."""
    if conn.closed or conn.broken:
        return False
    try:
        conn.execute("SELECT 1")
    except psycopg.Error:
        return False
    return True


def _options(options: dict[str, Any] | None) -> str:
    return " ".join(f"-c {key}={value}" for key, value in (options or {}).items())


@dataclass
class Transaction:
    """One open transaction seen through both drivers: ``pg`` for our SQL, ``sa`` for Alembic."""

    pg: psycopg.Connection[Any]
    sa: sa.Connection
    #: the first row of :meth:`Session.transaction`'s ``before`` statement, committed already
    before_row: tuple[Any, ...] | None = None
    #: the results of :meth:`Session.transaction`'s ``first`` when this call sent it with the
    #: ``BEGIN`` (positioned on the ``BEGIN``'s; ``nextset()`` to each statement's); None when
    #: a commit began the transaction ahead, or there was no ``first``
    first_results: psycopg.Cursor[Any] | None = None
    #: the first statement of the session's next transaction, which the commit begins
    _then: sql.Composable | None = field(default=None, repr=False)
    #: the statement the commit sends ahead of its COMMIT (:meth:`end_with`)
    _last: sql.Composable | None = field(default=None, repr=False)

    @property
    def then(self) -> sql.Composable | None:
        """The first statement the commit is to begin the session's next transaction with."""
        return self._then

    def begin_next_with(self, first: sql.Composable | None) -> None:
        """Have this transaction's commit begin the session's next transaction with ``first``,
        in the same round trip (None: the commit begins nothing). The holder may change its
        mind until the commit (the step engine does, once it knows whether a step follows).
        Only a :meth:`Session.transaction` chains; elsewhere the commit is a plain one."""
        self._then = first

    @property
    def last(self) -> sql.Composable | None:
        """The statement the commit is to send ahead of its ``COMMIT``."""
        return self._last

    def end_with(self, last: sql.Composable) -> None:
        """Have this transaction's commit send ``last`` (values as ``sql.Literal``) and its
        ``COMMIT`` in one simple query, one round trip where two were spent. When ``last``
        fails, the ``COMMIT`` never runs: the error leaves the block and the whole transaction
        rolls back. Not with :meth:`begin_next_with` (the error of one could not be told from
        the other's). Only a :meth:`Session.transaction` does so."""
        self._last = last


#: How :meth:`Session.transaction` opens a transaction that has no first statement to send.
BEGIN = sql.SQL("BEGIN")


class ChainingConnection(psycopg.Connection[Any]):
    """psycopg's connection, whose commit can also begin the next transaction, with that
    transaction's first statement, in the same simple query: ``COMMIT; BEGIN; <first>`` (see
    :meth:`Session.transaction`'s ``then``). One round trip where two were spent.
    """

    #: the first statement of the transaction the next commit is to begin
    chain: sql.Composable | None = None
    #: the first statement of the transaction the last commit began, still open
    chained: sql.Composable | None = None
    #: a statement the next commit sends ahead of its COMMIT, in the same simple query
    last: sql.Composable | None = None

    def commit(self) -> None:
        chain, self.chain = self.chain, None
        last, self.last = self.last, None
        if last is not None and self.pgconn.transaction_status == TransactionStatus.INTRANS:
            assert chain is None, "a commit sends a last statement or begins the next, not both"
            try:
                self.execute(sql.SQL("{}; COMMIT").format(last))
            except psycopg.Error:
                # A failing ``last`` skipped the COMMIT: end the failed transaction here
                # (SQLAlchemy counts a commit that raised as ended), then raise its error.
                if self.pgconn.transaction_status == TransactionStatus.INERROR:
                    with suppress(psycopg.Error):
                        super().rollback()
                raise
            return
        if chain is None or self.pgconn.transaction_status != TransactionStatus.INTRANS:
            super().commit()
            return
        try:
            self.execute(sql.SQL("COMMIT; BEGIN; {}").format(chain))
        except psycopg.Error:
            if self.pgconn.transaction_status != TransactionStatus.INERROR:
                raise  # the COMMIT itself failed (or the connection): as a plain commit would
            # Committed; the next transaction's first statement failed. That transaction
            # begins again when it is asked for, and meets its error there.
            super().rollback()
            return
        self.chained = chain

    def rollback(self) -> None:
        self.chained = None
        self.last = None
        super().rollback()


def _chaining(conn: sa.Connection) -> ChainingConnection | None:
    """The pooled session's psycopg connection (None: a connection this module did not make)."""
    driver = conn.connection.driver_connection
    return driver if isinstance(driver, ChainingConnection) else None


def _end_chained(conn: sa.Connection) -> None:
    """Roll back a transaction the session's last commit began that nobody took (best effort:
    a broken connection is discarded by the pool anyway)."""
    if conn.closed or conn.invalidated:
        return
    driver = _chaining(conn)
    if driver is not None and driver.chained is not None:
        with suppress(psycopg.Error):
            driver.rollback()


@dataclass(frozen=True)
class Session:
    """One checked-out session of a :class:`Database` (see :meth:`Database.session`). A
    connection the server dropped is replaced at the next transaction, once the failed one has
    rolled back (SQLAlchemy reconnects it)."""

    conn: sa.Connection
    #: its uses before it is replaced (see the module)
    recycle_after: int = RECYCLE_AFTER_USES

    def used(self) -> None:
        """Count one more use of its server process (:meth:`Database.session` counts each
        checkout; a worker child counts each job it runs on a session it holds on)."""
        self.conn.info[USES] = self.uses + 1

    @property
    def uses(self) -> int:
        return int(self.conn.info.get(USES, 0))

    @property
    def spent(self) -> bool:
        """True once it served its uses: handed back, it is closed."""
        return self.uses >= self.recycle_after

    @property
    def driver(self) -> ChainingConnection:
        driver = _chaining(self.conn)
        assert driver is not None
        return driver

    @contextmanager
    def transaction(
        self,
        first: sql.Composable | None = None,
        *,
        then: sql.Composable | None = None,
        before: sql.Composable | None = None,
        deferred: bool = False,
    ) -> Iterator[Transaction]:
        """Commit on success, roll back on any exception (which leaves translated).

        ``first`` is the transaction's first statement, sent with its ``BEGIN`` in one simple
        query (one round trip): composed with :mod:`psycopg.sql`, values as ``sql.Literal``,
        since a simple query carries no bound parameters. Its results are the transaction's
        ``first_results`` (when this call sent it).

        ``then`` is the first statement of this session's next transaction, known now: the
        commit begins that transaction too, in the same round trip (``COMMIT; BEGIN; then``),
        and the next call with ``first=then`` finds it open. A call with another ``first`` (or
        none) rolls it back and begins its own; so does the end of the session. When ``then``
        fails after the commit succeeded, this transaction is still committed, and the next
        one begins afresh and meets the error itself.

        ``before`` is a statement committed on its own just before this transaction begins, in
        the same round trip (``before; COMMIT; BEGIN; first``); its first row is the
        transaction's ``before_row``. When it fails, nothing else runs. (The step engine opens
        a job's first journal row so.)

        ``deferred`` (with neither ``first`` nor ``before``) sends nothing now: the session is
        in autocommit, so the caller sends the ``BEGIN`` itself, with its first statement, in
        the same round trip (``begin_with`` of :func:`provisioner.queue.close_step`, in its
        pipeline). A transaction whose first statement is known only later costs no round trip
        for its ``BEGIN`` (a step's close on control after its work on a tenant server:
        :mod:`provisioner.engine.remote`).
        """
        assert not deferred or (first is None and before is None), "deferred: nothing to send"
        with translated(), self.conn.begin():
            driver = self.driver
            before_row = None
            first_results = None
            if deferred:
                if driver.chained is not None:  # begun for a first statement: not this one
                    driver.rollback()
            elif before is not None or driver.chained is None or driver.chained != first:
                if driver.chained is not None:  # begun for another first statement
                    driver.rollback()
                begin = BEGIN if first is None else sql.SQL("BEGIN; {}").format(first)
                if before is None:
                    cursor = driver.execute(begin)
                    first_results = None if first is None else cursor
                else:
                    cursor = driver.execute(sql.SQL("{}; COMMIT; {}").format(before, begin))
                    before_row = cursor.fetchone()
            driver.chained = None
            tx = Transaction(
                pg=driver, sa=self.conn, before_row=before_row, first_results=first_results
            )
            tx.begin_next_with(then)
            yield tx
            driver.chain = tx.then  # the commit, as the block is left, begins it
            driver.last = tx.last  # ... or sends it ahead of its COMMIT


class Database:
    """The owner role's connections for the step engine: pooled, one connection kept open.

    Keeping one session open for a whole job lets other processes see that the job's holder is
    alive (``pg_stat_activity.application_name``), and ``idle_in_transaction_session_timeout``
    makes the server end a transaction whose process was frozen or lost, releasing its locks.

    Its sessions are in psycopg's autocommit mode, and every :meth:`transaction` sends its own
    ``BEGIN``: together with the transaction's first statement when the caller has one (the
    step engine's tenant lock), so that opening a step costs one round trip, not two (psycopg
    would send its implicit ``BEGIN`` alone). Nothing runs on them outside a transaction but
    :meth:`on_idle_session`'s work, which wants autocommit anyway.
    """

    def __init__(
        self,
        url: str,
        *,
        application_name: str = "provisioner",
        idle_in_transaction_timeout_ms: int | None = None,
        settings: dict[str, str] | None = None,
        most_sessions: int = 2,
        recycle_after: int | None = None,
    ) -> None:
        # Generic plans: the statements planned ahead on an idle session (on_idle_session, the
        # warm-up after a spare build) are used as they are, not planned again for their values.
        # ``settings``: more server settings for these sessions (the pool keeper's commits that
        # do not wait for the disk). ``most_sessions``: how many may be open at once; one is
        # kept open, the others are closed when handed back (the pool keeper's builders side
        # by side, which exist only during a refill).
        options: dict[str, Any] = {**GENERIC_PLANS, **(settings or {})}
        if idle_in_transaction_timeout_ms:
            options["idle_in_transaction_session_timeout"] = idle_in_transaction_timeout_ms
        self.url = url
        self.application_name = application_name[:63]
        #: uses of a session before it is replaced (None: :data:`RECYCLE_AFTER_USES`)
        self.recycle_after = recycle_after or RECYCLE_AFTER_USES
        #: until when the pooled session counts as just checked (see connect_ahead)
        self._fresh_until = 0.0
        connect_args: dict[str, Any] = {
            **SA_CONNECT_ARGS,
            "autocommit": True,  # every transaction() begins explicitly (see above)
            "application_name": self.application_name,
            "options": _options(options),
        }
        self._engine = conninfo.engine(
            url,
            # psycopg's connection, whose commit can begin the next transaction
            connection_class=ChainingConnection,
            connect_args=connect_args,
            pool_size=1,
            max_overflow=max(1, most_sessions - 1),
            # No ping before every transaction (it was ~8 round trips per tenant): the engine
            # calls ensure_alive() once before each job, and a connection that dies mid-job
            # fails that job's transaction, is invalidated by SQLAlchemy and replaced at the
            # next checkout (the job is retried like any failed attempt).
            pool_pre_ping=False,
            # Nothing here maps hstore columns: no catalog lookup of its type on first connect.
            use_native_hstore=False,
        )

    @contextmanager
    def transaction(self, first: sql.Composable | None = None) -> Iterator[Transaction]:
        """Commit on success, roll back on any exception (which leaves translated); see
        :meth:`Session.transaction` for ``first``."""
        with self.session() as session, session.transaction(first) as tx:
            yield tx

    @contextmanager
    def session(self) -> Iterator[Session]:
        """The pooled session checked out for several transactions (a job's): each then costs
        no checkout and check-in of the pool, 40-50 us apiece. A
        transaction its last commit began and nobody took is rolled back at its end; a session
        that served its uses is then closed (see the module)."""
        with translated(), self._engine.connect() as conn:
            session = Session(conn, self.recycle_after)
            session.used()
            try:
                yield session
            finally:
                _end_chained(conn)
                if not conn.closed and not conn.invalidated and session.spent:
                    conn.invalidate()  # spent: closed, the next use opens a new one

    def connect_ahead(
        self, prepare: Callable[[Transaction], object] | None = None
    ) -> threading.Thread:
        """Open the pooled session in a thread, started now, and run ``prepare`` in a first
        transaction on it (e.g. read what the steps will need); join the thread before the
        first transaction of your own. A one-off run opens two sessions (this one and the
        bookkeeping session), each a new server process and, here, SQLAlchemy's first-connect
        dialect set-up (a few round trips): made side by side, the bookkeeping's own round
        trips hide this one's. A failure is left for the real work to meet and report (it
        connects, or reads, again)."""

        def connect() -> None:
            # Hand the interpreter back at once: the caller goes on with its own session while
            # this one connects. Without it, this thread kept the GIL through SQLAlchemy's
            # first-connect set-up until its first wait on the network, and the caller's
            # ``start()`` returned about 3 ms later.
            time.sleep(0)
            # Any failure is met again, and reported, by the real work.
            with suppress(Exception):
                if prepare is None:
                    with self._engine.connect():
                        pass  # checked in again: the first transaction takes it
                else:
                    with self.transaction() as tx:
                        prepare(tx)
                self._fresh_until = time.monotonic() + FRESH_SECONDS

        thread = threading.Thread(target=connect, name="connect-ahead", daemon=True)
        thread.start()
        return thread

    def on_idle_session(self, work: Callable[[psycopg.Connection[Any]], object]) -> None:
        """Run ``work`` on the pooled session in autocommit, if one is open (none is opened for
        it). In autocommit nothing opens a transaction, so handing the connection back to the
        pool costs no ROLLBACK. A session found closed, or for which ``work`` returns False,
        is discarded: the next transaction opens a fresh one."""
        if self._engine.pool.checkedin() == 0:  # type: ignore[attr-defined]
            return
        with translated(), self._engine.connect() as conn:
            driver = conn.connection.driver_connection
            assert isinstance(driver, psycopg.Connection)
            if driver.closed or driver.broken:
                conn.invalidate()
                return
            result = work(driver)
            if result is False:
                conn.invalidate()

    def ensure_alive(self) -> None:
        """One round trip on the pooled connection; a dropped one (the server restarted since
        the last job) is discarded, so the job's first transaction opens a fresh session. A
        pool with no idle connection yet has nothing to check (the next checkout connects),
        nor has one :meth:`connect_ahead` used successfully an instant ago."""
        if time.monotonic() < self._fresh_until:
            return
        self.on_idle_session(is_alive)

    def close(self) -> None:
        self._engine.dispose()

    def __enter__(self) -> Database:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
