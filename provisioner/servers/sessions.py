"""The owner's sessions on the tenant servers: one pool per server for an engine, and the
check a worker makes before it starts (:func:`require_ready`).

A server is reached as :func:`provisioner.servers.reach.owner_address` says: its reference, as
the role it names or the owner URL's, with the password from libpq's own sources. The pools are
opened on first use (a worker whose jobs all live on the control database opens none) and kept
while they are used; a pool no job has used for :data:`IDLE_CLOSE_SECONDS` is closed when the
engine is next told to tidy up (:meth:`ServerSessions.close_idle`, from a worker child between
drains), so that a server drained and retired is not held by an idle session of every worker
child until it restarts (a ``DROP DATABASE`` there refused, a connection slot taken).

A worker child opens the pool of every server in service (active or full: a full server takes
no new tenant but runs its tenants' jobs) before it says it is ready
(:meth:`ServerSessions.open_ahead`), as it reads the tenant tree then: opening one costs a
login (SCRAM's key derivation on both ends), SQLAlchemy's first-connect set-up and the tool
schema's check, which the child's first job on each server paid inside a burst or a fleet
upgrade (a first job there took 28.6-36.0 ms, 20.5-30.2 since: ``docs/performance.md``), and
the plans its jobs there bind (``plans``, the fingerprint's), which its first five jobs there
paid. The servers are opened side by side (:data:`OPEN_AT_ONCE` at a time), so a server that
does not answer delays the child by one connect timeout, not one per server; such a server, or
one behind this build, is skipped and its first job meets the problem and reports it. A pool
opened so and never used is closed at the tidy-up like any idle one.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import closing
from dataclasses import dataclass
from typing import Any

import psycopg

from provisioner import db
from provisioner.db.plans import PlanAhead, prepare_ahead
from provisioner.errors import ProvisionerError, ServerUnready
from provisioner.servers import journal
from provisioner.servers.directory import ServerStatus, TenantServer, directory, get
from provisioner.servers.reach import owner_address, reach

#: A tenant server's pool unused this long is closed at the next tidy-up (reopened on use).
IDLE_CLOSE_SECONDS = 600.0

#: Pools :meth:`ServerSessions.open_ahead` opens at once (each waits on its own server).
OPEN_AT_ONCE = 8

#: The servers whose pools a worker child opens ahead: those whose tenants' jobs it runs and
#: that stay (a draining server is being emptied; a retired one holds no tenant).
IN_SERVICE = frozenset({ServerStatus.ACTIVE, ServerStatus.FULL})


class ServerSessions:
    """An engine's owner pools, one per tenant server (see the module)."""

    def __init__(
        self,
        owner_url: str,
        *,
        holder: str,
        idle_in_transaction_timeout_ms: int,
        plans: Sequence[PlanAhead] = (),
    ) -> None:
        self.owner_url = owner_url
        #: statements the jobs run on every server with bound parameters, prepared when its
        #: pool is opened ahead (the pools keep generic plans): the engine's, the fingerprint's
        self.plans = tuple(plans)
        self.holder = holder
        self.idle_ms = idle_in_transaction_timeout_ms
        self._pools: dict[str, db.Database] = {}
        self._used: dict[str, float] = {}

    def database(self, control: psycopg.Connection[Any], name: str) -> db.Database:
        """The pool of server ``name`` (its reference read from the directory on first use).
        On first use its tool schema is checked too: :class:`ServerUnready` when it is behind
        this build (a one-off command meets what a worker refuses to start with)."""
        found = self._pools.get(name)
        if found is None:
            with db.translated():
                server = get(control, name)
            found = self._pools[name] = self._open(server)
        self._used[name] = time.monotonic()
        return found

    def open_ahead(self, control: psycopg.Connection[Any]) -> list[str]:
        """Open the pool of every server in service (:data:`IN_SERVICE`) not open yet, side by
        side, and check each as :meth:`database` does (see the module); the names opened. A
        server that fails (unreachable, behind this build) is skipped: its first job meets the
        failure again and reports it."""
        with db.translated():
            wanted = [
                s
                for s in directory(control).servers
                if s.status in IN_SERVICE and s.name not in self._pools
            ]
        if not wanted:
            return []
        with ThreadPoolExecutor(min(len(wanted), OPEN_AT_ONCE)) as opening:
            futures = {s.name: opening.submit(self._open, s, self.plans) for s in wanted}
        opened = []
        for name, future in futures.items():
            if future.exception() is not None:
                continue  # its first job meets the failure again, and reports it
            self._pools[name] = future.result()
            self._used[name] = time.monotonic()
            opened.append(name)
        return opened

    def _open(self, server: TenantServer, plans: Sequence[PlanAhead] = ()) -> db.Database:
        """A new pool on ``server``, its session opened, its tool schema checked
        (:class:`ServerUnready` when it is behind this build) and ``plans`` made: by a worker
        child opening it ahead, not by a one-off's first use (its one job there would pay the
        round trip for a plan it binds once)."""
        found = db.Database(
            owner_address(server, self.owner_url),
            application_name=self.holder,
            idle_in_transaction_timeout_ms=self.idle_ms,
        )
        try:
            with found.transaction() as tx:
                behind = journal.behind(tx.pg)
                if behind is None:
                    prepare_ahead(tx.pg, plans)
        except BaseException:
            found.close()
            raise
        if behind is not None:
            found.close()
            raise ServerUnready(f"tenant server {server.name}: {behind}")
        return found

    def close_idle(self, idle_seconds: float = IDLE_CLOSE_SECONDS) -> list[str]:
        """Close the pools no call of :meth:`database` asked for in ``idle_seconds``; their
        names. Call it only between jobs: a pool handed out is in use until its job ends."""
        cutoff = time.monotonic() - idle_seconds
        idle = [name for name, used in self._used.items() if used <= cutoff]
        for name in idle:
            del self._used[name]
            self._pools.pop(name).close()
        return idle

    def close(self) -> None:
        for pool in self._pools.values():
            pool.close()
        self._pools.clear()
        self._used.clear()


