"""Safe rollouts of a fleet upgrade: a canary wave, a failure brake, resume and abort, and the
numbers behind ``upgrade --watch``.

Every ``provisioner upgrade`` that queues tenants records a rollout (``control.rollouts``) and
its tenants (``control.rollout_tenants``). With ``canary=N`` only the first N tenants' jobs are
queued and the rollout waits in ``canary`` for review; ``resume`` queues the rest once every
canary job has succeeded. With ``max_failures=K``, the K-th failed job halts the rollout: a
trigger in the control schema holds its queued jobs (:mod:`provisioner.queue.holds`: never
claimed, not failed) in the transaction that records the failure, whichever process wrote it.
``resume`` releases them; ``abort`` drops what has not started: held and queued jobs go back
to succeeded (their schema was never touched, it is still at its old head) and pending tenants
are dropped. A failed tenant stays at its old head, usable, and ``status`` shows its error.

Rollout writes go through the owner URL (the application role only reads these tables).
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from datetime import datetime
from typing import Any
from uuid import UUID

import psycopg

from provisioner import queue
from provisioner.errors import InvalidInput
from provisioner.kinds.provision import MIGRATION_STEP, PROVISION_JOB_TYPE, STEPS
from provisioner.models import Job
from provisioner.queue import journal, stats
from provisioner.templates import upgrade as upgrade_replay

# The newest rollout that still needs an operator or a worker.
ACTIVE = """
SELECT * FROM control.rollouts WHERE state IN ('canary', 'running', 'halted')
 ORDER BY id DESC LIMIT 1 FOR UPDATE
"""

LATEST = "SELECT * FROM control.rollouts ORDER BY id DESC LIMIT 1"

GET = "SELECT * FROM control.rollouts WHERE id = %(id)s"

# A new rollout closes the running ones before it (their jobs stay where they are).
CLOSE_RUNNING = (
    "UPDATE control.rollouts SET state = 'done', updated_at = now() WHERE state = 'running'"
)

CREATE = """
INSERT INTO control.rollouts (head, canary, max_failures, state)
VALUES (%(head)s, %(canary)s, %(max_failures)s, %(state)s)
RETURNING *
"""

ADD_TENANTS = """
INSERT INTO control.rollout_tenants (rollout_id, tenant_id, job_id, wave, state)
SELECT %(rollout)s, t, j, %(wave)s, %(state)s
  FROM unnest(%(tenants)s::text[], %(jobs)s::uuid[]) AS u(t, j)
"""

PENDING_JOBS = """
SELECT job_id FROM control.rollout_tenants WHERE rollout_id = %(rollout)s AND state = 'pending'
"""

MARK_QUEUED = """
UPDATE control.rollout_tenants SET state = 'queued'
 WHERE rollout_id = %(rollout)s AND job_id = ANY(%(jobs)s)
"""

DROP_PENDING = """
UPDATE control.rollout_tenants SET state = 'dropped'
 WHERE rollout_id = %(rollout)s AND state = 'pending'
"""

SET_STATE = "UPDATE control.rollouts SET state = %(state)s, updated_at = now() WHERE id = %(id)s"

Conn = psycopg.Connection[dict[str, Any]]


@dataclass(frozen=True)
class Rollout:
    id: int
    head: str
    state: str
    canary: int | None
    max_failures: int | None
    created_at: datetime

    @classmethod
    def from_row(cls, row: dict[str, Any]) -> Rollout:
        return cls(
            row["id"],
            row["head"],
            row["state"],
            row["canary"],
            row["max_failures"],
            row["created_at"],
        )


def _reopen(
    conn: Conn, rollout: Rollout, job_ids: list[UUID], started_by: str = "upgrade"
) -> list[Job]:
    jobs = queue.reopen_for_upgrade(
        conn,
        job_ids,
        step=MIGRATION_STEP,
        key=upgrade_replay.UPGRADE_TO,
        head=rollout.head,
        started_by=started_by,
    )
    conn.execute(MARK_QUEUED, {"rollout": rollout.id, "jobs": [j.id for j in jobs]})
    return jobs


def start(
    conn: Conn,
    head: str,
    behind: list[Job],
    *,
    canary: int | None = None,
    max_failures: int | None = None,
) -> tuple[Rollout, list[Job]]:
    """Record a rollout of ``behind`` and queue its first wave (all, or the canary); in the
    caller's transaction. Refused while another rollout waits for review or is halted."""
    active = conn.execute(ACTIVE).fetchone()
    if active is not None and active["state"] in ("canary", "halted"):
        raise InvalidInput(
            f"rollout {active['id']} is {active['state']}: "
            "`provisioner upgrade --resume` or `--abort` it first"
        )
    conn.execute(CLOSE_RUNNING)
    state = "canary" if canary is not None and canary < len(behind) else "running"
    row = conn.execute(
        CREATE, {"head": head, "canary": canary, "max_failures": max_failures, "state": state}
    ).fetchone()
    assert row is not None
    rollout = Rollout.from_row(row)
    first = behind[: canary or len(behind)]
    rest = behind[len(first) :]
    for wave, jobs in (("canary" if canary else "main", first), ("main", rest)):
        if jobs:
            conn.execute(
                ADD_TENANTS,
                {
                    "rollout": rollout.id,
                    "wave": wave,
                    "state": "pending",
                    "tenants": [str(j.tenant_id) for j in jobs],
                    "jobs": [j.id for j in jobs],
                },
            )
    return rollout, _reopen(conn, rollout, [j.id for j in first])


@dataclass(frozen=True)
class Resumed:
    rollout: Rollout
    #: jobs queued now (the rest after a canary), or released (held by the brake)
    queued: int
    released: int


