"""The ``provisioner`` command: parse, call one library function, render, map errors to exits.

Exit codes: 0 success; 1 the work failed (or the worker is not ready); 2 bad input or a
configuration that cannot work; 3 unknown tenant or job.

This module is the one place the command groups are joined; each command lives in the module
named for what it is about:

    provisioning  migrate, provision, enqueue, status
    fleet         upgrade (and its rollout levers)
    rollouts      rollouts pause / resume (and the watch's rendering)
    drift         check, repair
    tenants       suspend, restore, deprovision (one tenant or a batch), tenants list
    worker        worker, health
    jobs          jobs list / retry / cancel
    servers       servers add / list / drain / full / retire / activate / pgbouncer, locate
    moves         move a tenant to another server (--finish, --abort)
    local         local stop / status / env
    console       console (the web console, the [console] extra)
    render        output, progress and the error -> exit code mapping every command shares
"""

from __future__ import annotations

from dataclasses import replace

import click

from provisioner.cli import config as config_command
from provisioner.cli import (
    console,
    drift,
    fleet,
    jobs,
    local,
    moves,
    provisioning,
    rollouts,
    servers,
    tenants,
)
from provisioner.cli import init as init_command
from provisioner.cli import worker as worker_commands
from provisioner.cli.render import OneLineErrors, fail_cleanly
from provisioner.settings import Settings
from provisioner.version import __version__

__all__ = ["main"]


@click.group(
    cls=OneLineErrors,
    context_settings={"help_option_names": ["-h", "--help"], "show_default": True},
    invoke_without_command=True,
)
@click.version_option(__version__, prog_name="provisioner")
@click.option(
    "--owner-url", envvar="MIGRATIONS_DATABASE_URL", show_envvar=True, help="Owner role URL (DDL)."
)
@click.option(
    "--app-url", envvar="APP_DATABASE_URL", show_envvar=True, help="app_rw role URL (rows only)."
)
@click.pass_context
@fail_cleanly
def main(ctx: click.Context, owner_url: str | None, app_url: str | None) -> None:
    """Resumable tenant provisioning for schema-per-tenant PostgreSQL.

    With no database URL set, commands run on an embedded PostgreSQL under .provisioner/.
    """
    if ctx.invoked_subcommand is None:  # bare `provisioner`: the help, and success
        click.echo(ctx.get_help())
        ctx.exit(0)
    settings = Settings.load()
    ctx.obj = replace(
        settings,
        migrations_database_url=owner_url or settings.migrations_database_url,
        app_database_url=app_url or settings.app_database_url,
    )


for _command in (
    provisioning.migrate,
    provisioning.provision,
    provisioning.enqueue,
    fleet.upgrade,
    rollouts.rollouts_group,
    drift.check,
    drift.repair,
    provisioning.status,
    tenants.suspend,
    tenants.restore,
    tenants.deprovision,
    tenants.tenants_group,
    worker_commands.worker,
    worker_commands.health,
    jobs.jobs,
    servers.servers_group,
    servers.locate,
    moves.move,
    local.local,
    config_command.config,
    init_command.init,
    console.console,
):
    main.add_command(_command)
