"""The pytest plugin on the servers an application's CI has (issue 24, item 6): a server that
asks for passwords, given in each of libpq's three ways; setups that fail leave no database
behind; the pytest-xdist workers of a run share one throwaway cluster, which the last one stops.

Each runs the user's project (tests/user_project) in a real ``pytest`` subprocess, as
tests/integration/test_user_project.py does.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest

from provisioner.local import cluster as local_pg
from provisioner.testing import SERVER_URL_ENV
from tests.conftest import ROOT

PROJECT = ROOT / "tests" / "user_project"
PASSED = "12 passed"


@pytest.fixture(scope="module")
def scram_server() -> Iterator[local_pg.Cluster]:
    """A server of our own that asks every role for a password (scram-sha-256)."""
    cluster = local_pg.Cluster(Path(tempfile.mkdtemp(prefix="provisioner-scram-")), durable=False)
    try:
        cluster.ensure_running()
        yield cluster
    finally:
        cluster.stop()
        shutil.rmtree(cluster.root, ignore_errors=True)


@pytest.fixture
def project(tmp_path: Path) -> Path:
    copy = tmp_path / "project"
    shutil.copytree(PROJECT, copy, ignore=shutil.ignore_patterns("__pycache__"))
    return copy


def run_pytest(project: Path, env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    clean = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("PYTEST_", "PROVISIONER_", "PG")) and k != "DATABASE_URL"
    }
    clean.update({"PYTHONPATH": str(project), **env})
    return subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *args],
        cwd=project,
        env=clean,
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )


def leftover_databases(cluster: local_pg.Cluster) -> list[str]:
    with psycopg.connect(cluster.superuser_url(), autocommit=True) as conn:
        rows = conn.execute(
            "SELECT datname FROM pg_database WHERE datname LIKE 'provisioner_test%' ORDER BY 1"
        ).fetchall()
    return [name for (name,) in rows]


def password_forms(cluster: local_pg.Cluster, home: Path) -> dict[str, dict[str, str]]:
    password = cluster.password(local_pg.SUPERUSER)
    assert password
    bare = f"postgresql://postgres@127.0.0.1:{cluster.port}/postgres"
    (home / ".pgpass").write_text(f"127.0.0.1:{cluster.port}:*:postgres:{password}\n")
    (home / ".pgpass").chmod(0o600)
    return {
        "url": {SERVER_URL_ENV: bare.replace("postgres@", f"postgres:{password}@", 1)},
        "PGPASSWORD": {SERVER_URL_ENV: bare, "PGPASSWORD": password},
        "pgpass": {SERVER_URL_ENV: bare, "HOME": str(home)},
    }


@pytest.mark.parametrize("form", ["url", "PGPASSWORD", "pgpass"])
def test_the_plugin_works_with_a_server_that_asks_for_passwords(
    scram_server: local_pg.Cluster, project: Path, tmp_path: Path, form: str
) -> None:
    env = password_forms(scram_server, tmp_path)[form]
    # The PGPASSWORD run on two xdist workers, the others in one process (where the tests'
    # sign-ups must be swept between tests for the drain test's two attempts to pass).
    extra = ("-n", "2") if form == "PGPASSWORD" else ("-p", "no:xdist")
    result = run_pytest(project, env, *extra)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert PASSED in result.stdout, result.stdout
    assert leftover_databases(scram_server) == []


def reject(cluster: local_pg.Cluster, role: str) -> None:
    """pg_hba refuses ``role``: the plugin's database setup fails once the database exists."""
    hba = cluster.data / "pg_hba.conf"
    hba.write_text(f"host all {role} 127.0.0.1/32 reject\n" + local_pg.HBA)
    with psycopg.connect(cluster.superuser_url(), autocommit=True) as conn:
        conn.execute("SELECT pg_reload_conf()")


def test_a_failed_setup_leaves_no_database_behind(
    scram_server: local_pg.Cluster, project: Path, tmp_path: Path
) -> None:
    env = password_forms(scram_server, tmp_path)["PGPASSWORD"]
    reject(scram_server, local_pg.OWNER_ROLE)
    try:
        failed = run_pytest(project, env, "-p", "no:xdist")
    finally:
        (scram_server.data / "pg_hba.conf").write_text(local_pg.HBA)
        with psycopg.connect(scram_server.superuser_url(), autocommit=True) as conn:
            conn.execute("SELECT pg_reload_conf()")
    assert failed.returncode == 1
    assert 'user "provisioner_owner"' in failed.stdout, failed.stdout[-3000:]
    assert leftover_databases(scram_server) == []

    # No password at all: refused in one line, before anything is made.
    bare = {SERVER_URL_ENV: env[SERVER_URL_ENV]}
    refused = run_pytest(project, bare, "-p", "no:xdist", "-x")
    assert refused.returncode == 1
    assert "no password supplied" in refused.stdout, refused.stdout[-3000:]
    assert leftover_databases(scram_server) == []

    # A tenant tree that is not there: the database is made, the tenants fail; nothing stays.
    missing_tree = {**env, "PROVISIONER_TENANT_TREE": str(tmp_path / "none")}
    broken = run_pytest(project, missing_tree, "-p", "no:xdist")
    assert broken.returncode == 1, broken.stdout[-3000:]
    assert leftover_databases(scram_server) == []


WHERE = """
import os
from pathlib import Path

import pytest


@pytest.mark.parametrize("i", range(8))
def test_where(provisioner_server, i):
    worker = os.environ.get("PYTEST_XDIST_WORKER", "main")
    root = provisioner_server.cluster.root
    Path(os.environ["WHERE_DIR"], worker).write_text(f"{root}\\n")
"""


def test_xdist_workers_share_one_throwaway_cluster_and_the_last_stops_it(
    project: Path, tmp_path: Path
) -> None:
    (project / "tests" / "test_where.py").write_text(WHERE)
    where = tmp_path / "where"
    where.mkdir()
    # Every worker runs every test of the file (--dist each): under load scheduling one worker
    # busy with a slow test could leave all eight to the other.
    result = run_pytest(
        project, {"WHERE_DIR": str(where)}, "-n", "2", "--dist", "each", "tests/test_where.py"
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert "16 passed" in result.stdout, result.stdout
    seen = {path.name: path.read_text().strip() for path in where.iterdir()}
    assert set(seen) == {"gw0", "gw1"}, seen
    roots = set(seen.values())
    assert len(roots) == 1, seen  # one cluster for both workers
    (root,) = roots
    assert not Path(root).exists()  # the last worker stopped it and removed it
    assert not [line for line in command_lines() if root in line]  # no server left running


def command_lines() -> list[str]:
    lines = []
    for path in Path("/proc").glob("[0-9]*/cmdline"):
        try:
            lines.append(path.read_bytes().replace(b"\0", b" ").decode(errors="replace"))
        except OSError:  # the process ended meanwhile
            continue
    return lines
