"""A refill of the warm pool: one pass under the builders' lock, its spares built side by side.

The lock, the look for unfinished builds, the count and the template's reference once, then the
spares; within a spare, while the worker stays idle, each batch's commit begins the next batch
in the same round trip (:func:`provisioner.pool.build._run_batches`), and a spare's
bookkeeping rides its batches (its record and schema with the first, the fingerprint with the
last, the grants named from the reference's relations, its ready row begun by the last grant
batch's commit: :func:`provisioner.pool.build._build`); between two spares of one builder,
while the worker stays idle, the commit that records a spare begins the next spare's first
batch (:func:`_run`). Two round trips of bookkeeping are left per spare (the grants' check,
and the ready row's, which the last batch's commit carries), where there were five (and a
dozen more per spare, with three round trips per batch, before the refill was one pass). A
SIGKILL anywhere in it leaves the spares recorded before it whole and the ones under way
unfinished (``tests/crash/test_pool_crash.py``: a refill killed between chained batches, and
with two builds under way); the spare a record's commit began is one of those.

The builders' lock, tried and never waited for (:func:`builder_lock`), keeps one keeper
building per database (worker replicas share the pool); under it the schemas of builds whose
process died are dropped first (:func:`drop_unfinished`), then the spares are built on as many
sessions at once as the caller gives (:func:`refill`'s ``helpers``, the worker's children
count: :func:`_build_side_by_side`), each other builder connecting in its own thread while the
first builds (``tests/integration/test_pool_builders.py::
test_a_refills_first_build_does_not_wait_for_the_other_builders_sessions``). The keeper's
thread that calls it is :mod:`provisioner.pool.keeper`.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass, field

from psycopg.rows import dict_row

from provisioner import db
from provisioner.errors import BuildStopped
from provisioner.pool.build import build_spare, known_reference
from provisioner.pool.server_schemas import OnServer
from provisioner.pool.server_spares import drop_stale_on, drop_unfinished_on, server_counts
from provisioner.pool.spares import UNFINISHED_SPARES, counts, drop_schema, spare_name
from provisioner.roles import AppRoles
from provisioner.templates.reference import Reference

# One builder at a time per database (worker replicas share the pool): try, never wait. Held
# by the session for the whole build, across its transactions.
TRY_BUILD_LOCK = "SELECT pg_try_advisory_lock(%(class)s, 0) AS locked"
RELEASE_BUILD_LOCK = "SELECT pg_advisory_unlock(%(class)s, 0)"

#: First key of the pool builders' advisory lock ('pool').
POOL_LOCK_CLASS = 0x706F6F6C


@contextmanager
def builder_lock(session: db.Session) -> Iterator[bool]:
    """The builders' session lock, tried (never waited for): True when this session holds it
    until the block ends. One builder at a time per database; worker replicas share the pool."""
    with session.transaction() as tx, tx.pg.cursor(row_factory=dict_row) as cur:
        cur.execute(TRY_BUILD_LOCK, {"class": POOL_LOCK_CLASS})
        row = cur.fetchone()
    locked = bool(row and row["locked"])
    try:
        yield locked
    finally:
        if locked:
            with session.transaction() as tx:
                tx.pg.execute(RELEASE_BUILD_LOCK, {"class": POOL_LOCK_CLASS})


def drop_unfinished(session: db.Session) -> list[str]:
    """Drop every schema the pool recorded that holds no ready spare, under the builders' lock
    (the caller holds it: no build is under way, so each was left by a build whose process
    died); the names dropped. Only recorded schemas are looked at: a schema merely named
    ``pool_*`` is not the pool's (:data:`FOREIGN_SCHEMAS`)."""
    with session.transaction() as tx:
        names = [str(row[0]) for row in tx.pg.execute(UNFINISHED_SPARES).fetchall()]
    dropped = []
    for name in names:
        with session.transaction() as tx:
            if drop_schema(tx, name):
                dropped.append(name)
    return dropped


@dataclass(frozen=True)
class Tended:
    """What :func:`refill` did."""

    #: the spares built, in order
    built: tuple[str, ...] = ()
    #: schemas of unfinished builds it dropped first
    dropped: tuple[str, ...] = ()


@dataclass(frozen=True)
class Builder:
    """Where one of a refill's builds runs: a control session and, for a tenant server's
    spares, that server's (``on``)."""

    session: db.Session
    on: OnServer | None = None


#: Opens the sessions of one of a refill's other builders (none held by the builders' lock),
#: for as long as the block lasts: entered in that builder's own thread, once it has a spare
#: to build (:func:`_build_side_by_side`).
Helper = Callable[[], AbstractContextManager[Builder]]


