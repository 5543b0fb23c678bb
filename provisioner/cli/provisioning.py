"""The two everyday commands and their neighbours: ``migrate``, ``provision``, ``enqueue``,
``status``."""

from __future__ import annotations

import json
import sys
import time
from datetime import UTC, datetime
from typing import Any

import click

from provisioner import kinds, servers, service
from provisioner.cli.options import SECONDS, settings_of
from provisioner.cli.render import (
    StepPrinter,
    emit_json,
    ended_line,
    fail_cleanly,
    job_run_view,
    json_default,
    render_history,
    render_job,
    run_view,
    say,
)
from provisioner.models import JobStatus
from provisioner.settings import Settings


@click.command()
@click.pass_context
@fail_cleanly
def migrate(ctx: click.Context) -> None:
    """Bring the control schema to head (a no-op when it is there)."""
    settings: Settings = ctx.obj
    settings = service.resolve(settings, migrate=False, notify=say)
    before, after = service.migrate(settings)
    if before == after:
        click.echo(f"control schema already at head ({after})")
    else:
        click.echo(f"control schema upgraded {before or '(empty)'} -> {after}")
    for server in servers.migrate_servers(settings.owner_url):  # docs/servers.md
        if server.before == server.after:
            click.echo(f"tenant server {server.server}: tool schema at version {server.after}")
        else:
            click.echo(
                f"tenant server {server.server}: tool schema {server.before or '(none)'} -> "
                f"{server.after}"
            )


@click.command()
@click.argument("tenant_id")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object, no progress.")
@click.option(
    "--reuse-deleted", is_flag=True, help="Provision a purged (deleted) tenant id from scratch."
)
@click.pass_context
@fail_cleanly
def provision(ctx: click.Context, tenant_id: str, as_json: bool, reuse_deleted: bool) -> None:
    """Provision TENANT_ID now; resume it if half done. Exit 0 done, 1 failed, 2 bad input
    or a suspended, archived or deleted tenant."""
    service.TenantId(tenant_id)  # bad input is refused before anything starts or is created
    settings = settings_of(ctx)

    def announce() -> None:
        # Once the request is accepted: a refused one prints nothing but its one-line error.
        if not as_json:
            click.echo(f"provisioning tenant {tenant_id}")

    started = time.monotonic()
    result = service.provision(
        settings,
        tenant_id,
        on_progress=StepPrinter(as_json, kinds.for_settings(settings)),
        reuse_deleted=reuse_deleted,
        on_start=announce,
    )
    job = result.job
    if as_json:
        emit_json({**job.view(), "already_provisioned": result.already_provisioned})
    else:
        if result.already_provisioned:
            click.echo(f"tenant {tenant_id} is already provisioned; nothing to do")
            click.echo(
                f"(its objects are not compared with the template here: "
                f"`provisioner check {tenant_id}` does, `provisioner repair {tenant_id}` restores)"
            )
        else:
            click.echo(ended_line(job, time.monotonic() - started))
        render_job(job, kinds.for_settings(settings))
    sys.exit(0 if job.status is JobStatus.SUCCEEDED else 1)


EMBEDDED_WORKER_HINT = (
    "note: no worker serves the embedded database on its own; run one against it with "
    '`eval "$(provisioner local env)" && provisioner worker`, '
    "or provision now with `provisioner provision {tenant}`"
)


@click.command()
@click.argument("tenant_id")
@click.option("--json", "as_json", is_flag=True, help="Print the job as one JSON object.")
@click.option(
    "--server",
    default=None,
    help="Place a new tenant on this tenant server (`servers list`); control: the control "
    "database, while the directory has no server in use.",
)
@click.pass_context
@fail_cleanly
def enqueue(ctx: click.Context, tenant_id: str, as_json: bool, server: str | None) -> None:
    """Queue TENANT_ID for a worker (idempotent); print the job id. A new tenant is placed on
    the least loaded active tenant server, or on --server."""
    service.TenantId(tenant_id)
    if server is not None:
        servers.placement_name(server)
    embedded = ctx.obj.embedded
    result = service.enqueue(settings_of(ctx), tenant_id, server)
    if as_json:
        emit_json({**result.job.view(), "created": result.created, "requeued": result.requeued})
    else:
        click.echo(str(result.job.id))
    if embedded and not result.job.status.terminal:
        click.echo(EMBEDDED_WORKER_HINT.format(tenant=tenant_id), err=True)


@click.command()
@click.argument("tenant_id")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object.")
@click.option("--watch", is_flag=True, help="Follow the tenant until its job ends.")
@click.option(
    "--interval",
    type=SECONDS,
    default=1.0,
    help="Seconds between --watch polls.",
)
@click.pass_context
@fail_cleanly
def status(ctx: click.Context, tenant_id: str, as_json: bool, watch: bool, interval: float) -> None:
    """Show TENANT_ID's provisioning state. Exit 3 if the tenant is unknown."""
    service.TenantId(tenant_id)
    settings = settings_of(ctx)
    last: tuple[Any, ...] | None = None
    while True:
        current = service.status(settings, tenant_id)
        job = current.job
        if as_json and not watch:
            emit_json(
                {
                    **job.view(),
                    "state": current.tenant.state if current.tenant else None,
                    "step_runs": [run_view(run) for run in current.step_runs],
                    "runs": [job_run_view(run) for run in current.runs],
                }
                | _check_view(current.last_check)
            )
            return
        snapshot = (job.status, job.progress, job.attempts, job.error_detail)
        if not watch:
            render_job(job, kinds.for_settings(settings))
            if current.tenant:
                click.echo(f"state     {current.tenant.state}")
            if current.last_check:
                click.echo(f"check     {_check_line(current.last_check)}")
            render_history(current.runs, current.step_runs)
            return
        if snapshot != last:
            now = datetime.now(UTC).astimezone()
            if as_json:
                line = {**job.view(), "at": now.isoformat()}
                click.echo(json.dumps(line, default=json_default))
            else:
                click.echo(
                    f"{now:%H:%M:%S}  {job.status.value:<9} {job.progress:3d}%  "
                    f"attempt {job.attempts}  {', '.join(job.steps_completed) or '-'}"
                    + (f"  error: {job.error_detail}" if job.error_detail else "")
                )
            last = snapshot
        if job.status.terminal:
            sys.exit(0 if job.status is JobStatus.SUCCEEDED else 1)
        time.sleep(interval)


def _check_view(check: service.CheckRecord | None) -> dict[str, Any]:
    """The last drift check in ``status --json``: absent when the caller may not read it."""
    if check is None:
        return {}
    return {
        "last_check": {
            "checked_at": check.checked_at,
            "outcome": check.outcome,
            "summary": check.summary or None,
        }
    }


def _check_line(check: service.CheckRecord) -> str:
    when = f"{check.checked_at:%Y-%m-%d %H:%M:%S %Z}" if check.checked_at else "-"
    return f"{check.outcome} at {when}" + (f": {check.summary}" if check.summary else "")
