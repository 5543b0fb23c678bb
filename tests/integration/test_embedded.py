"""The embedded default: no database URL at all, a local PostgreSQL under the state folder."""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conftest import run_cli


@pytest.fixture
def state_dir() -> Iterator[Path]:
    # A folder the unprivileged server user can reach when the tests run as root.
    path = Path(tempfile.mkdtemp(prefix="provisioner-embedded-"))
    path.chmod(0o755)
    try:
        yield path / ".provisioner"
    finally:
        run_cli(None, "local", "stop", env=embedded_env(path / ".provisioner"))
        shutil.rmtree(path, ignore_errors=True)


def embedded_env(state_dir: Path) -> dict[str, str]:
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in ("MIGRATIONS_DATABASE_URL", "APP_DATABASE_URL", "OBJECT_STORE_PROVIDER")
        and not k.startswith("OBJECT_STORE_")
    }
    env["PROVISIONER_STATE_DIR"] = str(state_dir)
    return env


def test_demo_flow_on_the_embedded_default(state_dir: Path) -> None:
    env = embedded_env(state_dir)
    migrate = run_cli(None, "migrate", env=env)
    assert migrate.returncode == 0, migrate.stderr
    assert "control schema upgraded (empty) -> 20260804_c008" in migrate.stdout
    assert run_cli(None, "migrate", env=env).stdout.startswith("control schema already at head")

    first = run_cli(None, "provision", "demo", env=env)
    assert first.returncode == 0, first.stderr
    assert "[6/6] activate_onboarding" in first.stdout
    assert (state_dir / "postgres" / "data" / "PG_VERSION").exists()
    assert (state_dir / "objects").is_dir()

    again = run_cli(None, "provision", "demo", "--json", env=env)
    assert again.returncode == 0
    view = json.loads(again.stdout)
    assert view["already_provisioned"] is True
    assert view["status"] == "succeeded"

    status = run_cli(None, "local", "status", env=env)
    assert status.returncode == 0
    assert "running on 127.0.0.1:" in status.stdout
    stopped = run_cli(None, "local", "stop", env=env)
    assert "stopped" in stopped.stdout
    assert run_cli(None, "local", "status", env=env).returncode == 1
    # the data survives a stop: the next command restarts the server and finds the tenant
    after = run_cli(None, "status", "demo", "--json", env=env)
    assert after.returncode == 0, after.stderr
    assert json.loads(after.stdout)["status"] == "succeeded"
