"""The embedded default: no database URL at all, a local PostgreSQL under the state folder."""

from __future__ import annotations

import json
import os
import shlex
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest

from provisioner.local import state as embedded
from provisioner.templates import migrations
from tests.conftest import ROOT, run_cli


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
    head = migrations.head_label(migrations.control_heads())
    assert f"control schema upgraded (empty) -> {head}" in migrate.stdout
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


def run_in(folder: Path, *args: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    """``python -m provisioner ARGS`` run from ``folder`` (the state folder is looked up there)."""
    return subprocess.run(
        [sys.executable, "-m", "provisioner", *args],
        cwd=folder,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def test_the_state_folder_is_found_from_a_subfolder_and_a_worker_can_serve_it(
    state_dir: Path,
) -> None:
    project = state_dir.parent  # state_dir itself is not created yet: the default finds it
    sub = project / "src" / "deep"
    sub.mkdir(parents=True)
    env = embedded_env(state_dir)
    del env["PROVISIONER_STATE_DIR"]
    env["PYTHONPATH"] = str(ROOT)

    first = run_in(project, "migrate", env=env)
    assert first.returncode == 0, first.stderr
    assert f"creating a new embedded PostgreSQL cluster in {state_dir}" in first.stderr
    assert "started the embedded PostgreSQL on 127.0.0.1:" in first.stderr

    queued = run_in(sub, "enqueue", "demo", env=env)  # the project's cluster, not a new one
    assert queued.returncode == 0, queued.stderr
    assert "creating" not in queued.stderr and "started" not in queued.stderr
    assert 'eval "$(provisioner local env)" && provisioner worker' in queued.stderr
    assert not (sub / ".provisioner").exists()

    exports = run_in(sub, "local", "env", env=env)
    assert exports.returncode == 0, exports.stderr
    urls = dict(
        shlex.split(line.removeprefix("export "))[0].split("=", 1)
        for line in exports.stdout.splitlines()
    )
    assert set(urls) == {"MIGRATIONS_DATABASE_URL", "APP_DATABASE_URL", "OBJECT_STORE_PATH"}
    worker = run_in(sub, "worker", "--once", env={**env, **urls})
    assert worker.returncode == 0, worker.stderr

    done = run_in(sub, "status", "demo", "--json", env=env)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["status"] == "succeeded"
    shown = run_in(sub, "local", "status", env=env)
    assert shown.returncode == 0
    assert f"APP_DATABASE_URL={shlex.quote(urls['APP_DATABASE_URL'])}" in shown.stdout
    run_in(sub, "local", "stop", env=env)


def test_a_private_state_folder_keeps_a_pointer_to_data_the_server_can_reach() -> None:
    outer = Path(tempfile.mkdtemp(prefix="provisioner-private-"))
    outer.chmod(0o700)  # like /root: the server user cannot traverse it
    state = outer / "project" / ".provisioner"
    heard: list[str] = []
    cluster = None
    try:
        urls = embedded.ensure_embedded(state, heard.append)
        cluster = embedded.embedded_cluster(state)
        if os.geteuid() == 0:  # the server runs as another user, who cannot reach `outer`
            pointer = (state / embedded.LOCATION_FILE).read_text().strip()
            assert cluster.root == Path(pointer) and not cluster.root.is_relative_to(outer)
            assert any("is private" in line for line in heard)
        else:  # the server runs as us: the data stays in the state folder
            assert cluster.root == state / "postgres"
        assert any(line.startswith("creating a new embedded PostgreSQL cluster") for line in heard)
        with psycopg.connect(urls.owner) as conn:
            assert conn.execute("SELECT current_user").fetchone() == ("provisioner_owner",)
    finally:
        if cluster is not None:
            cluster.stop()
            if not cluster.root.is_relative_to(outer):
                shutil.rmtree(cluster.root, ignore_errors=True)
        shutil.rmtree(outer, ignore_errors=True)


def test_the_state_folder_is_looked_up_like_git(tmp_path: Path) -> None:
    (tmp_path / ".provisioner").mkdir()
    deep = tmp_path / "a" / "b"
    deep.mkdir(parents=True)
    default = embedded.DEFAULT_STATE_DIR
    assert embedded.locate_state_dir(default, deep) == tmp_path / ".provisioner"
    assert embedded.locate_state_dir(Path("elsewhere"), deep) == Path("elsewhere").absolute()
    lonely = tmp_path.parent / f"{tmp_path.name}-none"
    lonely.mkdir()
    assert embedded.locate_state_dir(default, lonely) in (
        lonely / ".provisioner",
        *(p / ".provisioner" for p in lonely.parents if (p / ".provisioner").is_dir()),
    )
