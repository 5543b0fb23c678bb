"""A move's rows by logical replication, so that the writes' freeze holds the catch-up alone
(issue 29's "logical replication when the deployment grants what it needs").

The mechanism, each part named after the move's job (:func:`name`: the publication, the
replication slot and the subscription share it):

* :func:`probe` decides, per move, whether the deployment grants what it needs (PostgreSQL 16
  or later on the target, the owner a member of ``pg_create_subscription`` with ``CREATE`` on
  the database there; ``wal_level = logical`` on the source, the owner ``REPLICATION`` there
  and owning every table, each with a replica identity; a password the subscription can
  carry). What is missing comes back one short phrase each, for the step's record or the
  refusal of ``move --method logical``.
* :func:`start` (step ``precopy_schema``, after the DDL's pre-copy, the application still
  writing): the publication of the schema's tables by name on the source (``FOR TABLES IN
  SCHEMA`` needs a superuser, ``FOR TABLE`` the tables' owner), the slot made there by the
  owner's own session, then the subscription on the target using it (``copy_data``: the
  initial rows come through it), waited on until every table is synchronised.
* :func:`catch_up` (step ``copy_schema``, in the freeze): the source's WAL position taken
  after the freeze, flushed (:func:`_freeze_position`), waited for until the slot's
  confirmed position passes it (the subscription commits synchronously, so a confirmed
  position is applied); then
  :func:`unsubscribe` drops the subscription (which drops the slot on the source) and the
  publication in a thread, alongside the DDL after the rows and the verification (the source
  is frozen: nothing more comes); the switch waits for it first.
* :func:`cleanup` drops whatever a dead run left (subscription, slot, publication), in that
  order: a forgotten slot holds WAL on the source for ever. It is idempotent and runs before a
  run starts anew, before a resumed run's full copy, after a failed replication, and in
  ``move --abort``.

The probe cannot see whether the target's server reaches the source (its address there, the
source's ``pg_hba.conf``, WAL senders or slots used up meanwhile): :func:`start` and
:func:`catch_up` raise :class:`ReplicationFailed` (one phrase, no server message: nothing of
the connection string) when the source refuses the publication or the slot, when ``CREATE
SUBSCRIPTION`` cannot connect, on the workers' first error (``pg_stat_subscription_stats``),
when no table's copy began within :data:`CONNECT_TIMEOUT_SECONDS` (the workers never reached
the source), or at a time limit; the move kind then falls back to the dump in ``auto``.

The subscription's connection string holds the source's password: it reaches SQL as a
literal (``CREATE SUBSCRIPTION`` takes no bind parameter), never a log line, a record or an
error (:class:`Capability` hides it from ``repr``).
"""

from __future__ import annotations

import enum
import time
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import contextmanager, suppress
from dataclasses import dataclass, field
from typing import Any
from uuid import UUID

import psycopg
from psycopg import sql
from psycopg.conninfo import conninfo_to_dict, make_conninfo
from psycopg.rows import tuple_row

from provisioner.errors import PermanentError
from provisioner.kinds import move_copy
from provisioner.servers.moves import End

Conn = psycopg.Connection[Any]

#: How long :func:`start` waits for the initial rows (the application still writes meanwhile).
SYNC_TIMEOUT_SECONDS = 3600.0
#: How long :func:`start` waits for a first table's copy to begin (``srsubstate`` past ``i``):
#: a worker that cannot reach the source reports no error the statistics count (the apply
#: worker's own connection), it only never begins.
CONNECT_TIMEOUT_SECONDS = 60.0
#: How long :func:`catch_up` waits for the subscription to pass the freeze's position.
CATCH_UP_TIMEOUT_SECONDS = 120.0
#: Between two looks at the subscription's progress.
POLL_SECONDS = 0.005


class MoveMethod(enum.StrEnum):
    """How a move copies the rows: ``auto`` (logical when :func:`probe` finds what it needs,
    else dump), ``dump`` (``COPY`` in the freeze, as before), ``logical`` (refused without)."""

    AUTO = "auto"
    DUMP = "dump"
    LOGICAL = "logical"


@dataclass(frozen=True)
class Capability:
    """:func:`probe`'s answer: what is missing (empty: logical replication can be used), and
    the connection string the subscription would use (holds a password: never shown)."""

    missing: tuple[str, ...]
    conninfo: str = field(default="", repr=False)

    @property
    def ok(self) -> bool:
        return not self.missing


