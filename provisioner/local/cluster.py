"""A throwaway or persistent PostgreSQL cluster in a folder: the embedded default and test servers.

Binaries come from the machine (``/usr/lib/postgresql/*/bin`` or ``PATH``) when it has them, else
from the ``pgserver`` wheel. The server never runs as root: as root, the commands run through
``runuser`` as the ``postgres`` user (or ``nobody``), and only the cluster's own folder changes
owner. It listens on 127.0.0.1 and a socket inside its folder, on a port recorded there.

The embedded default's state folder, and where its cluster lives, are
:mod:`provisioner.local.state`'s.

Only the cluster's owner gets in. Every role authenticates with ``scram-sha-256``, on the
socket and on 127.0.0.1 alike (no ``trust`` line, no replication line), with passwords
generated when the cluster is created and kept in its folder (``pgpass``, libpq's password
file, mode 0600, readable only by the user who owns the cluster). The socket's folder is
mode 0700 and the socket itself 0700, so another local user cannot even reach it. The URLs
carry no password: they name that file (``?passfile=...``), so printing one gives nothing
away. A cluster created by an older version (``trust``, no password file) is brought to this
on its next start (:meth:`Cluster.secure`).
"""

from __future__ import annotations

import functools
import hashlib
import hmac
import importlib.util
import os
import pwd
import secrets
import shutil
import socket
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass
from importlib.resources import files
from pathlib import Path
from typing import Any
from urllib.parse import quote

import psycopg
from psycopg import sql

from provisioner.db import CONNECT_TIMEOUT_SECONDS
from provisioner.errors import ConfigurationError
from provisioner.redact import redact

Notify = Callable[[str], None]

#: How long a reloaded pg_hba.conf may take to apply (see :meth:`Cluster.secure`).
RELOAD_TIMEOUT_SECONDS = 10.0


def quiet(message: str) -> None:
    return None


OWNER_ROLE = "provisioner_owner"
APP_ROLE = "app_rw"
SUPERUSER = "postgres"
#: In the cluster's folder, mode 0600: its passwords, in libpq's password-file format.
PASSFILE = "pgpass"

#: The cluster's whole pg_hba.conf: a password for every role, on the socket and on loopback.
HBA = """# Written by provisioner: only the cluster's owner, who holds the passwords (pgpass).
local all all scram-sha-256
host all all 127.0.0.1/32 scram-sha-256
host all all ::1/128 scram-sha-256
"""


def bin_candidates() -> list[Path]:
    """Folders that may hold PostgreSQL's binaries, the machine's newest first, then the
    ``PATH``'s, then the ``pgserver`` wheel's."""
    candidates = sorted(
        Path("/usr/lib/postgresql").glob("*/bin"),
        key=lambda p: int(p.parent.name) if p.parent.name.isdigit() else 0,
        reverse=True,
    )
    on_path = shutil.which("pg_ctl")
    if on_path:
        candidates.append(Path(on_path).parent)
    # The pgserver wheel's binaries, found without importing it (its import has side effects).
    spec = importlib.util.find_spec("pgserver")
    if spec and spec.submodule_search_locations:
        candidates.append(Path(next(iter(spec.submodule_search_locations))) / "pginstall" / "bin")
    return candidates


@functools.cache
def find_bin_dir() -> Path:
    """The newest PostgreSQL server binaries available here (looked up once per process)."""
    for directory in bin_candidates():
        if (directory / "initdb").exists() and (directory / "pg_ctl").exists():
            return directory
    raise ConfigurationError(
        "no PostgreSQL server binaries found: install PostgreSQL or `pip install pgserver`, "
        "or set MIGRATIONS_DATABASE_URL and APP_DATABASE_URL"
    )


@functools.cache
def client_major(directory: Path) -> int:
    """The major version of ``pg_dump`` in ``directory`` (0: none there, or unreadable)."""
    try:
        done = subprocess.run(
            [str(directory / "pg_dump"), "--version"], capture_output=True, text=True, check=False
        )
    except OSError:
        return 0
    words = done.stdout.split()
    return int(words[-1].split(".")[0]) if words and words[-1][:1].isdigit() else 0


