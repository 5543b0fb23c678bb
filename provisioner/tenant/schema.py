"""Lifecycle DDL/DCL of one tenant schema, its seed rows, and the catalog checks behind resumes.

Tables themselves are created only by the ``tenant_template`` Alembic tree; this module creates
the schema, grants, seeds, and reads the catalog. Every identifier goes through
``psycopg.sql.Identifier``.

Catalog reads stay flat as the database grows to thousands of tenant schemas: ``pg_class`` has
no index on ``relnamespace``, so a query that joins it to ``pg_namespace`` by schema name scans
every relation of every tenant. The schema's relations are found instead through ``pg_depend``
(indexed by the referenced object: every table, sequence and view records a dependency on its
schema), and their indexes, columns and constraints through indexes on the relation's oid.
"""

from __future__ import annotations

from typing import Any

import psycopg
from psycopg import sql
from psycopg.rows import dict_row, tuple_row

from provisioner.db.plans import keeping_prepared_statements
from provisioner.errors import GrantVerificationFailed, PermanentError
from provisioner.roles import AppRole, AppRoles
from provisioner.tenant import app_role as app_role_standing

Conn = psycopg.Connection[Any]

#: A readwrite role's privileges on each table (:class:`provisioner.roles.Privileges`).
TABLE_PRIVILEGES = ("SELECT", "INSERT", "UPDATE", "DELETE")

#: Alembic's version table in each tenant schema. The application role may read it, never
#: write it: the owner side trusts it to say which revisions a tenant has (``upgrade --all``
#: skips a tenant it says is at the head; a repair runs what it says is missing).
VERSION_TABLE = "alembic_version"
#: What the application role must not hold on the version table.
VERSION_TABLE_WRITES = ("INSERT", "UPDATE", "DELETE", "TRUNCATE", "REFERENCES", "TRIGGER")

# -- statements ---------------------------------------------------------------------------------

# The schema's owner (NULL when there is no such schema) and the connected role, in one trip.
SCHEMA_OWNER = """
SELECT (SELECT pg_get_userbyid(nspowner) FROM pg_namespace WHERE nspname = %(schema)s) AS owner,
       current_user AS me
"""

# The relations (tables, sequences, views) of one schema, through the schema's pg_depend
# entries: an index lookup, where a join on pg_class.relnamespace scans every relation.
SCHEMA_RELATIONS_CTE = """
WITH rels AS (
    SELECT c.oid, c.relname, c.relkind, c.relacl, c.relowner, n.oid AS nsp
      FROM pg_namespace n
      JOIN pg_depend d ON d.refclassid = 'pg_namespace'::regclass AND d.refobjid = n.oid
                      AND d.classid = 'pg_class'::regclass AND d.objsubid = 0
      JOIN pg_class c ON c.oid = d.objid AND c.relnamespace = n.oid
     WHERE n.nspname = %(schema)s
)
"""

# Tables (views and materialized views among them: the application reads through them, and a
# view a later revision creates gets the same privileges from the schema's default privileges
# on TABLES) and sequences of one schema, by name, for named grants and checks.
TABLE_KINDS = ("r", "p", "v", "m")
RELATIONS = (
    SCHEMA_RELATIONS_CTE
    + "SELECT relname, relkind FROM rels WHERE relkind IN ('r', 'p', 'v', 'm', 'S') "
    + "ORDER BY relname"
)

# How many objects of any kind (relations, types, functions...) live in the schema; no row
# when the schema does not exist.
SCHEMA_OBJECT_COUNT = """
SELECT (SELECT count(*) FROM pg_depend d
         WHERE d.refclassid = 'pg_namespace'::regclass AND d.refobjid = n.oid) AS objects
  FROM pg_namespace n WHERE n.nspname = %(schema)s
"""

