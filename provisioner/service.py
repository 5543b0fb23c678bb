"""The library facade: what the CLI, the worker and tests call. It never prints or exits.

Settings come in resolved by :func:`resolve` (embedded PostgreSQL when no URL is set); each
function opens what it needs, does one thing, and returns plain values.
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import AbstractContextManager, closing
from dataclasses import dataclass, replace
from typing import Any
from uuid import UUID

import psycopg

from provisioner import db, fleet, kinds, queue, servers
from provisioner.control import heartbeats
from provisioner.control import naming as control_naming
from provisioner.control.schema import (
    NOT_AT_HEAD,
    app_connection,
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
from provisioner.errors import (
    ConfigurationError,
    InvalidInput,
    UnknownTenant,
    WrongState,
)
from provisioner.fleet import bulk, drift, rollout, roster
from provisioner.fleet import health as fleet_health
from provisioner.fleet import overview as fleet_overview
from provisioner.kinds import lifecycle as tenant_lifecycle
from provisioner.kinds import repair as repair_kind
from provisioner.kinds.provision import PROVISION_JOB_TYPE
from provisioner.local import cluster as local_pg
from provisioner.local import state as embedded
from provisioner.models import Job, JobStatus, TenantId
from provisioner.queue import journal
from provisioner.roles import AppRoles
from provisioner.templates import migrations, seeds
from provisioner.tenant import app_role, checks
from provisioner.tenant import row as tenants
from provisioner.tenant.checks import CheckRecord
from provisioner.tenant.state import INACTIVE, TenantState

__all__ = ["CheckRecord", "TenantId", "embedded", "local_pg"]
from provisioner import storage
from provisioner.kinds.provision import ensure_provision_job
from provisioner.settings import Settings, tenant_naming


def no_announcement() -> None:
    """The default ``on_start`` of :func:`provision` and :func:`change_lifecycle`: a caller
    that prints no first line (the API, the tests)."""


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


TenantUpgrade = fleet.TenantUpgrade
UpgradeReport = fleet.UpgradeReport


def upgrade(
    settings: Settings,
    tenant_ids: list[str] | None = None,
    *,
    dry_run: bool = False,
    canary: int | None = None,
    max_failures: int | None = None,
    include_deleted: bool = False,
) -> UpgradeReport:
    """Queue the provisioned tenants behind the tenant template's head as a rollout (see
    :mod:`fleet` and :mod:`rollout`); purged tenants are reported only with
    ``include_deleted``."""
    migrations.check_tenant_tree()
    return fleet.upgrade(
        settings,
        tenant_ids,
        dry_run=dry_run,
        canary=canary,
        max_failures=max_failures,
        include_deleted=include_deleted,
    )


def upgrade_resume(
    settings: Settings, *, rollout_id: int | None = None, started_by: str = "upgrade"
) -> rollout.Resumed:
    return fleet.resume(settings, rollout_id=rollout_id, started_by=started_by)


def rollout_pause(settings: Settings, rollout_id: int, *, paused_by: str) -> rollout.Paused:
    """Pause a running rollout (:func:`provisioner.fleet.rollout.pause`)."""
    return fleet.pause(settings, rollout_id, paused_by=paused_by)


def upgrade_abort(settings: Settings, *, ended_by: str = "upgrade --abort") -> rollout.Aborted:
    return fleet.abort(settings, ended_by=ended_by)


def upgrade_progress(settings: Settings) -> rollout.Progress:
    return fleet.progress(settings)


def tenants_per_head(settings: Settings) -> dict[str, int]:
    return fleet.tenants_per_head(settings)


def wait_for_canary(settings: Settings, rollout_id: int) -> dict[str, int]:
    return fleet.wait_for_canary(settings, rollout_id)


TenantEntry = roster.TenantEntry
TenantOutcome = bulk.TenantOutcome


def parse_tenant_ids(raw: list[str]) -> list[TenantId]:
    """Every id validated; one InvalidInput (exit 2) naming all the bad ones."""
    return bulk.parse_ids(raw)


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


def check(settings: Settings, tenant_ids: list[str] | None = None) -> drift.DriftReport:
    """Compare tenants' catalogs with the template head's shape (see :mod:`drift`)."""
    migrations.check_tenant_tree()
    return drift.check(settings, tenant_ids)


@dataclass(frozen=True)
class RepairResult:
    """One drifted tenant's repair: the plan made from its check, and how its job ended
    (``job`` None: a dry run, or nothing to restore; ``after``: its check once repaired)."""

    tenant_id: str
    plan: drift.TenantPlan
    job: Job | None = None
    queued: bool = False
    after: drift.TenantDrift | None = None


@dataclass(frozen=True)
class RepairReport:
    check: drift.DriftReport
    results: list[RepairResult]


def repair(
    settings: Settings,
    tenant_ids: list[str] | None = None,
    *,
    dry_run: bool = False,
    queue_only: bool = False,
    on_progress: ProgressCallback = ignore_progress,
    holder: str | None = None,
) -> RepairReport:
    """Check the tenants, and run (or queue) a ``repair_tenant`` job for each drifted one that
    has something safe to restore; ``dry_run`` plans and changes nothing (see
    :mod:`provisioner.tenant.repairs` for what is restored and what is left alone)."""
    migrations.check_tenant_tree()
    report = drift.check(settings, tenant_ids, checked_by="repair")
    planned = drift.plans(settings, report)
    if dry_run:
        return RepairReport(report, [RepairResult(p.tenant_id, p) for p in planned])
    kind = kinds.for_settings(settings)[repair_kind.REPAIR_JOB_TYPE]
    command = f"repair{' (queued)' if queue_only else ''}"
    results: list[RepairResult] = []
    with Engine.from_settings(settings, holder or holder_id("cli")) as engine:
        conn = engine.control
        for planned_tenant in planned:
            if not planned_tenant.plan.actions:
                results.append(RepairResult(planned_tenant.tenant_id, planned_tenant))
                continue
            tenant = TenantId(planned_tenant.tenant_id)
            key = kind.idempotency_key(tenant) if kind.idempotency_key else None
            with db.translated(), conn.transaction():
                job = queue.ensure_tenant_job(
                    conn, tenant, kind.name, key, retry_terminal=True, started_by=command
                ).job
                if job.status is JobStatus.SUCCEEDED:
                    job = queue.reopen(conn, job.id, wake_workers=queue_only, started_by=command)
            if not queue_only:
                outcome = runner.claim_and_run(
                    engine, job.id, on_progress=on_progress, should_stop=never_stop
                )
                job = runner.settled_job(outcome)
            results.append(RepairResult(tenant.value, planned_tenant, job, queue_only))
    ran = [r.tenant_id for r in results if r.job is not None and not r.queued]
    after = (
        {t.tenant_id: t for t in drift.check(settings, ran, checked_by="repair").tenants}
        if ran
        else {}
    )
    return RepairReport(report, [replace(r, after=after.get(r.tenant_id)) for r in results])


def retry_failed(settings: Settings, kind: str | None = None) -> list[Job]:
    """Queue every failed job (of job type ``kind``, or all) again, as the owner; a ``kind``
    this build does not know is InvalidInput (the registry's, with the settings' kind modules).
    """
    if kind is not None:
        kinds.for_settings(settings).check([kind])
    conn = db.connect(settings.owner_url, application_name="retry")
    with closing(conn), db.translated():
        jobs = queue.retry_failed(conn, kind)
        conn.commit()
    return jobs


@dataclass(frozen=True)
class HistoryPruned:
    """What ``jobs prune`` deleted: the control database's history and, per tenant server not
    retired, its step journal's dead rows (a server that is down says why)."""

    control: queue.Pruned
    journals: list[servers.JournalPruned]

    @property
    def down(self) -> list[servers.JournalPruned]:
        return [s for s in self.journals if s.problem is not None]

    def view(self) -> dict[str, Any]:
        return {**self.control.view(), "servers": [s.view() for s in self.journals]}


