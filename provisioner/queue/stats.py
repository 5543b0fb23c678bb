"""The queue in figures, for the worker's metrics and the console: how many jobs of each kind
are in each status, and how long the oldest ready job has waited. One statement, one scan of
``control.platform_jobs``, however many kinds there are.
"""

from __future__ import annotations

from dataclasses import dataclass

from provisioner.models import JobStatus
from provisioner.queue.holds import PHASE
from provisioner.queue.rows import Conn, fetch_all

# Jobs by kind and status, and per kind the wait of the oldest job a worker could claim now
# (queued and available: not held by a rollout's brake, not waiting out a retry's backoff).
QUEUE_FIGURES = """
SELECT job_type, status, count(*) AS jobs,
       extract(epoch FROM now() - min(available_at)
                FILTER (WHERE status = 'queued' AND available_at <= now()))::float
           AS oldest_ready_seconds
  FROM control.platform_jobs
 GROUP BY job_type, status
 ORDER BY job_type, status
"""


@dataclass(frozen=True)
class QueueFigure:
    """How many jobs of one kind are in one status."""

    job_type: str
    status: JobStatus
    jobs: int
    #: queued only: seconds the oldest claimable job has waited (None: none is claimable)
    oldest_ready_seconds: float | None


def figures(conn: Conn) -> list[QueueFigure]:
    """The queue's figures, by kind and status (a status with no job is absent)."""
    return [
        QueueFigure(
            job_type=row["job_type"],
            status=JobStatus(row["status"]),
            jobs=int(row["jobs"]),
            oldest_ready_seconds=row["oldest_ready_seconds"],
        )
        for row in fetch_all(conn, QUEUE_FIGURES, {})
    ]


# The tenants of each of these rollouts by phase, folded as the watch folds them
# (:data:`provisioner.queue.holds.PROGRESS`).
ROLLOUT_PHASES = f"""
SELECT t.rollout_id,
       {PHASE},
       count(*) AS n
  FROM control.rollout_tenants t JOIN control.platform_jobs j ON j.id = t.job_id
 WHERE t.rollout_id = ANY(%(rollouts)s)
 GROUP BY 1, 2
"""


def rollout_phases(conn: Conn, rollout_ids: list[int]) -> dict[int, dict[str, int]]:
    """Each rollout's tenants by phase (done, running, queued, held, failed, pending,
    dropped), in one statement."""
    found: dict[int, dict[str, int]] = {}
    for row in fetch_all(conn, ROLLOUT_PHASES, {"rollouts": rollout_ids}):
        found.setdefault(row["rollout_id"], {})[row["phase"]] = int(row["n"])
    return found