# In one round trip: the schema's privileges for the role, and every (relation, privilege) pair
# the grant step gives the role that it lacks (its set's privileges on each table and sequence,
# SELECT alone on the version table), checked with has_*_privilege; and what it must NOT hold:
# a write on the version table, and what its set leaves out (a readonly role's INSERT...).
APP_ROLE_PRIVILEGES = (
    SCHEMA_RELATIONS_CTE
    + """
SELECT has_schema_privilege(%(role)s, n.oid, 'USAGE') AS usage,
       has_schema_privilege(%(role)s, n.oid, 'CREATE') AS can_create,
       ARRAY(SELECT r.relname || ': ' || p.privilege
               FROM rels r CROSS JOIN unnest(%(privileges)s::text[]) AS p(privilege)
              WHERE r.relkind IN ('r', 'p', 'v', 'm') AND r.relname <> %(version_table)s
                AND NOT has_table_privilege(%(role)s, r.oid, p.privilege)
             UNION ALL
             SELECT r.relname || ': ' || p.privilege
               FROM rels r CROSS JOIN unnest(%(sequence_privileges)s::text[]) AS p(privilege)
              WHERE r.relkind = 'S' AND NOT has_sequence_privilege(%(role)s, r.oid, p.privilege)
             UNION ALL
             SELECT r.relname || ': SELECT' FROM rels r
              WHERE r.relkind IN ('r', 'p') AND r.relname = %(version_table)s
                AND NOT has_table_privilege(%(role)s, r.oid, 'SELECT')
             ORDER BY 1) AS missing,
       ARRAY(SELECT r.relname || ': ' || p.privilege || ' must NOT be held'
               FROM rels r CROSS JOIN unnest(%(version_writes)s::text[]) AS p(privilege)
              WHERE r.relkind IN ('r', 'p') AND r.relname = %(version_table)s
                AND has_table_privilege(%(role)s, r.oid, p.privilege)
             UNION ALL
             SELECT r.relname || ': ' || p.privilege || ' must NOT be held'
               FROM rels r CROSS JOIN unnest(%(table_forbidden)s::text[]) AS p(privilege)
              WHERE r.relkind IN ('r', 'p', 'v', 'm') AND r.relname <> %(version_table)s
                AND has_table_privilege(%(role)s, r.oid, p.privilege)
             UNION ALL
             SELECT r.relname || ': ' || p.privilege || ' must NOT be held'
               FROM rels r CROSS JOIN unnest(%(sequence_forbidden)s::text[]) AS p(privilege)
              WHERE r.relkind = 'S' AND has_sequence_privilege(%(role)s, r.oid, p.privilege)
              ORDER BY 1) AS forbidden
  FROM pg_namespace n WHERE n.nspname = %(schema)s
"""
)

# What the role still holds in the schema, granted to it directly: on the schema itself, on its
# relations, and as default privileges for what a later migration creates. Empty when the schema
# does not exist. aclexplode reads the ACLs the REVOKEs below empty.
APP_ROLE_HOLDINGS = (
    SCHEMA_RELATIONS_CTE
    + """
, role AS (SELECT oid FROM pg_roles WHERE rolname = %(role)s)
SELECT 'schema ' || n.nspname || ': ' || a.privilege_type AS held
  FROM pg_namespace n, aclexplode(n.nspacl) a, role
 WHERE n.nspname = %(schema)s AND a.grantee = role.oid
UNION ALL
SELECT r.relname || ': ' || a.privilege_type
  FROM rels r, aclexplode(r.relacl) a, role WHERE a.grantee = role.oid
UNION ALL
SELECT 'default privileges on ' || d.defaclobjtype::text || ': ' || a.privilege_type
  FROM pg_namespace n JOIN pg_default_acl d ON d.defaclnamespace = n.oid
       CROSS JOIN aclexplode(d.defaclacl) a CROSS JOIN role
 WHERE n.nspname = %(schema)s AND d.defaclrole = (SELECT oid FROM pg_roles
                                                  WHERE rolname = current_user)
   AND a.grantee = role.oid
"""
)

# -- operations ---------------------------------------------------------------------------------


def schema_owner(conn: Conn, schema: str) -> tuple[str | None, str]:
    """(the schema's owner, or None when it does not exist; the connected role)."""
    with conn.cursor(row_factory=tuple_row) as cur:
        cur.execute(SCHEMA_OWNER, {"schema": schema})
        row = cur.fetchone()
    assert row is not None
    return row[0], str(row[1])


