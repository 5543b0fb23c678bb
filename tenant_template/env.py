"""Alembic environment applied inside ONE tenant schema.

Every object, the ``alembic_version`` table included, lands in that schema and nowhere else:
the revisions use schema-less names and the transaction's ``search_path`` is the tenant schema
alone (no ``public`` fallback), so an unqualified name can never resolve elsewhere.

The schema comes from ``config.attributes["tenant_schema"]`` when called from code, or
``-x tenant_schema=NAME`` by hand. It must be a tenant's schema under the project's naming rule
(``config.attributes["tenant_naming"]``, which the tool passes; by hand, the project's
``schema_pattern`` and tenant-id rule from provisioner.toml or the environment), or one of the
tool's own scratch schemas. The connection comes from ``config.attributes["connection"]``
(a Connection, or an Engine as pytest-alembic passes it)
or from ``MIGRATIONS_DATABASE_URL`` / ``-x url=...``. ``upgrade head --sql`` prints the SQL.
"""

from __future__ import annotations

import os

import sqlalchemy as sa
from alembic import context

from provisioner.db import SA_CONNECT_ARGS, engine
from provisioner.db.conninfo import DIALECT_URL
from provisioner.settings import tenant_naming

# A migration waits at most this long for a table lock, instead of queueing every query behind it.
# Overridden by config.attributes["lock_timeout"] or -x lock_timeout=...; online, a lock_timeout
# the caller's transaction already set (the provisioner's PROVISIONER_LOCK_TIMEOUT_SECONDS) wins.
DEFAULT_LOCK_TIMEOUT = "5s"

config = context.config
x_args = context.get_x_argument(as_dictionary=True)


def tenant_schema() -> str:
    schema = config.attributes.get("tenant_schema") or x_args.get("tenant_schema")
    naming = config.attributes.get("tenant_naming") or tenant_naming()
    expected = naming.schema_pattern.replace("{id}", "<id>")
    if not schema:
        raise SystemExit(f"the tenant tree needs a schema: pass -x tenant_schema={expected}")
    if not naming.accepts(schema):
        raise SystemExit(f"invalid tenant schema {str(schema)[:80]!r}: expected {expected}")
    return str(schema)


def _explicit_lock_timeout() -> str | None:
    value = config.attributes.get("lock_timeout") or x_args.get("lock_timeout")
    return str(value) if value else None


def _lock_timeout(connection: sa.Connection) -> str:
    explicit = _explicit_lock_timeout()
    if explicit:
        return explicit
    current = connection.execute(sa.text("SELECT current_setting('lock_timeout')")).scalar()
    return str(current) if current and current != "0" else DEFAULT_LOCK_TIMEOUT


def _url() -> str:
    url = x_args.get("url") or os.environ.get("MIGRATIONS_DATABASE_URL")
    # Any address libpq accepts (a host list, a service, key=value): handed to libpq as it is.
    return url or config.get_main_option("sqlalchemy.url") or ""


def _run(connection: sa.Connection, schema: str) -> None:
    # Transaction-local: ends with the migration's transaction and never leaks into a pool.
    lock_timeout = _lock_timeout(connection)
    connection.execute(sa.text("SELECT set_config('lock_timeout', :t, true)"), {"t": lock_timeout})
    connection.execute(sa.text("SELECT set_config('search_path', :s, true)"), {"s": f'"{schema}"'})
    context.configure(
        connection=connection,
        target_metadata=None,
        version_table_schema=schema,
        transactional_ddl=True,
        # The tool's callback: it names the revision that failed (provisioner.templates).
        on_version_apply=config.attributes.get("on_version_apply"),
    )
    with context.begin_transaction():
        context.run_migrations()


def run_offline(schema: str) -> None:
    context.configure(
        url=DIALECT_URL,  # offline: the dialect only, never a connection
        target_metadata=None,
        literal_binds=True,
        # As Alembic's own env.py template: psycopg's paramstyle (pyformat) would write every
        # '%' of the SQL as '%%' (LIKE 'https://%' as 'https://%%'), which is another statement.
        dialect_opts={"paramstyle": "named"},
        version_table_schema=schema,
    )
    with context.begin_transaction():
        lock_timeout = _explicit_lock_timeout() or DEFAULT_LOCK_TIMEOUT
        context.execute(f"SET LOCAL lock_timeout = '{lock_timeout}'")
        context.execute(f'SET LOCAL search_path TO "{schema}"')
        context.run_migrations()


def run_online(schema: str) -> None:
    connection = config.attributes.get("connection")
    if isinstance(connection, sa.Engine):  # e.g. pytest-alembic's alembic_engine
        with connection.begin() as begun:
            _run(begun, schema)
        return
    if connection is not None:
        _run(connection, schema)
        return
    owner = engine(_url(), poolclass=sa.pool.NullPool, connect_args=SA_CONNECT_ARGS)
    with owner.begin() as connection:
        _run(connection, schema)


if context.is_offline_mode():
    run_offline(tenant_schema())
else:
    run_online(tenant_schema())
