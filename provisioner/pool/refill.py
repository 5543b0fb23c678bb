"""A refill of the warm pool: one pass under the builders' lock, its spares built side by side.

The lock, the look for unfinished builds, the count and the template's reference once, then the
spares; within a spare, while the worker stays idle, each batch's commit begins the next batch
in the same round trip (:func:`provisioner.pool.spares._run_batches`), and a spare's
bookkeeping rides its batches (its record and schema with the first, the fingerprint with the
last, the grants named from the reference's relations: :func:`provisioner.pool.spares._build`),
one transaction of it left per spare (the grants' check and the record), where there were four
(and five more per spare, with three round trips per batch, before the refill was one pass). A
SIGKILL anywhere in it leaves the spares recorded before it whole and the ones under way
unfinished (``tests/crash/test_pool_crash.py``: a refill killed between chained batches, and
with two builds under way).

The builders' lock, tried and never waited for (:func:`builder_lock`), keeps one keeper
building per database (worker replicas share the pool); under it the schemas of builds whose
process died are dropped first (:func:`drop_unfinished`), then the spares are built on as many
sessions at once as the caller gives (:func:`refill`'s ``helpers``, the worker's children
count: :func:`_build_side_by_side`). The keeper's thread that calls it is
:mod:`provisioner.pool.keeper`.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator, Sequence
from contextlib import AbstractContextManager, contextmanager, nullcontext
from dataclasses import dataclass

from psycopg.rows import dict_row

from provisioner import db
from provisioner.errors import BuildStopped
from provisioner.pool.server_schemas import OnServer
from provisioner.pool.server_spares import drop_stale_on, drop_unfinished_on, server_counts
from provisioner.pool.spares import (
    UNFINISHED_SPARES,
    build_spare,
    counts,
    drop_schema,
    known_reference,
)
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


#: Opens the sessions of a refill's other builders (none held by the builders' lock), for as
#: long as the block lasts.
Helpers = Callable[[], AbstractContextManager[Sequence[Builder]]]


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
    helpers: Helpers | None = None,
) -> Tended:
    """Under the builders' lock (unless another builder holds it: nothing is done), drop the
    schemas of unfinished builds, count the ready spares, then build spares until ``size`` are
    ready (``on_dropped(name)`` after the drops, ``on_built(name, ready)`` after each build).

    The lock, the look for unfinished builds, the count and the template's reference are taken
    once per refill, not once per spare: each was its own transaction, a round trip or three,
    and a refill paid them for every spare. Between two spares (as between two batches of one)
    ``stop()`` is asked: a refill makes no progress while the worker has a job. A spare taken
    meanwhile leaves the pool short after the refill: the keeper's next look counts again.

    ``helpers``: more sessions to build on at once (:func:`_build_side_by_side`), opened only
    when more than one spare is wanted. They hold no lock: the builders' lock, held by
    ``session`` until every build has ended, keeps other builders away, and the unfinished
    builds were dropped before any of them began.

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

        def build(builder: Builder) -> str:
            return build_spare(
                builder.session,
                created_by,
                app_roles,
                stop=stop,
                go_on=go_on,
                references=references,
                on=builder.on,
            )

        wanted = size - ready
        if wanted <= 0:
            return Tended((), dropped)
        # Read (or computed, with Alembic, which is not thread-safe) before the builds, which
        # then share it.
        known_reference(session, created_by, references)
        with nullcontext(()) if helpers is None or wanted == 1 else helpers() as others:
            built = _build_side_by_side(
                [Builder(session, on), *others], wanted, ready, build, stop, on_built
            )
        return Tended(tuple(built), dropped)


def _build_side_by_side(
    builders: Sequence[Builder],
    wanted: int,
    ready: int,
    build: Callable[[Builder], str],
    stop: Callable[[], bool],
    on_built: Callable[[str, int], None],
) -> list[str]:
    """Build ``wanted`` spares, each builder (its own session, its own thread; the first in
    the calling thread) taking the next until enough are under way; the names built.

    Why at once: a spare's build waits mostly on the disk (PostgreSQL 15 syncs each new
    index's file before the statement ends) and on round trips, and two sessions' waits
    overlap, as raw SQL's do (see docs/performance.md). Each build still yields to jobs at
    every commit (``stop()`` before each spare, the build's own pauses between batches), so a
    job waits behind at most one transaction of each builder. The first failure stops the
    others before their next spare and is raised once all have ended; the spares built are
    recorded and stay."""
    lock = threading.Lock()
    built: list[str] = []
    failures: list[BaseException] = []
    started = [0]

    def run(builder: Builder) -> None:
        between = False  # stop() is asked between two spares (a build asks it between batches)
        while True:
            with lock:
                if failures or started[0] >= wanted:
                    return
                started[0] += 1
            try:
                if between and stop():
                    raise BuildStopped("the refill was stopped")
                between = True
                name = build(builder)
            except BaseException as exc:  # raised in the calling thread, below
                with lock:
                    failures.append(exc)
                return
            with lock:
                built.append(name)
                count = ready + len(built)
            on_built(name, count)

    threads = [
        threading.Thread(target=run, args=(builder,), name="pool-builder", daemon=True)
        for builder in builders[1:]
    ]
    for thread in threads:
        thread.start()
    run(builders[0])
    for thread in threads:
        thread.join()
    if failures:
        raise failures[0]
    return built