@functools.cache
def find_client_dir(at_least: int) -> Path:
    """Binaries whose ``pg_dump`` (and ``pg_restore``) can dump a server of major version
    ``at_least``: :func:`find_bin_dir`'s if they can, else the first that can (``pg_dump``
    refuses a server newer than itself); ConfigurationError when none here can."""
    first = find_bin_dir()
    for directory in [first, *bin_candidates()]:
        if client_major(directory) >= at_least:
            return directory
    raise ConfigurationError(
        f"no pg_dump of PostgreSQL {at_least} or later here: install it (or `pip install "
        "pgserver`) to move a tenant from that server"
    )


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@functools.cache
def service_user() -> str | None:
    """The unprivileged user to run as when we are root; None when we are not root."""
    if os.geteuid() != 0:
        return None
    for name in ("postgres", "nobody"):
        try:
            pwd.getpwnam(name)
            return name
        except KeyError:
            continue
    raise ConfigurationError("running as root and no 'postgres' or 'nobody' user to run as")


def role_password(secret: str, role: str) -> str:
    """The password of ``role`` on a server whose superuser's password is ``secret``: derived,
    so that whoever holds the superuser's password can rebuild every role's (and several
    processes sharing a server agree on it without talking), while a role's password says
    nothing about the superuser's."""
    message = f"provisioner role {role}".encode()
    return hmac.new(secret.encode(), message, hashlib.sha256).hexdigest()


def set_role_passwords(
    conn: psycopg.Connection[Any], secret: str, roles: tuple[str, ...] = (OWNER_ROLE, APP_ROLE)
) -> None:
    """Give each of ``roles`` that exists its :func:`role_password`. Only the SCRAM verifier,
    computed here, reaches the server: the password is in no statement and no server log."""
    for role in roles:
        if conn.execute("SELECT 1 FROM pg_roles WHERE rolname = %s", (role,)).fetchone():
            _set_password(conn, role, role_password(secret, role))


def _set_password(conn: psycopg.Connection[Any], role: str, password: str) -> None:
    verifier = conn.pgconn.encrypt_password(password.encode(), role.encode(), b"scram-sha-256")
    statement = sql.SQL("ALTER ROLE {} PASSWORD {}")
    conn.execute(statement.format(sql.Identifier(role), sql.Literal(verifier.decode())))


