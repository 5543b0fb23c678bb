"""One throwaway cluster for all the pytest-xdist workers of a test run.

Each worker is its own process with its own session fixtures, so without help each would start
(and pay for) a cluster of its own, and ``-n 2`` would gain nothing. The workers of one run
share a temporary folder (the parent of each worker's ``basetemp``); there they take turns on a
lock file (:data:`LOCK`, ``fcntl.flock``): the first starts the cluster and records its folder
(:data:`RECORD`), the others find it running and use it. While it uses the cluster, a worker
holds a *shared* lock on :data:`USERS`; leaving, it tries to turn that into an *exclusive*
one, which succeeds only for the last worker: that one stops the cluster and removes it. A
worker that dies loses its locks with its process, so it never keeps the cluster alive.
Setup and teardown both run under :data:`LOCK`, so a worker starting late never uses a cluster
that another is removing (it starts a new one instead).
"""

from __future__ import annotations

import fcntl
import shutil
import tempfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import IO

from provisioner.local import cluster as local_pg

#: Setup and teardown take turns on this file.
LOCK = "provisioner-cluster.lock"
#: The shared cluster's folder, one line.
RECORD = "provisioner-cluster.root"
#: Every worker using the cluster holds a shared lock on this file.
USERS = "provisioner-cluster.users"


@contextmanager
def _turn(directory: Path) -> Iterator[None]:
    with open(directory / LOCK, "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        yield  # closing the file releases the lock


#: A cluster object for a folder (its binaries and settings): a plain throwaway cluster by default.
Make = Callable[[Path], local_pg.Cluster]


def _plain(root: Path) -> local_pg.Cluster:
    return local_pg.Cluster(root, durable=False)


def _recorded(directory: Path, make: Make) -> local_pg.Cluster | None:
    record = directory / RECORD
    if not record.exists():
        return None
    cluster = make(Path(record.read_text().strip()))
    return cluster if cluster.running() else None


def _start_new(directory: Path, make: Make) -> local_pg.Cluster:
    # Its own top-level temporary folder: as root the server runs as an unprivileged user, who
    # must reach it (pytest's own temporary folders are private).
    cluster = make(Path(tempfile.mkdtemp(prefix="provisioner-pg-")))
    try:
        cluster.ensure_running()
    except BaseException:
        cluster.stop()
        shutil.rmtree(cluster.root, ignore_errors=True)
        raise
    (directory / RECORD).write_text(f"{cluster.root}\n")
    return cluster


@dataclass
class SharedCluster:
    """This process's use of the run's shared cluster (see the module)."""

    directory: Path
    cluster: local_pg.Cluster
    _users: IO[str]

    @classmethod
    def join(cls, directory: Path, make: Make = _plain) -> SharedCluster:
        """Use the run's cluster, starting it if this process is the first (``make``: the
        cluster object for a folder, the same in every process of the run)."""
        directory.mkdir(parents=True, exist_ok=True)
        with _turn(directory):
            cluster = _recorded(directory, make) or _start_new(directory, make)
            users = open(directory / USERS, "a")  # noqa: SIM115 (held until leave())
            fcntl.flock(users, fcntl.LOCK_SH)
        return cls(directory, cluster, users)

    def leave(self) -> bool:
        """Stop using the cluster; the last process to leave stops and removes it (True)."""
        with _turn(self.directory):
            try:
                fcntl.flock(self._users, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                last = False
            else:
                last = True
                self.cluster.stop()
                shutil.rmtree(self.cluster.root, ignore_errors=True)
                (self.directory / RECORD).unlink(missing_ok=True)
            finally:
                self._users.close()
        return last
