"""A tenant's lifecycle commands: ``suspend``, ``restore``, ``deprovision`` (``--purge``), each
run now or queued for a worker with ``--queue``."""

from __future__ import annotations

import sys
import time

import click

from provisioner import kinds, service
from provisioner.cli.options import settings_of
from provisioner.cli.render import StepPrinter, emit_json, fail_cleanly, render_job
from provisioner.errors import InvalidInput
from provisioner.kinds import lifecycle as tenant_lifecycle
from provisioner.models import JobStatus


def run_lifecycle(
    ctx: click.Context, tenant_id: str, job_type: str, *, as_json: bool, queue_only: bool
) -> None:
    """Run (or queue) one lifecycle kind for the tenant and report it; exits with its code."""
    service.TenantId(tenant_id)
    settings = settings_of(ctx)
    kind = kinds.for_settings(settings)[job_type]
    quiet = as_json or queue_only
    if not quiet:
        click.echo(f"{kind.command} tenant {tenant_id}")
    started = time.monotonic()
    result = service.change_lifecycle(
        settings,
        tenant_id,
        job_type,
        queue_only=queue_only,
        on_progress=StepPrinter(quiet, kinds.for_settings(settings)),
    )
    job = result.job
    ok = result.already or result.queued or (job is not None and job.status is JobStatus.SUCCEEDED)
    if as_json:
        view = job.view() if job is not None else {"tenant_id": tenant_id, "job_id": None}
        emit_json(
            {
                **view,
                "job_type": job_type,
                "state": result.state,
                "already": result.already,
                "queued": result.queued,
            }
        )
    elif result.queued and job is not None:
        click.echo(str(job.id))
    elif result.already:
        click.echo(f"tenant {tenant_id} is already {result.state}; nothing to do")
    else:
        click.echo(f"finished in {time.monotonic() - started:.2f} s; state {result.state}")
        if job is not None:
            render_job(job, kinds.for_settings(settings))
    sys.exit(0 if ok else 1)


QUEUE_HELP = "Queue the job for a worker (listed in PROVISIONER_WORKER_JOB_TYPES); print its id."


@click.command()
@click.argument("tenant_id")
@click.option("--queue", "queue_only", is_flag=True, help=QUEUE_HELP)
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object, no progress.")
@click.pass_context
@fail_cleanly
def suspend(ctx: click.Context, tenant_id: str, queue_only: bool, as_json: bool) -> None:
    """Take app_rw's access to TENANT_ID's schema away at once; data untouched.

    Exit 0 done, 1 failed, 2 bad input or wrong state, 3 unknown tenant.
    """
    run_lifecycle(
        ctx, tenant_id, tenant_lifecycle.SUSPEND_JOB_TYPE, as_json=as_json, queue_only=queue_only
    )


@click.command()
@click.argument("tenant_id")
@click.option("--queue", "queue_only", is_flag=True, help=QUEUE_HELP)
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object, no progress.")
@click.pass_context
@fail_cleanly
def restore(ctx: click.Context, tenant_id: str, queue_only: bool, as_json: bool) -> None:
    """Give a suspended or archived TENANT_ID its access back, as provisioning grants it.

    The state returns to what it was before suspension. Exit codes as for suspend.
    """
    run_lifecycle(
        ctx, tenant_id, tenant_lifecycle.RESTORE_JOB_TYPE, as_json=as_json, queue_only=queue_only
    )


@click.command()
@click.argument("tenant_id")
@click.option("--purge", is_flag=True, help="Drop the tenant's schema and data (state deleted).")
@click.option("--yes", is_flag=True, help="Do not ask before --purge (needed off a terminal).")
@click.option("--queue", "queue_only", is_flag=True, help=QUEUE_HELP)
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object, no progress.")
@click.pass_context
@fail_cleanly
def deprovision(
    ctx: click.Context, tenant_id: str, purge: bool, yes: bool, queue_only: bool, as_json: bool
) -> None:
    """Offboard TENANT_ID: revoke app_rw's access and archive it (data kept, restorable).

    With --purge (also on an archived tenant) the schema is dropped and the state is deleted;
    control rows and job history are kept. Exit codes as for suspend.
    """
    service.TenantId(tenant_id)
    if purge and not yes:
        if not sys.stdin.isatty():
            raise InvalidInput("--purge drops the tenant's data: pass --yes to confirm")
        click.confirm(
            f"Drop schema tenant_{tenant_id} and every row in it? This cannot be undone",
            abort=True,
        )
    job_type = tenant_lifecycle.PURGE_JOB_TYPE if purge else tenant_lifecycle.DEPROVISION_JOB_TYPE
    run_lifecycle(ctx, tenant_id, job_type, as_json=as_json, queue_only=queue_only)
