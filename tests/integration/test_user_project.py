"""A user's project (tests/user_project: a tiny application and its own tests) run by a real
``pytest`` subprocess, with the provisioner plugin loaded from its entry point, on two xdist
worker processes. Proves the plugin, the public API and xdist safety from the outside."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

from provisioner.testing import SERVER_URL_ENV
from tests.conftest import ROOT, Server

PROJECT = ROOT / "tests" / "user_project"


def run_pytest(project: Path, server: Server, *args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTEST_", "PROVISIONER_"))}
    env.pop("DATABASE_URL", None)
    env.update({SERVER_URL_ENV: server.admin_url, "PYTHONPATH": str(project)})
    return subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *args],
        cwd=project,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )


def test_a_users_project_passes_with_the_plugin_on_two_xdist_workers(
    pg_server: Server, tmp_path: Path
) -> None:
    project = tmp_path / "project"
    shutil.copytree(PROJECT, project, ignore=shutil.ignore_patterns("__pycache__"))
    result = run_pytest(project, pg_server, "-n", "2")
    assert result.returncode == 0, result.stdout + result.stderr
    assert "12 passed" in result.stdout, result.stdout
