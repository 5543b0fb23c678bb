"""The directory of tenant servers in ``control`` (control revision ``20261202_h29servers``):
which ordinary PostgreSQL servers hold tenants, whether each takes new ones, and where each
tenant lives.

A tenant whose row names no server lives on the control database itself, the implicit default:
a deployment that never adds a server keeps every tenant there, as before. Placement (which
server a new tenant gets) is the control database's own trigger on ``control.tenants``, so it
happens in the enqueue's transaction, once; this module adds, lists and changes servers, and
answers where a tenant lives (:func:`locate`).

A server's connection reference holds no secret: a libpq service name (``shard1``, stored as
``service=shard1``) or a conninfo without a password (``host=db2 port=5432 dbname=app``, or a
``postgresql://`` URL without one; no ``password``, ``sslpassword`` or ``oauth_client_secret``:
:data:`SECRET_KEYS`). Passwords come from ``.pgpass``, ``PGPASSWORD`` or the service file of
whoever connects, as for every other address of the tool. Nor does it set ``sslkeylogfile``
(:data:`LEAKING_KEYS`): every session opened with the reference (the owner's worker, and the
application, which reads it through ``control.tenant_location``) would write its TLS keys to
that file, for whoever reads it to decrypt the traffic. Nor does it hold a control character
(a newline, a tab, ...), written or %-encoded in a URL: the reference is printed one line a
server (``servers list``, ``locate``) and written into ``pgbouncer.ini``.
"""

from __future__ import annotations

import enum
import re
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

import psycopg
from psycopg.conninfo import conninfo_to_dict, make_conninfo
from psycopg.rows import dict_row

from provisioner.db.conninfo import libpq_address
from provisioner.errors import InvalidInput, UnknownServer, UnknownTenant
from provisioner.models import TenantId

Conn = psycopg.Connection[Any]

#: The name the control database goes by in the directory's views (no row holds it).
CONTROL = "control"

SERVER_NAME_RULE = (
    "server names are 1-48 characters of lower-case ASCII letters, digits and '_', starting "
    "with a letter ('control' is the control database's)"
)
_NAME_RE = re.compile(r"[a-z][a-z0-9_]{0,47}")
_SERVICE_RE = re.compile(r"[A-Za-z0-9_.-]{1,200}")
#: A reference written as a URL (libpq's two schemes).
_URL_RE = re.compile(r"postgres(ql)?://", re.IGNORECASE)
#: A control character (C0 or DEL): refused anywhere in a reference, as written or as parsed.
_CONTROL_RE = re.compile(r"[\x00-\x1f\x7f]")

#: The libpq connection parameters that carry a secret: refused in a reference, which the
#: application role reads (``control.tenant_location``). ``passfile``, ``sslkey`` and the like
#: name a file, which holds the secret where the directory's readers cannot see it.
SECRET_KEYS = frozenset({"password", "sslpassword", "oauth_client_secret"})

#: The libpq connection parameters that make whoever connects leak its sessions: refused in a
#: reference like a secret. ``sslkeylogfile`` (libpq 18) writes each TLS session's keys to the
#: file it names, from which anyone who reads it decrypts the owner's worker's traffic.
LEAKING_KEYS = frozenset({"sslkeylogfile"})


def leaking_keys(params: dict[str, Any]) -> list[str]:
    """The keys of :data:`LEAKING_KEYS` a parsed reference sets, by name: what ``servers add``
    refuses, what the owner never connects with, what ``locate`` leaves out."""
    return sorted(LEAKING_KEYS.intersection(params))


class ServerStatus(enum.StrEnum):
    """Whether a server takes new tenants: only ``active`` does. ``draining`` is being emptied,
    ``full`` is kept as it is, ``retired`` holds no tenant and is out of use."""

    ACTIVE = "active"
    DRAINING = "draining"
    FULL = "full"
    RETIRED = "retired"


# A new server; an existing name inserts nothing and returns no row.
ADD_SERVER = """
INSERT INTO control.tenant_servers (name, conninfo, capacity, weight)
VALUES (%(name)s, %(conninfo)s, %(capacity)s, %(weight)s)
ON CONFLICT (name) DO NOTHING
RETURNING *
"""

# Every server, by name, and how many tenants live on the control database.
LIST_SERVERS = "SELECT * FROM control.tenant_servers ORDER BY name"
ON_CONTROL = """
SELECT count(*) AS tenants FROM control.tenants WHERE server IS NULL AND state <> 'deleted'
"""

