"""A real pg_auto_failover formation for the failover lane: a monitor, a primary and a
synchronous standby on free 127.0.0.1 ports, each node run by its own ``pg_autoctl run``.

Debian's ``postgresql-15-auto-failover`` and ``pg-auto-failover-cli`` (``make ha-tools``). The
processes run as the ``postgres`` user when the tests run as root, each ``pg_autoctl run`` in
its own process group, so that :meth:`Formation.crash` kills a node whole (its keeper and its
PostgreSQL) with SIGKILL, as a lost machine would, and the monitor fails over to the standby.
The monitor's detection timeouts are shortened (writes refused for about seven seconds
instead of about fifty); everything else is pg_auto_failover's defaults.
"""

from __future__ import annotations

import os
import pwd
import shutil
import signal
import subprocess
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import psycopg
import pytest

from provisioner.local import cluster as local_pg

PG_BIN = Path("/usr/lib/postgresql/15/bin")
#: The monitor's health checks, shortened (milliseconds): a dead primary is declared unhealthy
#: after about 3 s instead of 20 s.
MONITOR_SETTINGS = {
    "pgautofailover.health_check_period": 1000,
    "pgautofailover.health_check_timeout": 1000,
    "pgautofailover.health_check_max_retries": 1,
    "pgautofailover.health_check_retry_delay": 500,
    "pgautofailover.node_considered_unhealthy_timeout": 3000,
    "pgautofailover.startup_grace_period": 3000,
    # How long the monitor waits for a lost primary to demote itself before promoting the
    # standby (30 s by default), counted from when it declared the primary unhealthy (no
    # report for node_considered_unhealthy_timeout, above). Kept above the keepers' network
    # partition timeout (below), after which a primary cut off from the monitor and its
    # standby demotes itself: a cut-off primary has stopped writing 3 + 3 - 2 = 4 s before
    # the standby is promoted. Most of the failover: 5 s here refused writes 9.2 s, 3 s 6.2 s.
    "pgautofailover.primary_demote_timeout": 3000,
}
#: Each keeper's settings (``pg_autoctl config set``), seconds.
KEEPER_SETTINGS = {"timeout.network_partition_timeout": 2}
#: Every node's PostgreSQL (the monitor's too), as every test cluster of the suite runs: the
#: lane kills processes, never the machine, so what a process wrote survives in the page cache.
#: With fsync on, the checkpoint the keeper takes right after promoting the standby (before
#: the new primary takes writes) took 6 s with the machine busy. The old primary rejoins by a
#: ``pg_basebackup`` that waits for a spread checkpoint (0.9 x checkpoint_timeout: 4.5 min by
#: default): an immediate-paced one, every 30 s, keeps that wait short.
NODE_SETTINGS = {
    "fsync": "off",
    "checkpoint_timeout": "30s",
    "checkpoint_completion_target": "0",
}


@dataclass
class Node:
    name: str
    port: int
    pgdata: Path
    proc: subprocess.Popen[bytes] | None = None


