"""Safe rollouts of a fleet upgrade: a canary wave, a failure brake, resume and abort, the
numbers behind ``upgrade --watch`` and the summary a rollout ends with.

Every ``provisioner upgrade`` that queues tenants records a rollout (``control.rollouts``) and
its tenants (``control.rollout_tenants``, each with the revision it started from). A rollout
is in one of six states (:class:`RolloutState`):

    canary  --resume-->  running  --(its last job settles)-->  completed
                          |  ^  ^
         (K-th failure)   |  |  | resume
                          |  |  paused  <--pause-- running
                          v  | resume        (K-th failure while paused: halted)
                          halted
    canary, running, paused or halted  --abort-->  aborted

With ``canary=N`` only the first N tenants' jobs are queued and the rollout waits in
``canary`` for review; ``resume`` queues the rest once every canary job has succeeded. With
``max_failures=K``, the K-th failed job halts the rollout: a trigger in the control schema holds
its queued jobs (:mod:`provisioner.queue.holds`: never claimed, not failed) in the transaction
that records the failure, whichever process wrote it. Another trigger completes a running
rollout in the transaction that settles its last queued or running job (control revision
``20261202_h28_rollouts``). ``resume`` releases held jobs; ``abort`` drops what has not
started: held and queued jobs go back to succeeded (their schema was never touched, it is
still at its old head) and pending tenants are dropped. A failed tenant stays at its old head,
usable, and ``status`` shows its error.

``pause`` holds a running rollout's queued jobs as the brake does (its running jobs finish,
nothing new starts) and records who paused it and when; ``resume`` releases them.

A tenant suspended, archived or purged while its upgrade is queued leaves the rollout in the
transaction that changes its state (:func:`provisioner.queue.skip_departed_tenant`): it is
skipped, never failed, and cannot trip the brake. A tenant suspended, archived or purged while
the rollout waited (for review, or halted) has
left the fleet: ``resume`` skips it (its job is neither re-opened nor released, so it cannot
fail and trip the brake) and reports it as skipped.

Rollout writes go through the owner URL (the application role only reads these tables).
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime
from enum import StrEnum
from typing import Any
from uuid import UUID

import psycopg

from provisioner import queue
from provisioner.errors import InvalidInput
from provisioner.kinds.provision import MIGRATION_STEP, PROVISION_JOB_TYPE, STEPS
from provisioner.models import Job
from provisioner.queue import journal, stats
from provisioner.templates import upgrade as upgrade_replay
from provisioner.tenant.state import INACTIVE

# The newest rollout that still needs an operator or a worker.
ACTIVE = """
SELECT * FROM control.rollouts WHERE state IN ('canary', 'running', 'paused', 'halted')
 ORDER BY id DESC LIMIT 1 FOR UPDATE
"""

# The newest rollout that waits for the operator: for review, paused, or halted by the brake.
WAITING = """
SELECT * FROM control.rollouts WHERE state IN ('canary', 'paused', 'halted')
 ORDER BY id DESC LIMIT 1 FOR UPDATE
"""

# One rollout, locked for a lever.
LOCK = "SELECT * FROM control.rollouts WHERE id = %(id)s FOR UPDATE"

PAUSE = """
UPDATE control.rollouts SET state = 'paused', paused_at = now(), paused_by = %(by)s,
       updated_at = now()
 WHERE id = %(id)s
RETURNING *
"""

LATEST = "SELECT * FROM control.rollouts ORDER BY id DESC LIMIT 1"

GET = "SELECT * FROM control.rollouts WHERE id = %(id)s"

CREATE = """
INSERT INTO control.rollouts (head, canary, max_failures, state)
VALUES (%(head)s, %(canary)s, %(max_failures)s, %(state)s)
RETURNING *
"""

ADD_TENANTS = """
INSERT INTO control.rollout_tenants (rollout_id, tenant_id, job_id, wave, state, from_revision)
SELECT %(rollout)s, t, j, %(wave)s, %(state)s, r
  FROM unnest(%(tenants)s::text[], %(jobs)s::uuid[], %(revisions)s::text[]) AS u(t, j, r)
"""

PENDING_JOBS = """
SELECT job_id FROM control.rollout_tenants WHERE rollout_id = %(rollout)s AND state = 'pending'
"""

MARK_QUEUED = """
UPDATE control.rollout_tenants SET state = 'queued'
 WHERE rollout_id = %(rollout)s AND job_id = ANY(%(jobs)s)
"""

# Tenants that left the fleet before their job was queued or released.
MARK_SKIPPED = """
UPDATE control.rollout_tenants SET state = 'skipped'
 WHERE rollout_id = %(rollout)s AND tenant_id = ANY(%(tenants)s)