# A server's status changed; a server still holding tenants cannot be retired.
SET_STATUS = """
UPDATE control.tenant_servers SET status = %(status)s, updated_at = now()
 WHERE name = %(name)s AND (%(status)s <> 'retired' OR placed = 0)
RETURNING *
"""

GET_SERVER = "SELECT * FROM control.tenant_servers WHERE name = %(name)s"

# Where a tenant lives: its server's name and connection reference (NULL: the control
# database); no row: no such tenant. A function of the owner's, which the application role may
# call (it reads no directory row itself).
LOCATE = "SELECT server, conninfo FROM control.tenant_location(%(tenant_id)s)"

# Each server's status and load, without its reference (what the application role may read).
LOADS = "SELECT name, status, capacity, weight, placed FROM control.tenant_servers ORDER BY name"

# Each server's status and load (no reference) and the tenants (not purged) on the control
# database, in one statement for the metrics' snapshot: one row with no server at all (its
# server columns NULL), else one per server.
PLACEMENT = """
SELECT c.on_control, s.name, s.status, s.capacity, s.placed
  FROM (SELECT count(*) AS on_control FROM control.tenants
         WHERE server IS NULL AND state <> 'deleted') AS c
  LEFT JOIN control.tenant_servers AS s ON true
 ORDER BY s.name
"""

# The server of each tenant that lives on one (a list's or a report's column).
SERVERS_OF = "SELECT tenant_id, server FROM control.tenants WHERE server IS NOT NULL"


@dataclass(frozen=True)
class TenantServer:
    """A row of ``control.tenant_servers``."""

    name: str
    conninfo: str
    status: ServerStatus
    #: at most this many tenants (None: no limit)
    capacity: int | None
    #: its share of new tenants against the other active servers
    weight: int
    #: how many tenant rows name it
    placed: int

    @classmethod
    def from_row(cls, row: dict[str, Any]) -> TenantServer:
        return cls(
            name=row["name"],
            conninfo=row["conninfo"],
            status=ServerStatus(row["status"]),
            capacity=row["capacity"],
            weight=row["weight"],
            placed=row["placed"],
        )

    def view(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "conninfo": self.conninfo,
            "status": self.status.value,
            "capacity": self.capacity,
            "weight": self.weight,
            "tenants": self.placed,
        }


@dataclass(frozen=True)
class ServerLoad:
    """A server's status and how many tenants it holds, as ``health`` reports it."""

    name: str
    status: ServerStatus
    capacity: int | None
    placed: int

    def view(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "status": self.status.value,
            "capacity": self.capacity,
            "tenants": self.placed,
        }


@dataclass(frozen=True)
class Directory:
    """The tenant servers, and the tenants (not purged) left on the control database."""

    servers: list[TenantServer]
    on_control: int


@dataclass(frozen=True)
class Placement:
    """Where the tenants (not purged) are: how many on the control database, and each server's
    status and load (by name)."""

    on_control: int
    servers: list[ServerLoad]


@dataclass(frozen=True)
class Location:
    """Where a tenant lives. ``conninfo`` None: on the control database (connect as usual)."""

    tenant_id: str
    #: the server's name; :data:`CONTROL` for the control database
    server: str
    conninfo: str | None

    def view(self) -> dict[str, Any]:
        return {"tenant_id": self.tenant_id, "server": self.server, "conninfo": self.conninfo}


def server_name(raw: str) -> str:
    """A valid server name, or InvalidInput (exit 2) naming the rule."""
    if not isinstance(raw, str) or not _NAME_RE.fullmatch(raw) or raw == CONTROL:
        shown = repr(str(raw)[:60])
        raise InvalidInput(f"invalid server name {shown}: {SERVER_NAME_RULE}")
    return raw


def placement_name(raw: str) -> str:
    """A server a new tenant may be placed on by name: a valid server name, or :data:`CONTROL`
    (the control database: :func:`control_placement_problem` says when it may be named)."""
    return CONTROL if raw == CONTROL else server_name(raw)


# For a placement on the control database by name: where the tenant lives if it is registered
# (no row: it is not), and whether the directory has a server not retired (while it does, the
# placement trigger puts a new tenant on a tenant server, never on the control database).
# Readable by the application role (its columns of the directory, and the tenant's row).
CONTROL_PLACEMENT = """
SELECT EXISTS (SELECT FROM control.tenants WHERE tenant_id = %(tenant_id)s) AS registered,
       (SELECT server FROM control.tenants WHERE tenant_id = %(tenant_id)s) AS server,
       EXISTS (SELECT FROM control.tenant_servers WHERE status <> 'retired') AS servers
"""


