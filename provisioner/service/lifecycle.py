"""One tenant's provisioning and lifecycle changes: enqueue, provision, suspend, restore,
deprovision, purge (and one lifecycle kind for many tenants), each refused up front when the
control schema, the application role or the tenant's state does not allow it."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import psycopg

from provisioner import db, kinds, queue, servers
from provisioner.control import naming as control_naming
from provisioner.control.schema import (
    NOT_AT_HEAD,
    control_ready,
    require_control_at_head,
    writer_connection,
)
from provisioner.engine import (
    Engine,
    ProgressCallback,
    StopRequested,
    ignore_progress,
    never_stop,
    runner,
)
from provisioner.engine.holder import holder_id
from provisioner.errors import ConfigurationError, UnknownTenant, WrongState
from provisioner.fleet import bulk
from provisioner.kinds import lifecycle as tenant_lifecycle
from provisioner.kinds.provision import PROVISION_JOB_TYPE, ensure_provision_job
from provisioner.models import Job, JobStatus, TenantId
from provisioner.roles import AppRoles
from provisioner.settings import Settings
from provisioner.templates import migrations, seeds
from provisioner.tenant import app_role
from provisioner.tenant import row as tenants
from provisioner.tenant.state import INACTIVE, TenantState


def no_announcement() -> None:
    """The default ``on_start`` of :func:`provision` and :func:`change_lifecycle`: a caller
    that prints no first line (the API, the tests)."""


def _refuse_unready(
    conn: psycopg.Connection[Any],
    tenant: TenantId,
    command: str,
    *,
    reuse_deleted: bool,
    roles: AppRoles,
) -> None:
    """:func:`require_control_at_head`, :func:`app_role.check`, the recorded tenant naming
    (:func:`provisioner.control.naming.check`) and :func:`refuse_inactive` in one round trip (a
    one-off provisioning's first): the control schema's revisions, the application role's
    standing, the naming and the tenant's state read in one pipeline. With
    ``reuse_deleted`` a deleted tenant is made pending first, in the caller's transaction (its
    row read back costs a second round trip), which rolls it back when a check refuses."""
    with control_ready(), db.translated(), db.pipeline(conn):
        versions = migrations.read_control_versions(conn)
        standing = app_role.send_check(conn, roles)
        naming = control_naming.send_read(conn)
        if reuse_deleted:
            tenants.reuse_deleted(conn, tenant)
        state = tenants.state_of(conn, tenant)
        if frozenset(versions) != migrations.control_heads():
            raise ConfigurationError(NOT_AT_HEAD)
        app_role.finish_check(standing)
        control_naming.finish_check(naming, tenant.naming)
    _refuse_state(tenant, state, command)


def refuse_inactive(conn: psycopg.Connection[Any], tenant: TenantId, command: str) -> None:
    """WrongState (exit 2) for a suspended, archived or deleted tenant: control.tenants.state
    is authoritative, and provisioning would give the application role its access back."""
    with db.translated():
        state = tenants.state_of(conn, tenant)
    _refuse_state(tenant, state, command)


#: What to do about a tenant in each of the states provisioning leaves alone.
INACTIVE_HINTS: dict[TenantState, str] = {
    TenantState.SUSPENDED: "`provisioner restore` it first",
    TenantState.ARCHIVED: "`provisioner restore` it first",
    TenantState.DELETED: "pass --reuse-deleted to `provisioner provision` to start it from scratch",
}


def _refuse_state(tenant: TenantId, state: TenantState | None, command: str) -> None:
    if state is not None and state in INACTIVE:
        hint = INACTIVE_HINTS[state]
        raise WrongState(f"tenant {tenant} is {state}: {command} leaves it alone; {hint}")


def enqueue(settings: Settings, tenant_id: str, server: str | None = None) -> queue.Enqueued:
    """Idempotently enqueue the tenant's provisioning job (re-queues a failed one); a new
    tenant goes to ``server`` when named, else where placement puts it."""
    tenant = TenantId(tenant_id)
    named = None if server is None else servers.placement_name(server)
    with writer_connection(settings) as conn:
        refuse_inactive(conn, tenant, "enqueue")
        return ensure_provision_job(conn, tenant, retry_terminal=True, server=named)


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
    reuse_deleted: bool = False,
    on_start: Callable[[], None] = no_announcement,
) -> ProvisionResult:
    """Provision one tenant now, in this process, through its job row and the step engine.

    Resumes a half-done tenant; repairs a provisioned one whose schema lost part of its effect;
    says so when there is nothing to do. While another live process runs the job, waits for it
    and returns how it ended (TenantBusy only when ``should_stop`` ends the wait). Raises
    WrongState for a suspended, archived or deleted tenant (a deleted one is provisioned again
    from scratch with ``reuse_deleted``).

    ``on_start`` is called once every refusal known up front has passed (the settings, the
    control schema, the tenant's state, its key) and before anything is waited for or run: a
    command prints its first line there, so a refused one prints only its error.
    """
    tenant = TenantId(tenant_id)
    settings.check_object_store_path()
    # Settings that cannot work are refused here, before the job row or the schema exists:
    # met at a step instead, they left a tenant placed and a job retried for nothing.
    migrations.check_tenant_tree()
    seeds.check_declared(settings.seeds, migrations.tenant_tree())
    holder = holder or holder_id("cli")
    started_by = "provision --reuse-deleted" if reuse_deleted else "provision"
    with Engine.from_settings(settings, holder) as engine:
        # One owner session does the bookkeeping (the engine's own): each new connection costs
        # several milliseconds, a large share of a provisioning that takes a few dozen. The
        # steps' session is opened meanwhile, in a thread, instead of after it.
        ahead = engine.connect_ahead()
        try:
            conn = engine.control
            with db.translated(), conn.transaction():
                _refuse_unready(
                    conn, tenant, "provision", reuse_deleted=reuse_deleted, roles=settings.app_roles
                )
                job = ensure_provision_job(
                    conn, tenant, retry_terminal=True, started_by=started_by
                ).job
        finally:
            ahead.join()
        on_start()
        if job.status is JobStatus.SUCCEEDED:
            if not engine.missing_effects(tenant, PROVISION_JOB_TYPE):
                return ProvisionResult(job, already_provisioned=True)
            with db.translated():
                job = queue.reopen(conn, job.id, started_by=f"{started_by} (repair)")
        outcome = runner.claim_and_run(
            engine, job.id, on_progress=on_progress, should_stop=should_stop
        )
        return ProvisionResult(runner.settled_job(outcome))


@dataclass(frozen=True)
class LifecycleResult:
    """How a suspend, restore, deprovision or purge request ended."""

    tenant: TenantId
    job_type: str
    #: the job as it was left (None: nothing to do and no job of that kind yet)
    job: Job | None
    #: control.tenants.state afterwards
    state: TenantState
    #: True when the tenant was already there and the catalog confirmed it: nothing ran
    already: bool = False
    #: True when the job was queued for a worker instead of run here
    queued: bool = False


def change_lifecycle(
    settings: Settings,
    tenant_id: str,
    job_type: str,
    *,
    queue_only: bool = False,
    on_progress: ProgressCallback = ignore_progress,
    should_stop: StopRequested = never_stop,
    holder: str | None = None,
    started_by: str | None = None,
    busy_wait: float | None = None,
    on_start: Callable[[], None] = no_announcement,
) -> LifecycleResult:
    """Suspend, restore, deprovision or purge one tenant (``job_type`` names the kind), here
    through its job row and the step engine, or queued for a worker (``queue_only``).
    ``busy_wait``: at most this many seconds waiting for another job of the tenant under a live
    holder, then TenantBusy (None: as long as it takes).

    UnknownTenant without a control row; WrongState when the tenant's state does not allow it;
    a tenant already there (and the catalog agreeing) is left alone. A half-done earlier
    request of the same kind is resumed.

    ``on_start`` is called once every refusal known up front has passed (the control schema,
    the application role, the tenant and its state), before the tenant is found already there
    or its job is run: a command prints its first line there, so a refused one prints only its
    error.
    """
    tenant = TenantId(tenant_id)
    kind = kinds.for_settings(settings)[job_type]
    rule = tenant_lifecycle.RULES[job_type]
    holder = holder or holder_id("cli")
    command = started_by or f"{kind.command or job_type}{' (queued)' if queue_only else ''}"
    with Engine.from_settings(settings, holder) as engine:
        conn = engine.control
        require_control_at_head(conn, tenant.naming)  # and the recorded naming, as a worker
        with db.translated():
            app_role.check(conn, settings.app_roles)  # ones a revoke cuts off, or refused
            found = tenants.get_tenant(conn, tenant)
            job = queue.latest_for_tenant(conn, tenant, job_type)
        if found is None:
            raise UnknownTenant(f"unknown tenant {tenant}: it has no control row")
        unfinished = job is not None and job.status is not JobStatus.SUCCEEDED
        if found.state not in rule.from_states and not (
            unfinished and found.state in rule.done_states
        ):
            if found.state in rule.done_states and job_type != tenant_lifecycle.RESTORE_JOB_TYPE:
                if not engine.missing_effects(tenant, job_type):
                    on_start()
                    return LifecycleResult(tenant, job_type, job, found.state, already=True)
            else:
                raise WrongState(
                    f"tenant {tenant} is {found.state}: {kind.command or job_type} applies to "
                    f"{' or '.join(rule.from_states)} tenants"
                )
        key = kind.idempotency_key(tenant) if kind.idempotency_key else None
        with db.translated(), conn.transaction():
            job = queue.ensure_tenant_job(
                conn, tenant, job_type, key, retry_terminal=True, started_by=command
            ).job
            if job.status is JobStatus.SUCCEEDED:
                job = queue.reopen(conn, job.id, wake_workers=queue_only, started_by=command)
        on_start()
        if queue_only:
            return LifecycleResult(tenant, job_type, job, found.state, queued=True)
        outcome = runner.claim_and_run(
            engine, job.id, on_progress=on_progress, should_stop=should_stop, busy_wait=busy_wait
        )
        job = runner.settled_job(outcome)
        with db.translated():
            state = tenants.state_of(conn, tenant) or found.state
        return LifecycleResult(tenant, job_type, job, state)


TenantOutcome = bulk.TenantOutcome


def parse_tenant_ids(raw: list[str]) -> list[TenantId]:
    """Every id validated; one InvalidInput (exit 2) naming all the bad ones."""
    return bulk.parse_ids(raw)


def change_lifecycle_many(
    settings: Settings,
    job_type: str,
    tenant_ids: list[str],
    *,
    states: list[TenantState] | None = None,
    queue_only: bool = False,
    on_tenant: Callable[[bulk.TenantOutcome], None] = lambda outcome: None,
    concurrency: int = 1,
) -> bulk.BatchReport:
    """One lifecycle kind for many tenants, queued as one batch, then run here one by one (or
    left to the workers with ``queue_only``); see :mod:`fleet.bulk`."""
    return bulk.change_many(
        settings,
        job_type,
        tenant_ids,
        states=states,
        queue_only=queue_only,
        on_tenant=on_tenant,
        concurrency=concurrency,
    )
