"""A throwaway or persistent PostgreSQL cluster in a folder: the embedded default and test servers.

Binaries come from the machine (``/usr/lib/postgresql/*/bin`` or ``PATH``) when it has them, else
from the ``pgserver`` wheel. The server never runs as root: as root, the commands run through
``runuser`` as the ``postgres`` user (or ``nobody``), and only the cluster's own folder changes
owner. It listens on 127.0.0.1 and a socket inside its folder, on a port recorded there.

The embedded default keeps its state in a ``.provisioner`` folder found the way git finds
``.git``: in the current folder or the nearest parent that has one (:func:`locate_state_dir`),
so a command run from a subfolder uses the project's cluster instead of starting an empty one.
When the server user cannot reach that folder (root working in a private home, mode 0700), the
cluster's data goes to a folder it can reach and the state folder keeps a pointer to it
(``postgres.location``). Starting a server, and above all creating a new cluster, is reported
through the caller's ``notify`` callback (the CLI prints it on stderr): never silently.
"""

from __future__ import annotations

import fcntl
import functools
import hashlib
import importlib.util
import os
import pwd
import shutil
import socket
import stat
import subprocess
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from importlib.resources import files
from pathlib import Path

import psycopg
from psycopg import sql

from provisioner.db import CONNECT_TIMEOUT_SECONDS
from provisioner.errors import ConfigurationError

EMBEDDED_DATABASE = "provisioner"
DEFAULT_STATE_DIR = Path(".provisioner")
#: In the state folder: where the cluster lives when it cannot live inside it.
LOCATION_FILE = "postgres.location"

Notify = Callable[[str], None]


def _quiet(message: str) -> None:
    return None


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
    # Bounded like every connection of the package: a silent server fails, never hangs.
    timeout = CONNECT_TIMEOUT_SECONDS
    with psycopg.connect(superuser_url, autocommit=True, connect_timeout=timeout) as conn:
        exists = conn.execute(
            "SELECT 1 FROM pg_database WHERE datname = %s", (database,)
        ).fetchone()
        if not exists:
            conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(database)))
    target = superuser_url.rsplit("/", 1)[0] + f"/{database}"
    with psycopg.connect(target, autocommit=True, connect_timeout=timeout) as conn:
        conn.execute(bootstrap_sql())


@dataclass(frozen=True)
class EmbeddedUrls:
    owner: str
    app: str
    objects: Path


def locate_state_dir(state_dir: Path, start: Path | None = None) -> Path:
    """The state folder to use. The default (``.provisioner``, relative) is looked up like git
    looks up ``.git``: the first of the current folder and its parents that has one, else a new
    one in the current folder. Any other value is used as given."""
    if state_dir != DEFAULT_STATE_DIR:
        return state_dir.absolute()
    here = (start or Path.cwd()).absolute()
    for folder in (here, *here.parents):
        if (folder / DEFAULT_STATE_DIR).is_dir():
            return folder / DEFAULT_STATE_DIR
    return here / DEFAULT_STATE_DIR


def _reachable_by(user: str, path: Path) -> bool:
    """Can ``user`` traverse every folder down to ``path`` (the parts that exist)?"""
    entry = pwd.getpwnam(user)
    groups = {entry.pw_gid, *os.getgrouplist(user, entry.pw_gid)}
    for folder in (path, *path.parents):
        try:
            info = folder.stat()
        except FileNotFoundError:
            continue
        if info.st_uid == entry.pw_uid:
            ok = bool(info.st_mode & stat.S_IXUSR)
        elif info.st_gid in groups:
            ok = bool(info.st_mode & stat.S_IXGRP)
        else:
            ok = bool(info.st_mode & stat.S_IXOTH)
        if not ok:
            return False
    return True


def cluster_root(state_dir: Path) -> Path:
    """Where the state folder's cluster lives: ``<state>/postgres``, or the folder its
    ``postgres.location`` pointer names (written by :func:`ensure_embedded`)."""
    pointer = state_dir / LOCATION_FILE
    if pointer.exists():
        return Path(pointer.read_text().strip())
    return state_dir / "postgres"


def _place_cluster(state_dir: Path, notify: Notify) -> Path:
    """The folder for a new cluster: in the state folder when the server user can reach it;
    else in the server user's home (``/var/lib/postgresql`` for ``postgres``), or a fresh
    private folder under ``/var/tmp`` when it has none, with a pointer left in the state
    folder."""
    inside = state_dir / "postgres"
    user = _service_user()
    if user is None or _reachable_by(user, state_dir):
        return inside
    digest = hashlib.sha256(str(state_dir).encode()).hexdigest()[:12]
    home = Path(pwd.getpwnam(user).pw_dir)
    if home.is_dir() and _reachable_by(user, home):
        outside = home / f"provisioner-{digest}"
    else:  # a random name: nobody else can have prepared it
        outside = Path(tempfile.mkdtemp(prefix=f"provisioner-{digest}-", dir="/var/tmp"))
    (state_dir / LOCATION_FILE).write_text(f"{outside}\n")
    notify(
        f"{state_dir} is private and the server runs as '{user}': its data goes to "
        f"{outside} (recorded in {state_dir / LOCATION_FILE})"
    )
    return outside


def ensure_embedded(state_dir: Path, notify: Notify = _quiet) -> EmbeddedUrls:
    """The embedded default: a cluster for ``state_dir`` with the owner and app roles.

    ``notify`` hears, in one line each, when a new cluster is created and when the server is
    started (and where), so that nothing of the kind happens unseen.
    """
    state_dir.mkdir(parents=True, exist_ok=True)
    # Two first commands at once must not both initdb: take turns on a lock file.
    with open(state_dir / "embedded.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        root = cluster_root(state_dir)
        if not (root / "data" / "PG_VERSION").exists():
            root = _place_cluster(state_dir, notify)
        cluster = Cluster(root)
        if not cluster.initialised():
            notify(f"creating a new embedded PostgreSQL cluster in {cluster.data}")
        if not cluster.running():
            cluster.ensure_running()
            notify(f"started the embedded PostgreSQL on 127.0.0.1:{cluster.port} ({cluster.data})")
        bootstrap_database(cluster.superuser_url(), EMBEDDED_DATABASE)
    objects = state_dir / "objects"
    objects.mkdir(parents=True, exist_ok=True)
    return EmbeddedUrls(
        owner=cluster.url(OWNER_ROLE, EMBEDDED_DATABASE),
        app=cluster.url(APP_ROLE, EMBEDDED_DATABASE),
        objects=objects,
    )


def embedded_urls(state_dir: Path) -> EmbeddedUrls:
    """The embedded database's URLs (as :func:`ensure_embedded` returns them; starts nothing)."""
    cluster = embedded_cluster(state_dir)
    return EmbeddedUrls(
        owner=cluster.url(OWNER_ROLE, EMBEDDED_DATABASE),
        app=cluster.url(APP_ROLE, EMBEDDED_DATABASE),
        objects=state_dir / "objects",
    )


def embedded_cluster(state_dir: Path) -> Cluster:
    """The state folder's cluster, whether or not it exists or runs (for status and stop)."""
    return Cluster(cluster_root(state_dir))


def stop_embedded(state_dir: Path) -> bool:
    return embedded_cluster(state_dir).stop()