def control_placement_problem(tenant: TenantId, found: dict[str, Any]) -> str | None:
    """Why ``tenant`` cannot be placed on the control database by name (None: it can), from
    :data:`CONTROL_PLACEMENT`'s row: it lives on a tenant server (a tenant is placed once), or
    it is new and the directory has servers (placement chooses among them; ``provisioner move
    TENANT --to control`` brings it back once it is provisioned)."""
    if found["registered"]:
        if found["server"] is None:
            return None
        return (
            f"tenant {tenant} lives on {found['server']}, not on {CONTROL}: a tenant is placed "
            "once (nothing was queued)"
        )
    if not found["servers"]:
        return None
    return (
        f"a new tenant cannot be placed on {CONTROL} while the directory has tenant servers "
        f"(placement chooses among them): enqueue {tenant} without a server, then "
        f"`provisioner move {tenant} --to {CONTROL}` once it is provisioned (nothing was queued)"
    )


def connection_reference(raw: str) -> str:
    """The reference as stored: a bare word is a libpq service (``service=WORD``); a conninfo
    or URL is kept as written once libpq parses it. Refused (InvalidInput, the value never
    shown back): one that does not parse, that holds a secret (:data:`SECRET_KEYS`, or a
    password in a URL), that sets a key that leaks the sessions (:data:`LEAKING_KEYS`), a URL
    that percent-encodes a parameter's name, or a control character, as written or once parsed
    (``%0A`` in a URL)."""
    text = raw.strip()
    if _CONTROL_RE.search(text):
        raise InvalidInput(
            "the connection reference holds a control character (a newline, a tab, ...): a "
            "reference is one line"
        )
    if _SERVICE_RE.fullmatch(text) and "=" not in text:
        return f"service={text}"
    try:
        params = conninfo_to_dict(libpq_address(text))
    except psycopg.ProgrammingError:
        raise InvalidInput(
            "the connection reference is neither a libpq service name nor a conninfo libpq "
            "parses (host=... port=... dbname=..., or a postgresql:// URL)"
        ) from None
    secrets = sorted(SECRET_KEYS.intersection(params))
    if secrets:
        raise InvalidInput(
            f"the connection reference holds a secret ({', '.join(secrets)}): keep it out of "
            "the directory (use ~/.pgpass, PGPASSWORD or a service file; the directory is "
            "readable by the application role)"
        )
    leaking = leaking_keys(params)
    if leaking:
        raise InvalidInput(
            f"the connection reference sets {', '.join(leaking)}: libpq would write the TLS "
            "session keys of whoever connects to that file; keep it out of the directory"
        )
    if not params:
        raise InvalidInput("the connection reference is empty")
    if _encoded_name(libpq_address(text)):
        raise InvalidInput(
            "the connection reference's URL percent-encodes a parameter name: write each name "
            "as it is (sslmode=..., not ssl%6Dode=...)"
        )
    controlled = sorted(key for key, value in params.items() if _CONTROL_RE.search(str(value)))
    if controlled:
        raise InvalidInput(
            f"the connection reference's {', '.join(controlled)} holds a control character "
            "(a newline, a tab, ...) once decoded: a reference is one line"
        )
    return libpq_address(text)


def _encoded_name(text: str) -> bool:
    """Whether ``text`` is a URL whose query percent-encodes a parameter's name, which libpq
    decodes: the directory's trigger refuses one (control revision ``20261208_h38keylog``), as no
    reading of the stored text by name could see what it sets."""
    if not _URL_RE.match(text):
        return False
    query = urlsplit(text).query
    return any("%" in part.split("=", 1)[0] for part in query.split("&"))


def control_character(value: str) -> bool:
    """Whether ``value`` holds a control character (C0 or DEL), which no reference may."""
    return _CONTROL_RE.search(value) is not None


def _positive(value: int | None, what: str, *, zero: bool) -> None:
    if value is not None and (value < (0 if zero else 1) or value > 1_000_000_000):
        raise InvalidInput(f"{what} must be {'0' if zero else '1'} or more (got {value})")