def _write_private(path: Path, text: str) -> None:
    """Write ``path`` readable by its owner alone (mode 0600, whatever the umask)."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as out:
        os.fchmod(out.fileno(), 0o600)
        out.write(text)


@dataclass
class Cluster:
    """One PostgreSQL cluster under ``root`` (data/, run/, port, pgpass, postgres.log)."""

    root: Path
    durable: bool = True
    #: the server binaries it runs (None: :func:`find_bin_dir`'s)
    bin_dir: Path | None = None
    #: lines added to its postgresql.conf when it is created (``wal_level = logical``)
    conf: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        self.root = self.root.absolute()

    @property
    def data(self) -> Path:
        return self.root / "data"

    @property
    def port(self) -> int | None:
        path = self.root / "port"
        return int(path.read_text()) if path.exists() else None

    @property
    def passfile(self) -> Path:
        """The cluster's passwords (libpq's password-file format, mode 0600)."""
        return self.root / PASSFILE

    def superuser_url(self, database: str = "postgres") -> str:
        return self.url(SUPERUSER, database)

    def url(self, role: str, database: str) -> str:
        """``role``'s URL with its password, for this process's own use (``Settings`` hide it);
        to print, or to hand to another process, :meth:`passfile_url`."""
        password = self.password(role)
        if password is None:  # a cluster of an older version, not yet secured
            return f"postgresql://{role}@127.0.0.1:{self.port}/{database}"
        return f"postgresql://{role}:{password}@127.0.0.1:{self.port}/{database}"

    def password(self, role: str) -> str | None:
        """``role``'s password on this cluster (None: the cluster has none yet)."""
        secret = self._secret()
        if secret is None or role == SUPERUSER:
            return secret
        return role_password(secret, role)

    def passfile_url(self, role: str, database: str) -> str:
        """``role``'s URL without a password, naming the password file instead: safe to print.
        (libpq prefers ``PGPASSWORD`` to a password file: where it is set, :meth:`url`.)"""
        passfile = quote(str(self.passfile))
        return f"postgresql://{role}@127.0.0.1:{self.port}/{database}?passfile={passfile}"

    def _run(self, *args: str) -> subprocess.CompletedProcess[str]:
        user = service_user()
        command = [str((self.bin_dir or find_bin_dir()) / args[0]), *args[1:]]
        if user:
            command = ["runuser", "-u", user, "--", *command]
        return subprocess.run(command, capture_output=True, text=True, check=False)

    def _chown(self) -> None:
        user = service_user()
        if user is None:
            return
        entry = pwd.getpwnam(user)
        for path in [self.root, *self.root.rglob("*")]:
            os.chown(path, entry.pw_uid, entry.pw_gid, follow_symlinks=False)

    def _close_folders(self) -> None:
        """The cluster's folder and its socket's folder: the server's user alone enters them."""
        self.root.chmod(0o700)
        (self.root / "run").mkdir(exist_ok=True)
        (self.root / "run").chmod(0o700)

    def initialised(self) -> bool:
        return (self.data / "PG_VERSION").exists()

    def running(self) -> bool:
        return (
            self.initialised()
            and self._run("pg_ctl", "-D", str(self.data), "status").returncode == 0
        )

    def _secret(self) -> str | None:
        """The superuser's password, from the password file (None: there is none yet)."""
        if not self.passfile.exists():
            return None
        for line in self.passfile.read_text().splitlines():
            fields = line.split(":")
            if len(fields) == 5 and fields[3] == SUPERUSER:
                return fields[4]
        return None

    def _write_passfile(self, secret: str) -> None:
        lines = [f"*:*:*:{SUPERUSER}:{secret}"] + [
            f"*:*:*:{role}:{role_password(secret, role)}" for role in (OWNER_ROLE, APP_ROLE)
        ]
        _write_private(self.passfile, "\n".join(lines) + "\n")

    def init(self) -> None:
        self.root.mkdir(parents=True, exist_ok=True)
        self._close_folders()
        secret = secrets.token_urlsafe(32)
        self._write_passfile(secret)
        # initdb reads the superuser's password from a file the server's user can read: one
        # in the closed cluster folder, removed as soon as initdb is done.
        pwfile = self.root / "initdb.pw"
        _write_private(pwfile, secret + "\n")
        self._chown()
        try:
            result = self._run(
                "initdb",
                "-D",
                str(self.data),
                "-U",
                SUPERUSER,
                "--auth=scram-sha-256",
                f"--pwfile={pwfile}",
                "-E",
                "UTF8",
                "--no-locale",
                *([] if self.durable else ["--no-sync"]),
            )
        finally:
            pwfile.unlink(missing_ok=True)
        if result.returncode != 0:
            last = (result.stderr.strip().splitlines() or ["no output"])[-1]
            raise ConfigurationError(f"initdb failed: {last}{_as_root_hint(self.root)}")
        (self.data / "pg_hba.conf").write_text(HBA)
        if self.conf:
            with open(self.data / "postgresql.conf", "a") as conf:
                conf.write("\n".join(self.conf) + "\n")
        self._chown()

    def start(self) -> None:
        port = self.port
        if port is None or not _port_free(port):
            port = free_port()
            (self.root / "port").write_text(str(port))
        options = (
            f"-c listen_addresses=127.0.0.1 -p {port} -k {self.root / 'run'}"
            " -c unix_socket_permissions=0700"
        )
        if not self.durable:
            options += " -c fsync=off -c synchronous_commit=off -c full_page_writes=off"
        self._close_folders()
        self._chown()
        result = self._run(
            "pg_ctl",
            "-D",
            str(self.data),
            "-w",
            "-t",
            "60",
            "-l",
            str(self.root / "postgres.log"),
            "-o",
            options,
            "start",
        )
        if result.returncode != 0:
            raise ConfigurationError(
                f"PostgreSQL did not start; see {self.root / 'postgres.log'}"
                f"{_as_root_hint(self.root)}"
            )

    def secured(self) -> bool:
        """Does the cluster ask every role for its password (and is there a password file)?"""
        hba = self.data / "pg_hba.conf"
        return self._secret() is not None and hba.exists() and hba.read_text() == HBA

    def secure(self) -> bool:
        """Bring a running cluster that an older version created (``trust`` on 127.0.0.1 and
        the socket, no passwords) to password authentication: passwords generated and kept
        in :attr:`passfile`, set on the superuser and the bootstrap roles, then this
        pg_hba.conf, reloaded. True if it changed anything. The folders are closed first, so
        nobody else gets in while the old rules still hold."""
        if self.secured():
            return False
        self._close_folders()
        secret = self._secret() or secrets.token_urlsafe(32)
        self._write_passfile(secret)
        try:
            with psycopg.connect(
                self.superuser_url(), autocommit=True, connect_timeout=CONNECT_TIMEOUT_SECONDS
            ) as conn:  # the old rules let the owner in (root, or the server's own user)
                _set_password(conn, SUPERUSER, secret)
                set_role_passwords(conn, secret)
                (self.data / "pg_hba.conf").write_text(HBA)
                self._chown()
                conn.execute("SELECT pg_reload_conf()")
        except psycopg.OperationalError as exc:
            raise ConfigurationError(
                f"cannot connect to the PostgreSQL in {self.data} to require passwords "
                f"(was its {PASSFILE} removed?): {redact(str(exc)).strip()}"
            ) from exc
        self._wait_for_passwords()
        return True

    def _wait_for_passwords(self) -> None:
        """Until the server refuses a connection without a password (the reload is applied)."""
        deadline = time.monotonic() + RELOAD_TIMEOUT_SECONDS
        while time.monotonic() < deadline:
            try:
                psycopg.connect(
                    host="127.0.0.1",
                    port=self.port,
                    user=SUPERUSER,
                    dbname="postgres",
                    password="",
                    passfile=str(self.root / "no-such-file"),  # so: no password at all
                    connect_timeout=CONNECT_TIMEOUT_SECONDS,
                ).close()
            except psycopg.OperationalError:
                return
            time.sleep(0.05)
        raise ConfigurationError(
            f"PostgreSQL in {self.data} still admits connections without a password after "
            "its pg_hba.conf was rewritten; stop it (`provisioner local stop`) and run again"
        )

    def stop(self) -> bool:
        """Stop the server if it runs; True if it was running."""
        if not self.running():
            return False
        self._run("pg_ctl", "-D", str(self.data), "-m", "fast", "-w", "stop")
        return True

    def ensure_running(self) -> bool:
        """Initialise and start as needed, and require passwords (:meth:`secure`); True if this
        call created the cluster."""
        created = False
        if not self.initialised():
            self.init()
            created = True
        if not self.running():
            self.start()
        self.secure()
        return created


