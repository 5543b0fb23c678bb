"""A move's copy in two parts, so that the writes' freeze holds the rows alone (issue 29's 2-s
goal).

Restoring a schema's DDL is most of a ``pg_dump | pg_restore`` of a tenant: for a 10,000-row
tenant of the default template, the tables, sequences, keys and indexes take about 80% of the
restore, the rows the rest. None of that DDL changes while the application writes (only the
owner's migrations change it, and the verification compares every catalog object after the
copy), so it is restored before the freeze:

* :func:`precopy` (step ``precopy_schema``, the application still writing):
  ``pg_dump --schema-only`` of the source restored on the target in one transaction, all but
  the entries that must follow the rows (:data:`AFTER_ROWS`: foreign keys, triggers, rules,
  row security and its policies, ``NOT VALID`` checks, materialized views' data), as a full
  restore orders them; then the application roles' privileges that came with it taken away
  there (committed). The entries kept for later are kept as the SQL ``pg_restore`` writes for
  them. The copy is routed nowhere until the switch; a write that slipped onto it meanwhile
  would show in the verification's row counts.
* :func:`copy_rows` (step ``copy_schema``, in the freeze): in one transaction on the target,
  each table's rows streamed by ``COPY`` from the source's (one repeatable-read transaction
  there), each sequence's value set, then the SQL kept for after the rows. No child process
  and no catalog scan of the whole database (``pg_dump``'s start, some 60% of a data-only
  ``pg_dump | pg_restore`` of a 10,000-row tenant) stays in the freeze; one commit.

Only the run that pre-copied may finish the copy so: a run resumed after a crash or a failed
step does not trust a half-made target, drops it and copies the whole schema in the freeze
(:func:`provisioner.kinds.move_copy.copy_schema`).
"""

from __future__ import annotations

import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

from psycopg import sql
from psycopg.rows import tuple_row

from provisioner.kinds import move_copy
from provisioner.roles import AppRoles
from provisioner.servers.moves import End
from provisioner.tenant import schema as tenant_schema

#: The archive's entry types a full restore creates after the rows (its post-data section,
#: less the keys and indexes, which the copy of the rows keeps up as it goes). A trigger made
#: before the rows would fire on them; a foreign key would need the tables in its order.
AFTER_ROWS = (
    "FK CONSTRAINT",
    "CHECK CONSTRAINT",
    "TRIGGER",
    "RULE",
    "POLICY",
    "ROW SECURITY",
    "MATERIALIZED VIEW DATA",
)


# The schema's tables that hold rows (partitions too, not their partitioned parents), each with
# its columns as COPY takes them (no dropped or generated one; NULL: none), in their order.
ROW_TABLES = """
SELECT c.relname,
       array_agg(a.attname::text ORDER BY a.attnum) FILTER (WHERE a.attname IS NOT NULL)
  FROM pg_class c
  JOIN pg_namespace n ON n.oid = c.relnamespace
  LEFT JOIN pg_attribute a
    ON a.attrelid = c.oid AND a.attnum > 0 AND NOT a.attisdropped AND a.attgenerated = ''
 WHERE n.nspname = %(schema)s AND c.relkind = 'r'
 GROUP BY c.relname
 ORDER BY c.relname
"""

SEQUENCES = """
SELECT c.relname FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
 WHERE n.nspname = %(schema)s AND c.relkind = 'S'
 ORDER BY c.relname
"""

# Both ends read and write COPY's text as pg_dump does: whatever each server's defaults, a date
# or an interval reads back as it was written, a float exactly; and rows the owner would not
# see under forced row security make the copy fail rather than go missing.
TEXT_SETTINGS = """
SELECT set_config('datestyle', 'ISO', true), set_config('intervalstyle', 'postgres', true),
       set_config('extra_float_digits', '3', true), set_config('row_security', 'off', true)
"""

#: psql's meta-commands ``pg_restore`` writes around a script (``\restrict KEY``, since the
#: 2025 minor releases): not SQL, dropped from the SQL kept for after the rows.
_META = ("\\restrict", "\\unrestrict")


@dataclass(frozen=True)
class PreCopy:
    """What the pre-copy restored (entries of the schema-only dump) and the SQL kept for after
    the rows (``pg_restore``'s script of :data:`AFTER_ROWS`); with the time each part took."""

    entries: int
    after_rows: int
    after_sql: str = field(repr=False)
    dump_ms: float
    restore_ms: float


@dataclass(frozen=True)
class RowsCopied:
    """The frozen part: tables and rows copied; the milliseconds of the rows (with the
    sequences' values), then of the DDL after them and the commit."""

    tables: int
    rows: int
    rows_ms: float
    after_ms: float


def entry_type(line: str) -> str:
    """An archive listing line's type (``3549; 0 0 SEQUENCE SET schema name owner``): the
    words after the two object ids; "" for a comment or a blank line."""
    if not line.strip() or line.startswith(";") or ";" not in line:
        return ""
    words = line.split(";", 1)[1].split()[2:]
    return " ".join(words)


def after_rows(line: str) -> bool:
    kind = entry_type(line)
    return any(kind.startswith(name + " ") for name in AFTER_ROWS)


