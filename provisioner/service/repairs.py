"""Drift: compare tenants' catalogs with the template head's shape (:func:`check`), and
restore what is safe to restore in the drifted ones (:func:`repair`)."""

from __future__ import annotations

from dataclasses import dataclass, replace

from provisioner import db, kinds, queue
from provisioner.engine import Engine, ProgressCallback, ignore_progress, never_stop, runner
from provisioner.engine.holder import holder_id
from provisioner.fleet import drift
from provisioner.kinds import repair as repair_kind
from provisioner.models import Job, JobStatus, TenantId
from provisioner.settings import Settings
from provisioner.templates import migrations


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
