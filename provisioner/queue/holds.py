"""The queue's side of a rollout: the jobs a rollout's brake holds, releases and drops, and the
rollout's tenants read through their jobs.

A halted rollout *holds* its queued jobs: a trigger of the control schema (control c008) sets
their ``available_at`` to :data:`HELD_UNTIL`, a time no claim reaches, in the transaction that
records the failure that tripped the brake. A held job is neither failed nor claimable; resume
puts ``available_at`` back to now, abort marks it succeeded with every step recorded (its
schema was never touched). The marker is written here and in that trigger only.
"""

from __future__ import annotations

from typing import Any
from uuid import UUID

from psycopg.types.json import Jsonb

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

# Abort: jobs not started go back to succeeded, with every step recorded (as before the
# rollout: the schema was never touched).
DROP_QUEUED = """
UPDATE control.platform_jobs j
   SET status = 'succeeded', steps_completed = %(steps)s, progress = 100, attempts = 0,
       available_at = now(), finished_at = now(), error_detail = NULL, updated_at = now()
  FROM control.rollout_tenants t
 WHERE t.rollout_id = %(rollout)s AND t.job_id = j.id AND j.status = 'queued'
RETURNING j.id
"""

# The watch: each tenant of the rollout with its job's state folded into one word.
PROGRESS = f"""
SELECT CASE
         WHEN t.state <> 'queued' THEN t.state
         WHEN j.status = 'queued' AND j.available_at = {HELD_UNTIL} THEN 'held'
         WHEN j.status = 'succeeded' THEN 'done'
         ELSE j.status
       END AS phase,
       count(*) AS n
  FROM control.rollout_tenants t JOIN control.platform_jobs j ON j.id = t.job_id
 WHERE t.rollout_id = %(rollout)s
 GROUP BY 1
"""

FINISHED_SPAN = """
SELECT count(*) AS done, min(j.finished_at) AS first, max(j.finished_at) AS last
  FROM control.rollout_tenants t JOIN control.platform_jobs j ON j.id = t.job_id
 WHERE t.rollout_id = %(rollout)s AND t.state = 'queued' AND j.status = 'succeeded'
   AND j.finished_at >= %(since)s
"""

LATEST_FAILURES = """
SELECT j.tenant_id, j.error_detail, j.status, j.attempts FROM control.rollout_tenants t
  JOIN control.platform_jobs j ON j.id = t.job_id
 WHERE t.rollout_id = %(rollout)s AND j.error_detail IS NOT NULL AND j.status <> 'succeeded'
 ORDER BY j.updated_at DESC LIMIT %(limit)s
"""


def _by_rollout(conn: Conn, statement: str, rollout_id: int, **params: Any) -> list[dict[str, Any]]:
    return fetch_all(conn, statement, {"rollout": rollout_id, **params})


def canary_status(conn: Conn, rollout_id: int) -> dict[str, int]:
    """The canary wave's jobs, counted by status."""
    return {r["status"]: int(r["n"]) for r in _by_rollout(conn, CANARY_STATUS, rollout_id)}


def release_held(conn: Conn, rollout_id: int) -> list[UUID]:
    """Make the rollout's held jobs claimable again; their ids."""
    return [r["id"] for r in _by_rollout(conn, RELEASE_HELD, rollout_id)]


def drop_queued(conn: Conn, rollout_id: int, steps: list[str]) -> list[UUID]:
    """Mark the rollout's jobs that have not started succeeded with ``steps`` recorded; their
    ids."""
    return [r["id"] for r in _by_rollout(conn, DROP_QUEUED, rollout_id, steps=Jsonb(steps))]


def phases(conn: Conn, rollout_id: int) -> dict[str, int]:
    """The rollout's tenants by phase (done, running, queued, held, failed, pending, dropped)."""
    return {r["phase"]: int(r["n"]) for r in _by_rollout(conn, PROGRESS, rollout_id)}


def finished_span(conn: Conn, rollout_id: int, since: Any) -> dict[str, Any] | None:
    """How many of the rollout's jobs finished since ``since``, and the first and last finish."""
    rows = _by_rollout(conn, FINISHED_SPAN, rollout_id, since=since)
    return rows[0] if rows else None


def latest_failures(conn: Conn, rollout_id: int, limit: int) -> list[dict[str, Any]]:
    """The rollout's most recent unsucceeded jobs that carry an error."""
    return _by_rollout(conn, LATEST_FAILURES, rollout_id, limit=limit)
