"""``provisioner console``: serve the operator's web console (the ``[console]`` extra)."""

from __future__ import annotations

import click

from provisioner.cli.options import settings_of
from provisioner.cli.render import fail_cleanly
from provisioner.errors import ConfigurationError

INSTALL_HINT = "pip install 'pg-tenant-provisioner[console]'"


@click.command("console")
@click.option(
    "--host",
    envvar="PROVISIONER_CONSOLE_HOST",
    show_envvar=True,
    default=None,
    help="Listen on this address (default 127.0.0.1).",
)
@click.option(
    "--port",
    envvar="PROVISIONER_CONSOLE_PORT",
    show_envvar=True,
    type=click.IntRange(0, 65535),
    default=None,
    help="Listen on this port (default 8080).",
)
@click.pass_context
@fail_cleanly
def console(ctx: click.Context, host: str | None, port: int | None) -> None:
    """The web console: the fleet, rollouts, tenants, the queue and the pool, live.

    Read-only unless PROVISIONER_CONSOLE_TOKEN is set; then actions (retry, cancel, resume or
    abort a rollout, suspend, restore) need that token, typed once into the login form.
    """
    try:
        from provisioner import console as web  # the [console] extra
    except ImportError as exc:
        raise ConfigurationError(
            f"the console needs the [console] extra ({exc.name} is missing): {INSTALL_HINT}"
        ) from None
    settings = settings_of(ctx)
    web.serve(
        settings,
        host or settings.console_host,
        port if port is not None else settings.console_port,
    )