# A tenant's schema made, in one round trip (a simple query, values as literals): the objects
# a schema of that name already holds (no row: none by that name), ``CREATE SCHEMA IF NOT
# EXISTS``, then its owner and the connected role.
CREATE_SCHEMA = """SELECT (SELECT count(*) FROM pg_depend d
         WHERE d.refclassid = 'pg_namespace'::regclass AND d.refobjid = n.oid)
  FROM pg_namespace n WHERE n.nspname = {name};
CREATE SCHEMA IF NOT EXISTS {schema} AUTHORIZATION CURRENT_USER;
SELECT (SELECT pg_get_userbyid(nspowner) FROM pg_namespace WHERE nspname = {name}), current_user"""


def create_schema(conn: Conn, schema: str) -> None:
    """``CREATE SCHEMA IF NOT EXISTS`` owned by the connected (owner) role, in one round trip.

    A schema of that name that already holds objects is refused (:class:`PermanentError`):
    the tool makes a tenant's schema in the step that records it (a crash cannot leave one
    made and unrecorded), so such a schema is someone else's (a restore, a DBA's, one from
    before the tool), and provisioning would hand its data to the application role. An empty
    one, or one another role owns, is refused as before when it is not the owner's."""
    query = sql.SQL(CREATE_SCHEMA).format(name=sql.Literal(schema), schema=sql.Identifier(schema))
    with conn.cursor(row_factory=tuple_row) as cur:
        cur.execute(query, prepare=False)
        before = cur.fetchone()
        cur.nextset()  # the CREATE's
        cur.nextset()
        row = cur.fetchone()
    assert row is not None, "the owner's query returns its row"
    owner, me = row[0], str(row[1])
    if owner != me:
        raise PermanentError(
            f"schema {schema} already exists and is owned by role {owner}, not {me}; "
            f"drop it or ALTER SCHEMA {schema} OWNER TO {me}"
        )
    if before is not None and int(before[0]) > 0:
        raise PermanentError(
            f"schema {schema} already exists and holds {int(before[0])} object(s) the tool did "
            "not make (a tenant's schema is made by its create_schema step, with its record): the "
            "tool takes no schema it did not make; rename or drop it, or use another tenant id"
        )


def schema_ready(conn: Conn, schema: str) -> bool:
    owner, me = schema_owner(conn, schema)
    return owner == me


def relations(conn: Conn, schema: str) -> tuple[list[str], list[str]]:
    """(tables, views and materialized views; sequences) of the schema, by name."""
    with conn.cursor(row_factory=tuple_row) as cur:
        cur.execute(RELATIONS, {"schema": schema})
        rows = cur.fetchall()
    tables = [name for name, kind in rows if kind in TABLE_KINDS]
    sequences = [name for name, kind in rows if kind == "S"]
    return tables, sequences


def object_count(conn: Conn, schema: str) -> int | None:
    """How many objects live in the schema (0: empty); None when it does not exist."""
    with conn.cursor(row_factory=tuple_row) as cur:
        cur.execute(SCHEMA_OBJECT_COUNT, {"schema": schema})
        row = cur.fetchone()
    return None if row is None else int(row[0])


def usage_grant(schema: str, role: AppRole) -> sql.Composed:
    """``GRANT USAGE`` on the schema: the grant step's first statement, and all that a taken
    spare still lacks (:mod:`provisioner.pool`)."""
    return sql.SQL("GRANT USAGE ON SCHEMA {} TO {}").format(
        sql.Identifier(schema), sql.Identifier(role.name)
    )


def _privileges(names: tuple[str, ...]) -> sql.Composable:
    return sql.SQL(", ").join(sql.SQL(name) for name in names)


def grant_statements(
    schema: str, role: AppRole, tables: list[str], sequences: list[str]
) -> list[sql.Composable]:
    """The grant step's statements for one role on the named tables and sequences (also used by
    the raw-SQL benchmark baseline, so both measure the same work)."""
    return schema_grant_statements(schema, role) + relation_grant_statements(
        schema, role, tables, sequences
    )