"""

DROP_PENDING = """
UPDATE control.rollout_tenants SET state = 'dropped'
 WHERE rollout_id = %(rollout)s AND state = 'pending'
"""

# Tenants of a wave whose job could not be re-opened (no longer succeeded): nothing to do.
DROP_NOT_QUEUED = """
UPDATE control.rollout_tenants SET state = 'dropped'
 WHERE rollout_id = %(rollout)s AND state = 'pending' AND job_id = ANY(%(jobs)s)
"""

NOW = "SELECT now() AS now"

# A lever's new state; a pause's record goes with it (it said who paused, and when).
SET_STATE = """
UPDATE control.rollouts SET state = %(state)s, paused_at = NULL, paused_by = NULL,
       updated_at = now()
 WHERE id = %(id)s
"""

ABORT = """
UPDATE control.rollouts SET state = 'aborted', finished_at = now(), paused_at = NULL,
       paused_by = NULL, updated_at = now()
 WHERE id = %(id)s
"""

# Complete a running rollout none of whose jobs is queued or running (control revision
# 20261202_h28_rollouts; its trigger runs the same check when a job settles); the state after.
SETTLE = "SELECT control.rollout_settle(%(id)s) AS state"

Conn = psycopg.Connection[dict[str, Any]]


class RolloutState(StrEnum):
    """``control.rollouts.state``."""

    CANARY = "canary"
    RUNNING = "running"
    PAUSED = "paused"
    HALTED = "halted"
    COMPLETED = "completed"
    ABORTED = "aborted"


#: States a rollout ends in (``halted`` stops it too, but ``--resume`` continues it).
ENDED: tuple[RolloutState, ...] = (RolloutState.COMPLETED, RolloutState.ABORTED)


@dataclass(frozen=True)
class Rollout:
    id: int
    head: str
    state: RolloutState
    canary: int | None
    max_failures: int | None
    created_at: datetime
    finished_at: datetime | None = None
    #: who paused it and when, while it is paused
    paused_by: str | None = None
    paused_at: datetime | None = None

    @classmethod
    def from_row(cls, row: dict[str, Any]) -> Rollout:
        return cls(
            row["id"],
            row["head"],
            RolloutState(row["state"]),
            row["canary"],
            row["max_failures"],
            row["created_at"],
            row.get("finished_at"),
            row.get("paused_by"),
            row.get("paused_at"),
        )

    @property
    def state_label(self) -> str:
        """The state as reports show it: a pause says who and when."""
        if self.state is RolloutState.PAUSED and self.paused_at is not None:
            when = self.paused_at.strftime("%Y-%m-%d %H:%M:%S %Z").strip()
            return f"paused by {self.paused_by or '?'} at {when}"
        return self.state.value


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
    behind: Sequence[tuple[Job, str]],
    *,
    canary: int | None = None,
    max_failures: int | None = None,
) -> tuple[Rollout, list[Job]]:
    """Record a rollout of ``behind`` (each job with the revision its tenant is at) and queue
    its first wave (all, or the canary); in the caller's transaction. Refused while another
    rollout waits for review or is halted; a rollout still running goes on beside it."""
    waiting = conn.execute(WAITING).fetchone()
    if waiting is not None:
        raise InvalidInput(
            f"rollout {waiting['id']} is {waiting['state']}: "
            "`provisioner upgrade --resume` or `--abort` it first"
        )
    waves = canary is not None and canary < len(behind)
    state = RolloutState.CANARY if waves else RolloutState.RUNNING
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
                    "tenants": [str(j.tenant_id) for j, _ in jobs],
                    "jobs": [j.id for j, _ in jobs],
                    "revisions": [revision for _, revision in jobs],
                },
            )
    first_jobs = [j.id for j, _ in first]
    queued = _reopen(conn, rollout, first_jobs)
    if len(queued) < len(first_jobs):  # a job that changed meanwhile is no longer behind
        conn.execute(DROP_NOT_QUEUED, {"rollout": rollout.id, "jobs": first_jobs})
        _settle(conn, rollout)
    return rollout, queued


@dataclass(frozen=True)
class Departed:
    """A tenant of the rollout that left the fleet (suspended, archived, purged) before its
    job was queued or released: skipped, not upgraded."""

    tenant_id: str
    state: str


@dataclass(frozen=True)
class Resumed:
    rollout: Rollout
    #: jobs queued now (the rest after a canary), or released (held by the brake)
    queued: int
    released: int
    #: tenants skipped because they left the fleet while the rollout waited
    skipped: list[Departed] = field(default_factory=list)
    #: the rollout's state afterwards (completed when nothing was left to run)
    state: RolloutState = RolloutState.RUNNING


def _skip_departed(conn: Conn, rollout: Rollout) -> list[Departed]:
    """Take the tenants that left the fleet out of what a resume queues or releases: a held
    job goes back to succeeded (its schema was never touched), a pending one stays as it is;
    both are marked skipped."""
    rows = queue.departed(conn, rollout.id, [s.value for s in INACTIVE])
    held = [r["job_id"] for r in rows if r["rollout_state"] == "queued"]
    if held:
        queue.drop_queued(conn, rollout.id, list(STEPS), held)
    if rows:
        names = [r["tenant_id"] for r in rows]
        conn.execute(MARK_SKIPPED, {"rollout": rollout.id, "tenants": names})
    return [Departed(str(r["tenant_id"]), str(r["tenant_state"])) for r in rows]


def _settle(conn: Conn, rollout: Rollout) -> RolloutState:
    row = conn.execute(SETTLE, {"id": rollout.id}).fetchone()
    assert row is not None
    return RolloutState(row["state"])


#: States a rollout waits for the operator in: ``resume`` continues it.
WAITS: tuple[RolloutState, ...] = (RolloutState.CANARY, RolloutState.PAUSED, RolloutState.HALTED)


def _locked(conn: Conn, rollout_id: int) -> Rollout:
    row = conn.execute(LOCK, {"id": rollout_id}).fetchone()
    if row is None:
        raise InvalidInput(f"no rollout {rollout_id}")
    return Rollout.from_row(row)


def _waiting(conn: Conn, rollout_id: int | None) -> Rollout:
    """The rollout to resume: the one named, or the newest that waits."""
    if rollout_id is None:
        row = conn.execute(WAITING).fetchone()
        if row is None:
            raise InvalidInput(
                "no rollout waits for review, is paused or is halted: nothing to resume"
            )
        return Rollout.from_row(row)
    rollout = _locked(conn, rollout_id)
    if rollout.state not in WAITS:
        raise InvalidInput(f"rollout {rollout.id} is {rollout.state}: nothing to resume")
    return rollout


def resume(conn: Conn, *, rollout_id: int | None = None, started_by: str = "upgrade") -> Resumed:
    """Continue the rollout that waits (``rollout_id``, or the newest): after a successful
    canary, queue the rest (their runs record ``started_by``); after a pause or a halt,
    release the held jobs. Tenants that left the fleet meanwhile are skipped. In the caller's
    transaction."""
    rollout = _waiting(conn, rollout_id)
    if rollout.state is RolloutState.CANARY:
        counts = queue.canary_status(conn, rollout.id)
        unfinished = sum(n for status, n in counts.items() if status != "succeeded")
        if unfinished:
            raise InvalidInput(
                f"rollout {rollout.id}: {unfinished} canary tenant(s) have not succeeded "
                f"({', '.join(f'{n} {s}' for s, n in sorted(counts.items()))}); wait, fix and "
                "`jobs retry --failed`, or `upgrade --abort`"
            )
        skipped = _skip_departed(conn, rollout)
        pending = [r["job_id"] for r in conn.execute(PENDING_JOBS, {"rollout": rollout.id})]
        queued = _reopen(conn, rollout, pending, started_by)
        conn.execute(DROP_PENDING, {"rollout": rollout.id})  # no longer behind: nothing to do
        conn.execute(SET_STATE, {"state": RolloutState.RUNNING, "id": rollout.id})
        return Resumed(rollout, len(queued), 0, skipped, _settle(conn, rollout))
    skipped = _skip_departed(conn, rollout)
    released = queue.release_held(conn, rollout.id)
    if released:  # wake the idle workers once the release commits
        queue.notify(conn, PROVISION_JOB_TYPE)
    conn.execute(SET_STATE, {"state": RolloutState.RUNNING, "id": rollout.id})
    return Resumed(rollout, 0, len(released), skipped, _settle(conn, rollout))


@dataclass(frozen=True)
class Paused:
    rollout: Rollout
    #: queued jobs now held (never claimed until resume)
    held: int
    #: jobs a worker runs now: they finish
    running: int


#: Why a rollout in each state other than running cannot be paused.
NOT_PAUSABLE = {
    RolloutState.CANARY: "its canary waits for review, nothing more starts until "
    "`provisioner upgrade --resume`",
    RolloutState.PAUSED: "it is already paused",
    RolloutState.HALTED: "its brake already holds it: fix, then `provisioner upgrade --resume` "
    "(or `--abort`)",
    RolloutState.COMPLETED: "it has ended",
    RolloutState.ABORTED: "it has ended",
}


def pause(conn: Conn, rollout_id: int, *, paused_by: str) -> Paused:
    """Pause a running rollout: hold its queued jobs (its running ones finish; a job of it
    queued again later, for a retry, is held too: control revision ``20261202_h28rest``) and
    record who paused it and when. InvalidInput for a rollout in any other state. In the
    caller's transaction."""
    rollout = _locked(conn, rollout_id)
    if rollout.state is not RolloutState.RUNNING:
        why = NOT_PAUSABLE[rollout.state]
        label = rollout.state_label
        raise InvalidInput(f"rollout {rollout.id} is {label}: {why}; nothing to pause")
    held, running = queue.hold_queued(conn, rollout.id)
    row = conn.execute(PAUSE, {"id": rollout.id, "by": paused_by}).fetchone()
    assert row is not None
    return Paused(Rollout.from_row(row), held, running)


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
    conn.execute(ABORT, {"id": rollout.id})
    return Aborted(rollout, count)


