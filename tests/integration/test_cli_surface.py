"""What the command line looks like from the outside: help, env vars, defaults, bad flag values,
and the one JSON shape of a job across commands."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import click
import pytest
from click.testing import CliRunner

from provisioner.cli import main
from provisioner.settings import Settings
from tests.conftest import ROOT, run_cli, settings_env

#: The installed console script (completion is keyed to the program's name).
PROVISIONER = str(Path(sys.executable).with_name("provisioner"))

JOB_KEYS = {
    "tenant_id",
    "job_id",
    "job_type",
    "status",
    "progress",
    "steps_completed",
    "attempts",
    "max_attempts",
    "error_detail",
    "locked_by",
    "available_at",
    "created_at",
    "updated_at",
    "finished_at",
}
ISO_8601 = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(\.\d+)?[+-]\d\d:\d\d$")


def commands(
    group: click.Group, path: tuple[str, ...] = ()
) -> list[tuple[tuple[str, ...], click.Command]]:
    found: list[tuple[tuple[str, ...], click.Command]] = [(path, group)]
    ctx = click.Context(group)
    for name in group.list_commands(ctx):  # the top-level group imports its commands lazily
        command = group.get_command(ctx, name)
        assert command is not None
        if isinstance(command, click.Group):
            found += commands(command, (*path, name))
        else:
            found.append(((*path, name), command))
    return found


COMMANDS = commands(main)


def test_bare_provisioner_prints_the_help_and_exits_0() -> None:
    result = run_cli(None)
    assert result.returncode == 0
    assert result.stdout.startswith("Usage: python -m provisioner")
    assert "Commands:" in result.stdout and result.stderr == ""
    for group in ("jobs", "local"):
        bare = run_cli(None, group)
        assert bare.returncode == 0 and bare.stderr == ""
        assert bare.stdout.startswith(f"Usage: python -m provisioner {group}")


@pytest.mark.parametrize(
    ("path", "command"), COMMANDS, ids=[" ".join(path) or "provisioner" for path, _ in COMMANDS]
)
def test_help_shows_every_env_var_and_every_default(
    path: tuple[str, ...], command: click.Command
) -> None:
    result = CliRunner().invoke(main, [*path, "--help"])
    assert result.exit_code == 0, result.output
    # One entry per option: a line starting with two spaces and a dash, plus its wrapped lines.
    entries = [
        " ".join(entry.split())
        for entry in re.split(r"\n(?=  -)", result.stdout.split("Options:\n", 1)[1])
    ]
    for option in command.params:
        if not isinstance(option, click.Option):
            continue
        (entry,) = [e for e in entries if re.match(rf"(-\w, )?{option.opts[0]}\b", e)]
        if option.envvar:
            assert f"env var: {option.envvar}" in entry, (path, entry)
        has_default = option.default is not None and "UNSET" not in repr(option.default)
        if has_default and not option.is_flag:
            assert "default:" in entry, (path, entry)


@pytest.mark.parametrize(
    "args",
    [
        ("jobs", "list", "--limit", "-1"),
        ("status", "acme", "--interval", "-1"),
        ("worker", "--poll-interval", "0"),
        ("worker", "--concurrency", "0"),
    ],
)
def test_bad_numeric_values_are_one_line_and_exit_2_touching_nothing(
    args: tuple[str, ...], tmp_path: Path
) -> None:
    state = tmp_path / "state"
    env = {
        "PROVISIONER_STATE_DIR": str(state),
        "MIGRATIONS_DATABASE_URL": "",
        "APP_DATABASE_URL": "",
    }
    done = CliRunner().invoke(main, list(args), env=env)
    assert done.exit_code == 2
    assert done.stderr.count("\n") == 1 and done.stderr.startswith("error: Invalid value")
    assert not state.exists()  # no embedded server was started for it


def test_one_json_shape_for_a_job_everywhere(settings: Settings) -> None:
    runner, env = CliRunner(), settings_env(settings)

    def run(*args: str) -> object:
        result = runner.invoke(main, list(args), env=env)
        assert result.exit_code == 0, result.output
        return json.loads(result.stdout)

    enqueued = run("enqueue", "acme", "--json")
    assert isinstance(enqueued, dict)
    assert enqueued["created"] is True and enqueued["requeued"] is False
    provisioned = run("provision", "acme", "--json")
    status = run("status", "acme", "--json")
    listed = run("jobs", "list", "--json")
    assert isinstance(provisioned, dict) and isinstance(status, dict) and isinstance(listed, list)
    for view in (enqueued, provisioned, status, listed[0]):
        assert set(view) >= JOB_KEYS, JOB_KEYS - set(view)
        assert view["job_id"] == enqueued["job_id"]
        assert ISO_8601.match(view["created_at"]), view["created_at"]
    assert ISO_8601.match(provisioned["finished_at"])
    assert all(ISO_8601.match(run["started_at"]) for run in status["step_runs"])
    assert {k: provisioned[k] for k in JOB_KEYS} == {k: status[k] for k in JOB_KEYS}


def test_shell_completion_works_as_the_readme_says() -> None:
    script = subprocess.run(
        [PROVISIONER],
        env={**os.environ, "_PROVISIONER_COMPLETE": "bash_source"},
        capture_output=True,
        text=True,
        check=False,
    )
    assert script.returncode == 0 and "_provisioner_completion()" in script.stdout
    completed = subprocess.run(
        [PROVISIONER],
        env={
            **os.environ,
            "_PROVISIONER_COMPLETE": "bash_complete",
            "COMP_WORDS": "provisioner jo",
            "COMP_CWORD": "1",
        },
        capture_output=True,
        text=True,
        check=False,
    )
    assert completed.stdout.split() == ["plain,jobs"]
    readme = (ROOT / "README.md").read_text()
    assert 'eval "$(_PROVISIONER_COMPLETE=bash_source provisioner)"' in readme


@pytest.mark.parametrize(
    "args", [("status", "nobody"), ("jobs", "list"), ("enqueue", "startup")], ids=" ".join
)
def test_a_command_on_rows_starts_without_alembic_or_sqlalchemy(
    settings: Settings, args: tuple[str, ...]
) -> None:
    """The control schema's at-head check reads the revision files, driver errors are told
    apart without importing SQLAlchemy (docs/performance.md "Start-up")."""
    code = (
        "import json, sys\nfrom provisioner.cli import main\n"
        f"try:\n    main({list(args)!r})\nexcept SystemExit as exit:\n    code = exit.code\n"
        "print('\\n' + json.dumps([code, sorted(sys.modules)]))"
    )
    done = subprocess.run(
        [sys.executable, "-c", code],
        env=settings_env(settings),
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    exit_code, modules = json.loads(done.stdout.rsplit("\n", 2)[-2])
    assert exit_code == (3 if args[0] == "status" else 0), done.stderr
    assert "psycopg" in modules  # it did talk to the database
    assert not {"alembic", "sqlalchemy", "boto3", "botocore"} & set(modules)
