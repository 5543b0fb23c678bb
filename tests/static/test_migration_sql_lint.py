"""squawk over the SQL of both Alembic trees (offline mode: ``upgrade --sql`` never connects).

Two views of the same SQL:

* the whole chain, base to head, exactly as ``alembic ... upgrade head --sql`` prints it;
* each revision on its own (``upgrade <down>:<rev> --sql``). This is the one that matters for
  lock safety: in the whole chain, a table created by an early revision looks brand new to
  squawk in every later one, so an index or constraint added to it later would pass unseen.
  Linted alone, a revision is judged against a table that already exists, as it will be when
  an upgrade runs against a live database.

The rules come from ``.squawk.toml`` at the repository root (each exclusion there has a reason).
"""

from __future__ import annotations

import argparse
import io
import os
import subprocess
import sys
import tomllib
from dataclasses import dataclass
from pathlib import Path

import pytest
from alembic import command
from alembic.config import Config
from alembic.script import ScriptDirectory

from tests.static.lint_tools import REPO_ROOT, SQUAWK_CONFIG, describe, run, squawk_binary

TENANT_SCHEMA = "tenant_acme"


@dataclass(frozen=True)
class Tree:
    name: str
    ini: Path
    x_args: tuple[str, ...] = ()

    def config(self, output: io.StringIO | None = None) -> Config:
        """The same configuration the command line builds from ``-c`` and ``-x``."""
        assert self.ini.is_file(), f"{self.ini} is missing"
        return Config(
            str(self.ini), output_buffer=output, cmd_opts=argparse.Namespace(x=list(self.x_args))
        )

    def alembic(self, *args: str) -> list[str]:
        argv = [sys.executable, "-m", "alembic", "-c", str(self.ini.relative_to(REPO_ROOT))]
        for x in self.x_args:
            argv += ["-x", x]
        return [*argv, *args]


TREES = {
    "control_migrations": Tree(
        "control_migrations", REPO_ROOT / "control_migrations" / "alembic.ini"
    ),
    "tenant_template": Tree(
        "tenant_template",
        REPO_ROOT / "tenant_template" / "alembic.ini",
        (f"tenant_schema={TENANT_SCHEMA}",),
    ),
}

# Rules that guard against long or blocking locks on live tables: never excluded.
LOCK_SAFETY_RULES = {
    "adding-field-with-default",
    "adding-foreign-key-constraint",
    "adding-not-nullable-field",
    "adding-required-field",
    "adding-serial-primary-key-field",
    "ban-concurrent-index-creation-in-transaction",
    "ban-drop-column",
    "ban-drop-not-null",
    "ban-drop-table",
    "changing-column-type",
    "constraint-missing-not-valid",
    "disallowed-unique-constraint",
    "renaming-column",
    "renaming-table",
    "require-concurrent-index-creation",
    "require-concurrent-index-deletion",
    "require-lock-timeout",
}


def offline_env() -> dict[str, str]:
    """The caller's environment without a database URL: offline mode must not need one."""
    env = dict(os.environ)
    env.pop("MIGRATIONS_DATABASE_URL", None)
    return env


