"""The primary crash mid-drain, run on a :class:`~tests.failover.Formation` by the failover lane
(which asserts what it left in the database) and by ``python -m bench --only failover`` (which
prints where the seconds went): 300 tenants queued, a worker draining them through a libpq
multi-host URL with ``target_session_attrs=read-write``, the primary's keeper and PostgreSQL
SIGKILLed together once ``crash_after`` jobs succeeded, then the drain to its end.

The seconds after the crash, each from its own witness: the monitor's event table (the
primary declared unhealthy; the standby's promotion reported), a probe writing every 50 ms
through the multi-host URL (writes refused), and the worker's JSON log (its first claim on the
new primary, every job's success and retry).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import IO, Any

import psycopg

import provisioner
from tests.failover import Formation

ROOT = Path(__file__).resolve().parent.parent
BOOTSTRAP_SQL = ROOT / "infra" / "postgres" / "bootstrap.sql"
DATABASE = "provisioner"
TENANTS = 300
#: Generous: a deadline for a stuck drain, never the figure measured.
DRAIN_DEADLINE_SECONDS = 240
#: The lane's worker: two engine children per core (a worker's default is one per core; the
#: suite's own workers run one each). One child's round trips and commits overlap another's
#: work: with the machine shared, 4 children drained 3.7 jobs/s after the crash (load 25-28)
#: and 2.7 (load 30-34) where 2 drained 2.3-2.7 (load 11-28). At most 8, for a bigger machine.
CONCURRENCY = min(8, 2 * max(2, os.cpu_count() or 2))
#: The crash comes mid-drain: once this many jobs succeeded.
CRASH_AFTER = 150


def worker_command(concurrency: int) -> list[str]:
    return [
        sys.executable,
        "-m",
        "provisioner",
        "worker",
        "--log-format=json",
        f"--concurrency={concurrency}",
    ]


def start_worker(
    env: dict[str, str], log: IO[str], concurrency: int = CONCURRENCY
) -> subprocess.Popen[bytes]:
    """A worker logging JSON lines to ``log``, in a session of its own."""
    return subprocess.Popen(
        worker_command(concurrency),
        env=env,
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )


def worker_env(formation: Formation, tmp: Path) -> dict[str, str]:
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("PROVISIONER_", "OBJECT_", "PG", "DATABASE_URL"))
    }
    env.update(
        MIGRATIONS_DATABASE_URL=formation.url("provisioner_owner", DATABASE),
        APP_DATABASE_URL=formation.url("app_rw", DATABASE),
        OBJECT_STORE_PROVIDER="filesystem",
        OBJECT_STORE_PATH=str(tmp / "objects"),
        PROVISIONER_STATE_DIR=str(tmp / "state"),
        PROVISIONER_HEARTBEAT_SECONDS="1",
        PROVISIONER_JOB_STALE_AFTER_SECONDS="6",
        PROVISIONER_POLL_SECONDS="0.5",
        PYTHONPATH=str(ROOT),
    )
    (tmp / "objects").mkdir(exist_ok=True)
    return env


def cli(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "provisioner", *args],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
        check=False,
    )


def counts(formation: Formation) -> dict[str, int] | None:
    """Jobs per status on the primary (None: no primary answers right now)."""
    try:
        with psycopg.connect(
            formation.url("provisioner_owner", DATABASE), connect_timeout=2
        ) as conn:
            rows = conn.execute(
                "SELECT status, count(*) FROM control.platform_jobs GROUP BY status"
            ).fetchall()
    except psycopg.Error:
        return None
    return {status: count for status, count in rows}


def events(log: Path, name: str) -> list[dict[str, Any]]:
    """The worker's JSON log lines of one event."""
    found = []
    for line in log.read_text().splitlines():
        try:
            record = json.loads(line)
        except ValueError:
            continue  # not a log line (a child's traceback would be shown by the asserts)
        if isinstance(record, dict) and record.get("event") == name:
            found.append(record)
    return found


def _count(conn: psycopg.Connection[Any], query: str) -> int:
    row = conn.execute(query).fetchone()
    assert row is not None
    return int(row[0])