@dataclass(frozen=True)
class Started:
    """What :func:`start` made, and how long the initial rows took to arrive."""

    name: str
    tables: int
    sync_ms: float
    conninfo: str = field(repr=False)


class ReplicationFailed(PermanentError):
    """Logical replication failed after :func:`probe` passed; ``reason`` is one short phrase
    for a record or an error, with no server message (a connection's error could echo what it
    was given)."""

    def __init__(self, reason: str) -> None:
        super().__init__(f"logical replication failed: {reason}")
        self.reason = reason


def name(job_id: UUID | None) -> str:
    """The move's publication, slot and subscription name (lower case, letters, digits and
    ``_``: what a slot name allows)."""
    assert job_id is not None, "a move's job is recorded with its row"
    return f"provisioner_move_{job_id.hex}"


# -- The probe ---------------------------------------------------------------------------------

SOURCE_PROBE = """
SELECT current_setting('wal_level') AS wal_level,
       (SELECT rolreplication OR rolsuper FROM pg_roles WHERE rolname = current_user) AS repl,
       (SELECT count(*) FROM pg_replication_slots)
         < current_setting('max_replication_slots')::int AS slot_free,
       has_function_privilege('pg_logical_emit_message(boolean, text, text)', 'EXECUTE')
         AS may_mark
"""

# The schema's tables that hold rows, and what stops each from being published.
SOURCE_TABLES = """
SELECT c.relname,
       NOT pg_has_role(current_user, c.relowner, 'USAGE') AS foreign_owner,
       c.relpersistence <> 'p' AS unlogged,
       (c.relreplident = 'n' OR (c.relreplident = 'd' AND NOT EXISTS (
           SELECT 1 FROM pg_index i WHERE i.indrelid = c.oid AND i.indisprimary))) AS no_identity
  FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
 WHERE n.nspname = %(schema)s AND c.relkind = 'r'
 ORDER BY c.relname
"""

TARGET_PROBE = """
SELECT current_setting('server_version_num')::int AS version,
       (SELECT rolsuper FROM pg_roles WHERE rolname = current_user)
         OR EXISTS (SELECT 1 FROM pg_roles r WHERE r.rolname = 'pg_create_subscription'
                    AND pg_has_role(current_user, r.oid, 'MEMBER')) AS may_subscribe,
       has_database_privilege(current_database(), 'CREATE') AS may_create
"""


def probe(source: End, target: End, schema: str) -> Capability:
    """Whether this move can copy its rows by logical replication; see the module."""
    missing: list[str] = []
    with move_copy.connect(target) as there:
        row = _one(there, TARGET_PROBE)
    version, may_subscribe, may_create = row[0], row[1], row[2]
    if version < 160000:
        missing.append(f"{target.server} runs PostgreSQL {version // 10000} (16 or later needed)")
    elif not may_subscribe:
        missing.append(f"the owner is not a member of pg_create_subscription on {target.server}")
    if not may_create:
        missing.append(f"the owner may not CREATE in {target.server}'s database")
    with move_copy.connect(source) as here:
        found = _one(here, SOURCE_PROBE)
        with here.cursor(row_factory=tuple_row) as cur:
            cur.execute(SOURCE_TABLES, {"schema": schema})
            tables = cur.fetchall()
        password = here.info.password or source.password
    if found[0] != "logical":
        missing.append(f"{source.server} has wal_level={found[0]} (logical needed)")
    if not found[1]:
        missing.append(f"the owner has no REPLICATION attribute on {source.server}")
    if not found[2]:
        missing.append(f"{source.server} has no free replication slot")
    if not found[3]:  # the freeze's position is marked with a message (_freeze_position)
        missing.append(f"the owner may not run pg_logical_emit_message on {source.server}")
    missing += _table_problems(tables)
    if not password:
        missing.append(f"no password for {source.server} (the subscription must carry one)")
        return Capability(tuple(missing))
    return Capability(tuple(missing), _conninfo(source, password))


def _table_problems(tables: list[tuple[Any, ...]]) -> list[str]:
    if not tables:
        return ["the schema has no table to publish"]
    problems = []
    for label, column in (
        ("not owned by the owner", 1),
        ("unlogged", 2),
        ("without a primary key or replica identity", 3),
    ):
        named = [str(t[0]) for t in tables if t[column]]
        if named:
            problems.append(f"tables {label}: {', '.join(named[:5])}")
    return problems


