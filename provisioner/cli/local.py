"""``provisioner local``: the embedded PostgreSQL under ``.provisioner/`` (``stop``, ``status``,
``env``)."""

from __future__ import annotations

import shlex
import sys
from dataclasses import replace

import click

from provisioner import service
from provisioner.cli.render import fail_cleanly, say
from provisioner.settings import Settings


@click.group()
def local() -> None:
    """The embedded PostgreSQL under .provisioner/ (used when no database URL is set)."""


@local.command("stop")
@click.pass_context
@fail_cleanly
def local_stop(ctx: click.Context) -> None:
    """Stop the embedded PostgreSQL (its data stays for the next run)."""
    settings: Settings = ctx.obj
    state_dir = service.embedded.locate_state_dir(settings.state_dir)
    stopped = service.embedded.stop_embedded(state_dir)
    click.echo("embedded PostgreSQL stopped" if stopped else "embedded PostgreSQL is not running")


def export_lines(urls: service.embedded.EmbeddedUrls) -> list[str]:
    """Shell-quoted: the URLs name the cluster's password file (``?passfile=...``), never a
    password."""
    return [
        f"export MIGRATIONS_DATABASE_URL={shlex.quote(urls.owner)}",
        f"export APP_DATABASE_URL={shlex.quote(urls.app)}",
        f"export OBJECT_STORE_PATH={shlex.quote(str(urls.objects))}",
    ]


@local.command("status")
@click.pass_context
@fail_cleanly
def local_status(ctx: click.Context) -> None:
    """Say whether the embedded PostgreSQL runs, where, and its URLs. Exit 0 running, 1 not."""
    settings: Settings = ctx.obj
    state_dir = service.embedded.locate_state_dir(settings.state_dir)
    cluster = service.embedded.embedded_cluster(state_dir)
    if not cluster.running():
        click.echo(f"not running (state folder {state_dir})")
        sys.exit(1)
    click.echo(f"running on 127.0.0.1:{cluster.port}, data in {cluster.data}")
    click.echo(f"state folder {state_dir}")
    for line in export_lines(service.embedded.embedded_urls(state_dir)):
        click.echo(line.removeprefix("export "))


@local.command("env")
@click.pass_context
@fail_cleanly
def local_env(ctx: click.Context) -> None:
    """Print export lines for the embedded database's URLs (starting it if needed), so that a
    worker can serve it: eval "$(provisioner local env)" && provisioner worker"""
    settings: Settings = ctx.obj
    resolved = service.resolve(
        replace(settings, migrations_database_url=None, app_database_url=None), notify=say
    )
    urls = service.embedded.embedded_urls(resolved.state_dir)
    for line in export_lines(urls):
        click.echo(line)
