"""The control schema as every command meets it: is it at this release's head, and the
connections the commands open on it (refusing, in one line, a schema that is missing or not
migrated instead of failing on a SQL error).

Below both :mod:`provisioner.service` and :mod:`provisioner.fleet`, so the fleet's commands
check the same rule without importing the façade.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import closing, contextmanager
from typing import Any

import psycopg

from provisioner import db
from provisioner.control import naming as control_naming
from provisioner.errors import ConfigurationError
from provisioner.naming import TenantNaming
from provisioner.settings import Settings
from provisioner.templates import migrations

#: What a command says of a control schema at another revision than this release's head.
NOT_AT_HEAD = "the control schema is not at this release's head: run `provisioner migrate`"


def require_control_at_head(
    conn: psycopg.Connection[Any], naming: TenantNaming | None = None
) -> None:
    """Refuse to work on a control schema older (or newer) than this release's tree, and, with
    ``naming`` (the configured one), under a tenant naming other than the one the control
    database records (:func:`provisioner.control.naming.check`, as a worker refuses to start):
    a command that works on existing tenants (suspend, restore, deprovision, purge) would
    otherwise name their schemas another way. Nothing is changed.

    ``conn`` is the owner's: the application role cannot read the version table.
    """
    with db.translated():
        if not migrations.control_at_head(conn):
            raise ConfigurationError(NOT_AT_HEAD)
        if naming is not None:  # its table is known to exist at the head
            control_naming.check(conn, naming)


@contextmanager
def app_connection(
    settings: Settings, name: str = "provisioner"
) -> Iterator[psycopg.Connection[Any]]:
    """An application-role connection; commits on success, rolls back on error."""
    connection = closing(db.connect(settings.app_url, application_name=name))
    with control_ready(), connection as conn, db.translated():
        yield conn  # closing without a commit rolls back
        conn.commit()


@contextmanager
def writer_connection(
    settings: Settings, name: str = "provisioner"
) -> Iterator[psycopg.Connection[Any]]:
    """The owner's connection when its URL is set, else the application role's.

    Row-level security (control c005) lets app_rw only insert a queued provisioning job: re-queue,
    retry and cancel of a provisioning job need the owner (MIGRATIONS_DATABASE_URL).
    """
    url = settings.migrations_database_url or settings.app_url
    with control_ready(), closing(db.connect(url, application_name=name)) as conn, db.translated():
        yield conn
        conn.commit()


@contextmanager
def control_ready() -> Iterator[None]:
    """A control schema that is missing or not migrated says so, instead of a SQL error."""
    try:
        yield
    except db.DatabaseError as exc:
        if db.control_missing(exc):
            raise ConfigurationError(
                "the control schema is not migrated (or is older than this release): run "
                "`provisioner migrate`"
            ) from exc
        raise
