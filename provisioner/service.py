"""The library facade: what the CLI, the worker and tests call. It never prints or exits.

Settings come in resolved by :func:`resolve` (embedded PostgreSQL when no URL is set); each
function opens what it needs, does one thing, and returns plain values.
"""

from __future__ import annotations

import os
import socket
import time
from collections.abc import Iterator
from contextlib import closing, contextmanager
from dataclasses import dataclass, replace
from typing import Any
from uuid import UUID

import psycopg

from provisioner import (
    db,
    drift,
    fleet,
    heartbeats,
    local_pg,
    migrations,
    queue,
    rollout,
    tenants,
)
from provisioner.engine import Engine, ProgressCallback, StopRequested, ignore_progress, never_stop
from provisioner.errors import (
    ConfigurationError,
    InvalidInput,
    StorageMisconfigured,
    StorageUnavailable,
    TenantBusy,
    UnknownTenant,
)
from provisioner.models import Job, JobStatus, TenantId

__all__ = ["TenantId", "local_pg"]
from provisioner.settings import Settings
from provisioner.storage import store_from_settings


def holder_id(kind: str) -> str:
    """A lease holder name, unique per process, visible as the sessions' application_name."""
    return f"{kind}:{socket.gethostname()[:24]}:{os.getpid()}"


def resolve(settings: Settings, *, migrate: bool = True) -> Settings:
    """Fill in the embedded default when no database URL is set, migrated and ready."""
    if not settings.embedded:
        return settings
    urls = local_pg.ensure_embedded(settings.state_dir)
    resolved = replace(
        settings,
        migrations_database_url=urls.owner,
        app_database_url=urls.app,
        object_store_path=settings.object_store_path or urls.objects,
    )
    if migrate:
        with closing(db.connect(urls.owner)) as conn, db.translated():
            at_head = migrations.control_at_head(conn)
        if not at_head:  # one query when it is, instead of an Alembic run
            migrations.upgrade_control(urls.owner, resolved.app_role)
    return resolved


@contextmanager
def app_connection(
    settings: Settings, name: str = "provisioner"
) -> Iterator[psycopg.Connection[Any]]:
    """An application-role connection; commits on success, rolls back on error."""
    with closing(db.connect(settings.app_url, application_name=name)) as conn, db.translated():
        yield conn  # closing without a commit rolls back
        conn.commit()


def migrate(settings: Settings) -> tuple[str | None, str | None]:
    """Control schema to head with the owner URL; (revision before, revision after)."""
    return migrations.upgrade_control(settings.owner_url, settings.app_role)


def require_control_at_head(conn: psycopg.Connection[Any]) -> None:
    """Refuse to work on a control schema older (or newer) than this release's tree.

    ``conn`` is the owner's: the application role cannot read the version table.
    """
    with db.translated():
        if not migrations.control_at_head(conn):
            raise ConfigurationError(
                "the control schema is not at this release's head: run `provisioner migrate`"
            )


def enqueue(settings: Settings, tenant_id: str) -> queue.Enqueued:
    """Idempotently enqueue the tenant's provisioning job (re-queues a failed one)."""
    tenant = TenantId(tenant_id)
    with app_connection(settings) as conn:
        return queue.ensure_provision_job(conn, tenant, retry_terminal=True)


@dataclass(frozen=True)
class ProvisionResult:
    job: Job
    #: True when the tenant was already provisioned and the catalog confirmed it: nothing ran.
    already_provisioned: bool = False


def provision(
    settings: Settings,
    tenant_id: str,
    *,
    on_progress: ProgressCallback = ignore_progress,
    should_stop: StopRequested = never_stop,
    holder: str | None = None,
) -> ProvisionResult:
    """Provision one tenant now, in this process, through its job row and the step engine.

    Resumes a half-done tenant; repairs a provisioned one whose schema lost part of its effect;
    says so when there is nothing to do. Raises TenantBusy if a live process holds the job.
    """
    tenant = TenantId(tenant_id)
    holder = holder or holder_id("cli")
    with Engine.from_settings(settings, holder) as engine:
        # One owner session does the bookkeeping (the engine's own): each new connection costs
        # several milliseconds, a large share of a provisioning that takes a few dozen.
        conn = engine.control
        require_control_at_head(conn)
        with db.translated(), conn.transaction():
            job = queue.ensure_provision_job(conn, tenant, retry_terminal=True).job
        if job.status is JobStatus.SUCCEEDED:
            if not engine.missing_effects(tenant):
                return ProvisionResult(job, already_provisioned=True)
            with db.translated():
                job = queue.reopen(conn, job.id)
        claimed = _claim_when_free(conn, job.id, holder)
        if claimed is None:
            with db.translated():
                current = queue.get_job(conn, job.id)
            raise TenantBusy(
                f"tenant {tenant} is being provisioned by {current.locked_by} "
                f"({current.status.value}, {current.progress}%); follow it with "
                f"`provisioner status {tenant} --watch`"
            )
        return ProvisionResult(
            engine.run(claimed, on_progress=on_progress, should_stop=should_stop)
        )


