"""The library's public functions, re-exported at the package top level (``provisioner.X``).

    import provisioner

    provisioner.enqueue(session, "acme")            # in the caller's transaction
    await provisioner.enqueue_async(aconn, "acme")  # the same, for async applications
    provisioner.provision("acme")                   # now, in this process
    provisioner.status("acme")
    provisioner.upgrade(dry_run=True)

``settings`` defaults to :meth:`Settings.from_env`; with no database URL set, the embedded
PostgreSQL under ``.provisioner/`` is used (started and migrated on first use), as the CLI does.
Everything raises :class:`ProvisionerError` subclasses (see :mod:`provisioner.errors`).
"""

from __future__ import annotations

from provisioner import service
from provisioner.db import caller as connections
from provisioner.engine import ProgressCallback, ignore_progress
from provisioner.kinds.provision import ensure_provision_job, ensure_provision_job_async
from provisioner.models import Job, TenantId
from provisioner.service import ProvisionResult, TenantStatus, UpgradeReport
from provisioner.settings import Settings


def _settings(settings: Settings | None) -> Settings:
    return service.resolve(settings if settings is not None else Settings.load())


def enqueue(conn: connections.SyncConnection, tenant_id: str) -> Job:
    """Queue ``tenant_id``'s provisioning job in the caller's transaction, and return it.

    ``conn`` is a SQLAlchemy ``Session`` or ``Connection`` on the psycopg 3 driver, or a psycopg
    ``Connection``. Nothing is committed here: the job (and the NOTIFY that wakes a worker) goes
    out with the caller's commit, or not at all. Idempotent: a tenant has one provisioning job;
    a failed or cancelled one is queued again. A bad id or an unsupported connection (psycopg2)
    raises :class:`InvalidInput` before anything is sent.
    """
    tenant = TenantId(tenant_id)
    pg = connections.sync_connection(conn)
    return ensure_provision_job(pg, tenant, retry_terminal=True).job


async def enqueue_async(conn: connections.AsyncConnectionLike, tenant_id: str) -> Job:
    """:func:`enqueue` for a psycopg ``AsyncConnection``: the same statements, awaited."""
    tenant = TenantId(tenant_id)
    pg = await connections.async_connection(conn)
    return (await ensure_provision_job_async(pg, tenant, retry_terminal=True)).job


def provision(
    tenant_id: str,
    *,
    settings: Settings | None = None,
    on_progress: ProgressCallback = ignore_progress,
) -> ProvisionResult:
    """Provision ``tenant_id`` now, in this process (resumes or repairs; a no-op when done).

    ``result.job.status`` says how it ended; a failure is recorded in the job, not raised.
    """
    return service.provision(_settings(settings), tenant_id, on_progress=on_progress)


def status(tenant_id: str, *, settings: Settings | None = None) -> TenantStatus:
    """The tenant's provisioning job, control row and step history; UnknownTenant if none."""
    return service.status(_settings(settings), tenant_id)


def upgrade(
    tenant_ids: list[str] | None = None, *, settings: Settings | None = None, dry_run: bool = False
) -> UpgradeReport:
    """Queue provisioned tenants (all when ``tenant_ids`` is None) whose schema is behind the
    tenant template's head, for a worker to bring up."""
    return service.upgrade(_settings(settings), tenant_ids, dry_run=dry_run)
