"""Drift's commands: ``check`` (what differs from the template head, per tenant and object) and
``repair`` (restore what is safe, as recorded ``repair_tenant`` jobs; ``--dry-run`` plans)."""

from __future__ import annotations

import sys
from typing import Any

import click

from provisioner import kinds, servers, service
from provisioner.cli.options import settings_of
from provisioner.cli.render import StepPrinter, emit_json, fail_cleanly
from provisioner.errors import InvalidInput
from provisioner.fleet.drift import DriftReport, ServerCheck, TenantCheck, TenantDrift
from provisioner.models import JobStatus
from provisioner.templates import migrations
from provisioner.tenant import catalog
from provisioner.tenant.catalog import Difference
from provisioner.tenant.repairs import Plan

#: A changed value longer than this (a function's body) is shown as "changed", not printed.
SHOWN_VALUE = 60


def _targets(tenant_ids: tuple[str, ...], every: bool) -> list[str] | None:
    if every == bool(tenant_ids):
        raise InvalidInput("name tenants, or pass --all (not both)")
    for tenant_id in tenant_ids:
        service.TenantId(tenant_id)
    return list(tenant_ids) or None


@click.command()
@click.argument("tenant_ids", nargs=-1, metavar="[TENANT_ID]...")
@click.option("--all", "every", is_flag=True, help="Every provisioned tenant (not the purged).")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object.")
@click.pass_context
@fail_cleanly
def check(ctx: click.Context, tenant_ids: tuple[str, ...], every: bool, as_json: bool) -> None:
    """Compare tenants' objects with what the template head builds.

    Tenants' schemas are only read; each tenant's result is recorded in
    control.tenant_checks (the console's and the metrics' drift figures).

    Lists, per tenant, the missing, extra and altered objects: tables, columns, constraints,
    indexes, sequences, views, functions, triggers, types, policies, rules, owners and
    privileges. A suspended or archived tenant is expected without app_rw's privileges.
    Tenants on tenant servers are checked on their server, a few servers at once; a server
    that is down is reported and its tenants counted unchecked, the others checked.
    Exit 0 clean (or only behind), 1 drift found, a tenant server down or the database
    unreachable, 2 bad input, 3 unknown tenant.
    """
    report = service.check(settings_of(ctx), _targets(tenant_ids, every))
    if as_json:
        emit_json(report_view(report))
    else:
        render_report(report)
    sys.exit(1 if report.drifted or report.down else 0)


def _value(value: Any) -> str:
    text = "(none)" if value is None else str(value)
    return text if len(text) <= SHOWN_VALUE and "\n" not in text else "(changed)"


def finding_line(difference: Difference, within: int) -> str:
    line = f"{difference.change:<8} {difference.kind} {difference.name}"
    if within:
        line += f" (and {within} object(s) of it)"
    if difference.changes:
        line += ": " + "; ".join(
            f"{name} {_value(want)} -> {_value(got)}"
            if _value(want) != "(changed)"
            else f"{name} changed"
            for name, want, got in difference.changes
        )
    return line


def finding_view(difference: Difference, within: int) -> dict[str, Any]:
    view: dict[str, Any] = {
        "change": difference.change,
        "kind": difference.kind,
        "name": difference.name,
    }
    if difference.table is not None and difference.kind != "table":
        view["table"] = difference.table
    if within:
        view["objects_within"] = within
    if difference.changes:
        view["changes"] = [
            {"attribute": name, "expected": want, "found": got}
            for name, want, got in difference.changes
        ]
    return view


def tenant_view(tenant: TenantDrift) -> dict[str, Any]:
    return {
        "tenant_id": tenant.tenant_id,
        "state": tenant.state.value,
        "lifecycle": None if tenant.lifecycle is None else tenant.lifecycle.value,
        "expected": tenant.expects,
        "versions": sorted(tenant.versions),
        "counts": tenant.counts,
        "findings": [finding_view(d, n) for d, n in catalog.fold(list(tenant.differences))],
    }


def _several(report: DriftReport) -> bool:
    """Whether the check reached a tenant server (a single-server report stays as it was)."""
    return any(s.server != servers.CONTROL for s in report.servers)


def report_view(report: DriftReport) -> dict[str, Any]:
    view = {
        "heads": sorted(report.heads),
        "checked": len(report.tenants),
        "counts": report.counts,
        "tenants": [tenant_view(t) for t in report.tenants],
    }
    if _several(report):
        view["unchecked"] = sum(len(s.unchecked) for s in report.servers)
        view["servers"] = [s.view() for s in report.servers]
    return view


def render_report(report: DriftReport) -> None:
    counts = ", ".join(f"{n} {state}" for state, n in report.counts.items() if n)
    unchecked = sum(len(s.unchecked) for s in report.servers)
    click.echo(
        f"tenant template head {migrations.head_label(report.heads)}: "
        f"{len(report.tenants)} tenant(s) checked"
        + (f": {counts}" if counts else "")
        + (f"; {unchecked} unchecked (server down)" if unchecked else "")
    )
    if not _several(report):
        for tenant in report.tenants:
            render_tenant(tenant)
        return
    for section in report.servers:
        render_server(section)
        held = set(section.checked)
        for tenant in report.tenants:
            if tenant.tenant_id in held:
                render_tenant(tenant, indent="  ")