@dataclass(frozen=True)
class Migration:
    """``provisioner migrate``'s account of one server's tool schema."""

    server: str
    before: int | None
    after: int


def migrate_all(control: psycopg.Connection[Any], owner_url: str) -> list[Migration]:
    """Apply the tool's schema to every server not retired, as the owner; the first server that
    cannot be reached or refuses raises (the servers before it stay migrated)."""
    with db.translated():
        servers = directory(control).servers
    done = []
    for server in servers:
        if server.status is ServerStatus.RETIRED:
            continue
        address = owner_address(server, owner_url)  # its error names the server already
        try:
            with closing(db.connect(address, autocommit=True)) as conn, db.translated():
                result = journal.migrate(conn)
        except ProvisionerError as exc:
            raise type(exc)(f"tenant server {server.name}: {exc}") from exc
        done.append(Migration(server.name, result.before, result.after))
    return done


def migrate_servers(owner_url: str) -> list[Migration]:
    """:func:`migrate_all` with a control session of its own (``provisioner migrate``)."""
    with closing(db.connect(owner_url, autocommit=True)) as control:
        return migrate_all(control, owner_url)


def require_ready(control: psycopg.Connection[Any], owner_url: str) -> None:
    """:class:`ServerUnready`, naming the first active server with a problem and how many have
    one, unless every active server can run jobs: what :func:`reach` reports (a reference that
    must not be used, never connected with; a superuser; a tool schema behind this build)."""
    with db.translated():
        servers = [s for s in directory(control).servers if s.status is ServerStatus.ACTIVE]
    problems = [(s.name, p) for s in servers if (p := reach(s, owner_url).problem) is not None]
    if problems:
        name, problem = problems[0]
        more = f" (and {len(problems) - 1} more)" if len(problems) > 1 else ""
        raise ServerUnready(f"tenant server {name}: {problem}{more}")