def precopy(source: End, target: End, schema: str, roles: AppRoles) -> PreCopy:
    """Restore the schema's DDL on the target but for :data:`AFTER_ROWS`, and take the
    application roles' privileges away there; the SQL of the rest kept for
    :func:`copy_rows`."""
    bin_dir = move_copy.bin_dir_for(source)
    began = time.perf_counter()
    with (
        tempfile.TemporaryDirectory(prefix="provisioner-move-") as folder,
        move_copy.Passwords() as passwords,
    ):
        base = Path(folder)
        archive = move_copy.run(
            move_copy.command(
                bin_dir,
                "pg_dump",
                passwords.address(source),
                "--format=custom",
                "--schema-only",
                f"--schema={move_copy.pattern(schema)}",
            ),
            fds=passwords.fds,
        )
        dumped = time.perf_counter()
        restore = str(bin_dir / "pg_restore")
        listing = move_copy.run([restore, "--list"], archive).decode()
        lines = [line for line in listing.splitlines() if entry_type(line)]
        later = [line for line in lines if after_rows(line)]
        first = base / "first.list"
        first.write_text("\n".join(line for line in lines if not after_rows(line)) + "\n")
        move_copy.run(
            move_copy.command(
                bin_dir,
                "pg_restore",
                passwords.address(target),
                "--single-transaction",
                "--exit-on-error",
                "--no-owner",
                f"--use-list={first}",
            ),
            archive,
            passwords.fds,
        )
        after_sql = ""
        if later:
            chosen = base / "after.list"
            chosen.write_text("\n".join(later) + "\n")
            script = move_copy.run(
                [restore, "--no-owner", f"--use-list={chosen}", "--file=-"], archive
            ).decode()
            after_sql = "\n".join(
                line for line in script.splitlines() if not line.startswith(_META)
            )
    with move_copy.connect(target) as conn, conn.transaction():
        tenant_schema.revoke_app_roles(conn, schema, roles)
    return PreCopy(
        len(lines),
        len(later),
        after_sql,
        (dumped - began) * 1000,
        (time.perf_counter() - dumped) * 1000,
    )


def copy_rows(source: End, target: End, schema: str, pre: PreCopy) -> RowsCopied:
    """In one transaction on the pre-copied target: every table's rows and every sequence's
    value as one repeatable-read transaction of the source reads them, then the SQL kept for
    after the rows."""
    began = time.perf_counter()
    with (
        move_copy.connect(source) as here,
        move_copy.connect(target) as there,
        here.transaction(),
        there.transaction(),
    ):
        here.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ READ ONLY")
        for conn in (here, there):
            conn.execute(TEXT_SETTINGS)
        tables, rows = _copy_tables(here, there, schema)
        _copy_sequences(here, there, schema)
        copied = time.perf_counter()
        if pre.after_sql:
            with there.cursor() as cur:
                cur.execute(pre.after_sql.encode())  # no parameters: one simple query
    return RowsCopied(tables, rows, (copied - began) * 1000, (time.perf_counter() - copied) * 1000)


def after_replication(
    here: move_copy.Conn, there: move_copy.Conn, schema: str, pre: PreCopy
) -> float:
    """In one transaction on a target (``there``) whose rows came by logical replication
    (which carries no sequence): each sequence's value as the frozen source (``here``) has it,
    then the SQL kept for after the rows; its milliseconds."""
    began = time.perf_counter()
    with here.transaction(), there.transaction():
        _copy_sequences(here, there, schema)
        if pre.after_sql:
            with there.cursor() as cur:
                cur.execute(pre.after_sql.encode())  # no parameters: one simple query
    return (time.perf_counter() - began) * 1000


def _copy_tables(here: move_copy.Conn, there: move_copy.Conn, schema: str) -> tuple[int, int]:
    """Each table's rows from ``here`` to ``there`` by ``COPY`` (text, as ``pg_dump``);
    returns the tables and the rows copied."""
    with here.cursor(row_factory=tuple_row) as cur:
        cur.execute(ROW_TABLES, {"schema": schema})
        tables = cur.fetchall()
    total = 0
    for name, columns in tables:
        target: sql.Composable = sql.Identifier(schema, name)
        if columns:
            target = sql.SQL("{} ({})").format(
                target, sql.SQL(", ").join(sql.Identifier(c) for c in columns)
            )
        with (
            here.cursor() as out_cur,
            there.cursor() as in_cur,
            out_cur.copy(sql.SQL("COPY {} TO STDOUT").format(target)) as out,
            in_cur.copy(sql.SQL("COPY {} FROM STDIN").format(target)) as into,
        ):
            for chunk in out:
                into.write(chunk)
        total += max(0, in_cur.rowcount)
    return len(tables), total


def _copy_sequences(here: move_copy.Conn, there: move_copy.Conn, schema: str) -> None:
    """Each sequence's ``(last_value, is_called)`` set on ``there`` as ``here`` has it."""
    with here.cursor(row_factory=tuple_row) as cur:
        cur.execute(SEQUENCES, {"schema": schema})
        names = [str(row[0]) for row in cur.fetchall()]
        if not names:
            return
        cur.execute(
            sql.SQL(" UNION ALL ").join(
                sql.SQL("SELECT {}, last_value, is_called FROM {}").format(
                    sql.Literal(n), sql.Identifier(schema, n)
                )
                for n in names
            )
        )
        values = cur.fetchall()
    with there.cursor() as cur:
        cur.execute(
            sql.SQL("SELECT {}").format(
                sql.SQL(", ").join(
                    sql.SQL("pg_catalog.setval({}::regclass, {}, {})").format(
                        sql.Literal(sql.Identifier(schema, n).as_string(there)),
                        sql.Literal(last),
                        sql.Literal(called),
                    )
                    for n, last, called in values
                )
            )
        )
