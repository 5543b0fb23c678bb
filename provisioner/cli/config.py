"""``provisioner config``: the effective settings, and where each came from."""

from __future__ import annotations

from pathlib import Path

import click
from click.core import ParameterSource

from provisioner import project
from provisioner.cli.render import emit_json, fail_cleanly
from provisioner.redact import redact
from provisioner.settings import environment

#: The CLI flags that override a key (the root group's options).
_FLAGS = {"migrations_database_url": "owner_url", "app_database_url": "app_url"}


def _rows(ctx: click.Context) -> tuple[Path | None, list[dict[str, str]]]:
    found = project.effective(environment())
    root = ctx.find_root()
    rows = []
    for key in project.KEYS:
        source = found.sources[key.name]
        value = found.env.get(key.env, "")
        flag = _FLAGS.get(key.name)
        if flag and root.get_parameter_source(flag) is ParameterSource.COMMANDLINE:
            source, value = project.Source.FLAG, str(root.params[flag])
        if key.secret and value:
            # A URL keeps its shape with the password hidden; any other secret is hidden whole.
            value = redact(value) if "://" in value or "=" in value else "***"
        rows.append(
            {
                "key": key.name,
                "variable": key.env,
                "value": value if source is not project.Source.DEFAULT else key.default,
                "source": str(source),
            }
        )
    return found.file, rows


@click.command("config")
@click.option("--json", "as_json", is_flag=True, help="One JSON object.")
@click.pass_context
@fail_cleanly
def config(ctx: click.Context, as_json: bool) -> None:
    """Print the effective settings and where each came from (flag, environment, the project's
    provisioner.toml or [tool.provisioner] in pyproject.toml, default). Secrets are hidden."""
    file, rows = _rows(ctx)
    if as_json:
        emit_json({"file": str(file) if file else None, "settings": rows})
        return
    click.echo(f"configuration file: {file}" if file else "configuration file: none found")
    width = max(len(row["key"]) for row in rows)
    for row in rows:
        value = row["value"] or "-"
        click.echo(f"{row['key']:<{width}}  {value}  ({row['source']}, {row['variable']})")
