"""The only importer of Alembic: upgrade the control schema or one tenant schema, check heads.

Alembic keeps module-level state (``alembic.context``, ``alembic.op``) and is not thread-safe:
run at most one migration at a time per process. The worker gets concurrency from processes.
"""

from __future__ import annotations

from functools import cache
from importlib.resources import files
from pathlib import Path
from typing import Any

import sqlalchemy as sa
from alembic import command
from alembic.config import Config
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
from psycopg import sql
from psycopg.rows import tuple_row

from provisioner.db import sqlalchemy_url, translated

CONTROL_SCHEMA = "control"


def _tree(package: str) -> Path:
    return Path(str(files(package)))


def control_config(**attributes: Any) -> Config:
    config = Config(str(_tree("provisioner.control_migrations") / "alembic.ini"))
    config.set_main_option("script_location", str(_tree("provisioner.control_migrations")))
    config.attributes.update(attributes)
    return config


def tenant_config(schema: str, **attributes: Any) -> Config:
    config = Config(str(_tree("provisioner.tenant_template") / "alembic.ini"))
    config.set_main_option("script_location", str(_tree("provisioner.tenant_template")))
    config.attributes.update(attributes, tenant_schema=schema)
    return config


@cache
def control_heads() -> frozenset[str]:
    return frozenset(ScriptDirectory.from_config(control_config()).get_heads())


@cache
def tenant_heads() -> frozenset[str]:
    return frozenset(ScriptDirectory.from_config(tenant_config("tenant_x")).get_heads())


def upgrade_control(owner_url: str, app_role: str = "app_rw") -> tuple[str | None, str | None]:
    """Bring the control schema to head; returns (revision before, revision after)."""
    engine = sa.create_engine(sqlalchemy_url(owner_url), poolclass=sa.pool.NullPool)
    try:
        with translated():
            before = control_revision_sa(engine)
            with engine.begin() as connection:
                command.upgrade(control_config(connection=connection, app_role=app_role), "head")
            return before, control_revision_sa(engine)
    finally:
        engine.dispose()


def control_revision_sa(engine: sa.Engine) -> str | None:
    with engine.connect() as connection:
        context = MigrationContext.configure(
            connection, opts={"version_table_schema": CONTROL_SCHEMA}
        )
        return context.get_current_revision()


def upgrade_tenant(connection: sa.Connection, schema: str) -> None:
    """Run the tenant template to head inside ``schema``, in the caller's transaction."""
    command.upgrade(tenant_config(schema, connection=connection), "head")


def _versions(pg_conn: Any, schema: str) -> frozenset[str] | None:
    """Revisions recorded in ``<schema>.alembic_version``; None if the table is missing."""
    with pg_conn.cursor(row_factory=tuple_row) as cur:
        cur.execute(
            "SELECT 1 FROM pg_tables WHERE schemaname = %s AND tablename = 'alembic_version'",
            (schema,),
        )
        if cur.fetchone() is None:
            return None
        cur.execute(
            sql.SQL("SELECT version_num FROM {}.alembic_version").format(sql.Identifier(schema))
        )
        return frozenset(row[0] for row in cur)


def control_at_head(pg_conn: Any) -> bool:
    return _versions(pg_conn, CONTROL_SCHEMA) == control_heads()


def tenant_at_head(pg_conn: Any, schema: str) -> bool:
    return _versions(pg_conn, schema) == tenant_heads()
