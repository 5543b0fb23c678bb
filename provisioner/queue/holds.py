"""The queue's side of a rollout: the jobs a rollout's brake holds, releases and drops, and the
rollout's tenants read through their jobs.

A halted (or paused) rollout *holds* its queued jobs: a trigger of the control schema
(control c008) sets their ``available_at`` to :data:`HELD_UNTIL`, a time no claim reaches, in
the transaction that records the failure that tripped the brake; a pause
(:func:`hold_queued`) does the same by hand. A held job is neither failed nor claimable;
resume puts ``available_at`` back to now, abort marks it succeeded with every step recorded
(its schema was never touched). The marker is written here and in that trigger only. A job
of a paused rollout queued again (by a worker, or retried by hand from failed or cancelled)
is held by the trigger ``control.rollout_hold_requeued`` (revisions ``20261202_h28rest`` and
``20261202_hgaps``), so every statement that queues a job obeys the pause without knowing
it. A tenant that leaves the fleet while its upgrade waits is taken out of its rollouts at
once (:func:`skip_departed_tenant`).
"""

from __future__ import annotations

from typing import Any
from uuid import UUID

from psycopg.types.json import Jsonb

from provisioner.queue import journal
from provisioner.queue.rows import Conn, fetch_all

#: The ``available_at`` of a held job (the trigger's literal, in SQL).
HELD_UNTIL = "'9999-01-01 00:00:00+00'"

# The canary's jobs by status.
CANARY_STATUS = """
SELECT j.status, count(*) AS n FROM control.rollout_tenants t
  JOIN control.platform_jobs j ON j.id = t.job_id
 WHERE t.rollout_id = %(rollout)s AND t.wave = 'canary' GROUP BY j.status
"""

# Release the jobs the brake held.
RELEASE_HELD = f"""
UPDATE control.platform_jobs j SET available_at = now(), updated_at = now()
  FROM control.rollout_tenants t
 WHERE t.rollout_id = %(rollout)s AND t.job_id = j.id AND j.status = 'queued'
   AND j.available_at = {HELD_UNTIL}
RETURNING j.id
"""

# Pause: hold the rollout's queued jobs as the brake does (a retry waiting out its backoff
# too: resume makes it claimable at once); its running jobs go on.
HOLD_QUEUED = f"""
UPDATE control.platform_jobs j SET available_at = {HELD_UNTIL}, updated_at = now()
  FROM control.rollout_tenants t
 WHERE t.rollout_id = %(rollout)s AND t.job_id = j.id AND t.state = 'queued'
   AND j.status = 'queued'
RETURNING j.id
"""

# How many of the rollout's jobs a worker runs now.
RUNNING_COUNT = """
SELECT count(*) AS n FROM control.rollout_tenants t
  JOIN control.platform_jobs j ON j.id = t.job_id
 WHERE t.rollout_id = %(rollout)s AND t.state = 'queued' AND j.status = 'running'
"""

# Abort (or a tenant that left the fleet): jobs not started go back to succeeded, with every
# step recorded (as before the rollout: the schema was never touched); all of the rollout's, or
# the named ones.
DROP_QUEUED = """
UPDATE control.platform_jobs j
   SET status = 'succeeded', steps_completed = %(steps)s, progress = 100, attempts = 0,
       available_at = now(), finished_at = now(), error_detail = NULL, updated_at = now()
  FROM control.rollout_tenants t
 WHERE t.rollout_id = %(rollout)s AND t.job_id = j.id AND j.status = 'queued'
   AND (%(jobs)s::uuid[] IS NULL OR j.id = ANY(%(jobs)s))
RETURNING j.id
"""

# The rollout's tenants not started yet (pending, or queued and held by the brake) whose
# lifecycle state is one of ``states``: they left the fleet while the rollout waited.
DEPARTED = f"""
SELECT t.tenant_id, t.job_id, t.state AS rollout_state, c.state AS tenant_state
  FROM control.rollout_tenants t
  JOIN control.platform_jobs j ON j.id = t.job_id
  JOIN control.tenants c ON c.tenant_id = t.tenant_id
 WHERE t.rollout_id = %(rollout)s AND c.state = ANY(%(states)s)
   AND (t.state = 'pending'
        OR (t.state = 'queued' AND j.status = 'queued' AND j.available_at = {HELD_UNTIL}))
 ORDER BY t.tenant_id
"""

