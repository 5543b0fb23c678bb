"""Alembic environment of the control schema: version table ``control.alembic_version``.

The connection comes from ``config.attributes["connection"]`` when called from code
(``provisioner migrate``; a Connection, or an Engine as pytest-alembic passes it), else from
``MIGRATIONS_DATABASE_URL`` (or ``-x url=...``).
An advisory lock makes two concurrent ``migrate`` runs take turns instead of colliding.
"""

from __future__ import annotations

import os

import sqlalchemy as sa
from alembic import context

from provisioner.db import SA_CONNECT_ARGS, engine
from provisioner.db.conninfo import DIALECT_URL

CONTROL_SCHEMA = "control"
MIGRATE_LOCK_KEY = 7_220_260_001  # arbitrary, fixed: serialises control migrations
# A migration waits at most this long for a table lock, instead of queueing every query behind it.
LOCK_TIMEOUT = "5s"

config = context.config


def _url() -> str:
    url = context.get_x_argument(as_dictionary=True).get("url") or os.environ.get(
        "MIGRATIONS_DATABASE_URL"
    )
    # Any address libpq accepts (a host list, a service, key=value): handed to libpq as it is.
    return url or config.get_main_option("sqlalchemy.url") or ""


def _configure(connection: sa.Connection) -> None:
    connection.execute(sa.text("SELECT pg_advisory_xact_lock(:key)"), {"key": MIGRATE_LOCK_KEY})
    connection.execute(sa.text(f"SET LOCAL lock_timeout = '{LOCK_TIMEOUT}'"))
    connection.execute(sa.text(f"CREATE SCHEMA IF NOT EXISTS {CONTROL_SCHEMA}"))
    context.configure(
        connection=connection,
        target_metadata=None,
        version_table_schema=CONTROL_SCHEMA,
        transactional_ddl=True,
    )
    with context.begin_transaction():
        context.run_migrations()


def run_offline() -> None:
    context.configure(
        url=DIALECT_URL,  # offline: the dialect only, never a connection
        target_metadata=None,
        literal_binds=True,
        version_table_schema=CONTROL_SCHEMA,
    )
    with context.begin_transaction():
        context.execute(f"SET LOCAL lock_timeout = '{LOCK_TIMEOUT}'")
        context.execute(f"CREATE SCHEMA IF NOT EXISTS {CONTROL_SCHEMA}")
        context.run_migrations()


def run_online() -> None:
    connection = config.attributes.get("connection")
    if isinstance(connection, sa.Engine):  # e.g. pytest-alembic's alembic_engine
        with connection.begin() as begun:
            _configure(begun)
        return
    if connection is not None:
        _configure(connection)
        return
    owner = engine(_url(), poolclass=sa.pool.NullPool, connect_args=SA_CONNECT_ARGS)
    with owner.begin() as connection:
        _configure(connection)


if context.is_offline_mode():
    run_offline()
else:
    run_online()
