"""Lifecycle DDL/DCL of one tenant schema, its seed rows, and the catalog checks behind resumes.

Tables themselves are created only by the ``tenant_template`` Alembic tree; this module creates
the schema, grants, seeds, and reads the catalog. Every identifier goes through
``psycopg.sql.Identifier``.
"""

from __future__ import annotations

from typing import Any

import psycopg
from psycopg import sql
from psycopg.rows import dict_row, tuple_row
from psycopg.types.json import Jsonb

from provisioner.errors import GrantVerificationFailed, PermanentError

Conn = psycopg.Connection[Any]

TABLE_PRIVILEGES = ("SELECT", "INSERT", "UPDATE", "DELETE")
SEQUENCE_PRIVILEGES = ("USAGE", "SELECT")

#: Role profiles every tenant starts with, keyed by ``role_profiles.key``.
DEFAULT_ROLE_PROFILES: tuple[dict[str, Any], ...] = (
    {"key": "owner", "name": "Owner", "permissions": ["*"], "is_default": False},
    {
        "key": "admin",
        "name": "Administrator",
        "permissions": ["members:manage", "datasets:write", "datasets:read", "audit:read"],
        "is_default": False,
    },
    {
        "key": "analyst",
        "name": "Analyst",
        "permissions": ["datasets:write", "datasets:read"],
        "is_default": True,
    },
    {"key": "viewer", "name": "Viewer", "permissions": ["datasets:read"], "is_default": False},
)

# -- statements ---------------------------------------------------------------------------------

SCHEMA_OWNER = """
SELECT pg_get_userbyid(nspowner) AS owner FROM pg_namespace WHERE nspname = %(schema)s
"""

# Tables and sequences of one schema, by name, for named grants and checks.
RELATIONS = """
SELECT c.relname, c.relkind FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
 WHERE n.nspname = %(schema)s AND c.relkind IN ('r', 'p', 'S') ORDER BY c.relname
"""

# Tables of the schema on which the role lacks any of the DML privileges.
MISSING_TABLE_PRIVILEGES = """
SELECT c.relname, p.privilege FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
 CROSS JOIN unnest(%(privileges)s::text[]) AS p(privilege)
 WHERE n.nspname = %(schema)s AND c.relkind IN ('r', 'p')
   AND NOT has_table_privilege(%(role)s, c.oid, p.privilege)
 ORDER BY 1, 2
"""

SCHEMA_PRIVILEGES = """
SELECT has_schema_privilege(%(role)s, %(schema)s, 'USAGE') AS usage,
       has_schema_privilege(%(role)s, %(schema)s, 'CREATE') AS can_create
"""

SEED_ROLE_PROFILE = """
INSERT INTO {schema}.role_profiles (key, name, permissions, is_default)
VALUES (%(key)s, %(name)s, %(permissions)s, %(is_default)s)
ON CONFLICT (key) DO NOTHING
"""

SEEDED_KEYS = "SELECT key FROM {schema}.role_profiles WHERE key = ANY(%(keys)s)"

# -- operations ---------------------------------------------------------------------------------


def schema_owner(conn: Conn, schema: str) -> str | None:
    with conn.cursor(row_factory=dict_row) as cur:
        cur.execute(SCHEMA_OWNER, {"schema": schema})
        row = cur.fetchone()
    return None if row is None else str(row["owner"])


def current_role(conn: Conn) -> str:
    with conn.cursor(row_factory=tuple_row) as cur:
        cur.execute("SELECT current_user")
        row = cur.fetchone()
    assert row is not None
    return str(row[0])


def create_schema(conn: Conn, schema: str) -> None:
    """``CREATE SCHEMA IF NOT EXISTS`` owned by the connected (owner) role."""
    with conn.cursor() as cur:
        cur.execute(
            sql.SQL("CREATE SCHEMA IF NOT EXISTS {} AUTHORIZATION CURRENT_USER").format(
                sql.Identifier(schema)
            )
        )
    owner, me = schema_owner(conn, schema), current_role(conn)
    if owner != me:
        raise PermanentError(
            f"schema {schema} already exists and is owned by role {owner}, not {me}; "
            f"drop it or ALTER SCHEMA {schema} OWNER TO {me}"
        )


