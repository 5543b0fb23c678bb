"""A spare's grants: what each application role must hold in a spare (everything its set gives
but USAGE on the schema and the sequences' privileges), how a spare is granted in batches, and
the checks the build and the take make (:mod:`provisioner.pool.build`,
:mod:`provisioner.pool.spares`).

Without USAGE a role cannot look up anything in the schema, so the grants a spare carries give
it nothing until the take grants USAGE (and the sequences', usable by oid without USAGE) with
its rename: the take then checks the ACLs instead of naming every table, whatever the
template's size.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from psycopg import sql
from psycopg.rows import dict_row

from provisioner.errors import SpareRejected
from provisioner.roles import AppRole, AppRoles, Privileges
from provisioner.tenant import schema as tenant_schema


# What an application role holds in one schema, read from the ACLs themselves in one round
# trip, against what a spare carries. A table is listed unless its ACL holds every privilege of
# the role's set, granted to the role itself by the table's owner (as the grant step, run by
# the owner, records them; a superuser's grant is recorded as the owner's), which implies
# has_table_privilege for each; and, for a set that leaves privileges out (readonly), unless
# the role holds none of them, by any grant. aclcontains on the ACL as stored costs half what
# expanding it with aclexplode did (1.7 against 3.1-4.4 ms for 400 relations). A grant by
# another grantor is not counted: the caller then runs the full grant step, which grants again
# as the owner. The version table is listed unless the role may read it and write nothing; a
# sequence is listed when the role holds any privilege on it: a spare's sequences are granted
# by the take, since a privilege on a sequence is usable by its oid without USAGE on the schema
# (nextval(oid) needs no name). ``sequences`` names them all, for the take's grant.
def _grants_held(privileges: Privileges) -> str:
    """:data:`GRANTS_HELD` for one privilege set: each privilege its own aclcontains (a
    makeaclitem of several needs PostgreSQL 16), and what the set leaves out never held."""
    owner_grants = "\n                      AND ".join(
        "aclcontains(r.relacl, makeaclitem((SELECT oid FROM role), r.relowner, "
        f"'{privilege}', false))"
        for privilege in privileges.table_privileges
    )
    forbidden = ", ".join(privileges.table_forbidden)
    none_else = (
        f"\n                      AND NOT has_table_privilege(%(role)s, r.oid, '{forbidden}')"
        if forbidden
        else ""
    )
    defaults = ", ".join(
        f"('{kind}', ARRAY[{', '.join(repr(p) for p in wanted)}])"
        for kind, wanted in (
            ("r", privileges.table_privileges),
            ("S", privileges.sequence_privileges),
        )
    )
    return (
        tenant_schema.SCHEMA_RELATIONS_CTE
        + """
