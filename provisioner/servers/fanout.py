"""Fan-out: run one piece of read work on every server that holds tenants, with bounded
connections, and report each server (a server that is down is reported, not fatal).

The fleet's read commands (``check --all``, ``tenants list``, ``upgrade --all``'s version read,
``health``) reach every tenant server the directory names, plus the control database. The
invariant, for every command that goes through :func:`fan_out`:

* **one connection per server at a time**: a server's work runs on one owner session opened
  for it (the control database's on the caller's own connection when one is given), and every
  tenant of that server is read over that session, one after the other;
* **a bounded number of servers at once**: at most ``at_once`` servers
  (:data:`SERVERS_AT_ONCE` by default) are worked on together, in a small thread pool, so a
  fleet of fifty servers opens at most that many connections at once, whatever its size;
* **a server that is down is reported**: one that refuses the connection or the owner's login,
  or that goes away during its work (:class:`~provisioner.errors.DatabaseUnavailable`, a lock
  timeout excepted), yields a :class:`Reached` with its ``problem`` (one line, redacted) and no
  result; the other servers' work goes on. Any other error (a statement refused, a bug) is
  raised, as on one server;
* **a server whose reference must not be used is reported, never reached**: one whose stored
  reference sets ``sslkeylogfile``
  (:func:`provisioner.servers.reach.reference_problem`) yields a :class:`Reached` with that
  problem, as a server that is down does, and no session is opened with it.

A tenant server is reached as the owner with its directory reference
(:func:`provisioner.servers.reach.owner_address`): the password comes from libpq's own
sources, never from the directory. Pinned by ``tests/integration/test_fanout.py`` (three
real clusters, one of them stopped).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from contextlib import closing
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

import psycopg

from provisioner import db
from provisioner.errors import DatabaseUnavailable, LockNotAvailable, ProvisionerError
from provisioner.servers.directory import CONTROL, Directory, ServerStatus, TenantServer
from provisioner.servers.reach import owner_address, reference_problem

Conn = psycopg.Connection[Any]
T = TypeVar("T")

#: Servers worked on at once (each with its one session). Small: a fleet read is bound by
#: the servers' catalogs, and four sessions already overlap their round trips.
SERVERS_AT_ONCE = 4


@dataclass(frozen=True)
class Target:
    """A server to reach: its name (:data:`CONTROL` for the control database), the owner's
    address there (no password in it), and its directory status (None: the control database).
    ``problem``: why it must not be reached (its ``address`` is then empty, never connected)."""

    name: str
    address: str
    status: ServerStatus | None = None
    problem: str | None = None


@dataclass(frozen=True)
class Reached(Generic[T]):
    """One server's outcome: its work's ``result``, or ``problem`` when it was not reached."""

    server: str
    result: T | None
    problem: str | None = None

    @property
    def down(self) -> bool:
        return self.problem is not None

    def view(self) -> dict[str, Any]:
        return {"server": self.server, "reachable": not self.down, "problem": self.problem}


def targets(
    found: Directory, owner_url: str, names: Iterable[str | None] | None = None
) -> list[Target]:
    """The control database and the servers named in ``names`` (a tenant's server, None for
    the control database), or every server not retired when ``names`` is None; by name, the
    control database first."""
    wanted = None if names is None else {name or CONTROL for name in names}
    out = [Target(CONTROL, owner_url)] if wanted is None or CONTROL in wanted else []
    for server in found.servers:
        if wanted is None and server.status is ServerStatus.RETIRED:
            continue
        if wanted is None or server.name in wanted:
            out.append(_target(server, owner_url))
    return out


def _target(server: TenantServer, owner_url: str) -> Target:
    """``server`` as a target; one whose reference must not be used carries its problem and no
    address, so that the fleet command reports it and goes on with the others."""
    problem = reference_problem(server)
    if problem is not None:
        return Target(server.name, "", server.status, problem)
    return Target(server.name, owner_address(server, owner_url), server.status)


def fan_out(
    servers: list[Target],
    work: Callable[[Conn, Target], T],
    *,
    application_name: str,
    control: Conn | None = None,
    at_once: int = SERVERS_AT_ONCE,
) -> dict[str, Reached[T]]:
    """``work(conn, target)`` on each server, over one session per server, at most
    ``at_once`` servers together; each server's outcome by name, in ``servers``' order.

    ``control``: the caller's open connection to the control database, used for the control
    database's work (no second session there); it must be in autocommit and idle."""

    def one(target: Target) -> Reached[T]:
        if target.problem is not None:
            return Reached(target.name, None, target.problem)
        if target.name == CONTROL and control is not None:
            return _run(target, control, work)
        try:
            conn = db.connect(target.address, application_name=application_name, autocommit=True)
        except ProvisionerError as exc:  # translated and redacted by db.connect
            return Reached(target.name, None, _line(exc))
        with closing(conn):
            return _run(target, conn, work)

    if len(servers) <= 1:
        return {t.name: one(t) for t in servers}
    with ThreadPoolExecutor(max(1, min(at_once, len(servers))), "fan-out") as pool:
        return {reached.server: reached for reached in pool.map(one, servers)}


def _run(target: Target, conn: Conn, work: Callable[[Conn, Target], T]) -> Reached[T]:
    try:
        with db.translated():
            return Reached(target.name, work(conn, target))
    except LockNotAvailable:
        raise  # a busy tenant, not a server down
    except DatabaseUnavailable as exc:
        return Reached(target.name, None, _line(exc))


def _line(exc: BaseException) -> str:
    return " ".join(str(exc).split())[:500]
