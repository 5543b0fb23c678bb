"""The directory as PgBouncer's ``[databases]`` section: one pooled database per tenant server.

An application that routes through PgBouncer connects to the database named for the tenant's
server (:func:`provisioner.locate` gives the name); PgBouncer forwards it to that server.
Each entry carries the server's host, port and database from its connection reference; no
user and no password (PgBouncer's ``auth_file`` or ``auth_query`` holds those). A reference
by libpq service cannot be written here (PgBouncer reads no service file): it is listed as a
comment to fill in by hand.
"""

from __future__ import annotations

from psycopg.conninfo import conninfo_to_dict

from provisioner.servers.directory import CONTROL, Directory

#: The connection parameters PgBouncer's database entries understand, in the order written.
_KEPT = ("host", "port", "dbname")


def databases_section(found: Directory, control_conninfo: str | None = None) -> str:
    """``[databases]`` for every server not retired (and the control database's entry, when
    its conninfo is given), as text for ``pgbouncer.ini``."""
    lines = ["[databases]"]
    if control_conninfo is not None:
        lines.append(_entry(CONTROL, control_conninfo))
    for server in found.servers:
        if server.status.value != "retired":
            lines.append(_entry(server.name, server.conninfo))
    return "\n".join(lines) + "\n"


def _entry(name: str, conninfo: str) -> str:
    params = conninfo_to_dict(conninfo)
    if "service" in params and "host" not in params:
        return f"; {name}: libpq service {params['service']} (PgBouncer reads no service file)"
    kept = " ".join(f"{key}={params[key]}" for key in _KEPT if key in params)
    return f"{name} = {kept}"