@dataclass(frozen=True)
class Failure:
    """A tenant of the rollout that failed, or carries an earlier attempt's error."""

    tenant_id: str
    #: failed (attempts spent), held (by the brake), queued (for a retry), running (again)
    phase: str
    attempts: int
    error: str


@dataclass(frozen=True)
class Summary:
    """What a rollout did, so far or in the end."""

    upgraded: int
    failed: int
    #: tenants that left the fleet before their job was queued or released
    skipped: int
    #: tenants not started when the rollout was aborted (or no longer behind on resume)
    dropped: int
    held: int
    #: tenants upgraded, by the revision each started from
    upgraded_from: dict[str, int]
    #: from the rollout's start to its end (or to now while it goes on)
    seconds: float
    #: tenants upgraded per minute over ``seconds``
    rate_per_minute: float | None


#: Phases a rollout's tenants are counted in, in the order reports list them.
PHASES = ("done", "running", "queued", "held", "failed", "pending", "skipped", "dropped")


@dataclass(frozen=True)
class Progress:
    """One frame of ``upgrade --watch``."""

    rollout: Rollout | None
    #: tenants of the rollout by phase (:data:`PHASES`)
    phases: dict[str, int]
    #: tenants finished per minute since the rollout started, and the minutes left at that rate
    rate_per_minute: float | None
    eta_minutes: float | None
    #: every failed tenant (up to the limit asked), then those retrying or held after an error
    failures: list[Failure]
    summary: Summary | None = None
    #: the phases per server, when a tenant of the rollout lives on a tenant server
    servers: dict[str, dict[str, int]] = field(default_factory=dict)

    @property
    def finished(self) -> bool:
        """The rollout has ended: completed or aborted."""
        return self.rollout is not None and self.rollout.state in ENDED

    @property
    def stopped(self) -> bool:
        """Nothing more happens without the operator: the rollout ended, halted or was paused
        (and its running jobs finished), or its canary has finished and waits for review."""
        if self.rollout is None or self.finished:
            return True
        state, running = self.rollout.state, self.phases.get("running", 0)
        if state is RolloutState.HALTED:
            return not running  # the jobs already running finish first
        if state is RolloutState.PAUSED:
            return not running  # paused: what runs finishes, nothing starts
        return state is RolloutState.CANARY and not running and not self.phases.get("queued")

    @property
    def clean(self) -> bool:
        """No tenant failed and the rollout was neither halted, paused nor aborted."""
        return not self.phases.get("failed") and (
            self.rollout is None
            or self.rollout.state
            not in (RolloutState.HALTED, RolloutState.PAUSED, RolloutState.ABORTED)
        )