def _conninfo(source: End, password: str) -> str:
    """The source as the target's server reaches it: its address with the password, without
    the password file (a path of this machine's)."""
    params = conninfo_to_dict(source.address)
    params.pop("passfile", None)
    return make_conninfo("", **{**params, "password": password})


# -- Start, catch up, clean up -----------------------------------------------------------------


def start(source: End, target: End, schema: str, move_name: str, conninfo: str) -> Started:
    """Publish the schema's tables, make the slot, subscribe the pre-copied target, and wait
    until every table's initial rows are there; :class:`ReplicationFailed` when a server
    refuses a part of it or the workers fail (what was made is left: :func:`cleanup`)."""
    began = time.perf_counter()
    with move_copy.connect(source) as here:
        with here.cursor(row_factory=tuple_row) as cur:
            cur.execute(SOURCE_TABLES, {"schema": schema})
            tables = [str(row[0]) for row in cur.fetchall()]
        with _refused("the source refused the publication or the replication slot"):
            _publish(here, schema, move_name, tables)
    with move_copy.connect(target) as there:
        with _refused("the target's server could not subscribe to the source"):
            _subscribe(there, move_name, conninfo)
        _wait(there, move_name, len(tables), SYNC_TIMEOUT_SECONDS, "the initial rows")
    return Started(move_name, len(tables), (time.perf_counter() - began) * 1000, conninfo)


@contextmanager
def _refused(what: str) -> Iterator[None]:
    """A server's refusal (an error with a SQLSTATE) as :class:`ReplicationFailed` naming
    ``what`` and the SQLSTATE alone: the message of ``CREATE SUBSCRIPTION``'s failed
    connection is libpq's, about a string that holds the password. A session lost (no
    SQLSTATE) is not replication's failure: raised as it is."""
    try:
        yield
    except psycopg.Error as exc:
        if exc.sqlstate is None:
            raise
        raise ReplicationFailed(f"{what} (SQLSTATE {exc.sqlstate})") from None


def _publish(here: Conn, schema: str, move_name: str, tables: list[str]) -> None:
    """The publication of the schema's tables by name, and the slot, on the source; neither
    waits longer than :data:`PUBLISH_TIMEOUT_MS` (see it)."""
    bound = str(PUBLISH_TIMEOUT_MS)
    here.execute(BOUNDED, {"ms": bound})
    try:
        here.execute(
            sql.SQL("CREATE PUBLICATION {} FOR TABLE {}").format(
                sql.Identifier(move_name),
                sql.SQL(", ").join(sql.Identifier(schema, t) for t in tables),
            )
        )
        # Made here, not by CREATE SUBSCRIPTION: it then works between two databases of one
        # cluster too (a subscription making its slot on its own cluster waits for itself).
        here.execute("SELECT pg_create_logical_replication_slot(%s, 'pgoutput')", (move_name,))
    finally:
        with suppress(psycopg.Error):  # a lost session: the caller meets that error
            here.execute(BOUNDED, {"ms": "0"})


#: How long the publication may wait for its tables' locks, and the slot for the transactions
#: that wrote on the source's cluster to end (every database's: an application idle in a
#: transaction after a write would hold it for ever). Past it the source refuses (SQLSTATE
#: 57014 or 55P03): replication failed, and ``auto`` falls back to the dump.
PUBLISH_TIMEOUT_MS = 60_000
# The session's statement and lock timeouts (in ms; 0: none), set around the publication.
BOUNDED = (
    "SELECT set_config('statement_timeout', %(ms)s, false), "
    "set_config('lock_timeout', %(ms)s, false)"
)


def _subscribe(there: Conn, move_name: str, conninfo: str) -> None:
    """The target's subscription to the publication through the slot made for it."""
    there.execute(
        sql.SQL(
            "CREATE SUBSCRIPTION {} CONNECTION {} PUBLICATION {} WITH (create_slot = false,"
            " slot_name = {}, copy_data = true, synchronous_commit = 'on')"
        ).format(
            sql.Identifier(move_name),
            sql.Literal(conninfo),
            sql.Identifier(move_name),
            sql.Literal(move_name),
        )
    )