def schema_grant_statements(schema: str, role: AppRole) -> list[sql.Composable]:
    """The grant step's statements on the schema itself: USAGE (first), no CREATE, and the
    default privileges (the role's set) of what it will hold."""
    schema_id, role_id = sql.Identifier(schema), sql.Identifier(role.name)
    return [
        usage_grant(schema, role),
        sql.SQL("REVOKE CREATE ON SCHEMA {} FROM {}").format(schema_id, role_id),
        sql.SQL(
            "ALTER DEFAULT PRIVILEGES FOR ROLE CURRENT_USER IN SCHEMA {} GRANT {} ON TABLES TO {}"
        ).format(schema_id, _privileges(role.privileges.table_privileges), role_id),
        sql.SQL(
            "ALTER DEFAULT PRIVILEGES FOR ROLE CURRENT_USER IN SCHEMA {} "
            "GRANT {} ON SEQUENCES TO {}"
        ).format(schema_id, _privileges(role.privileges.sequence_privileges), role_id),
    ]


def relation_grant_statements(
    schema: str, role: AppRole, tables: list[str], sequences: list[str]
) -> list[sql.Composable]:
    """The grant step's statements on the named tables and sequences (none for none): the
    role's set on each table but the version table, which the role may only read
    (:func:`version_table_grants`)."""
    role_id = sql.Identifier(role.name)
    statements: list[sql.Composable] = []
    rows = [t for t in tables if t != VERSION_TABLE]
    if rows:
        statements.append(
            sql.SQL("GRANT {} ON TABLE {} TO {}").format(
                _privileges(role.privileges.table_privileges),
                sql.SQL(", ").join(sql.Identifier(schema, t) for t in rows),
                role_id,
            )
        )
    if VERSION_TABLE in tables:
        statements.extend(version_table_grants(schema, role.name))
    if sequences:
        statements.append(sequence_grant(schema, role, sequences))
    return statements


def sequence_grant(schema: str, role: AppRole, sequences: list[str]) -> sql.Composed:
    """The role's set on the named sequences (a spare gets them only when taken)."""
    return sql.SQL("GRANT {} ON SEQUENCE {} TO {}").format(
        _privileges(role.privileges.sequence_privileges),
        sql.SQL(", ").join(sql.Identifier(schema, s) for s in sequences),
        sql.Identifier(role.name),
    )


def version_table_grants(schema: str, role_name: str) -> list[sql.Composable]:
    """SELECT on the version table, and every write taken away: a table created under the
    schema's default privileges (a version table Alembic made again) gets DML from them."""
    return [
        sql.SQL("GRANT SELECT ON TABLE {} TO {}").format(
            sql.Identifier(schema, VERSION_TABLE), sql.Identifier(role_name)
        ),
        version_writes_revoke(schema, role_name),
    ]


def version_writes_revoke(schema: str, role_name: str) -> sql.Composed:
    """``REVOKE`` of every write on the schema's version table from an application role."""
    return sql.SQL("REVOKE {} ON TABLE {} FROM {}").format(
        sql.SQL(", ").join(sql.SQL(p) for p in VERSION_TABLE_WRITES),
        sql.Identifier(schema, VERSION_TABLE),
        sql.Identifier(role_name),
    )


def revoke_version_writes(conn: Conn, schema: str, roles: AppRoles) -> None:
    """Take every write on the schema's version table away from the application roles, in the
    caller's transaction (an upgrade does it before it trusts the table: tenants granted by an
    earlier release held DML on it)."""
    with conn.cursor() as cur:
        cur.execute(sql.SQL("; ").join(version_writes_revoke(schema, r.name) for r in roles))


def grant_app_roles(conn: Conn, schema: str, roles: AppRoles) -> None:
    """For each role, its set's privileges: USAGE on the schema, its privileges on the tables
    and sequences, and default privileges so tables a later migration creates are covered too.
    Never CREATE.

    Grants name each table rather than ``ON ALL TABLES IN SCHEMA``, whose cost grows with the
    number of tables in the whole database. Every role's statements go in one round trip, and
    the check that follows (every table, every privilege, with ``has_table_privilege``) in one
    more per role.
    """
    tables, sequences = relations(conn, schema)
    statements = [s for r in roles for s in grant_statements(schema, r, tables, sequences)]
    # ALTER DEFAULT PRIVILEGES would have psycopg forget every statement the session prepared
    # (the queue's, the fingerprint's), at every sign-up: they change only this schema.
    with conn.cursor() as cur, keeping_prepared_statements(conn):
        # No parameters: psycopg sends the statements as one simple query.
        cur.execute(sql.SQL("; ").join(statements))
    verify_app_grants(conn, schema, roles)


