"""No command hangs on a silent server, no password leaks, libpq's password sources work.

These tests run against a throwaway cluster of their own: its postmaster is stopped with SIGSTOP
(it then accepts TCP connections but never answers, as an overloaded or frozen server does), and
``app_rw`` logs in with a password (scram) while the rest of the cluster trusts 127.0.0.1.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import quote

import psycopg
import pytest

from provisioner.local import cluster as local_pg
from provisioner.templates import migrations
from tests.conftest import BOOTSTRAP_SQL, ROOT

PASSWORD = "My Secret@Pw"
DATABASE = "hang"


@dataclass(frozen=True)
class Own:
    cluster: local_pg.Cluster
    objects: Path

    @property
    def owner_url(self) -> str:
        return self.cluster.url("provisioner_owner", DATABASE)

    def app_url(self, password: str | None = None) -> str:
        """app_rw's URL, with the password percent-encoded (or none: libpq finds it)."""
        user = "app_rw" if password is None else f"app_rw:{quote(password, safe='')}"
        return f"postgresql://{user}@127.0.0.1:{self.cluster.port}/{DATABASE}"

    def env(self, **overrides: str) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith(("PROVISIONER_", "PG"))}
        env.update(
            MIGRATIONS_DATABASE_URL=self.owner_url,
            APP_DATABASE_URL=self.app_url(PASSWORD),
            OBJECT_STORE_PROVIDER="filesystem",
            OBJECT_STORE_PATH=str(self.objects),
            PYTHONPATH=str(ROOT),
        )
        env.update(overrides)
        return env

    @property
    def postmaster_pid(self) -> int:
        return int((self.cluster.data / "postmaster.pid").read_text().split()[0])


@pytest.fixture(scope="module")
def own(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Own]:
    # Its own top-level folder, as tests/conftest.py's cluster: the server's user must reach it.
    root = Path(tempfile.mkdtemp(prefix="provisioner-hang-"))
    cluster = local_pg.Cluster(root, durable=False)
    try:
        cluster.ensure_running()
        with psycopg.connect(cluster.superuser_url(), autocommit=True) as conn:
            conn.execute(f"CREATE DATABASE {DATABASE}")
        with psycopg.connect(cluster.superuser_url(DATABASE), autocommit=True) as conn:
            conn.execute(BOOTSTRAP_SQL.read_text())
            local_pg.set_role_passwords(conn, conn.info.password)  # the owner's, from pgpass
            conn.execute(f"ALTER ROLE app_rw PASSWORD '{PASSWORD}'")
            hba = cluster.data / "pg_hba.conf"
            hba.write_text("host all app_rw 127.0.0.1/32 scram-sha-256\n" + hba.read_text())
            conn.execute("SELECT pg_reload_conf()")
        migrations.upgrade_control(cluster.url("provisioner_owner", DATABASE))
        yield Own(cluster, tmp_path_factory.mktemp("objects"))
    finally:
        cluster.stop()
        shutil.rmtree(root, ignore_errors=True)


