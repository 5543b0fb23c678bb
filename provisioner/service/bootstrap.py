"""The database the commands run against, made ready: the embedded default filled in when no
URL is set (:func:`resolve`), the control schema migrated and the project's tenant naming
recorded (:func:`migrate`, :func:`record_naming`)."""

from __future__ import annotations

from contextlib import closing
from dataclasses import replace

from provisioner import db
from provisioner.control import naming as control_naming
from provisioner.local import cluster as local_pg
from provisioner.local import state as embedded
from provisioner.settings import Settings, tenant_naming
from provisioner.templates import migrations


def resolve(
    settings: Settings, *, migrate: bool = True, notify: local_pg.Notify | None = None
) -> Settings:
    """Fill in the embedded default when no database URL is set, migrated and ready.

    The state folder is looked up like git's (:func:`embedded.locate_state_dir`); ``notify``
    hears when a cluster is created or a server started.
    """
    if not settings.embedded:
        return settings
    state_dir = embedded.locate_state_dir(settings.state_dir)
    names = tuple(role.name for role in settings.app_roles)
    urls = embedded.ensure_embedded(state_dir, notify or (lambda message: None), names)
    resolved = replace(
        settings,
        state_dir=state_dir,
        migrations_database_url=urls.owner,
        app_database_url=urls.app,
        object_store_path=settings.object_store_path or urls.objects,
    )
    if migrate:
        with closing(db.connect(urls.owner)) as conn, db.translated():
            at_head = migrations.control_at_head(conn)
        if not at_head:  # one query when it is, instead of an Alembic run
            migrations.upgrade_control(urls.owner, resolved.control_role)
            record_naming(urls.owner)
    return resolved


def migrate(settings: Settings) -> tuple[str | None, str | None]:
    """Control schema to head with the owner URL, and the project's tenant naming recorded
    (:func:`record_naming`); (revision before, revision after)."""
    revisions = migrations.upgrade_control(settings.owner_url, settings.control_role)
    record_naming(settings.owner_url)
    return revisions


def record_naming(owner_url: str) -> bool:
    """Record the project's tenant naming in the control database (True: it changed), which
    holds the application role's registrations to it; refused (ConfigurationError, nothing
    written) under tenants the new rule would not name (:mod:`provisioner.control.naming`)."""
    with closing(db.connect(owner_url)) as conn, db.translated():
        changed = control_naming.record(conn, tenant_naming())
        conn.commit()
    return changed
