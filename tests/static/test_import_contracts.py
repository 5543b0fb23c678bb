"""The package's layering is a contract (``[tool.importlinter]`` in pyproject.toml) that
``make lint`` and ``make test`` check with import-linter. These tests prove the check holds on
the tree and that it fails when a module imports a part above it, so it cannot pass by accident.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
LINT_IMPORTS = Path(sys.executable).with_name("lint-imports")


def _lint(tree: Path) -> subprocess.CompletedProcess[str]:
    """import-linter on the package found first on ``PYTHONPATH`` (``tree``), no cache."""
    env = {**os.environ, "PYTHONPATH": str(tree)}
    return subprocess.run(
        [str(LINT_IMPORTS), "--no-cache", "--config", str(tree / "pyproject.toml")],
        cwd=tree,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def _copy_tree(tmp_path: Path) -> Path:
    tree = tmp_path / "tree"
    shutil.copytree(
        ROOT / "provisioner", tree / "provisioner", ignore=shutil.ignore_patterns("__pycache__")
    )
    shutil.copy(ROOT / "pyproject.toml", tree / "pyproject.toml")
    return tree


def test_the_tree_keeps_every_contract(tmp_path: Path) -> None:
    result = _lint(_copy_tree(tmp_path))
    assert result.returncode == 0, result.stdout + result.stderr
    assert "BROKEN" not in result.stdout
    assert "0 broken" in result.stdout


@pytest.mark.parametrize(
    ("module", "imported", "broken"),
    [
        # A ground module (the database adapter) reaching the top of the package.
        ("db/__init__.py", "provisioner.cli", "Each part imports only the parts below it"),
        ("queue/__init__.py", "provisioner.kinds", "The queue names no job kind and runs no step"),
    ],
)
def test_a_forbidden_import_breaks_its_contract(
    tmp_path: Path, module: str, imported: str, broken: str
) -> None:
    tree = _copy_tree(tmp_path)
    target = tree / "provisioner" / module
    target.write_text(target.read_text() + f"\nimport {imported}  # noqa: E402,F401\n")
    result = _lint(tree)
    assert result.returncode != 0
    assert f"{broken} BROKEN" in result.stdout
    assert f"is not allowed to import {imported}" in result.stdout


def test_make_lint_and_make_test_check_the_contracts(tmp_path: Path) -> None:
    for target in ("lint", "test"):
        out = subprocess.run(
            ["make", "-n", target, f"VENV={tmp_path}/venv"],
            cwd=ROOT,
            capture_output=True,
            text=True,
            check=True,
        ).stdout
        assert "bin/lint-imports" in out, (target, out)
