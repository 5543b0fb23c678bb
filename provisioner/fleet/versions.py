"""Who is behind: every tenant schema's ``alembic_version``, read fast at any fleet size.

Two kinds of query, whatever the fleet's size: one catalog lookup for the schemas that have a
version table, then their versions read by strings of ``COPY ... TO STDOUT`` statements,
:data:`VERSION_CHUNK` tables each, over :data:`VERSION_SESSIONS` sessions. Each string runs as one
implicit transaction, so 10,000 tenants never hold 10,000 table locks at once (the lock table
would run out). Every answer is read from the schema's own ``alembic_version`` table, never from
a cache a hand-run Alembic could leave stale.

Invariant: a tenant's version is what its table held at some instant during the read; a table
dropped meanwhile is read as having none. Pinned by tests/integration/test_fleet_upgrade.py.
"""

from __future__ import annotations

import csv
import io
from concurrent.futures import ThreadPoolExecutor
from contextlib import closing
from dataclasses import dataclass
from typing import Any

import psycopg
from psycopg import sql
from psycopg.rows import tuple_row

from provisioner import db, servers
from provisioner.db import copy_out
from provisioner.settings import tenant_naming

#: A tenant stuck behind a long migration's lock fails the command rather than hang it. Set in
#: each of the upgrade's transactions (:func:`provisioner.db.local_settings`), never as libpq
#: ``options``: ``upgrade`` works through PgBouncer in transaction mode.
UPGRADE_SETTINGS = {"lock_timeout": "5s"}

#: Version tables per string of ``COPY`` statements (one round trip, one implicit transaction,
#: so as many table locks). ``COPY table TO STDOUT`` is not planned: a ``UNION ALL`` of the same
#: tables also opened each one's index and sized its files for the planner, and planning grew
#: faster than its branches (10,000 real tenants, two sessions, same minute: ``UNION ALL`` in
#: chunks of 100 0.56 s; ``COPY`` in strings of 100 0.40 s, of 500 0.33 s, of 1,000 0.32 s).
VERSION_CHUNK = 500


#: Sessions reading versions at once for a large fleet: each table costs the server a lock and
#: a relation open in a cold session, so two backends nearly halve the time on a 2-core machine
#: (``COPY`` strings of 500 over 10,000 tenants: 0.44 s with one session, 0.33 s with two; the
#: former ``UNION ALL``: 0.56 s with two, 0.81 s with three).
VERSION_SESSIONS = 2


# The schemas (of those named) that hold a version table: one catalog lookup by relname. A
# session reading a share of them (``oid % shares = share``) finds its own share.
VERSIONED_SCHEMAS = """
SELECT n.nspname, c.oid, c.relkind = 'p' FROM pg_class c
  JOIN pg_namespace n ON n.oid = c.relnamespace
 WHERE c.relname = 'alembic_version' AND c.relkind IN ('r', 'p') AND n.nspname = ANY(%(schemas)s)
   AND c.oid::int8 %% %(shares)s = %(share)s
"""


# Every schema named like a tenant's that holds a version table (a fleet-wide upgrade reads
# them all while it reads the jobs). %(like)s is the naming pattern's LIKE form (its "_" escaped):
# the rows are then held to the tenant-id rule (spares, pool_*, and scratch schemas never match).
VERSIONED_TENANT_SCHEMAS = """
SELECT n.nspname, c.oid, c.relkind = 'p' FROM pg_class c
  JOIN pg_namespace n ON n.oid = c.relnamespace
 WHERE c.relname = 'alembic_version' AND c.relkind IN ('r', 'p')
   AND n.nspname LIKE %(like)s AND c.oid::int8 %% %(shares)s = %(share)s
"""