def prune_history(
    settings: Settings,
    days: int,
    *,
    dry_run: bool = False,
    on_batch: Callable[[int], None] = lambda deleted: None,
    on_server_batch: Callable[[str, int], None] = lambda server, rows: None,
) -> HistoryPruned:
    """Delete the queue's history that ended more than ``days`` days ago, as the owner (or
    count it: ``dry_run``): control's (:mod:`provisioner.queue.retention`), then each tenant
    server's journal (:mod:`provisioner.servers.retention`), by the same cutoff."""
    conn = db.connect(settings.owner_url, application_name="prune", autocommit=True)
    with closing(conn), db.translated():
        pruned = queue.prune_history(conn, days, dry_run=dry_run, on_batch=on_batch)
        journals = servers.prune_journals(
            conn, settings.owner_url, pruned.cutoff, dry_run=dry_run, on_batch=on_server_batch
        )
    return HistoryPruned(pruned, journals)


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


def list_jobs(
    settings: Settings,
    *,
    status: str | None = None,
    limit: int = 50,
    tenant: str | None = None,
    kind: str | None = None,
) -> list[Job]:
    """The queue for the operator; of one status, tenant (validated) or job type when asked."""
    wanted = None if tenant is None else TenantId(tenant)
    if status is not None and status not in {s.value for s in JobStatus}:
        raise InvalidInput(
            f"unknown status {status!r}; one of {', '.join(s.value for s in JobStatus)}"
        )
    if limit < 1:
        raise InvalidInput(f"--limit must be at least 1, got {limit}")
    if kind is not None:
        kinds.for_settings(settings).check([kind])  # an unknown one matched nothing, silently
    with app_connection(settings) as conn:
        return queue.list_jobs(conn, status=status, limit=limit, tenant=wanted, kind=kind)