def cli(env: dict[str, str], *args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    """``python -m provisioner ARGS``; a hang fails the test at ``timeout`` instead of blocking."""
    return subprocess.run(
        [sys.executable, "-m", "provisioner", *args],
        capture_output=True,
        text=True,
        env=env,
        timeout=timeout,
        check=False,
        cwd=ROOT,
    )


def error_line(result: subprocess.CompletedProcess[str]) -> str:
    output = result.stdout + result.stderr
    assert "Traceback" not in output, output
    errors = [line for line in result.stderr.splitlines() if line.startswith("error: ")]
    assert len(errors) == 1, output
    return errors[0]


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


# -- libpq's own password sources (item 5) ---------------------------------------------------------


def test_the_password_can_come_from_libpq_instead_of_the_url(own: Own, tmp_path: Path) -> None:
    passfile = tmp_path / "pgpass"
    passfile.write_text(f"127.0.0.1:{own.cluster.port}:{DATABASE}:app_rw:{PASSWORD}\n")
    passfile.chmod(0o600)
    services = tmp_path / "pg_service.conf"
    services.write_text(
        f"[app]\nhost=127.0.0.1\nport={own.cluster.port}\ndbname={DATABASE}\nuser=app_rw\n"
        f"password={PASSWORD}\n"
    )
    ways = {
        "PGPASSWORD": own.env(APP_DATABASE_URL=own.app_url(), PGPASSWORD=PASSWORD),
        "PGPASSFILE": own.env(APP_DATABASE_URL=own.app_url(), PGPASSFILE=str(passfile)),
        "PGSERVICE": own.env(
            APP_DATABASE_URL="postgresql:///?service=app", PGSERVICEFILE=str(services)
        ),
        "percent-encoded": own.env(),
    }
    for way, env in ways.items():
        result = cli(env, "jobs", "list")
        assert (result.returncode, result.stdout.strip()) == (0, "no jobs"), (way, result.stderr)
    result = cli(own.env(APP_DATABASE_URL=own.app_url()), "jobs", "list")
    assert result.returncode == 1 and "password" in error_line(result)


# -- passwords never echoed (item 5) ---------------------------------------------------------------


@pytest.mark.parametrize(
    ("variable", "command"),
    [
        ("APP_DATABASE_URL", ("status", "acme")),
        ("APP_DATABASE_URL", ("worker", "--once")),
        ("MIGRATIONS_DATABASE_URL", ("migrate",)),
    ],
)
def test_an_unencoded_password_is_refused_without_echoing_it(
    own: Own, variable: str, command: tuple[str, ...]
) -> None:
    user = "app_rw" if variable == "APP_DATABASE_URL" else "provisioner_owner"
    for secret in ("Secret@127.0.0.1", "My Secret Pw"):
        url = f"postgresql://{user}:{secret}@127.0.0.1:{own.cluster.port}/{DATABASE}"
        result = cli(own.env(**{variable: url}), *command)
        assert result.returncode == 2, result.stdout + result.stderr
        line = error_line(result)
        assert f"{variable} cannot be parsed as a PostgreSQL URL (user {user})" in line
        output = result.stdout + result.stderr
        assert "Secret" not in output and "127.0.0.1" not in output and DATABASE not in line


# -- both URLs checked at start (item 4) -----------------------------------------------------------


@pytest.mark.parametrize("fault", ["wrong password", "nothing listening"])
def test_worker_once_refuses_to_start_without_a_working_app_url(own: Own, fault: str) -> None:
    url = (
        own.app_url("not-the-password")
        if fault == "wrong password"
        else f"postgresql://app_rw:{quote(PASSWORD, safe='')}@127.0.0.1:{free_port()}/{DATABASE}"
    )
    result = cli(own.env(APP_DATABASE_URL=url), "worker", "--once")
    assert result.returncode == 2, result.stdout + result.stderr
    line = error_line(result)
    assert "APP_DATABASE_URL" in line
    assert "not-the-password" not in result.stderr and "Secret" not in result.stderr


# -- a server that accepts connections but never answers (item 4) --------------------------------


@pytest.mark.slow
def test_no_command_hangs_on_a_stopped_server(own: Own) -> None:
    commands = {
        ("migrate",): 1,
        ("provision", "acme"): 1,
        ("enqueue", "acme"): 1,
        ("status", "acme"): 1,
        ("health",): 1,
        ("worker", "--once"): 2,
        ("check", "--all"): 1,
        ("repair", "--all", "--dry-run"): 1,
    }
    pid = own.postmaster_pid
    os.kill(pid, signal.SIGSTOP)
    try:
        # All at once: each waits for its connect timeout, not one after the other.
        procs = {
            args: subprocess.Popen(
                [sys.executable, "-m", "provisioner", *args],
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
                env=own.env(),
                cwd=ROOT,
            )
            for args in commands
        }
        results, hung = {}, []
        for args, proc in procs.items():
            try:
                out, err = proc.communicate(timeout=90)
            except subprocess.TimeoutExpired:
                proc.kill()
                out, err = proc.communicate()
                hung.append(" ".join(args))
            results[args] = subprocess.CompletedProcess(proc.args, proc.returncode, out, err)
    finally:
        os.kill(pid, signal.SIGCONT)
    assert not hung, f"hung on the stopped server: {hung}"
    for args, expected in commands.items():
        result = results[args]
        assert result.returncode == expected, (args, result.stdout, result.stderr)
        line = error_line(result)
        assert "timeout expired" in line or "unavailable" in line, (args, line)
        assert "Secret" not in result.stdout + result.stderr
    # and the server, woken up, serves them again
    assert cli(own.env(), "status", "acme").returncode == 3
