"""Local clusters admit only their owner (issue 27, item 17).

Reproduced the way it was found: a second local user (a throwaway OS user made with
``useradd`` for the test) runs ``psql`` through ``runuser`` against the embedded PostgreSQL and
the plugin's throwaway cluster, over TCP on 127.0.0.1 and over the socket, as the superuser
``postgres`` and as the bootstrap roles. Every attempt is refused; the owner (the user running
the tests) still gets in. A cluster an older version made (``trust``, socket 0777) lets the
stranger in, and is secured on its next start.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import psycopg
import pytest

from provisioner.local import cluster as local_pg
from provisioner.local import state as embedded
from provisioner.testing import PgServer
from tests.conftest import run_cli
from tests.integration.test_embedded import embedded_env

ROLES = (local_pg.SUPERUSER, local_pg.OWNER_ROLE, local_pg.APP_ROLE)


def psql() -> str:
    here = local_pg.find_bin_dir() / "psql"
    found = str(here) if here.exists() else shutil.which("psql")
    assert found, "psql is needed to connect as another local user"
    return found


@dataclass(frozen=True)
class Stranger:
    """Another local user of the machine: no password, no access to our files."""

    name: str

    def run(self, *command: str) -> subprocess.CompletedProcess[str]:
        env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": "/nonexistent"}
        return subprocess.run(
            ["runuser", "-u", self.name, "--", *command],
            capture_output=True,
            text=True,
            env=env,
            timeout=60,
            check=False,
            cwd="/",
        )

    def connect(self, conninfo: str) -> subprocess.CompletedProcess[str]:
        """``psql`` as this user, never prompting for a password (``-w``)."""
        return self.run(psql(), "-w", "-X", "-At", "-d", conninfo, "-c", "SELECT current_user")


@pytest.fixture
def stranger() -> Iterator[Stranger]:
    assert os.geteuid() == 0, "a second local user needs root to create (useradd)"
    name = f"pvx{uuid.uuid4().hex[:10]}"
    subprocess.run(
        ["useradd", "--no-create-home", "--shell", "/usr/sbin/nologin", name],
        check=True,
        capture_output=True,
    )
    try:
        yield Stranger(name)
    finally:
        subprocess.run(["userdel", name], check=False, capture_output=True)


@pytest.fixture
def project() -> Iterator[Path]:
    """A project folder as people have them: anyone on the machine may look inside."""
    path = Path(tempfile.mkdtemp(prefix="provisioner-auth-"))
    path.chmod(0o755)
    try:
        yield path
    finally:
        state = path / ".provisioner"
        cluster = embedded.embedded_cluster(state)
        cluster.stop()
        if not cluster.root.is_relative_to(path):
            shutil.rmtree(cluster.root, ignore_errors=True)
        shutil.rmtree(path, ignore_errors=True)


def tcp(cluster: local_pg.Cluster, role: str) -> str:
    return f"host=127.0.0.1 port={cluster.port} user={role} dbname=postgres"


def socket(cluster: local_pg.Cluster, role: str) -> str:
    return f"host={cluster.root / 'run'} port={cluster.port} user={role} dbname=postgres"


def assert_refused(stranger: Stranger, cluster: local_pg.Cluster) -> None:
    for role in ROLES:
        over_tcp = stranger.connect(tcp(cluster, role))
        assert over_tcp.returncode != 0, f"{role} over TCP: {over_tcp.stdout}"
        assert "password" in over_tcp.stderr, over_tcp.stderr
        over_socket = stranger.connect(socket(cluster, role))
        assert over_socket.returncode != 0, f"{role} over the socket: {over_socket.stdout}"
        assert "Permission denied" in over_socket.stderr, over_socket.stderr
    # Nor can the stranger read the passwords.
    assert stranger.run("cat", str(cluster.passfile)).returncode != 0


def assert_owner_gets_in(cluster: local_pg.Cluster) -> None:
    with psycopg.connect(cluster.superuser_url(), autocommit=True) as conn:
        assert conn.execute("SELECT current_user").fetchone() == ("postgres",)
    with psycopg.connect(cluster.passfile_url("postgres", "postgres")) as conn:
        assert conn.execute("SELECT 1").fetchone() == (1,)


def test_the_embedded_cluster_admits_its_owner_only(stranger: Stranger, project: Path) -> None:
    state = project / ".provisioner"
    urls = embedded.ensure_embedded(state)
    cluster = embedded.embedded_cluster(state)

    assert_refused(stranger, cluster)
    assert_owner_gets_in(cluster)
    for url, role in ((urls.owner, local_pg.OWNER_ROLE), (urls.app, local_pg.APP_ROLE)):
        with psycopg.connect(url) as conn:
            assert conn.execute("SELECT current_user").fetchone() == (role,)
    assert cluster.passfile.stat().st_mode & 0o777 == 0o600
    assert (cluster.root / "run").stat().st_mode & 0o777 == 0o700
    assert "trust" not in (cluster.data / "pg_hba.conf").read_text()
    with psycopg.connect(cluster.superuser_url(), autocommit=True) as conn:
        settings = dict(
            conn.execute(
                "SELECT name, setting FROM pg_settings"
                " WHERE name IN ('unix_socket_permissions', 'listen_addresses')"
            ).fetchall()
        )
    assert settings == {"unix_socket_permissions": "0700", "listen_addresses": "127.0.0.1"}


def test_the_plugins_throwaway_cluster_admits_its_owner_only(stranger: Stranger) -> None:
    server = PgServer.start(None)
    try:
        assert server.cluster is not None and server.secret
        assert_refused(stranger, server.cluster)
        assert_owner_gets_in(server.cluster)
    finally:
        server.stop()


def start_as_an_older_version(cluster: local_pg.Cluster) -> None:
    """initdb and start as provisioner did before: trust, the socket world-writable."""
    cluster.root.mkdir(parents=True, exist_ok=True)
    cluster.root.chmod(0o755)
    (cluster.root / "run").mkdir(mode=0o755)
    (cluster.root / "run").chmod(0o755)
    cluster._chown()
    initdb = cluster._run(
        "initdb", "-D", str(cluster.data), "-U", "postgres", "-A", "trust", "--no-sync"
    )
    assert initdb.returncode == 0, initdb.stderr
    port = local_pg.free_port()
    (cluster.root / "port").write_text(str(port))
    cluster._chown()
    options = f"-c listen_addresses=127.0.0.1 -p {port} -k {cluster.root / 'run'} -c fsync=off"
    log = str(cluster.root / "postgres.log")
    started = cluster._run(
        "pg_ctl", "-D", str(cluster.data), "-w", "-l", log, "-o", options, "start"
    )
    assert started.returncode == 0, started.stderr


@pytest.mark.parametrize("running", [True, False], ids=["still-running", "stopped"])
def test_a_cluster_an_older_version_made_is_secured_on_its_next_start(
    stranger: Stranger, project: Path, running: bool
) -> None:
    state = project / ".provisioner"
    state.mkdir()
    cluster = embedded.embedded_cluster(state)
    start_as_an_older_version(cluster)
    # The hole, as found: the stranger is the superuser, over TCP and over the socket.
    assert stranger.connect(tcp(cluster, "postgres")).stdout.strip() == "postgres"
    assert stranger.connect(socket(cluster, "postgres")).stdout.strip() == "postgres"
    old_url = f"postgresql://postgres@127.0.0.1:{cluster.port}/postgres"
    with psycopg.connect(old_url, autocommit=True) as conn:
        conn.execute("CREATE DATABASE provisioner")
    local_pg.bootstrap_database(old_url, "provisioner")  # the roles, without passwords
    old_provisioner = f"postgresql://postgres@127.0.0.1:{cluster.port}/provisioner"
    with psycopg.connect(old_provisioner, autocommit=True) as conn:
        conn.execute("CREATE TABLE kept (note text)")
        conn.execute("INSERT INTO kept VALUES ('made before the upgrade')")
    if not running:
        cluster.stop()

    heard: list[str] = []
    urls = embedded.ensure_embedded(state, heard.append)

    assert any("now asks every role for a password" in line for line in heard), heard
    assert_refused(stranger, cluster)
    assert_owner_gets_in(cluster)
    with psycopg.connect(urls.owner) as conn:
        assert conn.execute("SELECT current_user").fetchone() == ("provisioner_owner",)
    with psycopg.connect(cluster.superuser_url("provisioner")) as conn:
        assert conn.execute("SELECT note FROM kept").fetchall() == [("made before the upgrade",)]
    heard.clear()
    embedded.ensure_embedded(state, heard.append)  # once is enough
    assert not any("password" in line for line in heard), heard


def test_no_password_is_printed(project: Path) -> None:
    state = project / ".provisioner"
    env = embedded_env(state)
    outputs = [
        run_cli(None, "migrate", env=env),
        run_cli(None, "provision", "demo", env=env),
        run_cli(None, "local", "env", env=env),
        run_cli(None, "local", "status", env=env),
        run_cli(None, "status", "demo", "--json", env=env),
    ]
    assert all(result.returncode == 0 for result in outputs), [r.stderr for r in outputs]
    passwords = [
        line.rsplit(":", 1)[1]
        for line in embedded.embedded_cluster(state).passfile.read_text().splitlines()
    ]
    assert len(passwords) == len(ROLES) and all(len(p) >= 32 for p in passwords)
    printed = "".join(result.stdout + result.stderr for result in outputs)
    assert not [p for p in passwords if p in printed]
    assert "passfile=" in printed  # the URLs name the file instead