def resume(conn: Conn, *, started_by: str = "upgrade") -> Resumed:
    """Continue the active rollout: after a successful canary, queue the rest (their runs
    record ``started_by``); after a halt, release the held jobs. In the caller's
    transaction."""
    row = conn.execute(ACTIVE).fetchone()
    if row is None or row["state"] == "running":
        raise InvalidInput("no rollout waits for review or is halted: nothing to resume")
    rollout = Rollout.from_row(row)
    if rollout.state == "canary":
        counts = queue.canary_status(conn, rollout.id)
        unfinished = sum(n for status, n in counts.items() if status != "succeeded")
        if unfinished:
            raise InvalidInput(
                f"rollout {rollout.id}: {unfinished} canary tenant(s) have not succeeded "
                f"({', '.join(f'{n} {s}' for s, n in sorted(counts.items()))}); wait, fix and "
                "`jobs retry --failed`, or `upgrade --abort`"
            )
        pending = [r["job_id"] for r in conn.execute(PENDING_JOBS, {"rollout": rollout.id})]
        queued = _reopen(conn, rollout, pending, started_by)
        conn.execute(DROP_PENDING, {"rollout": rollout.id})  # no longer behind: nothing to do
        conn.execute(SET_STATE, {"state": "running", "id": rollout.id})
        return Resumed(rollout, len(queued), 0)
    released = queue.release_held(conn, rollout.id)
    if released:  # wake the idle workers once the release commits
        queue.notify(conn, PROVISION_JOB_TYPE)
    conn.execute(SET_STATE, {"state": "running", "id": rollout.id})
    return Resumed(rollout, 0, len(released))


@dataclass(frozen=True)
class Aborted:
    rollout: Rollout
    dropped_jobs: int


def abort(conn: Conn, *, ended_by: str = "upgrade --abort") -> Aborted:
    """Drop what the active rollout has not started (each dropped run records ``ended_by``);
    running jobs finish. In the caller's transaction."""
    row = conn.execute(ACTIVE).fetchone()
    if row is None:
        raise InvalidInput("no rollout is in progress: nothing to abort")
    rollout = Rollout.from_row(row)
    dropped = queue.drop_queued(conn, rollout.id, list(STEPS))
    journal.record_runs_ended(conn, dropped, ended_by)
    count = len(dropped)
    conn.execute(DROP_PENDING, {"rollout": rollout.id})
    conn.execute(SET_STATE, {"state": "aborted", "id": rollout.id})
    return Aborted(rollout, count)


@dataclass(frozen=True)
class Failure:
    tenant_id: str
    status: str
    attempts: int
    error: str


@dataclass(frozen=True)
class Progress:
    """One frame of ``upgrade --watch``."""

    rollout: Rollout | None
    #: tenants of the rollout by phase: done, running, queued, held, failed, pending, dropped
    phases: dict[str, int]
    #: tenants finished per minute since the first finished, and the minutes left at that rate
    rate_per_minute: float | None
    eta_minutes: float | None
    failures: list[Failure]

    @property
    def finished(self) -> bool:
        return not any(self.phases.get(p) for p in ("running", "queued"))


def progress(conn: Conn, failures: int = 5) -> Progress:
    row = conn.execute(LATEST).fetchone()
    if row is None:
        return Progress(None, {}, None, None, [])
    rollout = Rollout.from_row(row)
    phases = queue.phases(conn, rollout.id)
    done = queue.finished_span(conn, rollout.id, rollout.created_at)
    rate = eta = None
    if done and done["done"] and done["last"] is not None:
        seconds = max((done["last"] - rollout.created_at).total_seconds(), 0.001)
        rate = done["done"] / seconds * 60
        left = phases.get("queued", 0) + phases.get("running", 0)
        eta = left / rate if rate else None
    latest = [
        Failure(str(r["tenant_id"]), r["status"], int(r["attempts"]), str(r["error_detail"]))
        for r in queue.latest_failures(conn, rollout.id, failures)
    ]
    return Progress(rollout, phases, rate, eta, latest)


def get(conn: Conn, rollout_id: int) -> Rollout:
    row = conn.execute(GET, {"id": rollout_id}).fetchone()
    if row is None:
        raise InvalidInput(f"no rollout {rollout_id}")
    return Rollout.from_row(row)


def wait_for_canary(conn: Conn, rollout: Rollout, poll_seconds: float = 0.5) -> dict[str, int]:
    """Block until no canary job is queued or running; the canary's jobs by status."""
    while True:
        counts = queue.canary_status(conn, rollout.id)
        if not counts.get("queued") and not counts.get("running"):
            return counts
        time.sleep(poll_seconds)


# The newest rollouts, newest first.
NEWEST = "SELECT * FROM control.rollouts ORDER BY id DESC LIMIT %(limit)s"


@dataclass(frozen=True)
class PastRollout:
    """One rollout and its tenants by phase, for the console's list."""

    rollout: Rollout
    phases: dict[str, int]
    updated_at: datetime


def latest(conn: Conn) -> Rollout | None:
    """The newest rollout, whatever its state."""
    row = conn.execute(LATEST).fetchone()
    return Rollout.from_row(row) if row else None


def history(conn: Conn, limit: int = 20) -> list[PastRollout]:
    """The newest ``limit`` rollouts, each with its tenants by phase (two statements)."""
    rows = conn.execute(NEWEST, {"limit": limit}).fetchall()
    phases = stats.rollout_phases(conn, [row["id"] for row in rows])
    return [
        PastRollout(Rollout.from_row(row), phases.get(row["id"], {}), row["updated_at"])
        for row in rows
    ]