# A tenant that left the fleet (suspended, archived, purged): its rows in rollouts that have
# not ended whose upgrade has not started (pending, or its job queued, held or not). The job
# rows are locked: a claim racing this (SKIP LOCKED) passes them by, and one that took a job
# first leaves it running, which this statement then no longer returns.
TENANT_NOT_STARTED = """
SELECT t.rollout_id, t.job_id, t.state AS rollout_state
  FROM control.rollout_tenants t
  JOIN control.rollouts r ON r.id = t.rollout_id
  JOIN control.platform_jobs j ON j.id = t.job_id
 WHERE t.tenant_id = %(tenant)s AND r.state NOT IN ('completed', 'aborted')
   AND (t.state = 'pending' OR (t.state = 'queued' AND j.status = 'queued'))
 ORDER BY t.rollout_id
   FOR UPDATE OF j
"""

# Those rows skipped: the tenant is neither upgraded nor counted as a failure.
SKIP_TENANT = """
UPDATE control.rollout_tenants SET state = 'skipped'
 WHERE tenant_id = %(tenant)s AND rollout_id = ANY(%(rollouts)s) AND state IN ('pending', 'queued')
"""

# A rollout tenant's row (t) and its job's (j) folded into one word: the watch's phase.
PHASE = f"""CASE
         WHEN t.state <> 'queued' THEN t.state
         WHEN j.status = 'queued' AND j.available_at = {HELD_UNTIL} THEN 'held'
         WHEN j.status = 'succeeded' THEN 'done'
         ELSE j.status
       END AS phase"""

# The watch: each tenant of the rollout with its job's state folded into one word.
PROGRESS = f"""
SELECT {PHASE},
       count(*) AS n
  FROM control.rollout_tenants t JOIN control.platform_jobs j ON j.id = t.job_id
 WHERE t.rollout_id = %(rollout)s
 GROUP BY 1
"""

# PROGRESS by the server each tenant lives on (control: the control database), for a rollout
# whose tenants are spread over tenant servers.
PROGRESS_BY_SERVER = f"""
SELECT coalesce(s.server, 'control') AS server,
       {PHASE},
       count(*) AS n
  FROM control.rollout_tenants t JOIN control.platform_jobs j ON j.id = t.job_id
  LEFT JOIN control.tenants s ON s.tenant_id = j.tenant_id
 WHERE t.rollout_id = %(rollout)s
 GROUP BY 1, 2
"""

FINISHED_SPAN = """
SELECT count(*) AS done, min(j.finished_at) AS first, max(j.finished_at) AS last
  FROM control.rollout_tenants t JOIN control.platform_jobs j ON j.id = t.job_id
 WHERE t.rollout_id = %(rollout)s AND t.state = 'queued' AND j.status = 'succeeded'
   AND j.finished_at >= %(since)s
"""

# The rollout's tenants that failed, or carry the error of an earlier attempt (queued for a
# retry, running again, or held by the brake since), each with its phase as PROGRESS names it:
# failed ones first, then the most recently changed.
FAILURES = f"""
SELECT j.tenant_id, j.error_detail, j.attempts,
       CASE
         WHEN j.status = 'queued' AND j.available_at = {HELD_UNTIL} THEN 'held'
         ELSE j.status
       END AS phase
  FROM control.rollout_tenants t JOIN control.platform_jobs j ON j.id = t.job_id
 WHERE t.rollout_id = %(rollout)s AND t.state = 'queued'
   AND (j.status = 'failed' OR (j.status IN ('queued', 'running') AND j.error_detail IS NOT NULL))
 ORDER BY (j.status = 'failed') DESC, j.updated_at DESC, j.tenant_id
 LIMIT %(limit)s
"""

# The tenants the rollout upgraded, by the revision each started from.
UPGRADED_BY_REVISION = """
SELECT coalesce(t.from_revision, '(unknown)') AS revision, count(*) AS n
  FROM control.rollout_tenants t JOIN control.platform_jobs j ON j.id = t.job_id
 WHERE t.rollout_id = %(rollout)s AND t.state = 'queued' AND j.status = 'succeeded'
 GROUP BY 1 ORDER BY 1
"""


def _by_rollout(conn: Conn, statement: str, rollout_id: int, **params: Any) -> list[dict[str, Any]]:
    return fetch_all(conn, statement, {"rollout": rollout_id, **params})


