"""The fleet's commands: ``upgrade`` (with its rollout levers: canary, resume, abort, watch), with
its text and JSON reports (``check`` and ``repair`` live in :mod:`provisioner.cli.drift`)."""

from __future__ import annotations

import sys
from collections import Counter
from typing import Any

import click

from provisioner import service
from provisioner.cli import rollouts
from provisioner.cli.options import INTEGER_COUNT, SECONDS, settings_of
from provisioner.cli.render import emit_json, fail_cleanly
from provisioner.errors import InvalidInput
from provisioner.settings import Settings
from provisioner.templates import migrations


@click.command()
@click.argument("tenant_ids", nargs=-1, metavar="[TENANT_ID]...")
@click.option("--all", "every", is_flag=True, help="Every provisioned tenant.")
@click.option("--dry-run", is_flag=True, help="Say which tenants are behind; queue nothing.")
@click.option("--details", is_flag=True, help="List every tenant behind, not the first ten.")
@click.option(
    "--canary",
    type=INTEGER_COUNT,
    default=None,
    help="Queue N tenants first, then stop for review.",
)
@click.option("--then-all", is_flag=True, help="With --canary: continue once the canary succeeded.")
@click.option(
    "--max-failures",
    type=INTEGER_COUNT,
    default=None,
    help="Hold the rest after K failures.",
)
@click.option(
    "--resume", is_flag=True, help="Continue the rollout after review, a pause or a halt."
)
@click.option("--abort", is_flag=True, help="Drop what the rollout has not started.")
@click.option(
    "--watch",
    is_flag=True,
    help="Follow the latest rollout until it stops; exit 1 if it halted, was aborted or a "
    "tenant failed.",
)
@click.option("--include-deleted", is_flag=True, help="List purged tenants among those skipped.")
@click.option(
    "--interval",
    type=SECONDS,
    default=1.0,
    show_default=True,
    help="Seconds between --watch frames.",
)
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object.")
@click.pass_context
@fail_cleanly
def upgrade(
    ctx: click.Context,
    tenant_ids: tuple[str, ...],
    every: bool,
    dry_run: bool,
    details: bool,
    canary: int | None,
    then_all: bool,
    max_failures: int | None,
    resume: bool,
    abort: bool,
    watch: bool,
    include_deleted: bool,
    interval: float,
    as_json: bool,
) -> None:
    """Queue provisioned tenants whose schema is behind the template's head for a worker.

    Run it after a release that adds tenant_template revisions (migrate, roll the workers,
    then upgrade --all). Only run_tenant_migrations runs again, in place. Exit 0 done,
    1 the canary failed (--then-all) or the watched rollout halted, was aborted or has a
    failed tenant, or a tenant server was down (the others' tenants queued, its own neither
    read nor queued), 2 bad input (--resume, --abort and --watch go alone: with --json, and
    --watch with --interval) or no rollout to resume/abort, 3 unknown tenant.
    """
    levers = [
        name for name, on in (("--resume", resume), ("--abort", abort), ("--watch", watch)) if on
    ]
    if levers:
        # A lever acts on the latest rollout: a flag of a new upgrade would be ignored, and a
        # --dry-run would not keep --abort or --resume from acting.
        ignored = [
            flag
            for flag, given in (
                ("--dry-run", dry_run),
                ("--details", details),
                ("--canary", canary is not None),
                ("--then-all", then_all),
                ("--max-failures", max_failures is not None),
                ("--include-deleted", include_deleted),
                ("--interval", not watch and _given(ctx, "interval")),
            )
            if given
        ]
        if len(levers) > 1 or every or tenant_ids or ignored:
            extra = f"; got {', '.join(ignored)}" if ignored else ""
            raise InvalidInput(
                f"{' '.join(levers)} goes alone (no tenants, no --all, no other flag but --json"
                f"{' and --interval' if watch else ''}){extra}"
            )
        pull_lever(settings_of(ctx), resume=resume, abort=abort, interval=interval, as_json=as_json)
        return
    if every == bool(tenant_ids):
        raise InvalidInput("name tenants to upgrade, or pass --all (not both)")
    if then_all and canary is None:
        raise InvalidInput("--then-all goes with --canary N")
    for tenant_id in tenant_ids:
        service.TenantId(tenant_id)
    settings = settings_of(ctx)
    report = service.upgrade(
        settings,
        list(tenant_ids) or None,
        dry_run=dry_run,
        canary=canary,
        max_failures=max_failures,
        include_deleted=include_deleted,
    )
    if as_json:
        emit_json(upgrade_view(report))
    else:
        print_upgrade(report, details)
    if report.rollout_id is not None and canary is not None and canary < len(report.behind):
        follow_canary(settings, report.rollout_id, canary, then_all=then_all, as_json=as_json)
    if report.down:
        sys.exit(1)  # what could be read was queued; the down server's tenants were not


def _given(ctx: click.Context, name: str) -> bool:
    """Whether the option ``name`` was given on the command line (not left to its default)."""
    return ctx.get_parameter_source(name) is click.core.ParameterSource.COMMANDLINE


