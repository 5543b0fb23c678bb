"""What the operator reads, writing nothing: a tenant's status, the list of tenants, the
object store's readiness and the fleet's health, and the console's pages."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import psycopg

from provisioner import db, queue, storage
from provisioner.control import heartbeats
from provisioner.control.schema import writer_connection
from provisioner.errors import UnknownTenant
from provisioner.fleet import health as fleet_health
from provisioner.fleet import overview as fleet_overview
from provisioner.fleet import rollout, roster
from provisioner.models import Job, TenantId
from provisioner.settings import Settings
from provisioner.templates import migrations
from provisioner.tenant import checks
from provisioner.tenant import row as tenants
from provisioner.tenant.state import TenantState

TenantEntry = roster.TenantEntry


def list_tenants(
    settings: Settings,
    *,
    states: list[TenantState] | None = None,
    behind: bool = False,
    drifted: bool = False,
    check_now: bool = False,
    include_deleted: bool = False,
) -> list[roster.TenantEntry]:
    """The tenants, their state, revision and provisioning status (see :mod:`fleet.roster`)."""
    migrations.check_tenant_tree()
    return roster.list_tenants(
        settings,
        states=states,
        behind=behind,
        drifted=drifted,
        check_now=check_now,
        include_deleted=include_deleted,
    )


@dataclass(frozen=True)
class TenantStatus:
    #: the tenant's most recently changed job of the owner's kinds (never the application's)
    job: Job
    tenant: tenants.Tenant | None
    #: every step run of the tenant's jobs (each with its job_type, run and attempt)
    step_runs: list[queue.StepRunRecord]
    #: every run of the tenant's jobs: job_id, run, job_type, started_by, started_at
    runs: list[queue.JobRunRecord]
    #: its last stored drift check (None: never checked, or the caller's role may not read it)
    last_check: checks.CheckRecord | None = None


def status(settings: Settings, tenant_id: str) -> TenantStatus:
    """Read as the owner when its URL is set (its last drift check is then shown), else as the
    application role."""
    with writer_connection(settings) as conn:
        return status_on(conn, TenantId(tenant_id))


def status_on(conn: psycopg.Connection[Any], tenant: TenantId) -> TenantStatus:
    """:func:`status` read on the caller's connection (in its transaction, nothing written)."""
    with db.translated():
        job = queue.latest_any_for_tenant(conn, tenant)
        if job is None:
            raise UnknownTenant(f"unknown tenant {tenant}: no provisioning job; enqueue it first")
        runs, step_runs = queue.tenant_history(conn, tenant)
        last_check = checks.last_if_readable(conn, tenant.value)
        return TenantStatus(job, tenants.get_tenant(conn, tenant), step_runs, runs, last_check)


def check_storage(settings: Settings) -> dict[str, Any]:
    """Run the object-store readiness check from here; never raises for a store fault."""
    found = storage.readiness(settings)
    return {"ready": found.ready, "provider": found.provider, "detail": found.text}


def health(settings: Settings) -> heartbeats.HealthReport:
    """Readiness, and each tenant server's load and reach (:mod:`provisioner.fleet.health`)."""
    return fleet_health.health(settings)


# -- the console's reads -------------------------------------------------------------------


def overview(settings: Settings) -> fleet_overview.Overview:
    """The fleet at a glance (:mod:`provisioner.fleet.overview`), read as the owner."""
    with writer_connection(settings, "console") as conn, conn.transaction():
        return fleet_overview.read(conn, settings.app_roles)


def server_rows(settings: Settings) -> list[fleet_overview.ServerRow]:
    """The control database and every tenant server, with their references and their tenants'
    jobs, in one snapshot (the console's servers page), read as the owner."""
    with writer_connection(settings, "console") as conn, conn.transaction():
        return fleet_overview.server_rows(conn)


def rollout_history(settings: Settings, limit: int = 20) -> list[rollout.PastRollout]:
    """The newest rollouts, each with its tenants by phase."""
    with writer_connection(settings, "console") as conn:
        return rollout.history(conn, limit)