def parse_job_id(raw: str) -> UUID:
    try:
        return UUID(raw)
    except ValueError:
        raise InvalidInput(f"invalid job id {raw!r}: expected a UUID") from None


def retry_job(settings: Settings, job_id: str, *, started_by: str = "jobs retry") -> Job:
    """Queue a failed or cancelled job again; its new run records ``started_by``."""
    with writer_connection(settings) as conn:
        _require_owner_for(settings, conn, parse_job_id(job_id))
        return queue.retry(conn, parse_job_id(job_id), started_by=started_by)


def cancel_job(settings: Settings, job_id: str, *, cancelled_by: str = "jobs cancel") -> Job:
    """Cancel a queued or running job; with the owner URL, its run records ``cancelled_by``
    as what ended it (the application role may not write the run's record)."""
    with writer_connection(settings) as conn:
        _require_owner_for(settings, conn, parse_job_id(job_id))
        job = queue.cancel(conn, parse_job_id(job_id))
        if settings.migrations_database_url:
            journal.record_run_ended(conn, job.id, job.run, cancelled_by)
        return job


def _require_owner_for(settings: Settings, conn: psycopg.Connection[Any], job_id: UUID) -> None:
    """Only the owner changes an owner job (control c005): say so rather than match no row."""
    if settings.migrations_database_url:
        return
    job = queue.get_job(conn, job_id)  # UnknownJob (exit 3) first
    if job.job_type not in kinds.for_settings(settings).application_kinds:
        raise ConfigurationError(
            f"job {job_id} is a {job.job_type} job: only the owner role may change it; set "
            "MIGRATIONS_DATABASE_URL"
        )


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


# -- the directory of tenant servers (provisioner.servers) -----------------------------------


def add_server(
    settings: Settings, name: str, reference: str, *, capacity: int | None = None, weight: int = 1
) -> servers.TenantServer:
    """A new active tenant server in the directory (the owner's: ``MIGRATIONS_DATABASE_URL``).
    Name and reference are checked before anything is sent."""
    servers.server_name(name)
    servers.connection_reference(reference)
    with _owner_connection(settings) as conn:
        return servers.add(conn, name, reference, capacity=capacity, weight=weight)


def list_servers(settings: Settings) -> servers.Directory:
    """The tenant servers with their references, and the tenants on the control database (the
    owner's to read: the application role reads no reference)."""
    with _owner_connection(settings) as conn:
        return servers.directory(conn)


def set_server_status(
    settings: Settings, name: str, status: servers.ServerStatus
) -> servers.TenantServer:
    """Drain, retire, mark full or activate a tenant server (UnknownServer: no such name)."""
    servers.server_name(name)
    with _owner_connection(settings) as conn:
        return servers.set_status(conn, name, status)


def check_servers(settings: Settings) -> list[servers.Reach]:
    """Whether the owner reaches each active tenant server as an ordinary role."""
    directory = list_servers(settings)
    return servers.reach_active(directory.servers, settings.owner_url)


def locate(settings: Settings, tenant_id: str) -> servers.Location:
    """Where ``tenant_id`` lives (UnknownTenant when it has no control row)."""
    tenant = TenantId(tenant_id)
    with app_connection(settings) as conn:
        return servers.locate(conn, tenant)


def _owner_connection(settings: Settings) -> AbstractContextManager[psycopg.Connection[Any]]:
    """The owner's connection: the directory is written by the owner alone (ConfigurationError,
    exit 2, when its URL is not set)."""
    settings.owner_url  # noqa: B018 - raises when it is not set
    return writer_connection(settings)
