"""The directory as PgBouncer's ``[databases]`` section: one pooled database per tenant server.

An application that routes through PgBouncer connects to the database named for the tenant's
server (:func:`provisioner.locate` gives the name); PgBouncer forwards it to that server.
Each entry carries the server's host, port and database from its connection reference; no
user and no password (PgBouncer's ``auth_file`` or ``auth_query`` holds those). A reference
by libpq service cannot be written here (PgBouncer reads no service file): it is listed as a
comment to fill in by hand.

A value is written as PgBouncer's connection-string parser reads it (``cstr_get_value`` in its
``src/loader.c``; libpq's rules differ): a value without a space or a single quote as it is, any
other in single quotes with each single quote doubled (``dbname='it''s a db'``); a backslash
means nothing there and is written as it is. A value PgBouncer cannot hold (empty, or a control
character, which no reference added since may hold:
:func:`provisioner.servers.directory.connection_reference`) is not written: the entry becomes a
comment to fill in by hand, so that no value can end its line or start another entry.
"""

from __future__ import annotations

from psycopg.conninfo import conninfo_to_dict

from provisioner.servers.directory import CONTROL, Directory, control_character

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
        service = _value(str(params["service"]))
        return f"; {name}: libpq service {service} (PgBouncer reads no service file)"
    kept = {key: str(params[key]) for key in _KEPT if key in params}
    unwritable = [key for key, value in kept.items() if not value or control_character(value)]
    if unwritable:
        return (
            f"; {name}: its {', '.join(unwritable)} cannot be written for PgBouncer (empty, or "
            "a control character): write this entry by hand"
        )
    return f"{name} = " + " ".join(f"{key}={_value(value)}" for key, value in kept.items())


def _value(value: str) -> str:
    """``value`` as PgBouncer's connection-string parser reads it back (see the module)."""
    if control_character(value):
        return "(a control character)"  # never written where it could end the line
    if value and " " not in value and "'" not in value:
        return value
    return "'" + value.replace("'", "''") + "'"