@dataclass(frozen=True, order=True)
class VersionTable:
    """A schema's ``alembic_version`` table, found in the catalog."""

    schema: str
    oid: int
    #: a partitioned table (``COPY`` reads it through a query, as it cannot name it)
    partitioned: bool = False

    def copy_statement(self, conn: psycopg.Connection[Any]) -> bytes:
        """``COPY ... TO STDOUT`` of its versions, one CSV line each."""
        table = sql.Identifier(self.schema, "alembic_version").as_bytes(conn)
        source = b"(SELECT version_num FROM " + table + b")" if self.partitioned else table
        if not self.partitioned:
            source += b" (version_num)"
        return b"COPY " + source + b" TO STDOUT (FORMAT csv)"


def schema_versions(
    conn: psycopg.Connection[Any], schemas: list[str]
) -> dict[str, frozenset[str] | None]:
    """Each schema's recorded revisions (None: no version table, or no schema).

    ``conn`` is in autocommit: every chunk is a transaction of its own.
    """
    found = _read_chunks(conn, versioned(conn, schemas))
    return {s: found.get(s) for s in schemas}


def versioned(
    conn: psycopg.Connection[Any], schemas: list[str] | None, share: int = 0, shares: int = 1
) -> list[VersionTable]:
    """Of ``schemas`` (None: every tenant schema), those that hold a version table, by name;
    of those, the ``share``-th of ``shares`` (by oid)."""
    naming = tenant_naming()
    params = {"schemas": schemas, "share": share, "shares": shares, "like": naming.like()}
    with conn.cursor(row_factory=tuple_row) as cur:
        cur.execute(VERSIONED_TENANT_SCHEMAS if schemas is None else VERSIONED_SCHEMAS, params)
        rows = cur.fetchall()
    if schemas is None:
        rows = [row for row in rows if naming.tenant_of(row[0]) is not None]
    return sorted(VersionTable(row[0], int(row[1]), bool(row[2])) for row in rows)


def _read_chunks(
    conn: psycopg.Connection[Any], tables: list[VersionTable]
) -> dict[str, frozenset[str]]:
    found: dict[str, frozenset[str]] = {}
    for start in range(0, len(tables), VERSION_CHUNK):
        found.update(_copy_versions(conn, tables[start : start + VERSION_CHUNK]))
    return found


def _copy_versions(
    conn: psycopg.Connection[Any], tables: list[VersionTable]
) -> dict[str, frozenset[str]]:
    """The versions of ``tables``: one string of ``COPY`` statements, one result per table,
    after the upgrade's settings for the string's implicit transaction."""
    first = db.local_settings(UPGRADE_SETTINGS).as_bytes(conn)
    outputs = copy_out.copy_each(conn, [first, *(table.copy_statement(conn) for table in tables)])
    encoding = conn.info.encoding
    found: dict[str, frozenset[str]] = {}
    for table, data in zip(tables, outputs, strict=False):
        lines = csv.reader(io.StringIO(data.decode(encoding)))
        found[table.schema] = frozenset(line[0] for line in lines if line)
    return found


def read_versions(url: str, schemas: list[str] | None) -> dict[str, frozenset[str]]:
    """The recorded revisions of each of ``schemas`` (None: every tenant schema) that has a
    version table (the others are absent).

    A fleet-wide read (or one of more than :data:`VERSION_CHUNK` schemas) runs over
    :data:`VERSION_SESSIONS` sessions at once, each finding and reading its own share: the
    sessions connect, look up and read side by side, with nothing serial before them."""
    shares = 1 if schemas is not None and len(schemas) <= VERSION_CHUNK else VERSION_SESSIONS

    def part(share: int) -> dict[str, frozenset[str]]:
        conn = db.connect(url, application_name="upgrade", autocommit=True)
        with closing(conn), db.translated():
            return _read_chunks(conn, versioned(conn, schemas, share, shares))

    if shares == 1:
        return part(0)
    found: dict[str, frozenset[str]] = {}
    with ThreadPoolExecutor(shares) as pool:
        for result in pool.map(part, range(shares)):
            found.update(result)
    return found


@dataclass(frozen=True)
class ServerVersions:
    """The versions read on each server (by schema), and the servers that were down (why)."""

    found: dict[str, frozenset[str]]
    down: dict[str, str]

    def merged(self, other: ServerVersions) -> ServerVersions:
        """Both reads together (``other``'s versions and servers down added to these)."""
        return ServerVersions({**self.found, **other.found}, {**self.down, **other.down})