def canary_status(conn: Conn, rollout_id: int) -> dict[str, int]:
    """The canary wave's jobs, counted by status."""
    return {r["status"]: int(r["n"]) for r in _by_rollout(conn, CANARY_STATUS, rollout_id)}


def release_held(conn: Conn, rollout_id: int) -> list[UUID]:
    """Make the rollout's held jobs claimable again; their ids."""
    return [r["id"] for r in _by_rollout(conn, RELEASE_HELD, rollout_id)]


def hold_queued(conn: Conn, rollout_id: int) -> tuple[int, int]:
    """Hold the rollout's queued jobs (a pause); how many were held, and how many are running
    (they finish)."""
    held = len(_by_rollout(conn, HOLD_QUEUED, rollout_id))
    return held, int(_by_rollout(conn, RUNNING_COUNT, rollout_id)[0]["n"])


def drop_queued(
    conn: Conn, rollout_id: int, steps: list[str], jobs: list[UUID] | None = None
) -> list[UUID]:
    """Mark the rollout's jobs that have not started (all, or those of ``jobs``) succeeded with
    ``steps`` recorded; their ids."""
    params = {"steps": Jsonb(steps), "jobs": jobs}
    return [r["id"] for r in _by_rollout(conn, DROP_QUEUED, rollout_id, **params)]


def departed(conn: Conn, rollout_id: int, states: list[str]) -> list[dict[str, Any]]:
    """The rollout's tenants not started yet (pending or held) now in one of ``states``:
    ``tenant_id``, ``job_id``, ``rollout_state`` (pending or queued), ``tenant_state``."""
    return _by_rollout(conn, DEPARTED, rollout_id, states=states)


def skip_departed_tenant(conn: Conn, tenant_id: str, steps: list[str], ended_by: str) -> list[int]:
    """Take a tenant that has just left the fleet out of every rollout that has not ended, in
    the transaction that changes its state: a queued (or held) upgrade job goes back to
    succeeded with ``steps`` recorded (its schema was never touched; its run records
    ``ended_by``), and its rollout rows say ``skipped``. Its job can then never fail on the
    tenant's state and trip a brake. The rollouts concerned, by id."""
    rows = fetch_all(conn, TENANT_NOT_STARTED, {"tenant": tenant_id})
    if not rows:
        return []
    rollouts = sorted({int(r["rollout_id"]) for r in rows})
    for rollout_id in rollouts:
        queued = [
            r["job_id"]
            for r in rows
            if r["rollout_id"] == rollout_id and r["rollout_state"] == "queued"
        ]
        if queued:
            journal.record_runs_ended(conn, drop_queued(conn, rollout_id, steps, queued), ended_by)
    with conn.cursor() as cur:
        cur.execute(SKIP_TENANT, {"tenant": tenant_id, "rollouts": rollouts})
    return rollouts


def phases(conn: Conn, rollout_id: int) -> dict[str, int]:
    """The rollout's tenants by phase (done, running, queued, held, failed, pending, dropped)."""
    return {r["phase"]: int(r["n"]) for r in _by_rollout(conn, PROGRESS, rollout_id)}


def phases_by_server(conn: Conn, rollout_id: int) -> dict[str, dict[str, int]]:
    """:func:`phases` per server (``control``: the control database)."""
    out: dict[str, dict[str, int]] = {}
    for r in _by_rollout(conn, PROGRESS_BY_SERVER, rollout_id):
        out.setdefault(str(r["server"]), {})[r["phase"]] = int(r["n"])
    return out


def finished_span(conn: Conn, rollout_id: int, since: Any) -> dict[str, Any] | None:
    """How many of the rollout's jobs finished since ``since``, and the first and last finish."""
    rows = _by_rollout(conn, FINISHED_SPAN, rollout_id, since=since)
    return rows[0] if rows else None


def failures(conn: Conn, rollout_id: int, limit: int) -> list[dict[str, Any]]:
    """The rollout's failed tenants, and those carrying an earlier attempt's error, with their
    phase (failed, held, queued, running); failed ones first."""
    return _by_rollout(conn, FAILURES, rollout_id, limit=limit)


def upgraded_by_revision(conn: Conn, rollout_id: int) -> dict[str, int]:
    """How many of the rollout's tenants it upgraded, by the revision each started from."""
    rows = _by_rollout(conn, UPGRADED_BY_REVISION, rollout_id)
    return {r["revision"]: int(r["n"]) for r in rows}