def pull_lever(
    settings: Settings, *, resume: bool, abort: bool, interval: float, as_json: bool
) -> None:
    """``--resume``, ``--abort`` or ``--watch`` on the latest rollout."""
    if resume:
        click.echo(rollouts.resumed_line(service.upgrade_resume(settings)))
    elif abort:
        aborted = service.upgrade_abort(settings)
        click.echo(
            f"rollout {aborted.rollout.id} aborted: {aborted.dropped_jobs} job(s) not started "
            "dropped (those tenants stay at their old head); running jobs finish"
        )
    else:
        rollouts.watch(settings, interval, as_json)


def follow_canary(
    settings: Settings, rollout_id: int, canary: int, *, then_all: bool, as_json: bool
) -> None:
    """The canary is queued: stop for review, or (``--then-all``) wait for it and queue the rest
    once it succeeded; exit 1 when it did not."""
    if not then_all:
        if not as_json:
            click.echo(
                f"rollout {rollout_id}: canary of {canary} queued; review it, then "
                "`provisioner upgrade --resume` (or `--abort`)"
            )
        return
    counts = service.wait_for_canary(settings, rollout_id)
    if set(counts) - {"succeeded"}:
        click.echo(
            f"rollout {rollout_id}: the canary did not succeed "
            f"({', '.join(f'{n} {s}' for s, n in sorted(counts.items()))}); the rest is "
            "not queued: see `provisioner upgrade --watch`, then --resume or --abort",
            err=True,
        )
        sys.exit(1)
    resumed = service.upgrade_resume(settings)
    if not as_json:
        click.echo(
            f"rollout {rollout_id}: canary succeeded; {resumed.queued} more tenant(s) queued"
        )


def print_upgrade(report: service.UpgradeReport, details: bool) -> None:
    at = ", ".join(f"{n} at {v}" for v, n in report.versions_behind().items())
    click.echo(
        f"tenant template head {migrations.head_label(report.heads)}: {report.checked} provisioned "
        f"tenant(s) checked, {len(report.behind)} behind" + (f" ({at})" if at else "")
    )
    actions = Counter(item.action for item in report.behind)
    if report.behind:
        click.echo(
            ", ".join(f"{actions[a]} tenant(s) {a}" for a in ACTIONS if actions[a])
            + ("" if report.rollout_id is None else f" (rollout {report.rollout_id})")
        )
    shown = report.behind if details else report.behind[:LISTED]
    for item in shown:
        at_label = migrations.head_label(item.versions) or "(no version table)"
        click.echo(f"  {item.job.tenant_id:<24} at {at_label:<20} {item.action}  job {item.job.id}")
    if len(report.behind) > len(shown):
        click.echo(f"  ... and {len(report.behind) - len(shown)} more (--details lists them all)")
    for server in report.servers:
        if server.problem is not None:
            click.echo(
                f"server {server.server}: DOWN, {server.unread} tenant(s) not read nor queued "
                f"({server.problem})"
            )
        else:
            click.echo(
                f"server {server.server}: {server.checked} tenant(s) checked, "
                f"{server.behind} behind"
            )
    if report.skipped:
        names = ", ".join(f"{s.tenant_id} ({s.state})" for s in report.skipped[:LISTED])
        more = len(report.skipped) - LISTED
        click.echo(
            f"{len(report.skipped)} tenant(s) skipped, suspended, archived or deleted: {names}"
            + (f" and {more} more" if more > 0 else "")
        )
    if report.unfinished:
        names = ", ".join(f"{j.tenant_id} ({j.status.value})" for j in report.unfinished[:LISTED])
        more = len(report.unfinished) - LISTED
        click.echo(
            f"{len(report.unfinished)} tenant(s) not checked, their job has not succeeded "
            f"(they reach head when it runs; see `provisioner jobs list`): {names}"
            + (f" and {more} more" if more > 0 else "")
        )


#: The actions of an upgrade report, in the order a summary lists them.
ACTIONS = ("queued", "pending", "would queue")

#: Tenants listed by name in a text report; --details (or --json) lists every one.
LISTED = 10


def upgrade_view(report: service.UpgradeReport) -> dict[str, Any]:
    return {
        "heads": sorted(report.heads),
        "checked": report.checked,
        "behind_by_version": report.versions_behind(),
        "behind": [
            {
                "tenant_id": item.job.tenant_id,
                "versions": sorted(item.versions),
                "action": item.action,
                "job_id": str(item.job.id),
            }
            for item in report.behind
        ],
        "unfinished": [
            {"tenant_id": j.tenant_id, "job_id": str(j.id), "status": j.status.value}
            for j in report.unfinished
        ],
        "skipped": [{"tenant_id": s.tenant_id, "state": s.state} for s in report.skipped],
        "rollout_id": report.rollout_id,
    } | ({"servers": [s.view() for s in report.servers]} if report.servers else {})