def revoke_statements(
    schema: str, role_name: str, tables: list[str], sequences: list[str]
) -> list[sql.Composable]:
    """Undo of :func:`grant_statements`, and everything else the role might hold there."""
    schema_id, role_id = sql.Identifier(schema), sql.Identifier(role_name)
    statements: list[sql.Composable] = [
        sql.SQL("REVOKE ALL ON SCHEMA {} FROM {}").format(schema_id, role_id),
        sql.SQL(
            "ALTER DEFAULT PRIVILEGES FOR ROLE CURRENT_USER IN SCHEMA {} "
            "REVOKE ALL ON TABLES FROM {}"
        ).format(schema_id, role_id),
        sql.SQL(
            "ALTER DEFAULT PRIVILEGES FOR ROLE CURRENT_USER IN SCHEMA {} "
            "REVOKE ALL ON SEQUENCES FROM {}"
        ).format(schema_id, role_id),
    ]
    if tables:
        statements.append(
            sql.SQL("REVOKE ALL ON TABLE {} FROM {}").format(
                sql.SQL(", ").join(sql.Identifier(schema, t) for t in tables), role_id
            )
        )
    if sequences:
        statements.append(
            sql.SQL("REVOKE ALL ON SEQUENCE {} FROM {}").format(
                sql.SQL(", ").join(sql.Identifier(schema, s) for s in sequences), role_id
            )
        )
    return statements


def revoke_app_roles(conn: Conn, schema: str, roles: AppRoles) -> None:
    """Take every privilege of every application role on the schema away, in the caller's
    transaction (all at once on commit): each role's next query gets ``permission denied``. A
    missing schema has nothing to revoke. Raises when any role keeps any access."""
    if schema_owner(conn, schema)[0] is None:
        return
    tables, sequences = relations(conn, schema)
    statements = [s for r in roles for s in revoke_statements(schema, r.name, tables, sequences)]
    with conn.cursor() as cur:
        cur.execute(sql.SQL("; ").join(statements))
    for role in roles:
        held = app_role_holdings(conn, schema, role.name)
        if held:
            raise PermanentError(f"{role.name} still holds in {schema}: {'; '.join(held[:10])}")
        left = app_role_standing.access_left(conn, schema, role.name)
        if left:
            raise PermanentError(
                f"{role.name} can still use {schema} after the revoke (a superuser, or a grant "
                f"to PUBLIC or to a role it belongs to): {'; '.join(left[:10])}"
            )


def app_roles_cut_off(conn: Conn, schema: str, roles: AppRoles) -> bool:
    """No role holds anything in the schema, by name or through any other grant."""
    return all(
        not app_role_holdings(conn, schema, r.name)
        and not app_role_standing.access_left(conn, schema, r.name)
        for r in roles
    )


def app_role_holdings(conn: Conn, schema: str, role_name: str) -> list[str]:
    """What the application role holds in the schema (granted to it by name); [] when none."""
    with conn.cursor(row_factory=tuple_row) as cur:
        cur.execute(APP_ROLE_HOLDINGS, {"role": role_name, "schema": schema})
        return [str(row[0]) for row in cur.fetchall()]