def schema_ready(conn: Conn, schema: str) -> bool:
    owner = schema_owner(conn, schema)
    return owner is not None and owner == current_role(conn)


def relations(conn: Conn, schema: str) -> tuple[list[str], list[str]]:
    """(tables, sequences) of the schema, by name."""
    with conn.cursor(row_factory=tuple_row) as cur:
        cur.execute(RELATIONS, {"schema": schema})
        rows = cur.fetchall()
    tables = [name for name, kind in rows if kind in ("r", "p")]
    sequences = [name for name, kind in rows if kind == "S"]
    return tables, sequences


def grant_app_role(conn: Conn, schema: str, app_role: str) -> None:
    """USAGE on the schema, DML on its tables, USAGE/SELECT on its sequences, and default
    privileges so tables a later migration creates are covered too. Never CREATE.

    Grants name each table rather than ``ON ALL TABLES IN SCHEMA``, whose cost grows with the
    number of tables in the whole database.
    """
    schema_id, role_id = sql.Identifier(schema), sql.Identifier(app_role)
    tables, sequences = relations(conn, schema)
    statements = [
        sql.SQL("GRANT USAGE ON SCHEMA {} TO {}").format(schema_id, role_id),
        sql.SQL("REVOKE CREATE ON SCHEMA {} FROM {}").format(schema_id, role_id),
        sql.SQL(
            "ALTER DEFAULT PRIVILEGES FOR ROLE CURRENT_USER IN SCHEMA {} "
            "GRANT SELECT, INSERT, UPDATE, DELETE ON TABLES TO {}"
        ).format(schema_id, role_id),
        sql.SQL(
            "ALTER DEFAULT PRIVILEGES FOR ROLE CURRENT_USER IN SCHEMA {} "
            "GRANT USAGE, SELECT ON SEQUENCES TO {}"
        ).format(schema_id, role_id),
    ]
    if tables:
        statements.append(
            sql.SQL("GRANT SELECT, INSERT, UPDATE, DELETE ON TABLE {} TO {}").format(
                sql.SQL(", ").join(sql.Identifier(schema, t) for t in tables), role_id
            )
        )
    if sequences:
        statements.append(
            sql.SQL("GRANT USAGE, SELECT ON SEQUENCE {} TO {}").format(
                sql.SQL(", ").join(sql.Identifier(schema, s) for s in sequences), role_id
            )
        )
    with conn.cursor() as cur:
        for statement in statements:
            cur.execute(statement)
    verify_app_grants(conn, schema, app_role)


def missing_app_grants(conn: Conn, schema: str, app_role: str) -> list[str]:
    """What the application role lacks in the schema, e.g. ``['members: DELETE']``."""
    if schema_owner(conn, schema) is None:
        return [f"schema {schema}: does not exist"]
    with conn.cursor(row_factory=dict_row) as cur:
        cur.execute(SCHEMA_PRIVILEGES, {"role": app_role, "schema": schema})
        schema_row = cur.fetchone()
        cur.execute(
            MISSING_TABLE_PRIVILEGES,
            {"role": app_role, "schema": schema, "privileges": list(TABLE_PRIVILEGES)},
        )
        missing = [f"{row['relname']}: {row['privilege']}" for row in cur.fetchall()]
    assert schema_row is not None
    if not schema_row["usage"]:
        missing.insert(0, f"schema {schema}: USAGE")
    if schema_row["can_create"]:
        missing.insert(0, f"schema {schema}: CREATE must NOT be held")
    return missing


def verify_app_grants(conn: Conn, schema: str, app_role: str) -> None:
    missing = missing_app_grants(conn, schema, app_role)
    if missing:
        raise GrantVerificationFailed(
            f"{app_role} lacks privileges in {schema} after granting: {'; '.join(missing[:10])}"
        )