def _claim_when_free(
    conn: psycopg.Connection[Any], job_id: UUID, holder: str, grace_seconds: float = 3.0
) -> Job | None:
    """Claim the job, waiting briefly for a just-killed holder's sessions to disappear."""
    deadline = time.monotonic() + grace_seconds
    while True:
        with db.translated():
            claimed = queue.claim_job(conn, job_id, holder)
        if claimed is not None or time.monotonic() >= deadline:
            return claimed
        time.sleep(0.1)


TenantUpgrade = fleet.TenantUpgrade
UpgradeReport = fleet.UpgradeReport


def upgrade(
    settings: Settings,
    tenant_ids: list[str] | None = None,
    *,
    dry_run: bool = False,
    canary: int | None = None,
    max_failures: int | None = None,
) -> UpgradeReport:
    """Queue the provisioned tenants behind the tenant template's head as a rollout (see
    :mod:`fleet` and :mod:`rollout`)."""
    return fleet.upgrade(
        settings, tenant_ids, dry_run=dry_run, canary=canary, max_failures=max_failures
    )


def upgrade_resume(settings: Settings) -> rollout.Resumed:
    return fleet.resume(settings)


def upgrade_abort(settings: Settings) -> rollout.Aborted:
    return fleet.abort(settings)


def upgrade_progress(settings: Settings) -> rollout.Progress:
    return fleet.progress(settings)


def tenants_per_head(settings: Settings) -> dict[str, int]:
    return fleet.tenants_per_head(settings)


def wait_for_canary(settings: Settings, rollout_id: int) -> dict[str, int]:
    return fleet.wait_for_canary(settings, rollout_id)


def check(settings: Settings, tenant_ids: list[str] | None = None) -> drift.DriftReport:
    """Compare tenants' catalogs with the template head's shape (see :mod:`drift`)."""
    return drift.check(settings, tenant_ids)


def retry_failed(settings: Settings, kind: str | None = None) -> list[Job]:
    """Queue every failed job (of job type ``kind``, or all) again, as the owner."""
    conn = db.connect(settings.owner_url, application_name="retry")
    with closing(conn), db.translated():
        jobs = queue.retry_failed(conn, kind)
        conn.commit()
    return jobs


@dataclass(frozen=True)
class TenantStatus:
    job: Job
    tenant: tenants.Tenant | None
    step_runs: list[dict[str, Any]]


def status(settings: Settings, tenant_id: str) -> TenantStatus:
    tenant = TenantId(tenant_id)
    with app_connection(settings) as conn:
        job = queue.latest_for_tenant(conn, tenant)
        if job is None:
            raise UnknownTenant(f"unknown tenant {tenant}: no provisioning job; enqueue it first")
        return TenantStatus(job, tenants.get_tenant(conn, tenant), queue.step_runs(conn, job.id))


def list_jobs(settings: Settings, *, status: str | None = None, limit: int = 50) -> list[Job]:
    if status is not None and status not in {s.value for s in JobStatus}:
        raise InvalidInput(
            f"unknown status {status!r}; one of {', '.join(s.value for s in JobStatus)}"
        )
    with app_connection(settings) as conn:
        return queue.list_jobs(conn, status=status, limit=limit)


def parse_job_id(raw: str) -> UUID:
    try:
        return UUID(raw)
    except ValueError:
        raise InvalidInput(f"invalid job id {raw!r}: expected a UUID") from None


def retry_job(settings: Settings, job_id: str) -> Job:
    with app_connection(settings) as conn:
        return queue.retry(conn, parse_job_id(job_id))


def cancel_job(settings: Settings, job_id: str) -> Job:
    with app_connection(settings) as conn:
        return queue.cancel(conn, parse_job_id(job_id))


def check_storage(settings: Settings) -> dict[str, Any]:
    """Run the object-store readiness check from here; never raises for a store fault."""
    store = store_from_settings(settings)
    try:
        store.check()
    except (StorageMisconfigured, StorageUnavailable) as exc:
        return {"ready": False, "provider": store.provider, "detail": str(exc)}
    return {"ready": True, "provider": store.provider, "detail": store.describe()}


def health(settings: Settings) -> heartbeats.HealthReport:
    required = {settings.worker_component: frozenset(settings.worker_job_types)}
    with app_connection(settings) as conn:
        return heartbeats.readiness(conn, required, settings.heartbeat_seconds)
