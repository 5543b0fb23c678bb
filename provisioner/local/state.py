"""The embedded default: the project's own PostgreSQL, a :class:`~provisioner.local.cluster.Cluster`
kept for a state folder.

The state lives in a ``.provisioner`` folder found the way git finds ``.git``: in the current
folder or the nearest parent that has one (:func:`locate_state_dir`), so a command run from a
subfolder uses the project's cluster instead of starting an empty one. When the server user
cannot reach that folder (root working in a private home, mode 0700), the cluster's data goes to
a folder it can reach and the state folder keeps a pointer to it (``postgres.location``).
Starting a server, and above all creating a new cluster, is reported through the caller's
``notify`` callback (the CLI prints it on stderr): never silently. Two first commands at once
take turns on a lock file: one creates the cluster, the other finds it.
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import pwd
import stat
import tempfile
from dataclasses import dataclass
from pathlib import Path

from provisioner.local.cluster import (
    APP_ROLE,
    OWNER_ROLE,
    Cluster,
    Notify,
    bootstrap_database,
    quiet,
    service_user,
)

EMBEDDED_DATABASE = "provisioner"
DEFAULT_STATE_DIR = Path(".provisioner")
#: In the state folder: where the cluster lives when it cannot live inside it.
LOCATION_FILE = "postgres.location"


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
    user = service_user()
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


def ensure_embedded(
    state_dir: Path, notify: Notify = quiet, app_roles: tuple[str, ...] = ()
) -> EmbeddedUrls:
    """The embedded default: a cluster for ``state_dir`` with the owner and app roles (and
    ``app_roles``, the project's others, created when missing).

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
            if not cluster.initialised():
                cluster.init()
            cluster.start()
            notify(f"started the embedded PostgreSQL on 127.0.0.1:{cluster.port} ({cluster.data})")
        if cluster.secure():
            notify(
                f"the embedded PostgreSQL now asks every role for a password (kept in "
                f"{cluster.passfile}, mode 0600); connections without one are refused"
            )
        bootstrap_database(cluster.superuser_url(), EMBEDDED_DATABASE, app_roles)
    objects = state_dir / "objects"
    objects.mkdir(parents=True, exist_ok=True)
    return EmbeddedUrls(
        owner=cluster.url(OWNER_ROLE, EMBEDDED_DATABASE),
        app=cluster.url(APP_ROLE, EMBEDDED_DATABASE),
        objects=objects,
    )


def embedded_urls(state_dir: Path) -> EmbeddedUrls:
    """The embedded database's URLs to show (starts nothing): they name the cluster's password
    file instead of holding a password (:meth:`Cluster.passfile_url`)."""
    cluster = embedded_cluster(state_dir)
    return EmbeddedUrls(
        owner=cluster.passfile_url(OWNER_ROLE, EMBEDDED_DATABASE),
        app=cluster.passfile_url(APP_ROLE, EMBEDDED_DATABASE),
        objects=state_dir / "objects",
    )


def embedded_cluster(state_dir: Path) -> Cluster:
    """The state folder's cluster, whether or not it exists or runs (for status and stop)."""
    return Cluster(cluster_root(state_dir))


def stop_embedded(state_dir: Path) -> bool:
    return embedded_cluster(state_dir).stop()
