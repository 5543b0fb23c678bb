"""`make demo` installs only what it runs; `make test` installs the rest (read with `make -n`
against a virtualenv path that does not exist, so every install step shows)."""

from __future__ import annotations

import subprocess
from pathlib import Path

from tests.conftest import ROOT


def dry_run(target: str, tmp_venv: str) -> list[str]:
    out = subprocess.run(
        ["make", "-n", target, f"VENV={tmp_venv}"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
    )
    return [line for line in out.stdout.splitlines() if "pip install" in line]


def test_demo_installs_the_package_alone_and_test_installs_the_dev_extra(tmp_path: Path) -> None:
    venv = f"{tmp_path}/venv"
    (demo,) = dry_run("demo", venv)
    assert "[dev]" not in demo
    assert demo.endswith(("-e '.'", "-e '.[embedded]'"))
    (test,) = dry_run("test", venv)
    assert test.endswith("-e '.[dev]'")