# Tables of the subscription ready, tables whose copy began, and its workers' errors so far.
PROGRESS = """
SELECT s.oid,
       (SELECT count(*) FROM pg_subscription_rel r WHERE r.srsubid = s.oid AND r.srsubstate = 'r'),
       (SELECT coalesce(sum(apply_error_count + sync_error_count), 0)
          FROM pg_stat_subscription_stats t WHERE t.subid = s.oid),
       (SELECT count(*) FROM pg_subscription_rel r WHERE r.srsubid = s.oid AND r.srsubstate <> 'i')
  FROM pg_subscription s
 WHERE s.subname = %(name)s AND s.subdbid = (SELECT oid FROM pg_database
                                             WHERE datname = current_database())
"""


def _wait(there: Conn, move_name: str, tables: int, timeout: float, what: str) -> None:
    """Until every table of the subscription is ready; :class:`ReplicationFailed` at once on
    its workers' first error (the server's log says which), when no table's copy began within
    :data:`CONNECT_TIMEOUT_SECONDS`, or after ``timeout`` seconds."""
    began = time.monotonic()
    while True:
        row = _maybe(there, PROGRESS, {"name": move_name})
        if row is None:
            raise ReplicationFailed(f"the subscription vanished while waiting for {what}")
        if row[2]:
            errors = f"{row[2]} errors" if row[2] > 1 else "an error"
            raise ReplicationFailed(
                f"the subscription's workers reported {errors} (see the target's server log)"
            )
        if row[1] >= tables:
            return
        waited = time.monotonic() - began
        if not row[3] and waited > min(timeout, CONNECT_TIMEOUT_SECONDS):
            raise ReplicationFailed(
                f"no table's copy began within {waited:.0f} s (does the target's server "
                "reach the source?)"
            )
        if waited > timeout:
            raise ReplicationFailed(f"{what} did not arrive within {timeout:g} s")
        time.sleep(POLL_SECONDS)


CONFIRMED = """
SELECT confirmed_flush_lsn >= %(lsn)s::pg_lsn FROM pg_replication_slots WHERE slot_name = %(name)s
"""


def catch_up(here: Conn, there: Conn, started: Started) -> float:
    """In the freeze, on owner sessions of the source (``here``) and the target (``there``):
    wait until the subscription has applied everything the source wrote before now; its
    milliseconds, or :class:`ReplicationFailed` (its workers' errors looked at on each turn:
    a worker that fails on a row retries it for ever, and would only meet the time limit)."""
    began = time.perf_counter()
    lsn = _freeze_position(here)
    _wait(there, started.name, started.tables, CATCH_UP_TIMEOUT_SECONDS, "the last rows")
    deadline = time.monotonic() + CATCH_UP_TIMEOUT_SECONDS
    while True:
        done = _maybe(here, CONFIRMED, {"lsn": lsn[0], "name": started.name})
        if done is None:
            raise ReplicationFailed("the replication slot vanished on the source")
        if done[0]:
            return (time.perf_counter() - began) * 1000
        if time.monotonic() > deadline:
            raise ReplicationFailed(
                f"the subscription did not catch up within {CATCH_UP_TIMEOUT_SECONDS:g} s"
            )
        _wait(there, started.name, 0, CATCH_UP_TIMEOUT_SECONDS, "the last rows")  # errors
        time.sleep(POLL_SECONDS)


def _freeze_position(here: Conn) -> tuple[Any, ...]:
    """A WAL position on the source past the commit of every write made before the freeze,
    and flushed there (the WAL sender sends nothing beyond the flushed position).

    An application's commit with ``synchronous_commit = off`` returns before its WAL is
    written: ``pg_current_wal_lsn()`` (the written position) could stand before it, and the
    catch-up end with its rows missing (the verification then failed the move). So this
    session writes a transaction of its own and commits it waiting for the disk, whatever the
    server's default: that flushes the WAL of every commit before it, and the flushed position
    read after it is past them all. What it writes is a logical decoding message (no table's
    row; not sent to a subscription, which does not ask for messages): a transaction that
    wrote no WAL would commit without waiting."""
    with here.transaction():
        here.execute(FLUSHED_COMMIT)
    return _one(here, "SELECT pg_current_wal_flush_lsn()::text")


# A transaction's only write and its commit's durability (see :func:`_freeze_position`).
FLUSHED_COMMIT = (
    "SELECT set_config('synchronous_commit', 'on', true),"
    " pg_logical_emit_message(true, 'provisioner', 'move: the freeze''s position')"
)