def wall(record: dict[str, Any]) -> float:
    """A log line's time, in seconds since the epoch."""
    return datetime.fromisoformat(record["ts"].replace("Z", "+00:00")).timestamp()


class WriteProbe(threading.Thread):
    """Writes one row every 50 ms through the multi-host URL; keeps the refused stretch (wall
    clock, to compare with the worker's log)."""

    def __init__(self, url: str) -> None:
        super().__init__(daemon=True)
        self.url = url
        self.stopped = threading.Event()
        self.refused: list[float] = []
        self.acknowledged = 0

    def run(self) -> None:
        conn: psycopg.Connection | None = None
        while not self.stopped.is_set():
            try:
                if conn is None or conn.closed or conn.broken:
                    conn = psycopg.connect(self.url, connect_timeout=1, autocommit=True)
                conn.execute("INSERT INTO failover_probe DEFAULT VALUES")
                self.acknowledged += 1
            except psycopg.Error:
                self.refused.append(time.time())
                if conn is not None:
                    conn.close()
                conn = None
            time.sleep(0.05)
        if conn is not None:
            conn.close()


@dataclass(frozen=True)
class CrashDrain:
    """What the crash mid-drain left (the lane asserts it) and its seconds (the bench prints
    them; every time is counted from the SIGKILL)."""

    counts: dict[str, int]
    #: jobs whose attempts > 1, and the retries the worker logged (with their delays)
    retried: int
    retry_delays: list[float]
    #: step runs still ``running`` after the drain
    open_runs: int
    #: jobs the worker logged as succeeded whose row now shows another attempt or status
    lost_jobs: int
    probe_acknowledged: int
    probe_kept: int
    left_at_crash: int
    #: the monitor declared the primary unhealthy; the standby reported itself the primary
    detected: float
    promoted: float
    #: the probe's last refused write, the worker's first claim after it, the drain's end
    writable: float
    back: float
    drained: float
    rate_before: float
    rate_after: float
    health_alone: dict[str, Any]

    def summary(self) -> str:
        return (
            f"primary declared unhealthy {self.detected:.1f} s after the crash, standby "
            f"promoted {self.promoted:.1f} s; writes refused until {self.writable:.1f} s; the "
            f"worker claimed again {self.back:.2f} s after that; drain done {self.drained:.1f} s "
            f"after the crash ({self.left_at_crash} tenants left at the crash; "
            f"{self.rate_before:.1f} jobs/s before, {self.rate_after:.1f} after); "
            f"{self.retried} job(s) on a second attempt; {self.lost_jobs} acknowledged job(s) "
            f"lost; {self.probe_acknowledged} probe writes acknowledged, {self.probe_kept} kept"
        )


def prepare(formation: Formation, tmp: Path, tenants: int = TENANTS) -> dict[str, str]:
    """The database, the control schema and ``tenants`` queued jobs; the worker's env."""
    with psycopg.connect(formation.superuser_url(), autocommit=True) as conn:
        conn.execute(f"CREATE DATABASE {DATABASE}")
    with psycopg.connect(formation.superuser_url(DATABASE), autocommit=True) as conn:
        conn.execute(BOOTSTRAP_SQL.read_text())
        conn.execute("CREATE TABLE failover_probe (id bigserial PRIMARY KEY)")
    env = worker_env(formation, tmp)
    migrated = cli(env, "migrate")
    assert migrated.returncode == 0, migrated.stderr
    with psycopg.connect(formation.url("app_rw", DATABASE)) as conn:
        for i in range(tenants):
            provisioner.enqueue(conn, f"t{i:03d}")
    return env


def _monitor_times(formation: Formation, since: float) -> tuple[float, float]:
    """From the monitor's events: when it first assigned the old primary a goal other than
    primary (it declared it unhealthy), and when the standby first reported a writable state."""
    with psycopg.connect(formation.monitor_url) as conn:
        rows = conn.execute(
            "SELECT extract(epoch FROM eventtime)::float8, nodename, reportedstate::text,"
            " goalstate::text FROM pgautofailover.event"
            " WHERE eventtime >= to_timestamp(%s) ORDER BY eventid",
            [since],
        ).fetchall()
    detected = next((t for t, n, _, g in rows if n == "node1" and g != "primary"), float("nan"))
    promoted = next(
        (t for t, n, r, _ in rows if n == "node2" and r in ("wait_primary", "primary")),
        float("nan"),
    )
    return detected - since, promoted - since


