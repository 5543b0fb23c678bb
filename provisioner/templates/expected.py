"""What a tenant should hold: the inventory of a schema built at the template head, then undone.

``check`` and ``repair`` compare tenants with it (:mod:`provisioner.tenant.catalog`). It is
built, never kept: under a SAVEPOINT a scratch schema is created, Alembic takes it to the head,
the provisioning grant step grants it to the application role, its inventory is read, and the
savepoint is rolled back. Nothing of it ever commits, so there is nothing to drop afterwards.

The scratch schema's name is one no tenant id maps to under any naming rule:
``provisioner_expected_<random>`` (:func:`provisioner.naming.scratch_name`), which the tenant
tree's ``env.py`` accepts as the tool's own. It is created with a plain ``CREATE SCHEMA``: a
schema of that name that somebody else made is never adopted, the build fails instead and
names it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import psycopg
from psycopg import sql

from provisioner import naming
from provisioner.errors import PermanentError
from provisioner.roles import AppRoles
from provisioner.templates import migrations
from provisioner.tenant import catalog
from provisioner.tenant import schema as tenant_schema

if TYPE_CHECKING:
    import sqlalchemy as sa

SAVEPOINT = sql.Identifier("provisioner_expected_schema")


def scratch_name() -> str:
    return naming.scratch_name("expected")


def build(
    pg: psycopg.Connection[Any], conn: sa.Connection, app_roles: AppRoles
) -> catalog.Inventory:
    """The inventory of a schema freshly built at head and granted to ``app_roles``, read under
    the session's default ``search_path`` (as tenants are read), in the caller's transaction;
    the savepoint leaves it exactly as it was."""
    scratch = scratch_name()
    with pg.cursor() as cur:
        cur.execute(sql.SQL("SAVEPOINT {}").format(SAVEPOINT))
        try:
            if tenant_schema.schema_owner(pg, scratch)[0] is not None:
                raise PermanentError(f"schema {scratch} exists and is not the tool's: drop it")
            cur.execute(
                sql.SQL("CREATE SCHEMA {} AUTHORIZATION CURRENT_USER").format(
                    sql.Identifier(scratch)
                )
            )
            migrations.upgrade_tenant(conn, scratch)
            tenant_schema.grant_app_roles(pg, scratch, app_roles)
            # Alembic left search_path on the scratch schema, which changes how the catalog
            # prints names: read it as the tenants are read.
            cur.execute("SET LOCAL search_path TO DEFAULT")
            found = catalog.read(pg, scratch)
        finally:
            cur.execute(sql.SQL("ROLLBACK TO SAVEPOINT {}").format(SAVEPOINT))
            cur.execute(sql.SQL("RELEASE SAVEPOINT {}").format(SAVEPOINT))
    assert found is not None
    return found