@dataclass
class Formation:
    root: Path
    monitor: Node
    nodes: dict[str, Node] = field(default_factory=dict)

    # -- processes ---------------------------------------------------------------------------

    def _env(self) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith("PG")}
        env.update(
            XDG_CONFIG_HOME=str(self.root / "config"),
            XDG_DATA_HOME=str(self.root / "share"),
            XDG_RUNTIME_DIR=str(self.root / "run"),
            PG_CONFIG=str(PG_BIN / "pg_config"),
        )
        return env

    def _command(self, *args: str) -> list[str]:
        command = ["pg_autoctl", *args]
        return ["runuser", "-u", "postgres", "--", *command] if os.geteuid() == 0 else command

    def autoctl(self, *args: str, timeout: float = 180) -> str:
        result = subprocess.run(
            self._command(*args),
            capture_output=True,
            text=True,
            env=self._env(),
            timeout=timeout,
            check=False,
            cwd=self.root,
        )
        if result.returncode != 0:
            raise AssertionError(f"pg_autoctl {' '.join(args)}: {result.stderr[-2000:]}")
        return result.stdout

    def run(self, node: Node) -> None:
        """``pg_autoctl run`` for the node, in a process group of its own."""
        with (self.root / f"{node.name}.log").open("ab") as log:
            node.proc = subprocess.Popen(
                self._command("run", "--pgdata", str(node.pgdata)),
                stdout=log,
                stderr=subprocess.STDOUT,
                env=self._env(),
                cwd=self.root,
                start_new_session=True,
            )

    def crash(self, name: str) -> None:
        """SIGKILL to the node's whole process group: its keeper and its PostgreSQL."""
        node = self.nodes[name]
        assert node.proc is not None
        os.killpg(node.proc.pid, signal.SIGKILL)
        node.proc.wait(10)
        node.proc = None

    def switchover(self) -> None:
        """A planned switchover, asked of the monitor as ``pg_autoctl perform switchover`` asks
        it (run against the monitor's folder, that command fails in pg_auto_failover 2.0: it
        asks for group '')."""
        with psycopg.connect(self.monitor_url, autocommit=True) as conn:
            conn.execute("SELECT pgautofailover.perform_failover('default', 0)")

    def stop(self) -> None:
        for node in [*self.nodes.values(), self.monitor]:
            if node.proc is not None and node.proc.poll() is None:
                os.killpg(node.proc.pid, signal.SIGTERM)
        # One deadline for all: a busy machine had the three stops take 116 s one after another.
        deadline = time.monotonic() + 10
        for node in [*self.nodes.values(), self.monitor]:
            if node.proc is not None:
                try:
                    node.proc.wait(max(0.1, deadline - time.monotonic()))
                except subprocess.TimeoutExpired:
                    os.killpg(node.proc.pid, signal.SIGKILL)
                    node.proc.wait(10)
        # A postmaster whose keeper was killed may still run: stop it by its data folder.
        for node in [*self.nodes.values(), self.monitor]:
            if (node.pgdata / "postmaster.pid").exists():
                subprocess.run(
                    [
                        "runuser",
                        "-u",
                        "postgres",
                        "--",
                        str(PG_BIN / "pg_ctl"),
                        "-D",
                        str(node.pgdata),
                        "-m",
                        "immediate",
                        "stop",
                    ],
                    capture_output=True,
                    check=False,
                    timeout=60,
                )

    # -- state -------------------------------------------------------------------------------

    @property
    def monitor_url(self) -> str:
        return f"postgresql://autoctl_node@127.0.0.1:{self.monitor.port}/pg_auto_failover"

    def states(self) -> dict[str, tuple[str, str]]:
        """Each node's (reported state, assigned state), as the monitor sees them."""
        with psycopg.connect(self.monitor_url, connect_timeout=3) as conn:
            rows = conn.execute(
                "SELECT nodename, reportedstate::text, goalstate::text FROM pgautofailover.node"
            ).fetchall()
        return {name: (reported, goal) for name, reported, goal in rows}

    def settled(self, primary: str) -> bool:
        """``primary`` is the primary and every other node a secondary, reported and assigned."""
        try:
            states = self.states()
        except psycopg.Error:
            return False
        return all(
            states.get(name) == (("primary",) * 2 if name == primary else ("secondary",) * 2)
            for name in self.nodes
        )

    def primary(self) -> str | None:
        for name, (reported, goal) in self.states().items():
            # wait_primary: a primary whose standby is gone (it writes without waiting for one)
            if reported == goal and reported in ("primary", "wait_primary", "single"):
                return name
        return None

    def url(self, role: str, database: str, *, read_write: bool = True) -> str:
        """A multi-host URL of every node; libpq picks the primary (read-write)."""
        hosts = ",".join(f"127.0.0.1:{n.port}" for n in self.nodes.values())
        attrs = "?target_session_attrs=read-write" if read_write else ""
        return f"postgresql://{role}@{hosts}/{database}{attrs}"

    def superuser_url(self, database: str = "postgres") -> str:
        return self.url("postgres", database)


