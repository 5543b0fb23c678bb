"""The worker's commands: ``worker`` (the long-running process) and ``health`` (its readiness,
read from its heartbeat)."""

from __future__ import annotations

import sys
from dataclasses import replace

import click

from provisioner import logs, service
from provisioner.cli.options import SECONDS, component_options, for_component, settings_of
from provisioner.cli.render import emit_json, fail_cleanly
from provisioner.settings import MAX_CONCURRENCY, Settings
from provisioner.worker import WorkerOptions, run_worker


@click.command()
@click.option("--once", is_flag=True, help="Drain every claimable job, then exit 0.")
@click.option(
    "--concurrency",
    type=click.IntRange(1, MAX_CONCURRENCY),
    default=None,
    help="Jobs at once, each in its own child process "
    "[default: PROVISIONER_WORKER_CONCURRENCY, else one per core, at most 8].",
)
@click.option(
    "--log-format",
    type=click.Choice(logs.LOG_FORMATS),
    default="human",
    show_default=True,
    help="One line per event: human-readable or JSON.",
)
@click.option(
    "--poll-interval",
    type=SECONDS,
    envvar="PROVISIONER_POLL_SECONDS",
    show_envvar=True,
    default=Settings.poll_interval_seconds,
    help="Seconds between polls when no wake-up arrives.",
)
@click.option(
    "--stale-after",
    type=SECONDS,
    envvar="PROVISIONER_JOB_STALE_AFTER_SECONDS",
    show_envvar=True,
    default=Settings.job_stale_after_seconds,
    help="Seconds after which a running job's lease has expired.",
)
@click.option(
    "--heartbeat",
    type=SECONDS,
    envvar="PROVISIONER_HEARTBEAT_SECONDS",
    show_envvar=True,
    default=Settings.heartbeat_seconds,
    help="Seconds between heartbeats and lease renewals.",
)
@click.option(
    "--drain-timeout",
    type=SECONDS,
    envvar="PROVISIONER_DRAIN_TIMEOUT_SECONDS",
    show_envvar=True,
    default=Settings.drain_timeout_seconds,
    help="On SIGTERM/SIGINT, seconds the running step gets to finish.",
)
@component_options(
    component_help="Heartbeat component name.",
    job_types_help="Comma-separated job types to claim.",
)
@click.option(
    "--allow-superuser",
    is_flag=True,
    help="Run even when MIGRATIONS_DATABASE_URL connects as a superuser.",
)
@click.pass_context
@fail_cleanly
def worker(
    ctx: click.Context,
    once: bool,
    concurrency: int | None,
    log_format: str,
    poll_interval: float | None,
    stale_after: float | None,
    heartbeat: float | None,
    drain_timeout: float | None,
    component: str | None,
    job_types: str | None,
    allow_superuser: bool,
) -> None:
    """The long-running worker: claim and provision queued tenants. Exit 0 on a clean stop.

    Needs MIGRATIONS_DATABASE_URL and APP_DATABASE_URL (never the embedded database).
    """
    base: Settings = ctx.obj
    settings = replace(
        base,
        poll_interval_seconds=poll_interval or base.poll_interval_seconds,
        job_stale_after_seconds=stale_after or base.job_stale_after_seconds,
        heartbeat_seconds=heartbeat or base.heartbeat_seconds,
        drain_timeout_seconds=drain_timeout or base.drain_timeout_seconds,
    )
    settings = for_component(settings, component, job_types)
    options = WorkerOptions(
        once=once, concurrency=concurrency or 0, allow_superuser=allow_superuser
    )
    sys.exit(run_worker(settings, options, logs.configure(log_format)))


@click.command()
@click.option("--json", "as_json", is_flag=True, help="Print what was seen as JSON.")
@component_options(
    component_help="Component to check.",
    job_types_help="Comma-separated job types the component must advertise.",
)
@click.option("--check-storage", is_flag=True, help="Also check the object store from here.")
@click.pass_context
@fail_cleanly
def health(
    ctx: click.Context,
    as_json: bool,
    component: str | None,
    job_types: str | None,
    check_storage: bool,
) -> None:
    """Ready (exit 0) when the worker's heartbeat is fresh and advertises its job types.

    Lists each tenant server's status and tenants and, with the owner's URL, whether the owner
    reaches it now (a server that is down is listed, not a reason for exit 1)."""
    settings = for_component(settings_of(ctx), component, job_types)
    report = service.health(settings)
    view = report.view()
    ready = report.ready
    if check_storage:
        storage = service.check_storage(settings)
        view["storage"] = storage
        ready = ready and bool(storage["ready"])
    view["ready"] = ready
    if as_json:
        emit_json(view)
    else:
        for c in report.components:
            click.echo(f"{c.component}: {'ready' if c.ready else 'NOT READY'} ({c.reason})")
            foreign = (c.detail.get("pool") or {}).get("foreign") or []
            if foreign:
                click.echo(
                    f"  warm pool: {len(foreign)} pool_* schema(s) not the pool's, left alone: "
                    + ", ".join(foreign[:10])
                )
        if report.database is not None:
            click.echo(f"database: {report.database.detail}")
        for server in report.servers:
            room = "" if server.capacity is None else f" of {server.capacity}"
            load = f"{server.placed}{room} tenants"
            reach = report.reach_of(server.name)
            state = "" if not reach else ", reachable" if reach["reachable"] else ", DOWN"
            why = f" ({reach['problem']})" if reach.get("problem") else ""
            click.echo(f"tenant server {server.name}: {server.status}, {load}{state}{why}")
        if check_storage:
            click.echo(
                f"object store: {'ready' if view['storage']['ready'] else 'NOT READY'} "
                f"({view['storage']['detail']})"
            )
    sys.exit(0 if ready else 1)
