"""A throwaway or persistent PostgreSQL cluster in a folder: the embedded default and test servers.

Binaries come from the machine (``/usr/lib/postgresql/*/bin`` or ``PATH``) when it has them, else
from the ``pgserver`` wheel. The server never runs as root: as root, the commands run through
``runuser`` as the ``postgres`` user (or ``nobody``), and only the cluster's own folder changes
owner. It listens on 127.0.0.1 and a socket inside its folder, on a port recorded there.
"""

from __future__ import annotations

import fcntl
import functools
import importlib.util
import os
import pwd
import shutil
import socket
import subprocess
from dataclasses import dataclass
from importlib.resources import files
from pathlib import Path

import psycopg
from psycopg import sql

from provisioner.errors import ConfigurationError

EMBEDDED_DATABASE = "provisioner"
OWNER_ROLE = "provisioner_owner"
APP_ROLE = "app_rw"


@functools.cache
def find_bin_dir() -> Path:
    """The newest PostgreSQL server binaries available here (looked up once per process)."""
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
    for directory in candidates:
        if (directory / "initdb").exists() and (directory / "pg_ctl").exists():
            return directory
    raise ConfigurationError(
        "no PostgreSQL server binaries found: install PostgreSQL or `pip install pgserver`, "
        "or set MIGRATIONS_DATABASE_URL and APP_DATABASE_URL"
    )


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@functools.cache
def _service_user() -> str | None:
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


@dataclass
class Cluster:
    """One PostgreSQL cluster under ``root`` (data/, run/, port, postgres.log)."""

    root: Path
    durable: bool = True

    def __post_init__(self) -> None:
        self.root = self.root.absolute()

    @property
    def data(self) -> Path:
        return self.root / "data"

    @property
    def port(self) -> int | None:
        path = self.root / "port"
        return int(path.read_text()) if path.exists() else None

    def superuser_url(self, database: str = "postgres") -> str:
        return f"postgresql://postgres@127.0.0.1:{self.port}/{database}"

    def url(self, role: str, database: str) -> str:
        return f"postgresql://{role}@127.0.0.1:{self.port}/{database}"

    def _run(self, *args: str) -> subprocess.CompletedProcess[str]:
        user = _service_user()
        command = [str(find_bin_dir() / args[0]), *args[1:]]
        if user:
            command = ["runuser", "-u", user, "--", *command]
        return subprocess.run(command, capture_output=True, text=True, check=False)

    def _chown(self) -> None:
        user = _service_user()
        if user is None:
            return
        entry = pwd.getpwnam(user)
        for path in [self.root, *self.root.rglob("*")]:
            os.chown(path, entry.pw_uid, entry.pw_gid, follow_symlinks=False)

    def initialised(self) -> bool:
        return (self.data / "PG_VERSION").exists()

    def running(self) -> bool:
        return (
            self.initialised()
            and self._run("pg_ctl", "-D", str(self.data), "status").returncode == 0
        )

    def init(self) -> None:
        self.root.mkdir(parents=True, exist_ok=True)
        (self.root / "run").mkdir(exist_ok=True)
        self._chown()
        result = self._run(
            "initdb",
            "-D",
            str(self.data),
            "-U",
            "postgres",
            "-A",
            "trust",
            "-E",
            "UTF8",
            "--no-locale",
            *([] if self.durable else ["--no-sync"]),
        )
        if result.returncode != 0:
            last = (result.stderr.strip().splitlines() or ["no output"])[-1]
            raise ConfigurationError(f"initdb failed: {last}{_as_root_hint(self.root)}")

    def start(self) -> None:
        port = self.port
        if port is None or not _port_free(port):
            port = free_port()
            (self.root / "port").write_text(str(port))
        options = f"-c listen_addresses=127.0.0.1 -p {port} -k {self.root / 'run'}"
        if not self.durable:
            options += " -c fsync=off -c synchronous_commit=off -c full_page_writes=off"
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

    def stop(self) -> bool:
        """Stop the server if it runs; True if it was running."""
        if not self.running():
            return False
        self._run("pg_ctl", "-D", str(self.data), "-m", "fast", "-w", "stop")
        return True

    def ensure_running(self) -> bool:
        """Initialise and start as needed; True if this call created the cluster."""
        created = False
        if not self.initialised():
            self.init()
            created = True
        if not self.running():
            self.start()
        return created


def _as_root_hint(root: Path) -> str:
    user = _service_user()
    if user is None:
        return ""
    return (
        f" (as root, PostgreSQL runs as '{user}', who must be able to reach {root}: "
        "choose a PROVISIONER_STATE_DIR whose parent folders are not private)"
    )


def _port_free(port: int) -> bool:
    with socket.socket() as sock:
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return False
        return True


def bootstrap_sql() -> str:
    """The role bootstrap SQL shipped with the package (infra/postgres/bootstrap.sql)."""
    return files("provisioner").joinpath("bootstrap.sql").read_text()


def bootstrap_database(superuser_url: str, database: str) -> None:
    """Create ``database`` if missing and run the role bootstrap in it (idempotent)."""
    with psycopg.connect(superuser_url, autocommit=True) as conn:
        exists = conn.execute(
            "SELECT 1 FROM pg_database WHERE datname = %s", (database,)
        ).fetchone()
        if not exists:
            conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(database)))
    target = superuser_url.rsplit("/", 1)[0] + f"/{database}"
    with psycopg.connect(target, autocommit=True) as conn:
        conn.execute(bootstrap_sql())


@dataclass(frozen=True)
class EmbeddedUrls:
    owner: str
    app: str
    objects: Path


def ensure_embedded(state_dir: Path) -> EmbeddedUrls:
    """The embedded default: a cluster under ``state_dir`` with the owner and app roles."""
    cluster = Cluster(state_dir / "postgres")
    state_dir.mkdir(parents=True, exist_ok=True)
    # Two first commands at once must not both initdb: take turns on a lock file.
    with open(state_dir / "embedded.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        cluster.ensure_running()
        bootstrap_database(cluster.superuser_url(), EMBEDDED_DATABASE)
    objects = state_dir / "objects"
    objects.mkdir(parents=True, exist_ok=True)
    return EmbeddedUrls(
        owner=cluster.url(OWNER_ROLE, EMBEDDED_DATABASE),
        app=cluster.url(APP_ROLE, EMBEDDED_DATABASE),
        objects=objects,
    )


def stop_embedded(state_dir: Path) -> bool:
    return Cluster(state_dir / "postgres").stop()
