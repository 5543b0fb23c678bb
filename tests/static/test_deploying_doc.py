"""docs/deploying.md (moved there from the README) stays in step with the code and the files it
names."""

from __future__ import annotations

import re

import pytest

from provisioner import roles
from provisioner.settings import Settings
from tests.static.lint_tools import REPO_ROOT, package_env_names

DOC = REPO_ROOT / "docs" / "deploying.md"


@pytest.fixture(scope="module")
def doc() -> str:
    return DOC.read_text()


def table_defaults(doc: str) -> dict[str, str]:
    """``| `NAME` | `default` | ... |`` rows of the environment table."""
    return dict(re.findall(r"^\| `([A-Z][A-Z0-9_]+)`[^|]*\| `([^`]*)` \|", doc, re.MULTILINE))


def test_every_variable_the_package_reads_is_documented(doc: str) -> None:
    """In the environment table here, or (the pytest plugin's) in the README."""
    docs = doc + (REPO_ROOT / "README.md").read_text()
    missing = sorted(name for name in package_env_names() if f"`{name}`" not in docs)
    assert missing == []


def test_documented_defaults_match_the_settings(doc: str) -> None:
    defaults = table_defaults(doc)
    settings = Settings()
    expected = {
        "PROVISIONER_WORKER_COMPONENT": settings.worker_component,
        "PROVISIONER_WORKER_JOB_TYPES": ",".join(settings.worker_job_types),
        "PROVISIONER_JOB_STALE_AFTER_SECONDS": f"{settings.job_stale_after_seconds:g}",
        "PROVISIONER_HEARTBEAT_SECONDS": f"{settings.heartbeat_seconds:g}",
        "PROVISIONER_POLL_SECONDS": f"{settings.poll_interval_seconds:g}",
        "PROVISIONER_DRAIN_TIMEOUT_SECONDS": f"{settings.drain_timeout_seconds:g}",
        "PROVISIONER_APP_ROLES": roles.render(settings.app_roles),
        "OBJECT_STORE_PROVIDER": settings.object_store_provider,
    }
    assert {name: defaults.get(name) for name in expected} == expected


def test_files_the_doc_names_exist(doc: str) -> None:
    named = set(re.findall(r"`((?:infra|docs|tests)/[\w./-]+|\.squawk\.toml)`", doc))
    named |= set(re.findall(r"-f (infra/[\w./-]+)", doc))
    assert "infra/docker-compose.yml" in named
    assert "infra/docker-compose.azure.yml" in named
    optional = {"infra/.env"}  # the operator's own overrides, never committed
    missing = sorted(p for p in named - optional if not (REPO_ROOT / p).exists())
    assert missing == []
