"""A spare's schema on a tenant server: where it is built (:class:`OnServer`), how its name is
recorded on control and its schema created there, and how an unfinished one is dropped.

The server's catalog is not control's: the name is recorded on control first, then the schema
created on the server (refused when a schema there holds the name: :class:`NameTaken`, the
record alone is forgotten); a drop drops the schema there, then forgets it on control. A crash
between two of those leaves a recorded name with no ready row, which the server's next builder
drops (nothing more when the schema is gone) and forgets.
"""

from __future__ import annotations

from dataclasses import dataclass

from psycopg import sql

from provisioner import db
from provisioner.errors import PermanentError


@dataclass(frozen=True)
class OnServer:
    """A spare built on tenant server ``name`` (its schema there, on ``session``); its records
    stay on control, where placement reads them."""

    name: str
    session: db.Session


# The name of a spare about to be created on a tenant server, recorded on control first (the
# server's catalog is not control's: the creation there says whether the name is free).
RECORD_SERVER_SPARE_SCHEMA = """
INSERT INTO control.tenant_pool_schemas (schema_name, created_by, server)
VALUES (%(schema)s, %(created_by)s, %(server)s)
ON CONFLICT DO NOTHING
RETURNING schema_name
"""

# On a tenant server: whether no schema holds a spare's name (then it is created).
SERVER_NAME_FREE = """
SELECT NOT EXISTS (SELECT 1 FROM pg_namespace WHERE nspname = %(schema)s) AS free
"""

# On a tenant server: whether a recorded spare's schema is there and owned by the connected
# role (only then is it dropped).
SERVER_SCHEMA_OURS = """
SELECT EXISTS (SELECT 1 FROM pg_namespace n
                WHERE n.nspname = %(schema)s
                  AND n.nspowner = (SELECT oid FROM pg_roles WHERE rolname = current_user))
"""

# Forget a spare on a tenant server (its ready row if any, and its name), once its schema there
# is dropped or gone.
FORGET_SERVER_SPARE = """
WITH ready AS (DELETE FROM control.tenant_pool WHERE schema_name = %(schema)s)
DELETE FROM control.tenant_pool_schemas WHERE schema_name = %(schema)s
"""


class NameTaken(PermanentError):
    """A recorded spare's name is held by a schema on its tenant server that is not the pool's
    (never dropped: the record alone is forgotten)."""


def create_on_server(on: OnServer, name: str) -> None:
    """Create the recorded spare schema ``name`` on its server (:class:`NameTaken` when a
    schema there holds the name)."""
    with on.session.transaction() as tx, tx.pg.cursor() as cur:
        cur.execute(SERVER_NAME_FREE, {"schema": name})
        free = cur.fetchone()
        if free is None or not free[0]:
            raise NameTaken(f"schema {name} exists on tenant server {on.name}")
        cur.execute(
            sql.SQL("CREATE SCHEMA {} AUTHORIZATION CURRENT_USER").format(sql.Identifier(name))
        )


def drop_server_schema(
    control: db.Session, on: OnServer, schema: str, *, ours: bool = True
) -> bool:
    """Drop a recorded spare's schema on its tenant server (if it is there and owned by the
    connected role, and ``ours``), then forget it on control (its ready row too); True when
    dropped. In that order: a crash between the two leaves the record, and the next builder
    drops nothing more and forgets it."""
    dropped = False
    if ours:
        with on.session.transaction() as tx, tx.pg.cursor() as cur:
            cur.execute(SERVER_SCHEMA_OURS, {"schema": schema})
            found = cur.fetchone()
            if found is not None and found[0]:
                cur.execute(sql.SQL("DROP SCHEMA {} CASCADE").format(sql.Identifier(schema)))
                dropped = True
    with control.transaction() as tx:
        tx.pg.execute(FORGET_SERVER_SPARE, {"schema": schema})
    return dropped
