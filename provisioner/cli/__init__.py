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

Each command's module is imported when click resolves that command (to run it, for its own
``--help``, for shell completion), never by ``provisioner --help`` or ``--version``: the
command modules import the service, the engine and the driver, and one command should not pay
for the other twenty-one (docs/performance.md "Start-up"). ``COMMANDS`` below is the one list of
top-level commands; it carries the first sentence of each command's docstring, so the top-level
help lists them without importing them (tests/unit/test_startup.py pins each summary to what
click derives from the command itself).
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass, replace

import click

from provisioner.cli.render import OneLineErrors, fail_cleanly
from provisioner.settings import Settings
from provisioner.version import __version__

__all__ = ["COMMANDS", "main"]


@dataclass(frozen=True)
class Lazy:
    """Where a top-level command lives, and what ``provisioner --help`` says of it."""

    module: str  # under provisioner.cli
    attribute: str
    summary: str  # the first sentence of the command's docstring


COMMANDS: dict[str, Lazy] = {
    "migrate": Lazy(
        "provisioning", "migrate", "Bring the control schema to head (a no-op when it is there)."
    ),
    "provision": Lazy(
        "provisioning", "provision", "Provision TENANT_ID now; resume it if half done."
    ),
    "enqueue": Lazy(
        "provisioning", "enqueue", "Queue TENANT_ID for a worker (idempotent); print the job id."
    ),
    "upgrade": Lazy(
        "fleet",
        "upgrade",
        "Queue provisioned tenants whose schema is behind the template's head for a worker.",
    ),
    "rollouts": Lazy(
        "rollouts",
        "rollouts_group",
        "Levers on one rollout, by id (`upgrade --watch` shows the latest).",
    ),
    "check": Lazy("drift", "check", "Compare tenants' objects with what the template head builds."),
    "repair": Lazy(
        "drift",
        "repair",
        "Restore what drifted from the template head where it is safe, as repair_tenant jobs.",
    ),
    "status": Lazy("provisioning", "status", "Show TENANT_ID's provisioning state."),
    "suspend": Lazy(
        "tenants",
        "suspend",
        "Take app_rw's access to the tenants' schemas away at once; data untouched.",
    ),
    "restore": Lazy(
        "tenants",
        "restore",
        "Give suspended or archived tenants their access back, as provisioning grants it.",
    ),
    "deprovision": Lazy(
        "tenants",
        "deprovision",
        "Offboard tenants: revoke app_rw's access and archive them (data kept, restorable).",
    ),
    "tenants": Lazy("tenants", "tenants_group", "The fleet's tenants."),
    "worker": Lazy(
        "worker", "worker", "The long-running worker: claim and provision queued tenants."
    ),
    "health": Lazy(
        "worker",
        "health",
        "Ready (exit 0) when the worker's heartbeat is fresh and advertises its job types.",
    ),
    "jobs": Lazy("jobs", "jobs", "Operator view of the queue, and its levers."),
    "servers": Lazy(
        "servers",
        "servers_group",
        "The tenant servers: where new tenants go, and where each tenant lives.",
    ),
    "locate": Lazy(
        "servers", "locate", "Print the server TENANT_ID lives on, and its connection reference."
    ),
    "move": Lazy(
        "moves",
        "move",
        "Move TENANT_ID's schema to --to SERVER: DDL pre-copied (with --method logical or auto,"
        " the rows too, by logical replication), writes frozen (app roles revoked on the"
        " source), the rows copied or caught up as the owner, verified (catalog, rows,"
        " sequences, grants), directory switched and grants given on the target.",
    ),
    "local": Lazy(
        "local",
        "local",
        "The embedded PostgreSQL under .provisioner/ (used when no database URL is set).",
    ),
    "config": Lazy(
        "config",
        "config",
        "Print the effective settings and where each came from (flag, environment, the"
        " project's provisioner.toml or [tool.provisioner] in pyproject.toml, default).",
    ),
    "init": Lazy(
        "init",
        "init",
        "Scaffold a project in DIRECTORY: provisioner.toml, a tenant tree (tenant/) whose env.py "
        "runs in each tenant's schema, a seeds folder with an example, and a first revision (an "
        "example table, an existing schema's DDL, or SQLAlchemy metadata).",
    ),
    "console": Lazy(
        "console",
        "console",
        "The web console: the fleet, rollouts, tenants, the queue and the pool, live.",
    ),
}


class LazyCommands(OneLineErrors):
    """The top-level group: lists ``COMMANDS`` from their summaries and imports a command's
    module only when click resolves that command (see the module docstring for why)."""

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted(COMMANDS)

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        lazy = COMMANDS.get(cmd_name)
        if lazy is None:
            return None
        command = getattr(importlib.import_module(f"provisioner.cli.{lazy.module}"), lazy.attribute)
        assert isinstance(command, click.Command)
        return command

    def format_commands(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        """Click's own listing (same width, same shortening), from the summaries."""
        limit = formatter.width - 6 - max(len(name) for name in COMMANDS)
        rows = [
            (name, click.Command(name, help=lazy.summary).get_short_help_str(limit))
            for name, lazy in sorted(COMMANDS.items())
        ]
        with formatter.section("Commands"):
            formatter.write_dl(rows)


@click.group(
    cls=LazyCommands,
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