def add(
    conn: Conn, name: str, reference: str, *, capacity: int | None = None, weight: int = 1
) -> TenantServer:
    """A new active server in the directory (InvalidInput if the name is taken)."""
    _positive(capacity, "capacity", zero=True)
    _positive(weight, "weight", zero=False)
    if weight > 1_000_000:
        raise InvalidInput(f"weight must be at most 1000000 (got {weight})")
    params = {
        "name": server_name(name),
        "conninfo": connection_reference(reference),
        "capacity": capacity,
        "weight": weight,
    }
    with conn.cursor(row_factory=dict_row) as cur:
        cur.execute(ADD_SERVER, params)
        row = cur.fetchone()
    if row is None:
        raise InvalidInput(f"a tenant server named {name} is already in the directory")
    return TenantServer.from_row(row)


def directory(conn: Conn) -> Directory:
    with conn.cursor(row_factory=dict_row) as cur:
        cur.execute(LIST_SERVERS)
        servers = [TenantServer.from_row(row) for row in cur.fetchall()]
    with conn.cursor(row_factory=dict_row) as cur:
        cur.execute(ON_CONTROL)
        counted = cur.fetchone()
    return Directory(servers, int(counted["tenants"]) if counted else 0)


def get(conn: Conn, name: str) -> TenantServer:
    with conn.cursor(row_factory=dict_row) as cur:
        cur.execute(GET_SERVER, {"name": server_name(name)})
        row = cur.fetchone()
    if row is None:
        raise UnknownServer(f"no tenant server named {name} in the directory")
    return TenantServer.from_row(row)


def set_status(conn: Conn, name: str, status: ServerStatus) -> TenantServer:
    """The server's new status. Retiring one that still holds tenants is refused
    (InvalidInput): they would have nowhere to run."""
    with conn.cursor(row_factory=dict_row) as cur:
        cur.execute(SET_STATUS, {"name": server_name(name), "status": status.value})
        row = cur.fetchone()
    if row is not None:
        return TenantServer.from_row(row)
    held = get(conn, name)  # UnknownServer when it is not there
    raise InvalidInput(
        f"tenant server {name} still holds {held.placed} tenant(s): drain it and move them "
        "before retiring it"
    )


def locate(conn: Conn, tenant: TenantId) -> Location:
    """Where ``tenant`` lives (UnknownTenant when it has no control row). The reference comes
    without the keys of :data:`LEAKING_KEYS`: a row stored before ``servers add`` refused them
    may still hold one, and the application connects with what this returns (the owner's
    commands refuse such a server and report it: :func:`.reach.reference_problem`). The SQL
    lookup leaves them out since control revision ``20261208_h38keylog``; this reading does
    too, for a control schema not migrated yet."""
    with conn.cursor(row_factory=dict_row) as cur:
        cur.execute(LOCATE, {"tenant_id": tenant.value})
        row = cur.fetchone()
    if row is None:
        raise UnknownTenant(f"unknown tenant {tenant}")
    return Location(tenant.value, row["server"] or CONTROL, _without_leaks(row["conninfo"]))


def _without_leaks(conninfo: str | None) -> str | None:
    """``conninfo`` without the keys of :data:`LEAKING_KEYS` (as it was when it has none)."""
    if conninfo is None:
        return None
    params = conninfo_to_dict(conninfo)
    leaking = leaking_keys(params)
    if not leaking:
        return conninfo
    return make_conninfo("", **{k: v for k, v in params.items() if k not in leaking})


def loads(conn: Conn) -> list[ServerLoad]:
    """Every server's status and load, by name (readable by the application role)."""
    with conn.cursor(row_factory=dict_row) as cur:
        cur.execute(LOADS)
        return [
            ServerLoad(r["name"], ServerStatus(r["status"]), r["capacity"], r["placed"])
            for r in cur.fetchall()
        ]


def placement(conn: Conn) -> Placement:
    """The control database's tenants and every server's load in one statement, so that a
    caller's snapshot (the metrics' scrape) reads them together."""
    with conn.cursor(row_factory=dict_row) as cur:
        cur.execute(PLACEMENT)
        rows = cur.fetchall()
    loads = [
        ServerLoad(r["name"], ServerStatus(r["status"]), r["capacity"], r["placed"])
        for r in rows
        if r["name"] is not None
    ]
    return Placement(int(rows[0]["on_control"]), loads)


def servers_of(conn: Conn) -> dict[str, str]:
    """Each tenant's server, by tenant id, for the tenants not on the control database."""
    with conn.cursor(row_factory=dict_row) as cur:
        cur.execute(SERVERS_OF)
        return {str(row["tenant_id"]): str(row["server"]) for row in cur.fetchall()}
