"""``provisioner init``: scaffold a project (configuration, tenant tree, seeds, first revision)."""

from __future__ import annotations

from pathlib import Path

import click

from provisioner.cli.render import fail_cleanly
from provisioner.errors import InvalidInput
from provisioner.templates import scaffold


@click.command("init")
@click.argument("directory", type=click.Path(file_okay=False, path_type=Path), default=".")
@click.option("--from-schema", "schema", help="Write the first revision from this schema.")
@click.option(
    "--database-url",
    envvar="MIGRATIONS_DATABASE_URL",
    show_envvar=True,
    help="The database holding --from-schema (libpq URL or key=value; default: the owner URL).",
)
@click.option("--from-metadata", "metadata", help="module:attr of SQLAlchemy metadata or a Base.")
@fail_cleanly
def init(
    directory: Path, schema: str | None, database_url: str | None, metadata: str | None
) -> None:
    """Scaffold a project in DIRECTORY: provisioner.toml, a tenant tree (tenant/) whose env.py
    runs in each tenant's schema, a seeds folder with an example, and a first revision (an
    example table, an existing schema's DDL, or SQLAlchemy metadata). Writes only new files."""
    if schema and metadata:
        raise InvalidInput("--from-schema and --from-metadata cannot be used together")
    if schema:
        if not database_url:
            raise InvalidInput("--from-schema needs --database-url (or MIGRATIONS_DATABASE_URL)")
        first = scaffold.from_schema(database_url, schema)
    elif metadata:
        first = scaffold.from_metadata(metadata)
    else:
        first = scaffold.example_revision()
    done = scaffold.write(directory, first)
    click.echo(f"wrote a project in {done.root} (first revision from {first.source}):")
    for path in done.files:
        click.echo(f"  {path}")
    click.echo("next: provisioner migrate && provisioner provision <tenant-id>")
