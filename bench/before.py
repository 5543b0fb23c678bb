"""The catalog code as it was before the fast-path work (commit 3a2fc5e), kept here only so a
benchmark run can measure, in the same run, what replacing it bought. Not used by the package.

* the fingerprint: six queries joining ``pg_class.relnamespace`` (or ``pg_indexes``) by schema
  name, one round trip each;
* the grant step: the relations by the same kind of join, one round trip per statement (the
  statements themselves are the package's own, unchanged since), then a three-query check;
* who is behind (commit bb5fdf6): the versions read by ``UNION ALL`` queries of 100 tables
  over two sessions, after one catalog lookup (:func:`union_read_versions`).
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from contextlib import closing
from typing import Any

import psycopg
from psycopg import sql
from psycopg.rows import tuple_row

from provisioner import db, fleet
from provisioner.roles import AppRole
from provisioner.tenant import schema as tenant_schema

FINGERPRINT_QUERIES = (
    """SELECT c.relname, c.relkind::text, coalesce(c.relacl::text, '') FROM pg_class c
         JOIN pg_namespace n ON n.oid = c.relnamespace
        WHERE n.nspname = %(schema)s AND c.relkind IN ('r', 'p', 'S', 'v', 'm', 'i') ORDER BY 1""",
    """SELECT c.relname, a.attname, format_type(a.atttypid, a.atttypmod), a.attnotnull,
              coalesce(pg_get_expr(d.adbin, d.adrelid), ''), a.attidentity::text
         FROM pg_attribute a JOIN pg_class c ON c.oid = a.attrelid
         JOIN pg_namespace n ON n.oid = c.relnamespace
         LEFT JOIN pg_attrdef d ON d.adrelid = a.attrelid AND d.adnum = a.attnum
        WHERE n.nspname = %(schema)s AND c.relkind IN ('r', 'p') AND a.attnum > 0
          AND NOT a.attisdropped ORDER BY 1, a.attnum""",
    "SELECT indexname, indexdef FROM pg_indexes WHERE schemaname = %(schema)s ORDER BY 1",
    """SELECT c.relname, k.conname, pg_get_constraintdef(k.oid) FROM pg_constraint k
         JOIN pg_class c ON c.oid = k.conrelid JOIN pg_namespace n ON n.oid = k.connamespace
        WHERE n.nspname = %(schema)s ORDER BY 1, 2""",
    """SELECT pg_get_userbyid(nspowner), coalesce(nspacl::text, '') FROM pg_namespace
        WHERE nspname = %(schema)s""",
    """SELECT pg_get_userbyid(d.defaclrole), d.defaclobjtype::text, d.defaclacl::text
         FROM pg_default_acl d JOIN pg_namespace n ON n.oid = d.defaclnamespace
        WHERE n.nspname = %(schema)s ORDER BY 1, 2""",
)

RELATIONS = """
SELECT c.relname, c.relkind FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
 WHERE n.nspname = %(schema)s AND c.relkind IN ('r', 'p', 'S') ORDER BY c.relname
"""

SCHEMA_OWNER = "SELECT pg_get_userbyid(nspowner) FROM pg_namespace WHERE nspname = %(schema)s"

SCHEMA_PRIVILEGES = """
SELECT has_schema_privilege(%(role)s, %(schema)s, 'USAGE'),
       has_schema_privilege(%(role)s, %(schema)s, 'CREATE')
"""

MISSING_TABLE_PRIVILEGES = """
SELECT c.relname, p.privilege FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
 CROSS JOIN unnest(%(privileges)s::text[]) AS p(privilege)
 WHERE n.nspname = %(schema)s AND c.relkind IN ('r', 'p')
   AND c.relname <> 'alembic_version'  -- read-only for the application role (as the step's)
   AND NOT has_table_privilege(%(role)s, c.oid, p.privilege)
 ORDER BY 1, 2
"""


def fingerprint(conn: psycopg.Connection[Any], schema: str) -> None:
    for query in FINGERPRINT_QUERIES:
        conn.execute(query, {"schema": schema}).fetchall()


def grant_app_role(conn: psycopg.Connection[Any], schema: str, role: str) -> None:
    rows = conn.execute(RELATIONS, {"schema": schema}).fetchall()
    tables = [name for name, kind in rows if kind in ("r", "p")]
    sequences = [name for name, kind in rows if kind == "S"]
    # The statements themselves are unchanged; how they are sent (one trip each) is the former way.
    statements = tenant_schema.grant_statements(schema, AppRole(role), tables, sequences)
    for statement in statements:
        conn.execute(sql.Composed([statement]))
    params = {
        "schema": schema,
        "role": role,
        "privileges": ["SELECT", "INSERT", "UPDATE", "DELETE"],
    }
    conn.execute(SCHEMA_OWNER, params).fetchone()
    conn.execute(SCHEMA_PRIVILEGES, params).fetchone()
    missing = conn.execute(MISSING_TABLE_PRIVILEGES, params).fetchall()
    assert not missing, missing


UNION_CHUNK = 100
UNION_SESSIONS = 2


def _union_chunks(
    conn: psycopg.Connection[Any], tables: list[fleet.VersionTable]
) -> dict[str, frozenset[str]]:
    found: dict[str, set[str]] = {table.schema: set() for table in tables}
    schema_of = {table.oid: table.schema for table in tables}
    for start in range(0, len(tables), UNION_CHUNK):
        query = b" UNION ALL ".join(
            b"SELECT tableoid::int8, version_num::text FROM "
            + sql.Identifier(table.schema, "alembic_version").as_bytes(conn)
            for table in tables[start : start + UNION_CHUNK]
        )
        with conn.cursor(row_factory=tuple_row) as cur:
            cur.execute(query)
            for oid, version in cur.fetchall():
                found[schema_of[oid]].add(version)
    return {schema: frozenset(versions) for schema, versions in found.items()}


def union_read_versions(url: str, schemas: list[str] | None) -> dict[str, frozenset[str]]:
    """``fleet.read_versions`` as it was: one lookup, then ``UNION ALL`` chunks, 2 sessions."""
    with closing(db.connect(url, autocommit=True)) as conn:
        versioned = fleet.versioned(conn, schemas)

    def part(share: list[fleet.VersionTable]) -> dict[str, frozenset[str]]:
        conn = db.connect(url, autocommit=True)
        with closing(conn):
            conn.execute("SET lock_timeout = '5s'")  # as it was: for the session (direct)
            return _union_chunks(conn, share)

    size = max(1, -(-len(versioned) // UNION_SESSIONS))
    found: dict[str, frozenset[str]] = {}
    shares = [versioned[i : i + size] for i in range(0, len(versioned), size)]
    with ThreadPoolExecutor(UNION_SESSIONS) as pool:
        for result in pool.map(part, shares):
            found.update(result)
    return found
