"""A real PgBouncer in transaction mode in front of the test cluster, for the tests.

Started on a free 127.0.0.1 port with its configuration in a temporary folder; clients log in
with a password from its ``auth_file`` (scram), and it reaches the cluster as the same role
(the test cluster trusts 127.0.0.1). It runs as the ``postgres`` user when the tests run as
root (PgBouncer refuses to run as root). Loaded as a pytest plugin (``tests/conftest.py``).
"""

from __future__ import annotations

import os
import pwd
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import quote

import psycopg
import pytest

from provisioner.local import cluster as local_pg
from provisioner.testing import PgServer

#: Every role the tests log in as through PgBouncer, with its PgBouncer password on a server
#: that trusts 127.0.0.1. A server that asks for passwords (the suite's own throwaway cluster)
#: knows each role by the password derived from its superuser's (``secret``): PgBouncer logs in
#: to it with that one, so its clients use it too.
PASSWORDS = {"provisioner_owner": "bouncer owner pw", "app_rw": "bouncer app pw"}


def passwords_for(secret: str | None) -> dict[str, str]:
    if not secret:
        return dict(PASSWORDS)
    return {role: local_pg.role_password(secret, role) for role in PASSWORDS}


@dataclass
class Bouncer:
    """A running PgBouncer: ``url(role, database)`` is an address through it."""

    port: int
    folder: Path
    proc: subprocess.Popen[bytes]
    secret: str | None = None

    def url(self, role: str, database: str) -> str:
        password = quote(passwords_for(self.secret)[role], safe="")
        return f"postgresql://{role}:{password}@127.0.0.1:{self.port}/{database}"

    def log(self) -> str:
        path = self.folder / "pgbouncer.log"
        return path.read_text(errors="replace") if path.exists() else ""

    def stop(self) -> None:
        """SIGINT (PgBouncer's immediate shutdown) to its process group: ``runuser`` does not
        pass signals on, so PgBouncer itself must get it."""
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGINT)
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(10)


def start_bouncer(
    server_port: int,
    pool_mode: str = "transaction",
    secret: str | None = None,
    databases: str | None = None,
) -> Bouncer:
    """``databases``: the ``[databases]`` section to run with (default: every database of the
    server, ``* = host=127.0.0.1 port=...``)."""
    binary = shutil.which("pgbouncer") or "/usr/sbin/pgbouncer"
    if not Path(binary).exists():
        raise AssertionError("pgbouncer is not installed: `make test` installs it (make ha-tools)")
    folder = Path(tempfile.mkdtemp(prefix="provisioner-bouncer-"))
    port = local_pg.free_port()
    users = "".join(f'"{role}" "{password}"\n' for role, password in passwords_for(secret).items())
    (folder / "users.txt").write_text(users)
    (folder / "pgbouncer.ini").write_text(
        (databases or f"[databases]\n* = host=127.0.0.1 port={server_port}\n") + "\n"
        "[pgbouncer]\n"
        f"listen_addr = 127.0.0.1\nlisten_port = {port}\nunix_socket_dir =\n"
        f"auth_type = scram-sha-256\nauth_file = {folder / 'users.txt'}\n"
        f"pool_mode = {pool_mode}\ndefault_pool_size = 4\nmax_client_conn = 100\n"
        f"logfile = {folder / 'pgbouncer.log'}\npidfile = {folder / 'pgbouncer.pid'}\n"
    )
    command = [binary, str(folder / "pgbouncer.ini")]
    if os.geteuid() == 0:
        entry = pwd.getpwnam("postgres")
        for path in [folder, *folder.iterdir()]:
            os.chown(path, entry.pw_uid, entry.pw_gid)
        command = ["runuser", "-u", "postgres", "--", *command]
    proc = subprocess.Popen(
        command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True
    )
    bouncer = Bouncer(port, folder, proc, secret)
    deadline = time.monotonic() + 20
    while True:
        with socket.socket() as sock:
            if sock.connect_ex(("127.0.0.1", port)) == 0:
                return bouncer
        if proc.poll() is not None or time.monotonic() > deadline:
            bouncer.stop()
            raise AssertionError(f"pgbouncer did not start:\n{bouncer.log()[-2000:]}")
        time.sleep(0.05)


@pytest.fixture(scope="session")
def pgbouncer(provisioner_server: PgServer) -> Iterator[Bouncer]:
    """PgBouncer in transaction mode in front of the suite's server."""
    info = psycopg.conninfo.conninfo_to_dict(provisioner_server.admin_url)
    bouncer = start_bouncer(int(info.get("port") or 5432), secret=provisioner_server.secret)
    try:
        yield bouncer
    finally:
        bouncer.stop()
        shutil.rmtree(bouncer.folder, ignore_errors=True)