def refill(
    session: db.Session,
    size: int,
    created_by: str,
    app_roles: AppRoles | None = None,
    *,
    stop: Callable[[], bool] = lambda: False,
    go_on: Callable[[], bool] = lambda: False,
    on_built: Callable[[str, int], None] = lambda name, ready: None,
    on_dropped: Callable[[str], None] = lambda name: None,
    on: OnServer | None = None,
    helpers: Sequence[Helper] = (),
) -> Tended:
    """Under the builders' lock (unless another builder holds it: nothing is done), drop the
    schemas of unfinished builds, count the ready spares, then build spares until ``size`` are
    ready (``on_dropped(name)`` after the drops, ``on_built(name, ready)`` after each build).

    The lock, the look for unfinished builds, the count and the template's reference are taken
    once per refill, not once per spare: each was its own transaction, a round trip or three,
    and a refill paid them for every spare. Between two spares (as between two batches of one)
    ``stop()`` is asked: a refill makes no progress while the worker has a job. A spare taken
    meanwhile leaves the pool short after the refill: the keeper's next look counts again.

    ``helpers``: more builders at once (:func:`_build_side_by_side`), each opening its sessions
    in its own thread, only when more than one spare is wanted: ``session``'s first build does
    not wait for their connections (a new server process each, 5-9 ms). They hold no lock: the
    builders' lock, held by ``session`` until every build has ended, keeps other builders away,
    and the unfinished builds were dropped before any of them began.

    ``on``: the spares of a tenant server (``session`` is control's): under that server's
    builders' lock, its useless spares are dropped too (:func:`drop_stale_on`), and they are
    built there (:mod:`provisioner.pool.server_spares`)."""
    with builder_lock(session if on is None else on.session) as locked:
        if not locked:
            return Tended()
        if on is None:
            dropped = tuple(drop_unfinished(session))
        else:
            dropped = (*drop_unfinished_on(session, on), *drop_stale_on(session, on, app_roles))
        for name in dropped:
            on_dropped(name)
        with session.transaction() as tx:
            if on is None:
                ready = counts(tx.pg, app_roles).ready
            else:
                ready = server_counts(tx.pg, on.name, app_roles).ready
        references: dict[str, Reference] = {}

        def build(builder: Builder, name: str | None, next_spare: Callable[[], str | None]) -> str:
            return build_spare(
                builder.session,
                created_by,
                app_roles,
                stop=stop,
                go_on=go_on,
                references=references,
                on=builder.on,
                name=name,
                next_spare=next_spare,
            )

        wanted = size - ready
        if wanted <= 0:
            return Tended((), dropped)
        # Read (or computed, with Alembic, which is not thread-safe) before the builds, which
        # then share it.
        known_reference(session, created_by, references)
        built = _build_side_by_side(
            Builder(session, on),
            helpers if wanted > 1 else (),
            _Spares(wanted, ready, stop, go_on, on_built),
            build,
        )
        return Tended(tuple(built), dropped)


#: Builds one spare on a builder: the name to try first (None: drawn), and what to ask, just
#: before the commit that records it, for the next spare this builder builds.
Build = Callable[[Builder, str | None, Callable[[], str | None]], str]


@dataclass
class _Spares:
    """The spares of one refill, shared by its builders' threads: how many are wanted, how many
    were started (each builder takes the next), the ones built and the first failure."""

    wanted: int
    ready: int
    stop: Callable[[], bool]
    go_on: Callable[[], bool]
    on_built: Callable[[str, int], None]
    started: int = 0
    built: list[str] = field(default_factory=list)
    failures: list[BaseException] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def take(self) -> bool:
        """One more spare for the caller to build; False when enough are under way or a build
        failed."""
        with self.lock:
            if self.failures or self.started >= self.wanted:
                return False
            self.started += 1
            return True

    def done(self, name: str) -> None:
        with self.lock:
            self.built.append(name)
            count = self.ready + len(self.built)
        self.on_built(name, count)

    def failed(self, exc: BaseException) -> None:
        with self.lock:
            self.failures.append(exc)


def _build_side_by_side(
    first: Builder, helpers: Sequence[Helper], spares: _Spares, build: Build
) -> list[str]:
    """Build ``spares.wanted`` spares, each builder (its own session, its own thread; ``first``
    in the calling thread, each helper's opened in its thread once it has a spare to build)
    taking the next until enough are under way; the names built.

    Why at once: a spare's build waits mostly on the disk (PostgreSQL 15 syncs each new
    index's file before the statement ends) and on round trips, and two sessions' waits
    overlap, as raw SQL's do (see docs/performance.md). Each build still yields to jobs at
    every commit: a builder asks ``stop()`` before each spare but its first, unless the commit
    that recorded its last spare began the next one (:func:`_run`, only while ``go_on()``, as a
    build's batches do), and the build pauses between batches itself; so a job waits behind at
    most one transaction of each builder. The first failure stops the others before their next
    spare and is raised once all have ended; the spares built are recorded and stay."""

    def helped(helper: Helper) -> None:
        # Hand the interpreter back at once: the first builder goes on while this one connects
        # (as Database.connect_ahead does).
        time.sleep(0)
        if not spares.take():
            return
        try:
            with helper() as builder:
                _run(builder, spares, build, taken=True)
        except BaseException as exc:  # raised in the calling thread, below
            spares.failed(exc)

    threads = [
        threading.Thread(target=helped, args=(helper,), name="pool-builder", daemon=True)
        for helper in helpers
    ]
    for thread in threads:
        thread.start()
    _run(first, spares, build)
    for thread in threads:
        thread.join()
    if spares.failures:
        raise spares.failures[0]
    return spares.built


def _run(builder: Builder, spares: _Spares, build: Build, *, taken: bool = False) -> None:
    """One builder's spares, one after another, until enough are under way (``taken``: the
    first one is taken already). Just before the commit that records a spare, its build asks
    for the next (``next_spare``): while the worker is idle (``go_on()``) and another spare is
    wanted, it is taken and named then, and that commit begins its first transaction in the
    same round trip; ``stop()`` is not asked before it, since nothing of the next build was
    begun unless the worker was idle. A tenant server's build records on control apart and
    begins nothing (:func:`provisioner.pool.build.build_spare`)."""
    follows: list[str] = []  # the spare whose first transaction the last commit began

    def next_spare() -> str | None:
        if builder.on is not None or not spares.go_on() or not spares.take():
            return None
        follows.append(spare_name())
        return follows[-1]

    between = False  # stop() is asked between two spares (a build asks it between batches)
    while taken or follows or spares.take():
        taken = False
        name = follows.pop() if follows else None
        try:
            if between and name is None and spares.stop():
                raise BuildStopped("the refill was stopped")
            between = True
            spares.done(build(builder, name, next_spare))
        except BaseException as exc:  # raised in the calling thread
            spares.failed(exc)
            return