# Each function of the (renamed) schema whose own search_path names the schema by its former
# name points at the new one instead; the other entries of its path are kept as they are. A
# function created with ``SET search_path FROM CURRENT`` (as PostgreSQL's docs advise for code
# that must not depend on its caller's path) stores the schema's name as text: a rename leaves
# it naming a schema that no longer exists. ``{old}`` and ``{new}`` are literals.
REPIN_SEARCH_PATH = """
DO $repin$
DECLARE f record;
BEGIN
  FOR f IN
    SELECT p.oid::regprocedure AS fn,
           array_to_string(ARRAY(
             SELECT CASE WHEN btrim(btrim(e), '"') = {old} THEN quote_ident({new})
                         ELSE btrim(e) END
               FROM unnest(string_to_array(substr(c.setting, 13), ',')) AS e), ', ') AS path
      FROM pg_namespace n
      JOIN pg_depend d ON d.refclassid = 'pg_namespace'::regclass AND d.refobjid = n.oid
                      AND d.classid = 'pg_proc'::regclass
      JOIN pg_proc p ON p.oid = d.objid
      CROSS JOIN unnest(p.proconfig) AS c(setting)
     WHERE n.nspname = {new} AND starts_with(c.setting, 'search_path=')
  LOOP
    -- No percent sign in this text: it joins statements sent with client-side parameters.
    EXECUTE 'ALTER FUNCTION ' || f.fn::text || ' SET search_path = ' || f.path;
  END LOOP;
END
$repin$
"""


def repin_search_path(old: str, new: str) -> sql.Composed:
    """The statement that points the functions of schema ``new`` (renamed from ``old``) whose
    own ``search_path`` names ``old`` at ``new`` (:data:`REPIN_SEARCH_PATH`)."""
    return sql.SQL(REPIN_SEARCH_PATH).format(old=sql.Literal(old), new=sql.Literal(new))


def drop_schema(conn: Conn, schema: str, *, lock_timeout_ms: int | None = None) -> None:
    """``DROP SCHEMA ... CASCADE``: the tenant's tables and data are gone on commit. With
    ``lock_timeout_ms``, the drop waits at most that long for its locks (``lock_timeout`` set
    for the caller's transaction), then fails with SQLSTATE 55P03."""
    drop = sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(sql.Identifier(schema))
    if lock_timeout_ms is not None:
        timeout = sql.Literal(f"{max(1, lock_timeout_ms)}ms")
        drop = sql.SQL("SELECT set_config('lock_timeout', {}, true); {}").format(timeout, drop)
    with conn.cursor() as cur:
        cur.execute(drop)


def missing_app_grants(conn: Conn, schema: str, roles: AppRoles) -> list[str]:
    """What the application roles lack in the schema, e.g. ``['members: DELETE']``, and what
    they hold but must not (CREATE on the schema, a write on the version table, a privilege
    their set leaves out). With several roles each line starts with the role's name."""
    several = len(roles) > 1
    return [
        f"{role.name}: {line}" if several else line
        for role in roles
        for line in role_missing_grants(conn, schema, role)
    ]


def role_missing_grants(conn: Conn, schema: str, role: AppRole) -> list[str]:
    """:func:`missing_app_grants` for one role."""
    with conn.cursor(row_factory=dict_row) as cur:
        cur.execute(
            APP_ROLE_PRIVILEGES,
            {
                "role": role.name,
                "schema": schema,
                "privileges": list(role.privileges.table_privileges),
                "sequence_privileges": list(role.privileges.sequence_privileges),
                "table_forbidden": list(role.privileges.table_forbidden),
                "sequence_forbidden": list(role.privileges.sequence_forbidden),
                "version_table": VERSION_TABLE,
                "version_writes": list(VERSION_TABLE_WRITES),
            },
        )
        schema_row = cur.fetchone()
    if schema_row is None:
        return [f"schema {schema}: does not exist"]
    missing = list(schema_row["forbidden"]) + list(schema_row["missing"])
    if not schema_row["usage"]:
        missing.insert(0, f"schema {schema}: USAGE")
    if schema_row["can_create"]:
        missing.insert(0, f"schema {schema}: CREATE must NOT be held")
    return missing


def verify_app_grants(conn: Conn, schema: str, roles: AppRoles) -> None:
    for role in roles:
        missing = role_missing_grants(conn, schema, role)
        if missing:
            raise GrantVerificationFailed(
                f"{role.name} lacks privileges in {schema} after granting: "
                f"{'; '.join(missing[:10])}"
            )


def versions_query(schema: str) -> sql.Composed:
    """The statement that reads the revisions ``<schema>.alembic_version`` records."""
    return sql.SQL("SELECT version_num FROM {}.alembic_version").format(sql.Identifier(schema))
