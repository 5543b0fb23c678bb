"""What a fresh process imports: `import provisioner` and `provisioner --help` load neither the
driver nor the engine, the migrations or the object stores' libraries, and the top-level help
still lists every command as click would from the commands themselves (docs/performance.md
"Start-up")."""

from __future__ import annotations

import json
import subprocess
import sys

import click
import pytest

from provisioner.cli import COMMANDS, main

#: Modules a start-up that does no database work must not import: each costs tens to hundreds
#: of milliseconds, and the list is what the command modules and the public API pull in.
HEAVY = (
    "alembic",
    "azure.storage.blob",
    "boto3",
    "botocore",
    "prometheus_client",
    "psycopg",
    "sqlalchemy",
    "sqlparse",
    "provisioner.api",
    "provisioner.engine",
    "provisioner.kinds",
    "provisioner.service",
)


def imported_after(code: str) -> set[str]:
    """The modules a fresh interpreter holds after running ``code`` (its stdout is dropped)."""
    done = subprocess.run(
        [
            sys.executable,
            "-c",
            f"{code}\nimport json, sys\nprint('\\n' + json.dumps(sorted(sys.modules)))",
        ],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    return set(json.loads(done.stdout.rsplit("\n", 2)[-2]))


def test_import_provisioner_loads_no_heavy_module_until_an_export_is_used() -> None:
    modules = imported_after("import provisioner")
    assert not modules & set(HEAVY), sorted(modules & set(HEAVY))
    used = imported_after("import provisioner\nprovisioner.enqueue")
    assert {"provisioner.api", "psycopg"} <= used
    # An application on psycopg alone: SQLAlchemy's objects are recognised by class.
    assert not used & {"alembic", "boto3", "sqlalchemy", "prometheus_client"}


@pytest.mark.parametrize("args", [["--help"], [], ["--version"]], ids=["--help", "bare", "version"])
def test_the_top_level_help_loads_no_command_module(args: list[str]) -> None:
    modules = imported_after(
        "from provisioner.cli import main\n"
        f"try:\n    main({args!r})\nexcept SystemExit as exit:\n    assert not exit.code\n"
    )
    assert not modules & set(HEAVY), sorted(modules & set(HEAVY))
    assert not {f"provisioner.cli.{lazy.module}" for lazy in COMMANDS.values()} & modules


def test_running_a_command_imports_its_module() -> None:
    modules = imported_after(
        "from provisioner.cli import main\n"
        "try:\n    main(['init', '--help'])\nexcept SystemExit as exit:\n    assert not exit.code\n"
    )
    assert "provisioner.cli.init" in modules and "provisioner.cli.jobs" not in modules


@pytest.mark.parametrize("width", [50, 60, 79, 80, 120])
def test_the_listing_is_what_click_prints_from_the_commands_themselves(width: int) -> None:
    """The summaries in COMMANDS are each command's first sentence: a docstring edited without
    its summary fails here."""
    ctx = click.Context(main)
    eager = click.Group(commands={name: main.get_command(ctx, name) for name in COMMANDS})
    for group in (main, eager):
        assert isinstance(group, click.Group)
    lazy_listing, eager_listing = (
        click.HelpFormatter(width=width, max_width=width),
        click.HelpFormatter(width=width, max_width=width),
    )
    for name, lazy in COMMANDS.items():
        command = main.get_command(ctx, name)
        assert command is not None and command.name == name and not command.hidden
        for limit in range(3, 200):
            summary = click.Command(name, help=lazy.summary).get_short_help_str(limit)
            assert summary == command.get_short_help_str(limit), (
                f"COMMANDS[{name!r}].summary is stale: make it the first sentence of the "
                f"command's docstring, {command.get_short_help_str(1000)!r}"
            )
    main.format_commands(ctx, lazy_listing)
    eager.format_commands(click.Context(eager), eager_listing)
    assert lazy_listing.getvalue() == eager_listing.getvalue()
