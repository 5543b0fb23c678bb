"""Real ``provisioner worker`` processes for tests, and ways to hold a tenant mid-step.

A worker runs as ``python -m provisioner worker --log-format json`` in its own session (process
group), its log in a file; :class:`Workers` stops every worker it started (SIGCONT, then SIGKILL
to the group) when the test ends, so nothing lingers even after a failed assertion.

To freeze a worker *inside* a step without test hooks in product code, the test holds a lock the
step needs: :func:`tenant_row_locked` locks the tenant's row in ``control.tenants`` (the
``create_schema`` step updates it after creating the schema).

Loaded as a pytest plugin (``tests/conftest.py``): the :func:`workers` fixture starts workers with
the test module's own ``fast`` settings.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import psycopg
import pytest
from psycopg.rows import dict_row

from provisioner.settings import Settings
from tests.conftest import Database, settings_env

T = TypeVar("T")


def wait_until(predicate: Callable[[], T], timeout: float, what: str, interval: float = 0.1) -> T:
    """Poll until ``predicate()`` is truthy; fail the test after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:.0f} s waiting for {what}")
        time.sleep(interval)


@dataclass
class WorkerProcess:
    proc: subprocess.Popen[bytes]
    log_path: Path
    name: str

    @property
    def pid(self) -> int:
        return self.proc.pid

    def output(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    def events(self, name: str | None = None) -> list[dict[str, Any]]:
        """The JSON log lines (anything else, e.g. a traceback, is skipped)."""
        found = []
        for line in self.output().splitlines():
            with suppress(ValueError):
                record = json.loads(line)
                if isinstance(record, dict) and (name is None or record.get("event") == name):
                    found.append(record)
        return found

    def wait_for(self, name: str, timeout: float = 30, **match: Any) -> dict[str, Any]:
        def seen() -> dict[str, Any] | None:
            for record in self.events(name):
                if all(record.get(k) == v for k, v in match.items()):
                    return record
            if self.proc.poll() is not None:
                raise AssertionError(
                    f"worker {self.name} exited ({self.proc.returncode}) before logging "
                    f"{name} {match}:\n{self.output()[-3000:]}"
                )
            return None

        return wait_until(seen, timeout, f"{self.name} to log {name} {match}")

    def idle(self, timeout: float = 60) -> WorkerProcess:
        """Wait until the worker found the queue empty (it listens and polls from then on)."""
        self.wait_for("idle", timeout)
        return self

    def holders(self) -> list[str]:
        return [e["holder"] for e in self.events("child_started")]

    def child_pids(self) -> list[int]:
        return [int(e["pid"]) for e in self.events("child_started")]

    def send(self, sig: int) -> None:
        os.kill(self.pid, sig)

    def send_group(self, sig: int) -> None:
        """To the worker and its children, as a container runtime would (docker pause/kill)."""
        os.killpg(self.pid, sig)

    def wait(self, timeout: float = 60) -> int:
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            raise AssertionError(
                f"worker {self.name} still running after {timeout} s:\n{self.output()[-3000:]}"
            ) from None

    def stop(self, timeout: float = 60) -> int:
        """SIGTERM, then the exit code (a clean stop is 0)."""
        self.send(signal.SIGTERM)
        return self.wait(timeout)


@dataclass
class Workers:
    settings: Settings
    log_dir: Path
    started: list[WorkerProcess] = field(default_factory=list)

    def start(
        self,
        *args: str,
        env: dict[str, str] | None = None,
        settings: Settings | None = None,
        log_format: str = "json",
        cwd: Path | None = None,
    ) -> WorkerProcess:
        """A worker process (in ``cwd``: a project's folder, whose configuration it finds)."""
        name = f"w{len(self.started) + 1}"
        log_path = self.log_dir / f"worker-{name}.log"
        child_env = settings_env(settings or self.settings)
        child_env.update(env or {})
        with log_path.open("wb") as log:
            proc = subprocess.Popen(
                [sys.executable, "-m", "provisioner", "worker", "--log-format", log_format, *args],
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                env=child_env,
                start_new_session=True,
                cwd=cwd,
            )
        worker = WorkerProcess(proc, log_path, name)
        self.started.append(worker)
        return worker

    def cleanup(self) -> None:
        """Kill what still runs: the worker's own process group (it and its children)."""
        for worker in self.started:
            if worker.proc.poll() is None:
                with suppress(ProcessLookupError):
                    os.killpg(worker.pid, signal.SIGCONT)
                    os.killpg(worker.pid, signal.SIGKILL)
            with suppress(subprocess.TimeoutExpired):
                worker.proc.wait(10)


@contextmanager
def running_workers(settings: Settings, log_dir: Path) -> Iterator[Workers]:
    workers = Workers(settings, log_dir)
    try:
        yield workers
    finally:
        workers.cleanup()


def kill_frozen(
    settings: Settings,
    child: Path,
    *args: str,
    env: dict[str, str] | None = None,
    cwd: Path | None = None,
) -> None:
    """Run a crash-test child script (``child args...``, in ``cwd`` with ``env`` over the
    settings' environment) until it prints that it froze at its (step, outcome), the last two
    of ``args``, then SIGKILL it."""
    step, outcome = args[-2:]
    with subprocess.Popen(
        [sys.executable, str(child), *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**settings_env(settings), **(env or {})},
        cwd=cwd,
    ) as proc:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        os.kill(proc.pid, signal.SIGKILL)
        _, errors = proc.communicate(timeout=10)
    assert line.strip() == f"FROZEN {step} {outcome}", errors
    assert proc.returncode == -signal.SIGKILL


def alive(pid: int) -> bool:
    """True while the process exists and is not a zombie."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, ProcessLookupError, IndexError):
        return False
    return state not in ("Z", "X")


# -- the database side -----------------------------------------------------------------------------


def job_row(database: Database, tenant: str) -> dict[str, Any]:
    with psycopg.connect(database.owner_url, row_factory=dict_row) as conn:
        row = conn.execute(
            "SELECT * FROM control.platform_jobs WHERE tenant_id = %s", (tenant,)
        ).fetchone()
    assert row is not None, f"no job for tenant {tenant}"
    return row


def step_runs(database: Database, tenant: str) -> list[dict[str, Any]]:
    with psycopg.connect(database.owner_url, row_factory=dict_row) as conn:
        return conn.execute(
            "SELECT * FROM control.job_step_runs WHERE tenant_id = %s ORDER BY id", (tenant,)
        ).fetchall()


def overlapping_step_runs(database: Database) -> list[tuple[Any, ...]]:
    """Pairs of step runs of one tenant whose [started_at, finished_at) intervals overlap (a
    step's run starts at the instant the one before it finished: they touch, never overlap)."""
    with psycopg.connect(database.owner_url) as conn:
        return conn.execute(
            """
            SELECT a.tenant_id, a.step, a.worker, b.step, b.worker
              FROM control.job_step_runs a
              JOIN control.job_step_runs b ON a.tenant_id = b.tenant_id AND a.id < b.id
             WHERE tstzrange(a.started_at, coalesce(a.finished_at, 'infinity'), '[)')
                && tstzrange(b.started_at, coalesce(b.finished_at, 'infinity'), '[)')
            """
        ).fetchall()


def waiting_on_lock(database: Database, holder: str) -> bool:
    """True when a session of ``holder`` waits on a lock (it is frozen mid-step)."""
    with psycopg.connect(database.admin_url) as conn:
        row = conn.execute(
            "SELECT count(*) FROM pg_stat_activity WHERE application_name = %s "
            "AND wait_event_type = 'Lock'",
            (holder,),
        ).fetchone()
    return bool(row and row[0])


def wait_blocked_mid_step(database: Database, tenant: str) -> str:
    """Wait until a worker claimed the tenant's job and blocks inside a step; its holder id."""
    running = wait_until(
        lambda: (row := job_row(database, tenant))["status"] == "running" and row, 60, "a claim"
    )
    holder = str(running["locked_by"])
    wait_until(lambda: waiting_on_lock(database, holder), 30, f"{holder} to block mid-step")
    return holder


@contextmanager
def tenant_row_locked(database: Database, tenant: str) -> Iterator[psycopg.Connection[Any]]:
    """Hold ``control.tenants`` row of the tenant FOR UPDATE: create_schema blocks inside.

    Commit the yielded connection to let the step go on earlier than the block's end.
    """
    conn = psycopg.connect(database.owner_url)
    try:
        locked = conn.execute(
            "SELECT 1 FROM control.tenants WHERE tenant_id = %s FOR UPDATE", (tenant,)
        ).fetchone()
        assert locked, f"tenant {tenant} has no control row yet: enqueue it first"
        yield conn
    finally:
        with suppress(psycopg.Error):
            conn.rollback()
        conn.close()


@pytest.fixture
def workers(fast: Settings, tmp_path: Path) -> Iterator[Workers]:
    """Worker processes started with the test module's ``fast`` settings, all stopped at the end."""
    with running_workers(fast, tmp_path) as started:
        yield started