def _as_root_hint(root: Path) -> str:
    user = service_user()
    if user is None:
        return ""
    return (
        f" (as root, PostgreSQL runs as '{user}', who must be able to reach {root}: "
        "choose a PROVISIONER_STATE_DIR whose parent folders are not private)"
    )


def _port_free(port: int) -> bool:
    """Whether PostgreSQL could listen on ``port``: asked as it binds, with ``SO_REUSEADDR``,
    so that the connections a stopped or crashed server left in ``TIME_WAIT`` do not count
    (without it, a restart moved the cluster to another port, and every reference naming the
    old one was refused)."""
    with socket.socket() as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return False
        return True


def bootstrap_sql() -> str:
    """The role bootstrap SQL shipped with the package (infra/postgres/bootstrap.sql)."""
    return files("provisioner").joinpath("bootstrap.sql").read_text()


def bootstrap_database(superuser_url: str, database: str, app_roles: tuple[str, ...] = ()) -> None:
    """Create ``database`` if missing and run the role bootstrap in it (idempotent), with the
    project's further application roles (:func:`add_app_roles`)."""
    # Bounded like every connection of the package: a silent server fails, never hangs.
    timeout = CONNECT_TIMEOUT_SECONDS
    with psycopg.connect(superuser_url, autocommit=True, connect_timeout=timeout) as conn:
        exists = conn.execute(
            "SELECT 1 FROM pg_database WHERE datname = %s", (database,)
        ).fetchone()
        if not exists:
            conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(database)))
    target = psycopg.conninfo.make_conninfo(superuser_url, dbname=database)
    with psycopg.connect(target, autocommit=True, connect_timeout=timeout) as conn:
        conn.execute(bootstrap_sql())
        if conn.info.password:  # a server that asks for passwords: the roles get theirs
            set_role_passwords(conn, conn.info.password)
        add_app_roles(conn, app_roles)


def add_app_roles(conn: psycopg.Connection[Any], names: tuple[str, ...]) -> None:
    """Create each of ``names`` that does not exist, as the bootstrap creates ``app_rw``
    (LOGIN, NOINHERIT, nothing else), and let it connect to the connected database: a project
    that configures more application roles (``app_roles``) gets them in a cluster of the tool's
    own (the test harness). A role that exists is left as it is: it is not ours."""
    for name in names:
        role = sql.Identifier(name)
        if not conn.execute("SELECT 1 FROM pg_roles WHERE rolname = %s", (name,)).fetchone():
            conn.execute(
                sql.SQL(
                    "CREATE ROLE {} LOGIN NOSUPERUSER NOCREATEDB NOCREATEROLE NOREPLICATION "
                    "NOBYPASSRLS NOINHERIT"
                ).format(role)
            )
            if conn.info.password:
                _set_password(conn, name, role_password(conn.info.password, name))
        conn.execute(
            sql.SQL("GRANT CONNECT ON DATABASE {} TO {}").format(
                sql.Identifier(conn.info.dbname), role
            )
        )