def render_server(section: ServerCheck) -> None:
    if section.problem is not None:
        click.echo(
            f"server {section.server}: DOWN, {len(section.unchecked)} tenant(s) unchecked "
            f"({section.problem})"
        )
        return
    counts = ", ".join(f"{n} {state}" for state, n in section.counts.items() if n)
    click.echo(
        f"server {section.server}: {section.tenants} tenant(s) checked"
        + (f": {counts}" if counts else "")
    )


def render_tenant(tenant: TenantDrift, indent: str = "") -> None:
    if tenant.state is TenantCheck.BEHIND:
        at = migrations.head_label(tenant.versions)
        click.echo(f"{indent}{tenant.tenant_id}: behind (at {at}; see `provisioner upgrade`)")
    if tenant.state is not TenantCheck.DRIFTED:
        return
    counts = ", ".join(f"{n} {change}" for change, n in tenant.counts.items() if n)
    click.echo(f"{indent}{tenant.tenant_id}: drifted ({counts}; compared with {tenant.expects})")
    for difference, within in catalog.fold(list(tenant.differences)):
        click.echo(f"{indent}  {finding_line(difference, within)}")


# -- repair -------------------------------------------------------------------------------------


@click.command()
@click.argument("tenant_ids", nargs=-1, metavar="[TENANT_ID]...")
@click.option("--all", "every", is_flag=True, help="Every drifted tenant.")
@click.option("--dry-run", is_flag=True, help="Print what would be restored; change nothing.")
@click.option(
    "--queue",
    "queue_only",
    is_flag=True,
    help="Queue the jobs for a worker (listed in PROVISIONER_WORKER_JOB_TYPES).",
)
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object, no progress.")
@click.pass_context
@fail_cleanly
def repair(
    ctx: click.Context,
    tenant_ids: tuple[str, ...],
    every: bool,
    dry_run: bool,
    queue_only: bool,
    as_json: bool,
) -> None:
    """Restore what drifted from the template head where it is safe, as repair_tenant jobs.

    Restored: missing or extra privileges and default privileges, missing indexes,
    constraints, views, functions, triggers, policies, rules, enum types, nullable columns;
    altered sequence options, row-level security flags, defaults, owners, definitions. Left
    alone, and named: extra objects (with whether they hold data), missing tables, changed
    column types. Exit 0 every checked tenant clean afterwards (or --dry-run, --queue), 1 drift
    left or a job failed, 2 bad input, 3 unknown tenant.
    """
    settings = settings_of(ctx)
    quiet = as_json or dry_run or queue_only
    report = service.repair(
        settings,
        _targets(tenant_ids, every),
        dry_run=dry_run,
        queue_only=queue_only,
        on_progress=StepPrinter(quiet, kinds.for_settings(settings)),
    )
    if as_json:
        emit_json(repair_view(report, dry_run))
    else:
        render_repair(report, dry_run)
    left = [
        r
        for r in report.results
        if not r.queued and (r.after or r.plan.check).state is TenantCheck.DRIFTED
    ]
    failed = [r for r in report.results if r.job is not None and r.job.status is JobStatus.FAILED]
    sys.exit(1 if (left or failed) and not dry_run else 0)


def plan_view(plan: Plan) -> dict[str, Any]:
    return {
        "restores": [a.what for a in plan.actions],
        "left_alone": [{"what": a.what, "reason": a.reason} for a in plan.left_alone],
    }


def repair_view(report: service.RepairReport, dry_run: bool) -> dict[str, Any]:
    return {
        "dry_run": dry_run,
        "checked": len(report.check.tenants),
        "counts": report.check.counts,
        "tenants": [
            {
                "tenant_id": r.tenant_id,
                **plan_view(r.plan.plan),
                "job_id": None if r.job is None else str(r.job.id),
                "job_status": None if r.job is None else r.job.status.value,
                "queued": r.queued,
                "after": None if r.after is None else tenant_view(r.after),
            }
            for r in report.results
        ],
    }


def render_repair(report: service.RepairReport, dry_run: bool) -> None:
    drifted = len(report.check.drifted)
    click.echo(f"{len(report.check.tenants)} tenant(s) checked, {drifted} drifted")
    for result in report.results:
        plan = result.plan.plan
        verb = "would restore" if dry_run else "restores"
        click.echo(
            f"{result.tenant_id}: {verb} {len(plan.actions)}, leaves alone {len(plan.left_alone)}"
        )
        for action in plan.actions:
            click.echo(f"  restore    {action.what}")
        for alone in plan.left_alone:
            click.echo(f"  left alone {alone.what}: {alone.reason}")
        if result.job is not None:
            click.echo(f"  job {result.job.id} ({result.job.job_type}) {result.job.status.value}")
            if result.job.error_detail:
                click.echo(f"  error {result.job.error_detail}")
        if result.after is not None:
            if result.after.state is TenantCheck.DRIFTED:
                left = ", ".join(f"{n} {c}" for c, n in result.after.counts.items() if n)
                click.echo(f"  still drifted ({left}): `provisioner check {result.tenant_id}`")
            else:
                click.echo(f"  now {result.after.state.value}")
    if not report.results:
        click.echo("nothing to repair")