, role AS (SELECT oid FROM pg_roles WHERE rolname = %(role)s)
SELECT has_schema_privilege(%(role)s, n.oid, 'USAGE') AS usage,
       has_schema_privilege(%(role)s, n.oid, 'CREATE') AS can_create,
       ARRAY(SELECT r.relname FROM rels r
              WHERE r.relkind IN ('r', 'p', 'v', 'm', 'S')
                AND (CASE
                     WHEN r.relkind = 'S'
                     THEN NOT has_sequence_privilege(%(role)s, r.oid, 'USAGE, SELECT, UPDATE')
                     WHEN r.relname = '"""
        + tenant_schema.VERSION_TABLE
        + """'
                     THEN aclcontains(r.relacl, makeaclitem((SELECT oid FROM role),
                                                            r.relowner, 'SELECT', false))
                      AND NOT has_table_privilege(%(role)s, r.oid, '"""
        + ", ".join(tenant_schema.VERSION_TABLE_WRITES)
        + """')
                     ELSE """
        + owner_grants
        + none_else
        + """
                     END) IS NOT TRUE
              ORDER BY r.relname) AS lacking,
       ARRAY(SELECT t.kind FROM (VALUES """
        + defaults
        + """) AS t(kind, wanted)
              WHERE NOT EXISTS (
                    SELECT 1 FROM pg_default_acl d
                     WHERE d.defaclrole = (SELECT oid FROM pg_roles WHERE rolname = current_user)
                       AND d.defaclnamespace = n.oid AND d.defaclobjtype::text = t.kind
                       AND ARRAY(SELECT a.privilege_type FROM aclexplode(d.defaclacl) a, role
                                  WHERE a.grantee = role.oid) @> t.wanted)) AS lacking_defaults,
       ARRAY(SELECT r.relname FROM rels r WHERE r.relkind = 'S' ORDER BY r.relname) AS sequences,
       EXISTS (SELECT 1 FROM pg_depend d JOIN pg_proc p ON p.oid = d.objid
                CROSS JOIN unnest(p.proconfig) AS c(setting)
               WHERE d.refclassid = 'pg_namespace'::regclass AND d.refobjid = n.oid
                 AND d.classid = 'pg_proc'::regclass
                 AND starts_with(c.setting, 'search_path=')) AS pinned_functions
  FROM pg_namespace n WHERE n.nspname = %(schema)s
"""
    )


#: One statement per privilege set (the set's privileges written in it, as constants); both are
#: planned ahead (:data:`TAKE_PLANS`), on an idle session, whichever sets a project uses.
GRANTS_HELD: dict[Privileges, str] = {
    privileges: _grants_held(privileges) for privileges in Privileges
}


@dataclass(frozen=True)
class GrantsHeld:
    """What :data:`GRANTS_HELD` found for the application role in one schema."""

    usage: bool
    can_create: bool
    #: relations not as a spare carries them: a table lacking one of the grant step's
    #: privileges, the version table not readable or writable, a sequence the role may use
    lacking: list[str]
    #: 'r' / 'S': the schema's default privileges for tables / sequences are not in place
    lacking_defaults: list[str]
    #: every sequence of the schema, by name (the take grants them)
    sequences: list[str] = field(default_factory=list)
    #: a function of the schema carries its own search_path (``SET search_path FROM
    #: CURRENT`` names the spare): the take points it at the tenant's schema
    pinned_functions: bool = False

    @property
    def all_but_usage(self) -> bool:
        """The schema is as a spare is built: every grant of the grant step is in place but
        USAGE on the schema and the sequences' grants (the take's); no CREATE."""
        return not (self.can_create or self.lacking or self.lacking_defaults)

    def problems(self) -> list[str]:
        return [
            *(["CREATE must NOT be held"] if self.can_create else []),
            *(f"{name}: not as a spare carries it" for name in self.lacking),
            *(f"default privileges ({kind}): missing" for kind in self.lacking_defaults),
        ]


# -- operations ---------------------------------------------------------------------------------


def take_grants(schema: str, app_roles: AppRoles, sequences: list[str]) -> list[sql.Composable]:
    """What a taken spare's schema still needs for each application role: USAGE, and its set's
    privileges on its sequences (held back until now, see :data:`GRANTS_HELD`)."""
    return [
        statement
        for role in app_roles
        for statement in (
            tenant_schema.usage_grant(schema, role),
            *([tenant_schema.sequence_grant(schema, role, sequences)] if sequences else []),
        )
    ]


def grants_held(conn: Any, schema: str, role: AppRole) -> GrantsHeld | None:
    """An application role's privileges in ``schema``, against its set (None: no schema).
    Prepared at its first run on a session, as the fingerprint is: a builder checks every
    spare it builds with it, on a session opened for one refill."""
    with conn.cursor(row_factory=dict_row) as cur:
        cur.execute(
            GRANTS_HELD[role.privileges], {"schema": schema, "role": role.name}, prepare=True
        )
        row = cur.fetchone()
    return None if row is None else _held(row)


def _held(row: dict[str, Any]) -> GrantsHeld:
    return GrantsHeld(
        usage=bool(row["usage"]),
        can_create=bool(row["can_create"]),
        lacking=list(row["lacking"]),
        lacking_defaults=list(row["lacking_defaults"]),
        sequences=list(row["sequences"]),
        pinned_functions=bool(row["pinned_functions"]),
    )


def spare_grant_batches(
    schema: str, app_roles: AppRoles, tables: list[str], batch: int
) -> list[sql.Composed]:
    """The grant step's statements but USAGE on the schema and the sequences' grants (the
    take's), for every role: what a spare is built with, one batch per transaction: the
    schema's own statements, then the grants of ``tables`` (its tables, views and materialized
    views, by name), ``batch`` tables at a time."""
    schema_wide: list[sql.Composable] = []
    for role in app_roles:
        statements = tenant_schema.schema_grant_statements(schema, role)
        assert statements[0] == tenant_schema.usage_grant(schema, role), (
            "the grant step's first statement is no longer USAGE"
        )
        schema_wide.extend(statements[1:])
    batches = [sql.SQL("; ").join(schema_wide)]
    for start in range(0, len(tables), batch):
        statements = [
            statement
            for role in app_roles
            for statement in tenant_schema.relation_grant_statements(
                schema, role, tables[start : start + batch], []
            )
        ]
        batches.append(sql.SQL("; ").join(statements))
    return batches


def check_spare_grants(conn: Any, schema: str, app_roles: AppRoles) -> None:
    """Every grant of the grant step but USAGE and the sequences' is in place in a spare, for
    every role, and no role holds USAGE, CREATE or any privilege on a sequence (so each is
    refused anything in it). :class:`SpareRejected` otherwise."""
    for role in app_roles:
        held = grants_held(conn, schema, role)
        if held is None or held.usage or not held.all_but_usage:
            found = "no schema" if held is None else "; ".join(held.problems()) or "USAGE is held"
            raise SpareRejected(f"spare {schema}: grants for {role.name} not as built: {found}")


def grant_usage_if_in_place(conn: Any, schema: str, app_roles: AppRoles) -> bool:
    """The grant step on a tenant's schema whose table grants and default privileges are in
    place for every role (a taken spare, a tenant that lost USAGE alone): USAGE and the
    sequences' grants given (again, for sequences already granted), after a check of every
    ACL. False, with nothing changed, when any other grant is missing: the caller then runs the
    full grant step (which grants everything, and checks)."""
    sequences: list[str] = []
    for role in app_roles:
        held = grants_held(conn, schema, role)
        if held is None or held.can_create or held.lacking_defaults:
            return False
        if set(held.lacking) - set(held.sequences):  # a table: a sequence listed is merely usable
            return False
        sequences = held.sequences
    with conn.cursor() as cur:
        cur.execute(sql.SQL("; ").join(take_grants(schema, app_roles, sequences)))
    return True


def usage_held(conn: Any, schema: str, app_roles: AppRoles) -> bool:
    """The grant step on a taken spare whose other grants :func:`take` found in place (and to
    whose roles the take granted USAGE): USAGE held and CREATE not, by every role, in one simple
    query (nothing to plan again after the rename)."""
    schema_literal = sql.Literal(schema)
    held = sql.SQL(" AND ").join(
        sql.SQL(
            "has_schema_privilege({role}, {schema}, 'USAGE')"
            " AND NOT has_schema_privilege({role}, {schema}, 'CREATE')"
        ).format(role=sql.Literal(role.name), schema=schema_literal)
        for role in app_roles
    )
    with conn.cursor() as cur:
        cur.execute(sql.SQL("SELECT {}").format(held))
        row = cur.fetchone()
    return bool(row and row[0])
