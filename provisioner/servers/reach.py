"""Can the owner reach each active tenant server, as a role that is not a superuser?

What a worker must know before it runs jobs on tenant servers, and what ``provisioner servers
check`` reports today. A server is reached with its reference (which names no password) as the
owner: the role the reference names, else the owner URL's role; the password comes from
libpq's own sources (``~/.pgpass``/``PGPASSFILE``, ``PGPASSWORD``, a service file), never
from the directory. A superuser is refused: the owner must be an ordinary role, as on the
control database (``provisioner worker`` refuses the same).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from psycopg.conninfo import conninfo_to_dict, make_conninfo

from provisioner import db
from provisioner.errors import ProvisionerError
from provisioner.servers.directory import ServerStatus, TenantServer

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


def owner_address(server: TenantServer, owner_url: str) -> str:
    """The server's reference, as the role it names or the owner URL's (no password added)."""
    params = conninfo_to_dict(server.conninfo)
    if "user" not in params:
        owner = conninfo_to_dict(db.libpq_address(owner_url)).get("user")
        if owner:
            params["user"] = owner
    return make_conninfo("", **params)


def reach(server: TenantServer, owner_url: str) -> Reach:
    """Connect to ``server`` as the owner and read who it is; never raises for its failure."""
    address = owner_address(server, owner_url)
    try:
        with db.connect(address, application_name="servers-check") as conn, db.translated():
            row = conn.execute(WHO_AM_I).fetchone()
    except ProvisionerError as exc:  # already translated and redacted, on one line
        return Reach(server.name, server.status, False, None, str(exc))
    assert row is not None, "current_user is a role"
    if row["rolsuper"]:
        problem = f"role {row['role']} is a superuser: the owner must be an ordinary role"
        return Reach(server.name, server.status, False, row["role"], problem)
    return Reach(server.name, server.status, True, row["role"], None)


def reach_active(servers: list[TenantServer], owner_url: str) -> list[Reach]:
    """:func:`reach` for each active server, by name (the others take no new work)."""
    return [reach(s, owner_url) for s in servers if s.status is ServerStatus.ACTIVE]