def crash_mid_drain(
    formation: Formation,
    tmp: Path,
    env: dict[str, str],
    *,
    tenants: int = TENANTS,
    crash_after: int = CRASH_AFTER,
    concurrency: int = CONCURRENCY,
) -> CrashDrain:
    """Start the worker, SIGKILL node1 once ``crash_after`` jobs succeeded, wait for the drain;
    the worker is stopped before this returns."""
    log_path = tmp / "worker.log"
    log = log_path.open("w")
    worker = start_worker(env, log, concurrency)
    probe = WriteProbe(formation.superuser_url(DATABASE))
    probe.start()
    try:
        deadline = time.monotonic() + DRAIN_DEADLINE_SECONDS
        while (counts(formation) or {}).get("succeeded", 0) < crash_after:
            assert time.monotonic() < deadline, "the worker did not start draining"
            assert worker.poll() is None, log_path.read_text()[-3000:]
            time.sleep(0.05)
        formation.crash("node1")
        crashed, crashed_wall = time.monotonic(), time.time()
        deadline = crashed + DRAIN_DEADLINE_SECONDS
        while (counts(formation) or {}).get("succeeded", 0) < tenants:
            assert time.monotonic() < deadline, (
                f"not drained {DRAIN_DEADLINE_SECONDS} s after the crash: {counts(formation)}"
            )
            assert worker.poll() is None, log_path.read_text()[-3000:]
            time.sleep(0.1)
        drained = time.monotonic() - crashed
        probe.stopped.set()
        probe.join(10)
        assert formation.primary() == "node2"
        with psycopg.connect(formation.url("provisioner_owner", DATABASE)) as conn:
            found: dict[str, int] = dict(
                conn.execute(
                    "SELECT status, count(*) FROM control.platform_jobs GROUP BY status"
                ).fetchall()
            )
            attempts: dict[str, int] = dict(
                conn.execute("SELECT id::text, attempts FROM control.platform_jobs").fetchall()
            )
            open_runs = _count(
                conn, "SELECT count(*) FROM control.job_step_runs WHERE outcome = 'running'"
            )
        with psycopg.connect(formation.superuser_url(DATABASE)) as conn:
            kept = _count(conn, "SELECT count(*) FROM failover_probe")
        # The new primary has no standby until the old one rejoins: health says so.
        alone = json.loads(cli(env, "health", "--json").stdout)
    finally:
        probe.stopped.set()
        worker.terminate()
        worker.wait(60)
        log.close()

    writable_wall = probe.refused[-1] if probe.refused else crashed_wall
    claims = [wall(c) for c in events(log_path, "claimed") if wall(c) > writable_wall]
    back = claims[0] - writable_wall if claims else float("nan")
    successes = events(log_path, "succeeded")
    succeeded = sorted(wall(e) for e in successes)
    left = sum(1 for t in succeeded if t > crashed_wall)
    first = succeeded[0] if succeeded else crashed_wall
    after_start = writable_wall + (back if back == back else 0.0)
    lost = sum(1 for e in successes if attempts.get(str(e["job_id"])) != e["attempt"])
    detected, promoted = _monitor_times(formation, crashed_wall)
    return CrashDrain(
        counts=found,
        retried=sum(1 for a in attempts.values() if a > 1),
        retry_delays=[r["delay_seconds"] for r in events(log_path, "retry_scheduled")],
        open_runs=open_runs,
        lost_jobs=lost,
        probe_acknowledged=probe.acknowledged,
        probe_kept=kept,
        left_at_crash=left,
        detected=detected,
        promoted=promoted,
        writable=writable_wall - crashed_wall,
        back=back,
        drained=drained,
        rate_before=(tenants - left) / max(crashed_wall - first, 1e-9),
        rate_after=left / max(succeeded[-1] - after_start, 1e-9) if succeeded else 0.0,
        health_alone=alone,
    )
