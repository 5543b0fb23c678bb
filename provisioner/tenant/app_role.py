"""Whether the configured application roles (``app_roles``, :mod:`provisioner.roles`) can be cut
off a tenant.

Suspension and offboarding revoke each application role's privileges on a tenant's schema. That
only cuts the application off when the role is the one it connects as, and when nothing else
gives it access: a superuser reads every schema whatever is revoked, the owner role (or a role
holding its privileges) owns them, and a role that does not exist holds nothing to revoke while
the real application role keeps its grants. Such a setting is refused before anything is
granted or revoked (:func:`check`), and after every revoke the role's *effective* access is read
back (:func:`access_left`): a suspension never reports success while the role still reads the
tenant.
"""

from __future__ import annotations

from typing import Any

import psycopg
from psycopg.rows import dict_row, tuple_row

from provisioner.errors import ConfigurationError
from provisioner.roles import APP_ROLES_ENV, AppRoles

Conn = Any

#: How the messages name the setting.
SETTING = f"(app_roles / {APP_ROLES_ENV})"

# Each role's standing, seen from an owner connection (current_user is the owner): whether it
# exists, is a superuser, or is (or may become) the owner. One row per name, in their order.
STANDING = """
SELECT wanted.name, r.oid IS NOT NULL AS exists,
       coalesce(r.rolsuper, false) AS superuser,
       coalesce(pg_has_role(r.oid, (SELECT oid FROM pg_roles WHERE rolname = current_user),
                            'MEMBER'), false) AS owner_powers,
       current_user AS owner
  FROM unnest(%(roles)s::text[]) WITH ORDINALITY AS wanted(name, n)
  LEFT JOIN pg_roles r ON r.rolname = wanted.name
 ORDER BY wanted.n
"""

# Whether the role connected (an application URL's) gets the named role's privileges.
REACHES = "SELECT current_user, pg_has_role(current_user, %(role)s, 'USAGE')"

# What the role can still do in the schema, whatever grants it: its own, a role it belongs to,
# PUBLIC, or being a superuser. has_*_privilege reads effective privileges, not ACL entries;
# relations are listed whatever the schema's USAGE (a sequence is reachable by its OID).
ACCESS_LEFT = """
SELECT 'schema ' || n.nspname || ': ' || p.privilege
  FROM pg_namespace n CROSS JOIN unnest(ARRAY['USAGE', 'CREATE']) AS p(privilege)
 WHERE n.nspname = %(schema)s AND has_schema_privilege(%(role)s, n.oid, p.privilege)
UNION ALL
SELECT c.relname || ': ' || p.privilege
  FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
       CROSS JOIN unnest(ARRAY['SELECT', 'INSERT', 'UPDATE', 'DELETE']) AS p(privilege)
 WHERE n.nspname = %(schema)s AND c.relkind IN ('r', 'p', 'v', 'm', 'f')
   AND has_table_privilege(%(role)s, c.oid, p.privilege)
UNION ALL
SELECT c.relname || ': ' || p.privilege
  FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
       CROSS JOIN unnest(ARRAY['USAGE', 'SELECT', 'UPDATE']) AS p(privilege)
 WHERE n.nspname = %(schema)s AND c.relkind = 'S'
   AND has_sequence_privilege(%(role)s, c.oid, p.privilege)
"""


def problem(row: dict[str, Any]) -> str | None:
    """Why the role of :data:`STANDING`'s ``row`` cannot be an application role (None: it
    can), in one line naming the setting."""
    role = f"application role {row['name']} {SETTING}"
    if not row["exists"]:
        return (
            f"{role} names a role that does not exist: name the roles the application connects "
            "as (tenant schemas are granted to them)"
        )
    if row["superuser"]:
        return (
            f"{role} is a superuser: no revoke can cut it off a tenant; name the application's "
            "own role"
        )
    if row["owner_powers"]:
        return (
            f"{role} is, or holds the privileges of, the owner role {row['owner']}: no revoke "
            "can cut it off a tenant; name the application's own role"
        )
    return None


def check(conn: Conn, roles: AppRoles) -> None:
    """Refuse (ConfigurationError, exit 2) an application role that cannot be cut off a tenant;
    ``conn`` is the owner's."""
    finish_check(send_check(conn, roles))


def send_check(conn: Conn, roles: AppRoles) -> psycopg.Cursor[dict[str, Any]]:
    """The first half of :func:`check`, for a pipeline: the statement sent, its rows read by
    :func:`finish_check` (with the round trip of the pipeline's next fetch)."""
    cur: psycopg.Cursor[dict[str, Any]] = conn.cursor(row_factory=dict_row)
    cur.execute(STANDING, {"roles": [role.name for role in roles]})
    return cur


def finish_check(cur: psycopg.Cursor[dict[str, Any]]) -> None:
    with cur:
        found = [p for p in (problem(row) for row in cur.fetchall()) if p is not None]
    if found:
        raise ConfigurationError(found[0])


def check_reached(conn: Conn, role_name: str, url_name: str) -> None:
    """Refuse an application URL (``conn`` is its connection) whose role does not get its
    access through ``role_name`` (the control role): revoking from it would leave that
    role's access."""
    with conn.cursor(row_factory=tuple_row) as cur:
        cur.execute(REACHES, {"role": role_name})
        row = cur.fetchone()
    if row is None or not row[1]:
        who = row[0] if row else "its role"
        raise ConfigurationError(
            f"{url_name} connects as {who}, which does not get its access through application "
            f"role {role_name} {SETTING}: a suspension would revoke from one role and leave "
            "the other reading; name the role the application connects as"
        )


def access_left(conn: Conn, schema: str, app_role: str) -> list[str]:
    """What the role can still do in the schema, through any grant at all; [] when nothing."""
    with conn.cursor(row_factory=tuple_row) as cur:
        cur.execute(ACCESS_LEFT, {"role": app_role, "schema": schema})
        return [str(row[0]) for row in cur.fetchall()]
