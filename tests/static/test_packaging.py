"""The distribution's metadata and contents: what a user installing the wheel gets.

Read from ``pyproject.toml`` (no build, no network): the wheel holds the package and its two
Alembic trees and never the tests or the benchmarks; every sub-package of ``provisioner/`` is
declared (setuptools ships only the listed ones); the cloud SDKs are extras.
"""

from __future__ import annotations

import tomllib
from typing import Any

import pytest

from tests.static.lint_tools import PACKAGE, REPO_ROOT


@pytest.fixture(scope="module")
def pyproject() -> dict[str, Any]:
    return tomllib.loads((REPO_ROOT / "pyproject.toml").read_text())


def test_the_wheel_holds_the_package_and_its_trees_only(pyproject: dict[str, Any]) -> None:
    setuptools = pyproject["tool"]["setuptools"]
    packages: list[str] = setuptools["packages"]
    assert all(name == "provisioner" or name.startswith("provisioner.") for name in packages)
    assert set(setuptools["package-dir"].values()) == {
        "provisioner",
        "control_migrations",
        "tenant_template",
    }
    assert not any("tests" in name.split(".") or "bench" in name.split(".") for name in packages)


def test_every_sub_package_is_declared(pyproject: dict[str, Any]) -> None:
    declared = set(pyproject["tool"]["setuptools"]["packages"])
    found = {
        ".".join(("provisioner", *init.parent.relative_to(PACKAGE).parts))
        for init in PACKAGE.rglob("__init__.py")
        if "__pycache__" not in init.parts
    }
    assert found - declared == set()


def test_the_cloud_sdks_are_extras(pyproject: dict[str, Any]) -> None:
    project = pyproject["project"]
    required = " ".join(project["dependencies"])
    assert "boto3" not in required and "azure" not in required
    extras = project["optional-dependencies"]
    assert [d.split(">")[0] for d in extras["s3"]] == ["boto3"]
    assert [d.split(">")[0] for d in extras["azure"]] == ["azure-storage-blob"]
    assert f"{project['name']}[s3,azure,console]" in extras["dev"]


def test_license_and_metadata(pyproject: dict[str, Any]) -> None:
    project = pyproject["project"]
    assert project["license"] == "MIT"
    assert project["license-files"] == ["LICENSE"]
    text = (REPO_ROOT / "LICENSE").read_text()
    assert text.startswith("MIT License") and "Copyright (c) 2026 The provisioner authors" in text
    assert {"Homepage", "Source", "Issues", "Changelog"} <= set(project["urls"])
    assert project["classifiers"] and project["keywords"] and project["authors"]
