"""Can the owner use each active tenant server: reach it, as a role that is not a superuser,
and find the tool's schema there at this build's version?

What a worker must know before it runs jobs on tenant servers, and what ``provisioner servers
check`` reports today. A server is reached with its reference (which names no password) as the
owner: the role the reference names, else the owner URL's role; the password comes from
libpq's own sources (``~/.pgpass``/``PGPASSFILE``, ``PGPASSWORD``, a service file), never
from the directory. A superuser is refused: the owner must be an ordinary role, as on the
control database (``provisioner worker`` refuses the same).

A stored reference that sets a key which leaks the sessions (``sslkeylogfile``:
:data:`~provisioner.servers.directory.LEAKING_KEYS`) is never used to connect, whichever
command asks: ``servers add`` refuses one, and the directory's trigger a new or changed
reference (control revision ``20261208_h38keylog``), but a row stored before either may still
hold one. :func:`owner_address`, through which every owner session on a tenant server is
addressed, raises
:class:`~provisioner.errors.ConfigurationError` for it; the readers that report each server
(:func:`reach`, the fan-out) report it as that server's :func:`reference_problem` instead.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from psycopg.conninfo import conninfo_to_dict, make_conninfo

from provisioner import db
from provisioner.errors import ConfigurationError, ProvisionerError
from provisioner.servers import journal
from provisioner.servers.directory import ServerStatus, TenantServer, leaking_keys

# The role the session runs as, and whether it is a superuser.
WHO_AM_I = "SELECT current_user AS role, rolsuper FROM pg_roles WHERE rolname = current_user"


@dataclass(frozen=True)
class Reach:
    """One server's answer: reached as ``role`` (None: not reached), and what is wrong."""

    server: str
    status: ServerStatus
    ok: bool
    role: str | None
    problem: str | None

    def view(self) -> dict[str, Any]:
        return {
            "server": self.server,
            "status": self.status.value,
            "ok": self.ok,
            "role": self.role,
            "problem": self.problem,
        }


def reference_problem(server: TenantServer) -> str | None:
    """Why no session may be opened with ``server``'s stored reference (None: one may): it
    sets a key of :data:`~provisioner.servers.directory.LEAKING_KEYS`. Names the key, never
    its value; says how to fix it, as no command changes a stored reference."""
    leaking = leaking_keys(conninfo_to_dict(server.conninfo))
    if not leaking:
        return None
    return (
        f"its reference sets {', '.join(leaking)}: libpq would write the TLS session keys to "
        "that file, so no session is opened with it; as the owner, UPDATE "
        "control.tenant_servers SET conninfo to the reference without it (no command changes "
        "a stored reference)"
    )


def owner_address(server: TenantServer, owner_url: str) -> str:
    """The server's reference, as the role it names or the owner URL's (no password added).
    :class:`ConfigurationError` naming the server when it must not be used
    (:func:`reference_problem`): every owner session on a tenant server is addressed here."""
    problem = reference_problem(server)
    if problem is not None:
        raise ConfigurationError(f"tenant server {server.name}: {problem}")
    params = conninfo_to_dict(server.conninfo)
    if "user" not in params:
        owner = conninfo_to_dict(db.libpq_address(owner_url)).get("user")
        if owner:
            params["user"] = owner
    return make_conninfo("", **params)


def reach(server: TenantServer, owner_url: str) -> Reach:
    """Connect to ``server`` as the owner and read who it is and its tool schema's version
    (:func:`.journal.behind`: one that this build cannot use, ``provisioner migrate`` not run
    since the server was added or the tool upgraded, is a problem); never raises for its
    failure (a reference that must not be used is reported, and not connected with)."""
    problem = reference_problem(server)
    if problem is not None:
        return Reach(server.name, server.status, False, None, problem)
    address = owner_address(server, owner_url)
    try:
        with db.connect(address, application_name="servers-check") as conn, db.translated():
            row = conn.execute(WHO_AM_I).fetchone()
            problem = journal.behind(conn)
    except ProvisionerError as exc:  # already translated and redacted, on one line
        return Reach(server.name, server.status, False, None, str(exc))
    assert row is not None, "current_user is a role"
    if row["rolsuper"]:
        problem = f"role {row['role']} is a superuser: the owner must be an ordinary role"
    return Reach(server.name, server.status, problem is None, row["role"], problem)


def reach_active(servers: list[TenantServer], owner_url: str) -> list[Reach]:
    """:func:`reach` for each active server, by name (the others take no new work)."""
    return [reach(s, owner_url) for s in servers if s.status is ServerStatus.ACTIVE]
