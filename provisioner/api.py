"""The library's public functions, re-exported at the package top level (``provisioner.X``).

    import provisioner

    provisioner.enqueue(session, "acme")            # in the caller's transaction
    await provisioner.enqueue_async(aconn, "acme")  # the same, for async applications
    provisioner.provision("acme")                   # now, in this process
    provisioner.status("acme")                      # or status("acme", conn=session)
    provisioner.locate("acme")                      # the server it lives on
    provisioner.upgrade(dry_run=True)
    provisioner.suspend("acme"); provisioner.restore("acme")
    provisioner.deprovision("acme", purge=True)
    provisioner.check(); provisioner.health()

``settings`` defaults to :meth:`Settings.load` (the project file under the environment); with no
database URL set, the embedded PostgreSQL under ``.provisioner/`` is used (started and migrated
on first use), as the CLI does.
Everything raises :class:`ProvisionerError` subclasses (see :mod:`provisioner.errors`).
"""

from __future__ import annotations

from provisioner import servers, service
from provisioner.control.heartbeats import HealthReport
from provisioner.db import caller as connections
from provisioner.engine import ProgressCallback, ignore_progress
from provisioner.fleet.drift import DriftReport
from provisioner.kinds import lifecycle
from provisioner.kinds.provision import ensure_provision_job, ensure_provision_job_async
from provisioner.models import Job, TenantId
from provisioner.servers import Location
from provisioner.service import LifecycleResult, ProvisionResult, TenantStatus, UpgradeReport
from provisioner.settings import Settings


def _settings(settings: Settings | None) -> Settings:
    return service.resolve(settings if settings is not None else Settings.load())


def enqueue(conn: connections.SyncConnection, tenant_id: str, *, server: str | None = None) -> Job:
    """Queue ``tenant_id``'s provisioning job in the caller's transaction, and return it.

    ``conn`` is a SQLAlchemy ``Session`` or ``Connection`` on the psycopg 3 driver, or a psycopg
    ``Connection``. Nothing is committed here: the job (and the NOTIFY that wakes a worker) goes
    out with the caller's commit, or not at all. Idempotent: a tenant has one provisioning job;
    a failed or cancelled one is queued again. A bad id or an unsupported connection (psycopg2)
    raises :class:`InvalidInput` before anything is sent.

    A new tenant is placed on the least loaded active tenant server (``server`` names one);
    :class:`NoServerRoom` when none takes it (nothing is written; the caller's transaction is
    aborted by the failed statement, as by any other). ``server="control"`` (the control
    database) is taken for a tenant that lives there, or a new one while the directory has no
    server but retired ones; else :class:`InvalidInput` before anything is written.
    """
    tenant = TenantId(tenant_id)
    named = None if server is None else servers.placement_name(server)
    pg = connections.sync_connection(conn)
    return ensure_provision_job(pg, tenant, retry_terminal=True, server=named).job


async def enqueue_async(
    conn: connections.AsyncConnectionLike, tenant_id: str, *, server: str | None = None
) -> Job:
    """:func:`enqueue` for async applications: a psycopg ``AsyncConnection``, or SQLAlchemy's
    ``AsyncSession``/``AsyncConnection`` on the psycopg driver (``postgresql+psycopg://``);
    the same statements, awaited, in the caller's transaction."""
    tenant = TenantId(tenant_id)
    named = None if server is None else servers.placement_name(server)
    pg = await connections.async_connection(conn)
    return (await ensure_provision_job_async(pg, tenant, retry_terminal=True, server=named)).job


def locate(
    tenant_id: str,
    *,
    settings: Settings | None = None,
    conn: connections.SyncConnection | None = None,
) -> Location:
    """Where ``tenant_id`` lives: ``location.server`` (``"control"`` for the control database)
    and ``location.conninfo``, its connection reference without a password (None: the control
    database, reached as usual). UnknownTenant if it has no control row. With ``conn`` it is
    read on the caller's connection (one query), as :func:`status` does."""
    tenant = TenantId(tenant_id)
    if conn is not None:
        return servers.locate(connections.sync_connection(conn), tenant)
    return service.locate(_settings(settings), tenant_id)


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


def status(
    tenant_id: str,
    *,
    settings: Settings | None = None,
    conn: connections.SyncConnection | None = None,
) -> TenantStatus:
    """The tenant's latest job, control row and step history; UnknownTenant if none.

    With ``conn`` (what :func:`enqueue` accepts) it is read on the caller's connection, in its
    transaction, instead of a connection opened for the call (about 0.3 ms instead of 12)."""
    if conn is not None:
        return service.status_on(connections.sync_connection(conn), TenantId(tenant_id))
    return service.status(_settings(settings), tenant_id)


def _lifecycle(
    tenant_id: str, job_type: str, settings: Settings | None, queue: bool
) -> LifecycleResult:
    return service.change_lifecycle(_settings(settings), tenant_id, job_type, queue_only=queue)


def suspend(
    tenant_id: str, *, settings: Settings | None = None, queue: bool = False
) -> LifecycleResult:
    """Take every privilege of the application role on the tenant's schema away at once (data
    untouched; state ``suspended``), here or (``queue``) by a worker. Owner credentials."""
    return _lifecycle(tenant_id, lifecycle.SUSPEND_JOB_TYPE, settings, queue)


def restore(
    tenant_id: str, *, settings: Settings | None = None, queue: bool = False
) -> LifecycleResult:
    """Give a suspended or archived tenant's privileges back, as provisioning grants them."""
    return _lifecycle(tenant_id, lifecycle.RESTORE_JOB_TYPE, settings, queue)


def deprovision(
    tenant_id: str, *, purge: bool = False, settings: Settings | None = None, queue: bool = False
) -> LifecycleResult:
    """Offboard: revoke and archive (data kept, restorable); ``purge=True`` drops the schema and
    its data for good (state ``deleted``)."""
    job_type = lifecycle.PURGE_JOB_TYPE if purge else lifecycle.DEPROVISION_JOB_TYPE
    return _lifecycle(tenant_id, job_type, settings, queue)


def check(tenant_ids: list[str] | None = None, *, settings: Settings | None = None) -> DriftReport:
    """Compare tenants' catalogs (all provisioned ones when ``tenant_ids`` is None) with what
    the template head builds (read-only)."""
    return service.check(_settings(settings), tenant_ids)


def health(*, settings: Settings | None = None) -> HealthReport:
    """Readiness of the workers, from their heartbeats (``report.ready``)."""
    return service.health(_settings(settings))


def upgrade(
    tenant_ids: list[str] | None = None, *, settings: Settings | None = None, dry_run: bool = False
) -> UpgradeReport:
    """Queue provisioned tenants (all when ``tenant_ids`` is None) whose schema is behind the
    tenant template's head, for a worker to bring up."""
    return service.upgrade(_settings(settings), tenant_ids, dry_run=dry_run)
