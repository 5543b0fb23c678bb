"""The warm pool's keeper: the worker's thread that keeps ``size`` spares ready while idle.

One keeper builds at a time per database (worker replicas share the pool): the builders'
session lock is tried, never waited for (:func:`~provisioner.pool.refill.builder_lock`). Under
it the keeper drops the schemas of builds whose process died
(:func:`~provisioner.pool.refill.drop_unfinished`), then builds spares until enough
are ready (:func:`provisioner.pool.refill.refill`), on as many sessions at once as the worker
has engine children (``builders``: the children are idle while it builds, and the builds' waits
on the disk overlap; :func:`provisioner.pool.refill._build_side_by_side`,
``tests/integration/test_pool_builders.py``); outside it, it drops one spare of another tree
state (or role set) at a time (:func:`drop_stale_spare`). After the build that fills the pool
it tells the worker (``on_built``), which has its idle engine children warm their sessions: the
builds' schemas reset every plan of every session, and warming after each build of a refill
only made the children reload their caches while the next build ran (and emptied them again)
(``tests/integration/test_pool.py::test_a_spare_build_warms_the_idle_engine_sessions``).

Spare builds yield to sign-ups. Invariant: no build makes progress while the worker has a job
running or waiting to be claimed (each builder pauses on its own); between two of its
transactions a build pauses (its schema unfinished, the builders' lock kept) and goes on, with
the same schema, once the worker is idle again (:meth:`PoolKeeper.yield_to_jobs`). A sign-up
that arrives during a build therefore waits behind at most one transaction of each build under
way (:data:`~provisioner.pool.build.BATCH` statements), never a whole build, and the work
already done is not thrown away. A pause longer than :data:`PAUSE_LIMIT_SECONDS` (a long fleet
upgrade) stops the build and drops its schema, so that the builders' lock does not keep an idle
replica from building
(``tests/integration/test_pool.py::test_a_spare_build_pauses_while_the_worker_has_a_job``).

The keeper's sessions commit without waiting for the disk (``synchronous_commit = off``): a
build is a handful of transactions, and waiting for each flush made a refill cost about 1.65x
the raw build. Nothing is lost by it: a server crash can only undo a tail of the keeper's
commits, which leaves a recorded schema with no ready row (dropped by the next builder) or no
schema at all; and a take's own commit waits for the disk, which flushes the WAL before it, the
record of the spare it took included (``tests/integration/test_pool.py::
test_the_keepers_sessions_commit_without_waiting_for_the_disk``).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import asdict, dataclass
from typing import Any

from provisioner import db
from provisioner.db import DatabaseError, Transaction
from provisioner.errors import (
    BuildStopped,
    DatabaseUnavailable,
    ProvisionerError,
    SpareRejected,
    TemplateUnusable,
)
from provisioner.logs import event
from provisioner.pool.refill import Builder, Helper, refill
from provisioner.pool.server_schemas import OnServer
from provisioner.pool.server_spares import (
    active_servers,
    server_counts,
    takes_for,
)
from provisioner.pool.spares import (
    CLAIM_STALE_SPARE,
    counts,
    drop_schema,
    foreign_schemas,
    roles_key,
)
from provisioner.roles import AppRoles
from provisioner.servers.directory import TenantServer
from provisioner.servers.reach import owner_address
from provisioner.templates import migrations

#: How often a paused build looks whether the worker is idle again.
PAUSE_CHECK_SECONDS = 0.01
#: How long the keeper leaves a tenant server alone after a failed look (then tries again).
SERVER_RETRY_SECONDS = 5.0
#: The longest pause before a build gives up (its schema dropped, the builders' lock released).
PAUSE_LIMIT_SECONDS = 30.0


@dataclass(frozen=True)
class Dropped:
    """A useless spare :func:`drop_stale_spare` dropped, and why it was useless."""

    schema: str
    reason: str


def drop_stale_spare(tx: Transaction, app_roles: AppRoles | None = None) -> Dropped | None:
    """Drop one spare that no take may hand out (row and schema, if any): built for another
    tree state, or for another role set than ``app_roles`` (None: spares without grants only),
    or whose schema is gone; what was dropped and why, or None."""
    wanted = roles_key(app_roles)
    with tx.pg.cursor() as cur:
        cur.execute(
            CLAIM_STALE_SPARE,
            {"digest": migrations.tenant_tree_state().digest, "roles": wanted},
        )
        row = cur.fetchone()
        if row is None:
            return None
    name, same_tree, built_for = str(row[0]), bool(row[1]), str(row[2])
    drop_schema(tx, name)
    if not same_tree:
        reason = "stale head"
    elif built_for not in (wanted, ""):
        reason = f"built for roles {built_for or 'none'}, configured {wanted or 'none'}"
    else:
        reason = "schema gone"
    return Dropped(name, reason)


# -- the keeper ---------------------------------------------------------------------------------


class PoolKeeper(threading.Thread):
    """The worker's pool thread: keeps ``size`` spares ready while the worker is idle.

    One refill at a time (:func:`provisioner.pool.refill.refill`), and at each of a build's
    commits it asks again whether the worker is idle (:meth:`_may_go_on`; when it is not, the
    commit goes alone and :meth:`yield_to_jobs` pauses), so a job that arrives waits for no
    more than one transaction of each build under way. It runs Alembic only to compute a
    missing reference, and it is the only thread of the worker's parent process that does.
    """

    #: How often a full (or busy) pool is looked at again.
    CHECK_SECONDS = 0.5

    def __init__(
        self,
        owner_url: str,
        size: int,
        holder: str,
        is_idle: Callable[[], bool],
        log: logging.Logger,
        app_roles: AppRoles | None = None,
        on_built: Callable[[], None] = lambda: None,
        pause_limit_seconds: float = PAUSE_LIMIT_SECONDS,
        builders: int = 1,
        alive_seconds: float | None = None,
    ) -> None:
        super().__init__(name="pool-keeper", daemon=True)
        #: called in this thread after each spare is built (the worker warms its children)
        self.on_built = on_built
        self.size = size
        self.holder = holder
        self.is_idle = is_idle
        self.log = log
        #: the role spares are built with grants for (None: no grants, as before)
        self.app_roles = app_roles
        self.halt = threading.Event()
        self.wake = threading.Event()
        #: spares built at once while the worker is idle (the worker's children: one per core)
        self.builders = max(1, builders)
        #: how long the worker's heartbeat, and so this pool's report in it, stays believed
        self.alive_seconds = alive_seconds
        # A build commits without waiting for the disk (see the module's docstring).
        self._db = db.Database(
            owner_url,
            application_name=holder,
            settings={"synchronous_commit": "off"},
            most_sessions=max(2, self.builders),
        )
        self.owner_url = owner_url
        #: the owner's sessions on each active tenant server the keeper built spares on
        self._servers: dict[str, db.Database] = {}
        #: a server whose last look failed, and when to look again (monotonic seconds)
        self._server_retry: dict[str, float] = {}
        self._status: dict[str, Any] = {"size": size, "ready": None, "stale": None}
        self._problem: str | None = None
        #: ``pool_*`` schemas not the pool's that were reported (each is logged once)
        self._reported: set[str] = set()
        #: builds paused for a job, then resumed (:meth:`yield_to_jobs`)
        self.pauses = 0
        self.pause_limit_seconds = pause_limit_seconds

    def status(self) -> dict[str, Any]:
        """The heartbeat's ``pool`` entry."""
        return dict(self._status)

    def run(self) -> None:
        try:
            while not self.halt.is_set():
                busy = self._tend()
                if not busy:
                    self.wake.wait(self.CHECK_SECONDS)
                    self.wake.clear()
        finally:
            self._db.close()
            for database in self._servers.values():
                database.close()

    def _tend(self) -> bool:
        """One unit of work on the control database, then on each active tenant server; True
        when there may be more to do at once."""
        busy = self._tend_control()
        return self._tend_servers() or busy

    def _tend_servers(self) -> bool:
        """Each active tenant server's spares (:mod:`provisioner.pool.server_spares`): counted
        for the heartbeat, refilled while the worker is idle. A server that fails is reported
        in its entry and looked at again later; the others go on."""
        try:
            with self._db.transaction() as tx:
                found = active_servers(tx.pg)
        except (DatabaseUnavailable, DatabaseError):
            return False  # _tend_control said so
        entries: dict[str, Any] = {}
        busy = False
        for server in found:
            entry: dict[str, Any] = {}
            busy = self._tend_server(server, entry) or busy
            entries[server.name] = entry
        if entries or "servers" in self._status:
            self._status["servers"] = entries
        return busy

    def _tend_server(self, server: TenantServer, entry: dict[str, Any]) -> bool:
        try:
            with self._db.transaction() as tx:
                found = server_counts(tx.pg, server.name, self.app_roles)
            entry.update(ready=found.ready, stale=found.stale, unfinished=found.unfinished)
            if not self.is_idle() or self._problem is not None:
                return False
            if self._server_retry.get(server.name, 0.0) > time.monotonic():
                return False
            if found.ready >= self.size and not found.unfinished and not found.stale:
                return False
            with self._db.session() as session, self._server(server).session() as there:
                tended = refill(
                    session,
                    self.size,
                    self.holder,
                    self.app_roles,
                    stop=self.yield_to_jobs,
                    go_on=self._may_go_on,
                    on_built=lambda name, ready: event(
                        self.log, "pool_spare_built", schema=name, ready=ready, server=server.name
                    ),
                    on_dropped=lambda name: event(
                        self.log, "pool_spare_dropped", schema=name, server=server.name
                    ),
                    on=OnServer(server.name, there),
                    helpers=self._helpers(server),
                )
            return bool(tended.built or tended.dropped)
        except BuildStopped:
            return False
        except (SpareRejected, TemplateUnusable) as exc:
            self._problem = f"spares not built: {exc}"
            event(self.log, "pool_disabled", logging.ERROR, error=self._problem)
            return False
        except ProvisionerError as exc:  # unreachable, refused: this server only, later
            entry["error"] = str(exc)
            self._server_retry[server.name] = time.monotonic() + SERVER_RETRY_SECONDS
            event(self.log, "pool_error", logging.WARNING, error=str(exc), server=server.name)
            return False

    def _server(self, server: TenantServer) -> db.Database:
        """The owner's sessions on ``server``, opened on first use, committing without waiting
        for the disk as on control (see the module)."""
        found = self._servers.get(server.name)
        if found is None:
            found = db.Database(
                owner_address(server, self.owner_url),
                application_name=self.holder,
                settings={"synchronous_commit": "off"},
                most_sessions=max(2, self.builders),
            )
            self._servers[server.name] = found
        return found

    def _helpers(self, server: TenantServer | None = None) -> list[Helper]:
        """The other builders of a refill (:func:`provisioner.pool.refill.refill`): one fewer
        than :attr:`builders`, each with a session on control and, for ``server``'s spares, on
        that server too; opened in the builder's own thread when it has a spare to build, and
        closed after the refill (the databases' pools keep one each)."""

        @contextmanager
        def opened() -> Iterator[Builder]:
            with ExitStack() as stack:
                control = stack.enter_context(self._db.session())
                on = None
                if server is not None:
                    there = stack.enter_context(self._server(server).session())
                    on = OnServer(server.name, there)
                yield Builder(control, on)

        return [opened] * (self.builders - 1)

    def _tend_control(self) -> bool:
        """The control database's spares; True when there may be more to do at once."""
        try:
            with self._db.transaction() as tx:
                found = counts(tx.pg, self.app_roles)
            self._status.update(asdict(found), size=self.size, error=self._problem)
            # read by placement (server_spares), while the beat is younger than alive_seconds
            self._status.update(takes_for(self.app_roles, self.alive_seconds))
            if set(found.foreign) - self._reported:
                self._report_foreign()
            if not self.is_idle() or self._problem is not None:
                return False
            if found.stale:
                with self._db.transaction() as tx:
                    dropped = drop_stale_spare(tx, self.app_roles)
                if dropped:
                    event(
                        self.log, "pool_spare_dropped", schema=dropped.schema, reason=dropped.reason
                    )
                return dropped is not None
            if found.ready >= self.size and not found.unfinished:
                return False
            with self._db.session() as session:
                tended = refill(
                    session,
                    self.size,
                    self.holder,
                    self.app_roles,
                    stop=self.yield_to_jobs,
                    go_on=self._may_go_on,
                    on_built=self._built,
                    on_dropped=self._dropped_unfinished,
                    helpers=self._helpers(),
                )
            return bool(tended.built or tended.dropped)
        except BuildStopped:
            return False
        except (SpareRejected, TemplateUnusable) as exc:
            # The replay cannot be trusted for this tree: stop building (provisioning goes on).
            self._problem = f"spares not built: {exc}"
            event(self.log, "pool_disabled", logging.ERROR, error=self._problem)
            return False
        except (DatabaseUnavailable, DatabaseError) as exc:
            self._status["error"] = str(exc)
            self.halt.wait(2.0)  # the worker logs outages; try again later
            return False
        except ProvisionerError as exc:  # e.g. a spare's owner is wrong: say so, go on later
            self._status["error"] = str(exc)
            event(self.log, "pool_error", logging.WARNING, error=str(exc))
            self.halt.wait(2.0)
            return False

    def _dropped_unfinished(self, name: str) -> None:
        event(self.log, "pool_spare_dropped", schema=name, reason="unfinished build")

    def _built(self, name: str, ready: int) -> None:
        event(self.log, "pool_spare_built", schema=name, ready=ready)
        if ready >= self.size:  # the next build would empty the caches again
            self.on_built()

    def _may_go_on(self) -> bool:
        """A batch's commit may begin the next batch: the worker is idle and not stopping."""
        return not self.halt.is_set() and self.is_idle()

    def yield_to_jobs(self) -> bool:
        """Between two of a build's transactions: wait while the worker has a job (the build
        goes on once it is idle again); True to stop the build: the worker is stopping, or the
        pause outlasted its limit (:data:`PAUSE_LIMIT_SECONDS` by default)."""
        deadline = time.monotonic() + self.pause_limit_seconds
        paused = False
        while not self.halt.is_set() and not self.is_idle():
            if time.monotonic() >= deadline:
                event(self.log, "pool_build_yielded", reason="the worker stayed busy")
                return True
            paused = True
            self.halt.wait(PAUSE_CHECK_SECONDS)
        if paused:
            self.pauses += 1
        return self.halt.is_set()

    def _report_foreign(self) -> None:
        """One WARNING per ``pool_*`` schema that is not the pool's, with its name and owner:
        the keeper leaves it alone (never drops, never hands it out) and goes on with its own."""
        with self._db.transaction() as tx:
            found = foreign_schemas(tx.pg)
        for name, owner in found:
            if name not in self._reported:
                self._reported.add(name)
                event(
                    self.log,
                    "pool_schema_not_ours",
                    logging.WARNING,
                    schema=name,
                    owner=owner,
                    action="left alone: not recorded by the pool or not owned by it",
                )

    def stop(self) -> None:
        self.halt.set()
        self.wake.set()
        self.join(10)
