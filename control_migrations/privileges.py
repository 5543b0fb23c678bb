"""Grants of the control revisions to the application role, which may not exist yet.

The role name comes from ``config.attributes["app_role"]`` (set by ``provisioner migrate``),
``-x app_role=NAME``, or defaults to ``app_rw``. A missing role is skipped with a notice rather
than failing the migration: create the roles first (``infra/postgres/bootstrap.sql``).
"""

from __future__ import annotations

import re

from alembic import context, op

_ROLE = re.compile(r"[a-z_][a-z0-9_]{0,62}")


def app_role() -> str:
    role = context.config.attributes.get("app_role") or context.get_x_argument(
        as_dictionary=True
    ).get("app_role", "app_rw")
    if not _ROLE.fullmatch(role):
        raise ValueError(f"app role {role!r} must be a lower-case SQL identifier")
    return str(role)


def _if_role_exists(statement: str) -> None:
    role = app_role()
    op.execute(
        f"""
        DO $grant$
        BEGIN
          IF EXISTS (SELECT 1 FROM pg_roles WHERE rolname = '{role}') THEN
            {statement};
          ELSE
            RAISE NOTICE 'role {role} does not exist: skipping its control grants';
          END IF;
        END
        $grant$
        """
    )


def grant_to_app_role(privileges: str, objects: str) -> None:
    _if_role_exists(f'GRANT {privileges} ON {objects} TO "{app_role()}"')


def revoke_from_app_role(privileges: str, objects: str) -> None:
    _if_role_exists(f'REVOKE {privileges} ON {objects} FROM "{app_role()}"')


def for_app_role(statement: str) -> None:
    """Run ``statement`` with ``{role}`` replaced by the quoted app role, if the role exists."""
    _if_role_exists(statement.replace("{role}", f'"{app_role()}"'))