def unsubscribe(source: End, target: End, started: Started) -> Future[float]:
    """Once caught up (the source frozen: nothing more comes), drop the subscription (its
    workers stopped, its slot dropped on the source: about 0.1 s) and the publication, on
    sessions of their own in a thread, while the rest of the freeze goes on; the future gives
    its milliseconds, or the failure (the caller waits for it before the switch)."""

    def drop() -> float:
        began = time.perf_counter()
        with move_copy.connect(target) as there:
            there.execute(sql.SQL("DROP SUBSCRIPTION {}").format(sql.Identifier(started.name)))
        with move_copy.connect(source) as here:
            here.execute(sql.SQL("DROP PUBLICATION {}").format(sql.Identifier(started.name)))
        return (time.perf_counter() - began) * 1000

    pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="move-unsubscribe")
    try:
        return pool.submit(drop)
    finally:
        pool.shutdown(wait=False)


SUBSCRIPTION = """
SELECT oid FROM pg_subscription
 WHERE subname = %(name)s
   AND subdbid = (SELECT oid FROM pg_database WHERE datname = current_database())
"""

# The move's slots on the source: its own, and the table synchronisations' of its subscription
# (``pg_<subscription oid>_sync_...``), left only when the subscription could not drop them.
SLOTS = """
SELECT slot_name, active_pid FROM pg_replication_slots
 WHERE database = current_database()
   AND (slot_name = %(name)s OR slot_name LIKE %(sync)s)
"""


def cleanup(source: End, target: End, move_name: str) -> list[str]:
    """Drop what the move made for logical replication, wherever it is left: the subscription
    on the target, the slots and the publication on the source. Returns what it dropped."""
    dropped: list[str] = []
    sync = "pg\\_0\\_sync\\_%"
    with move_copy.connect(target) as there:
        row = _maybe(there, SUBSCRIPTION, {"name": move_name})
        if row is not None:
            sync = f"pg\\_{row[0]}\\_sync\\_%"
            _drop_subscription(there, move_name)
            dropped.append("subscription")
    with move_copy.connect(source) as here:
        dropped += _drop_slots(here, move_name, sync)
        found = _maybe(here, "SELECT 1 FROM pg_publication WHERE pubname = %(n)s", {"n": move_name})
        if found is not None:
            here.execute(sql.SQL("DROP PUBLICATION {}").format(sql.Identifier(move_name)))
            dropped.append("publication")
    return dropped


def _drop_subscription(there: Conn, move_name: str) -> None:
    """``DROP SUBSCRIPTION`` (which drops its slots on the source); when the source cannot be
    reached, the subscription is detached from its slot first (the slot is dropped apart)."""
    ident = sql.Identifier(move_name)
    try:
        there.execute(sql.SQL("DROP SUBSCRIPTION {}").format(ident))
    except psycopg.OperationalError:
        there.execute(sql.SQL("ALTER SUBSCRIPTION {} DISABLE").format(ident))
        there.execute(sql.SQL("ALTER SUBSCRIPTION {} SET (slot_name = NONE)").format(ident))
        there.execute(sql.SQL("DROP SUBSCRIPTION {}").format(ident))


def _drop_slots(here: Conn, move_name: str, sync: str) -> list[str]:
    """Drop the move's slots on the source, waiting (a few seconds at most) for a walsender
    still serving one to leave."""
    dropped: list[str] = []
    deadline = time.monotonic() + 10.0
    while True:
        with here.cursor(row_factory=tuple_row) as cur:
            cur.execute(SLOTS, {"name": move_name, "sync": sync})
            slots = cur.fetchall()
        for slot, active in slots:
            if active is None:
                here.execute("SELECT pg_drop_replication_slot(%s)", (slot,))
                dropped.append("slot")
        if all(active is None for _, active in slots) or time.monotonic() > deadline:
            return dropped
        time.sleep(0.05)


def _maybe(conn: Conn, query: str, params: dict[str, Any] | None = None) -> tuple[Any, ...] | None:
    with conn.cursor(row_factory=tuple_row) as cur:
        cur.execute(query, params)
        return cur.fetchone()


def _one(conn: Conn, query: str, params: dict[str, Any] | None = None) -> tuple[Any, ...]:
    row = _maybe(conn, query, params)
    assert row is not None, "the query returns one row"
    return row