def offline_sql_cli(tree: Tree, *upgrade_args: str) -> str:
    """``alembic -c INI [-x ...] upgrade ARGS --sql``, run as the command line."""
    argv = tree.alembic("upgrade", *upgrade_args, "--sql")
    result = subprocess.run(
        argv,
        cwd=REPO_ROOT,
        env=offline_env(),
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert result.returncode == 0, describe(result)
    assert result.stdout.strip(), f"{' '.join(argv)} printed no SQL"
    return result.stdout


def squawk(*args: str | Path, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
    return run(
        [squawk_binary(), "--config", SQUAWK_CONFIG, "--reporter", "gcc", *args], stdin=stdin
    )


def offline_sql_in_process(tree: Tree, target: str) -> str:
    """The same SQL through Alembic's API: ~10 ms a revision instead of ~1 s a process.

    Alembic keeps module-level state: call this from one thread only.
    """
    output = io.StringIO()
    command.upgrade(tree.config(output), target, sql=True)
    assert output.getvalue().strip(), f"{tree.name} {target}: no SQL"
    return output.getvalue()


def revision_ranges(tree: Tree) -> list[tuple[str, str]]:
    """(file stem, upgrade argument) for every revision, base first: ``down:rev`` or ``rev``."""
    script = ScriptDirectory.from_config(tree.config())
    ranges = []
    for revision in reversed(list(script.walk_revisions())):
        down = revision.down_revision
        assert not isinstance(down, tuple), (
            f"{tree.name}: {revision.revision} merges {down}; lint merge revisions by hand"
        )
        ranges.append(
            (revision.revision, f"{down}:{revision.revision}" if down else revision.revision)
        )
    assert ranges, f"{tree.name} has no revisions"
    return ranges


# --- configuration ---------------------------------------------------------------------------


def test_squawk_config_keeps_lock_safety_rules_and_explains_each_exclusion() -> None:
    config = tomllib.loads(SQUAWK_CONFIG.read_text())
    excluded = set(config.get("excluded_rules", []))
    assert not excluded & LOCK_SAFETY_RULES
    lines = SQUAWK_CONFIG.read_text().splitlines()
    for rule in excluded:
        line = next(line for line in lines if f'"{rule}"' in line)
        _, _, reason = line.partition("#")
        assert len(reason.strip()) > 20, f"{rule}: give the reason on its line"
    assert str(config["pg_version"]).split(".")[0] in {"15", "16"}


def test_squawk_flags_lock_unsafe_sql(tmp_path: Path) -> None:
    """The lint can fail: with the repository's config, unsafe DDL on live tables is rejected."""
    unsafe = tmp_path / "unsafe.sql"
    unsafe.write_text(
        "BEGIN;\n"
        "SET LOCAL lock_timeout = '5s';\n"
        "CREATE INDEX platform_jobs_status_idx ON control.platform_jobs (status);\n"
        "ALTER TABLE control.platform_jobs ALTER COLUMN attempts TYPE bigint;\n"
        "ALTER TABLE control.platform_jobs ADD CONSTRAINT jobs_tenant_fk\n"
        "    FOREIGN KEY (tenant_id) REFERENCES control.tenants (tenant_id);\n"
        "COMMIT;\n"
    )
    result = squawk(unsafe)
    assert result.returncode != 0, describe(result)
    for rule in (
        "require-concurrent-index-creation",
        "changing-column-type",
        "adding-foreign-key-constraint",
    ):
        assert rule in result.stdout, describe(result)

    no_timeout = tmp_path / "no_timeout.sql"
    no_timeout.write_text("BEGIN;\nALTER TABLE control.tenants ADD COLUMN note text;\nCOMMIT;\n")
    result = squawk(no_timeout)
    assert result.returncode != 0, describe(result)
    assert "require-lock-timeout" in result.stdout, describe(result)


# --- the trees --------------------------------------------------------------------------------


@pytest.mark.parametrize("tree_name", sorted(TREES))
def test_whole_chain_sql_passes_squawk(tree_name: str) -> None:
    tree = TREES[tree_name]
    sql = offline_sql_cli(tree, "head")
    assert "CREATE TABLE" in sql
    assert "COMMIT;" in sql
    result = squawk("--stdin-filepath", f"{tree.name}-head.sql", stdin=sql)
    assert result.returncode == 0, describe(result)


@pytest.mark.parametrize("tree_name", sorted(TREES))
def test_each_revision_alone_passes_squawk(
    tree_name: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("MIGRATIONS_DATABASE_URL", raising=False)
    monkeypatch.chdir(REPO_ROOT)  # the trees' prepend_sys_path is relative to the working dir
    tree = TREES[tree_name]
    files = []
    for stem, target in revision_ranges(tree):
        path = tmp_path / f"{tree.name}-{stem}.sql"
        path.write_text(offline_sql_in_process(tree, target))
        files.append(path)
    result = squawk(*files)
    assert result.returncode == 0, describe(result)