def progress(conn: Conn, failures: int = 100) -> Progress:
    """The latest rollout's numbers: phases, rate, ETA, its failures (at most ``failures``)
    and its summary."""
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
    listed = [
        Failure(str(r["tenant_id"]), str(r["phase"]), int(r["attempts"]), str(r["error_detail"]))
        for r in queue.failures(conn, rollout.id, failures)
    ]
    per_server = queue.phases_by_server(conn, rollout.id)
    spread = per_server if set(per_server) - {"control"} else {}
    return Progress(rollout, phases, rate, eta, listed, _summary(conn, rollout, phases), spread)


def _summary(conn: Conn, rollout: Rollout, phases: dict[str, int]) -> Summary:
    end = rollout.finished_at
    if end is None:
        now = conn.execute(NOW).fetchone()
        assert now is not None
        end = now["now"]
    seconds = max((end - rollout.created_at).total_seconds(), 0.0)
    upgraded = phases.get("done", 0)
    return Summary(
        upgraded=upgraded,
        failed=phases.get("failed", 0),
        skipped=phases.get("skipped", 0),
        dropped=phases.get("dropped", 0),
        held=phases.get("held", 0),
        upgraded_from=queue.upgraded_by_revision(conn, rollout.id),
        seconds=seconds,
        rate_per_minute=upgraded / seconds * 60 if seconds > 0 and upgraded else None,
    )


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