def _wait(predicate, timeout: float, what: str) -> None:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:.0f} s waiting for {what}")
        time.sleep(0.2)


def _configure(conn: psycopg.Connection, settings: dict[str, str]) -> None:
    for name, value in settings.items():
        conn.execute(f"ALTER SYSTEM SET {name} = '{value}'")
    conn.execute("SELECT pg_reload_conf()")


def start_formation(node_settings: dict[str, str] | None = None) -> Formation:
    """A monitor, node1 primary and node2 its synchronous standby; ``node_settings`` for every
    node's PostgreSQL (default :data:`NODE_SETTINGS`)."""
    node_settings = NODE_SETTINGS if node_settings is None else node_settings
    if shutil.which("pg_autoctl") is None:
        raise AssertionError("pg_autoctl is not installed: `make test` installs it (make ha-tools)")
    root = Path(tempfile.mkdtemp(prefix="provisioner-failover-"))
    for sub in ("config", "share", "run"):
        (root / sub).mkdir()
    if os.geteuid() == 0:
        entry = pwd.getpwnam("postgres")
        for path in [root, *root.iterdir()]:
            os.chown(path, entry.pw_uid, entry.pw_gid)
    monitor = Node("monitor", local_pg.free_port(), root / "monitor")
    formation = Formation(root, monitor)
    common = [
        "--hostname",
        "127.0.0.1",
        "--auth",
        "trust",
        "--no-ssl",
        "--pgctl",
        str(PG_BIN / "pg_ctl"),
    ]
    try:
        formation.autoctl(
            "create",
            "monitor",
            "--pgdata",
            str(monitor.pgdata),
            "--pgport",
            str(monitor.port),
            *common,
        )
        formation.run(monitor)
        _wait(lambda: _accepts(formation.monitor_url), 60, "the monitor")
        with psycopg.connect(
            f"postgresql://postgres@127.0.0.1:{monitor.port}/pg_auto_failover", autocommit=True
        ) as conn:
            for name, value in MONITOR_SETTINGS.items():
                conn.execute(f"ALTER SYSTEM SET {name} = {int(value)}")
            _configure(conn, node_settings)
        for name in ("node1", "node2"):
            node = Node(name, local_pg.free_port(), root / name)
            formation.nodes[name] = node
            formation.autoctl(
                "create",
                "postgres",
                "--pgdata",
                str(node.pgdata),
                "--pgport",
                str(node.port),
                "--name",
                name,
                "--monitor",
                formation.monitor_url + "?sslmode=disable",
                *common,
            )
            for key, value in KEEPER_SETTINGS.items():
                formation.autoctl("config", "set", "--pgdata", str(node.pgdata), key, str(value))
            formation.run(node)
            _wait(lambda n=name: n in formation.states(), 120, f"{name} to register")
            if name == "node1":  # node2's base backup copies postgresql.auto.conf
                _wait(lambda: _accepts(formation.superuser_url()), 120, "node1 to start")
                with psycopg.connect(formation.superuser_url(), autocommit=True) as conn:
                    _configure(conn, node_settings)
        _wait(lambda: formation.settled("node1"), 180, "node1 primary, node2 secondary")
    except BaseException:
        formation.stop()
        raise
    return formation


def _accepts(url: str) -> bool:
    try:
        psycopg.connect(url, connect_timeout=2).close()
    except psycopg.Error:
        return False
    return True


@pytest.fixture(scope="session")
def formation() -> Iterator[Formation]:
    found = start_formation()
    try:
        yield found
    finally:
        found.stop()
        shutil.rmtree(found.root, ignore_errors=True)
