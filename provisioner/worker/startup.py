"""What the worker checks before it starts, and refuses to start without.

Each refusal is a :class:`ConfigurationError` (or :class:`InvalidInput` for an unknown job type):
one line, exit code 2, nothing started. The object store being *down* is not a refusal: the
worker starts and reports it in its heartbeat (``detail["storage"]``), which ``health`` reads.
"""

from __future__ import annotations

import logging
from contextlib import closing
from typing import Any

import psycopg

from provisioner import db, kinds, servers, storage
from provisioner.control import heartbeats
from provisioner.control import naming as control_naming
from provisioner.errors import (
    ConfigurationError,
    DatabaseUnavailable,
)
from provisioner.logs import event
from provisioner.settings import Settings, tenant_naming
from provisioner.templates import migrations, seeds
from provisioner.tenant import app_role

#: The refusal of a worker whose owner URL leads to a pooler in transaction mode.
TRANSACTION_POOLED = (
    "MIGRATIONS_DATABASE_URL goes through a connection pooler in transaction mode (PgBouncer "
    "pool_mode=transaction): the worker needs a session of its own (LISTEN, advisory locks, "
    "prepared statements); connect the worker directly to PostgreSQL (or through session "
    "pooling), and keep the pooler for the application"
)


def check_configuration(settings: Settings) -> None:
    """Refuse settings this worker cannot run with; touches nothing outside the process."""
    registry = kinds.for_settings(settings)  # ConfigurationError: a kind module did not load
    job_types = settings.worker_job_types or registry.default_worker
    registry.check(job_types)  # InvalidInput for an unknown type
    unhandled = sorted(set(job_types) - registry.handled)
    if unhandled:
        raise ConfigurationError(
            f"this worker has no handler for job type(s) {', '.join(unhandled)}: it runs "
            f"{', '.join(sorted(registry.handled))} only (PROVISIONER_WORKER_JOB_TYPES)"
        )
    for name in job_types:
        registry[name].steps  # noqa: B018 -- a step module that does not import refuses here
    for name, value in (
        ("MIGRATIONS_DATABASE_URL", settings.migrations_database_url),
        ("APP_DATABASE_URL", settings.app_database_url),
    ):
        if not value:
            raise ConfigurationError(
                f"{name} is not set: the worker needs both database URLs and never falls back "
                "to the embedded local database"
            )
    if settings.heartbeat_seconds * 2 > settings.job_stale_after_seconds:
        raise ConfigurationError(
            f"PROVISIONER_HEARTBEAT_SECONDS ({settings.heartbeat_seconds:g}) must be at most half "
            f"of PROVISIONER_JOB_STALE_AFTER_SECONDS ({settings.job_stale_after_seconds:g}), or "
            "live jobs would look abandoned"
        )
    migrations.check_tenant_tree()  # a missing or unreadable PROVISIONER_TENANT_TREE
    seeds.check_declared(settings.seeds, migrations.tenant_tree())  # before step 4 meets them
    tenant_naming()  # a schema pattern or tenant-id rule that cannot work
    settings.check_object_store_path()
    storage.store_from_settings(settings)  # ConfigurationError for a store that cannot work


def connect_for_start(name: str, url: str) -> psycopg.Connection[Any]:
    """A connection for a start-up check; a refused login is a refusal to start (exit 2).

    Every connection is bounded by :data:`db.CONNECT_TIMEOUT_SECONDS`, so a silent server fails
    the check instead of hanging it; the error names the URL's variable, never its text.
    """
    try:
        return db.connect(url, application_name="provisioner-worker")
    except DatabaseUnavailable as exc:
        if db.login_refused(exc):
            raise ConfigurationError(f"{name}: the server refused the login: {exc}") from exc
        raise DatabaseUnavailable(f"{name}: {exc}") from exc


def check_database(settings: Settings, *, allow_superuser: bool, log: logging.Logger) -> None:
    """Both URLs connect, the owner URL leads to a session of its own (no pooler in transaction
    mode), the control schema is at head, the owner URL is not a superuser unless allowed, and
    the application role is one a revoke cuts off: it exists, is neither a superuser nor the
    owner, and is the role APP_DATABASE_URL gets its access through."""
    owner = connect_for_start("MIGRATIONS_DATABASE_URL", settings.owner_url)
    with closing(owner), db.translated():
        at_head = migrations.control_at_head(owner)
        superuser = heartbeats.connected_as_superuser(owner)
        app_role.check(owner, settings.app_roles)
        if at_head:  # the record is read only where its table is known to exist
            control_naming.check(owner, tenant_naming())
    app = connect_for_start("APP_DATABASE_URL", settings.app_url)
    with closing(app), db.translated():
        app_role.check_reached(app, settings.control_role, "APP_DATABASE_URL")
    if db.transaction_pooled(settings.owner_url, application_name="provisioner-worker"):
        raise ConfigurationError(TRANSACTION_POOLED)
    if not at_head:
        raise ConfigurationError("the control schema is not at head: run `provisioner migrate`")
    if superuser and not allow_superuser:
        raise ConfigurationError(
            "MIGRATIONS_DATABASE_URL connects as a superuser: the worker refuses to run with "
            "more power than the owner role needs; use the owner role, or pass --allow-superuser"
        )
    if superuser:
        message = (
            "WARNING: MIGRATIONS_DATABASE_URL connects as a SUPERUSER (--allow-superuser); a bug "
            "or a hostile migration could do anything to this server"
        )
        event(log, "superuser_allowed", logging.WARNING, message=message)
    # Every active tenant server: reached as the owner (credentials from libpq's sources), an
    # ordinary role, its tool schema at this build's version (ServerUnready, exit 2).
    with closing(connect_for_start("MIGRATIONS_DATABASE_URL", settings.owner_url)) as control:
        servers.require_ready(control, settings.owner_url)


def storage_status(settings: Settings) -> dict[str, Any]:
    """The object-store check, shaped for the heartbeat's ``storage`` field: ``ready``,
    ``provider``, and ``detail`` (what was checked) or ``error`` (why it is not ready). A store
    fault is reported here, never raised: a worker whose store is down still starts."""
    found = storage.readiness(settings)
    return {
        "ready": found.ready,
        "provider": found.provider,
        "detail" if found.ready else "error": found.text,
    }