def seed_role_profiles(conn: Conn, schema: str) -> None:
    statement = sql.SQL(SEED_ROLE_PROFILE).format(schema=sql.Identifier(schema))
    with conn.cursor() as cur:
        cur.executemany(
            statement,
            [
                {**profile, "permissions": Jsonb(profile["permissions"])}
                for profile in DEFAULT_ROLE_PROFILES
            ],
        )


def role_profiles_seeded(conn: Conn, schema: str) -> bool:
    tables, _ = relations(conn, schema)
    if "role_profiles" not in tables:
        return False
    keys = [profile["key"] for profile in DEFAULT_ROLE_PROFILES]
    with conn.cursor(row_factory=tuple_row) as cur:
        cur.execute(sql.SQL(SEEDED_KEYS).format(schema=sql.Identifier(schema)), {"keys": keys})
        return {row[0] for row in cur.fetchall()} == set(keys)


# -- catalog fingerprint --------------------------------------------------------------------------

FINGERPRINT_QUERIES: dict[str, str] = {
    "relations": """
        SELECT c.relname, c.relkind::text, coalesce(c.relacl::text, '') FROM pg_class c
          JOIN pg_namespace n ON n.oid = c.relnamespace
         WHERE n.nspname = %(schema)s AND c.relkind IN ('r', 'p', 'S', 'v', 'm', 'i')
         ORDER BY 1""",
    "columns": """
        SELECT c.relname, a.attname, format_type(a.atttypid, a.atttypmod), a.attnotnull,
               coalesce(pg_get_expr(d.adbin, d.adrelid), ''), a.attidentity::text
          FROM pg_attribute a JOIN pg_class c ON c.oid = a.attrelid
          JOIN pg_namespace n ON n.oid = c.relnamespace
          LEFT JOIN pg_attrdef d ON d.adrelid = a.attrelid AND d.adnum = a.attnum
         WHERE n.nspname = %(schema)s AND c.relkind IN ('r', 'p') AND a.attnum > 0
           AND NOT a.attisdropped
         ORDER BY 1, a.attnum""",
    "indexes": """
        SELECT indexname, indexdef FROM pg_indexes WHERE schemaname = %(schema)s ORDER BY 1""",
    "constraints": """
        SELECT c.relname, k.conname, pg_get_constraintdef(k.oid) FROM pg_constraint k
          JOIN pg_class c ON c.oid = k.conrelid JOIN pg_namespace n ON n.oid = k.connamespace
         WHERE n.nspname = %(schema)s ORDER BY 1, 2""",
    "schema": """
        SELECT pg_get_userbyid(nspowner), coalesce(nspacl::text, '') FROM pg_namespace
         WHERE nspname = %(schema)s""",
    "default_privileges": """
        SELECT pg_get_userbyid(d.defaclrole), d.defaclobjtype::text, d.defaclacl::text
          FROM pg_default_acl d JOIN pg_namespace n ON n.oid = d.defaclnamespace
         WHERE n.nspname = %(schema)s ORDER BY 1, 2""",
}


def fingerprint(conn: Conn, schema: str) -> dict[str, list[tuple[Any, ...]]]:
    """The schema's shape, with its own name abstracted: tables, columns, indexes,
    constraints, grants, default privileges and alembic version. Two tenants built the same way
    have equal fingerprints."""
    out: dict[str, list[tuple[Any, ...]]] = {}
    with conn.cursor(row_factory=tuple_row) as cur:
        for name, query in FINGERPRINT_QUERIES.items():
            cur.execute(query, {"schema": schema})
            out[name] = [
                tuple(v.replace(f"{schema}.", "<tenant>.") if isinstance(v, str) else v
                      for v in row)
                for row in cur.fetchall()
            ]
    tables = {row[0] for row in out["relations"]}
    if "alembic_version" in tables:
        with conn.cursor(row_factory=tuple_row) as cur:
            cur.execute(
                sql.SQL("SELECT version_num FROM {}.alembic_version").format(sql.Identifier(schema))
            )
            out["alembic_version"] = sorted(cur.fetchall())
    else:
        out["alembic_version"] = []
    return out