def read_versions_by_server(owner_url: str, schemas: dict[str | None, list[str]]) -> ServerVersions:
    """The recorded revisions of the schemas of each server (``schemas``: by server name, None
    for the control database), each server's read on that server: the control database's by
    :func:`read_versions` as ever, the tenant servers' through the fan-out
    (:mod:`provisioner.servers.fanout`: one session each, a few at once). A tenant server that
    is down is named in ``down``; its schemas are absent from ``found``."""
    found = read_versions(owner_url, schemas[None]) if schemas.get(None) else {}
    elsewhere = {name: listed for name, listed in schemas.items() if name is not None}
    if not elsewhere:
        return ServerVersions(found, {})
    owner = db.connect(owner_url, application_name="upgrade", autocommit=True)
    with closing(owner) as conn, db.translated():
        directory = servers.directory(conn)
    return ServerVersions(found, {}).merged(_read_on_servers(directory, owner_url, elsewhere))


@dataclass(frozen=True)
class PlacedVersions:
    """What :func:`read_placed_versions` read: the placement it read them by (tenant id ->
    server) and, per server, the versions found or why it was down."""

    placed: dict[str, str]
    read: ServerVersions

    def of(self, placed: dict[str, str], tenants: list[str]) -> tuple[ServerVersions, list[str]]:
        """The versions of ``tenants`` whose server in ``placed`` (the caller's placement) is
        the one they were read on, and the servers down among theirs; and the tenants placed
        otherwise since (a move switched them meanwhile), to be read again."""
        naming = tenant_naming()
        found: dict[str, frozenset[str]] = {}
        down: dict[str, str] = {}
        moved = []
        for tenant in tenants:
            server = placed.get(tenant)
            if server is None:
                continue
            if self.placed.get(tenant) != server:
                moved.append(tenant)
            elif server in self.read.down:
                down[server] = self.read.down[server]
            elif (schema := naming.schema(tenant)) in self.read.found:
                found[schema] = self.read.found[schema]
        return ServerVersions(found, down), moved


def read_placed_versions(
    directory: servers.Directory, owner_url: str, placed: dict[str, str]
) -> PlacedVersions:
    """Every placed tenant's versions on the tenant server ``placed`` (tenant id -> server, as
    the caller read it with ``directory``) names (``upgrade --all`` starts it in a thread once
    it read the placement, beside its own reads of control: the servers' sessions connect and
    read while the jobs are read and parsed)."""
    by_server = schemas_by_server(placed, list(placed))
    return PlacedVersions(placed, _read_on_servers(directory, owner_url, by_server))


def schemas_by_server(placed: dict[str, str], tenants: list[str]) -> dict[str, list[str]]:
    """The schemas of those of ``tenants`` on a tenant server, by server (``placed``: tenant
    id -> server; a tenant on the control database is left out)."""
    naming = tenant_naming()
    by_server: dict[str, list[str]] = {}
    for tenant in tenants:
        server = placed.get(tenant)
        if server is not None:
            by_server.setdefault(server, []).append(naming.schema(tenant))
    return by_server


def _read_on_servers(
    directory: servers.Directory, owner_url: str, schemas: dict[str, list[str]]
) -> ServerVersions:
    """The versions of ``schemas`` (by tenant server name), each read on its server through
    the fan-out; a server down is named with why."""
    plan = servers.targets(directory, owner_url, schemas)

    def there(conn: psycopg.Connection[Any], target: servers.Target) -> dict[str, frozenset[str]]:
        return _read_chunks(conn, versioned(conn, schemas[target.name]))

    found: dict[str, frozenset[str]] = {}
    down = {}
    for name, outcome in servers.fan_out(plan, there, application_name="upgrade").items():
        if outcome.result is None:
            down[name] = outcome.problem or "not reached"
        else:
            found.update(outcome.result)
    return ServerVersions(found, down)
