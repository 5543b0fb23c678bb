"""The hand-off from one job to the next: the transaction that completes a worker child's job
claims the holder's next job AND opens the journal row of that job's first step.

Without it the next job's first step commits its journal row on its own before its work (the
row must be durable before the work, so that a process killed mid-step leaves its trace for
recovery to mark abandoned): a round trip and a commit per job. Here the row is written by the
claiming statement itself (:data:`CLAIM_NEXT_OPENING`), so it commits with the claim, in the
commit that already had to happen.

Invariant: the next job's first journal row is committed if and only if its claim is (one
statement, one transaction), it names the step the job's run begins with (the first of its
kind's steps not in ``steps_completed``; the engine discards it when its run begins elsewhere,
e.g. a repaired step), and a claimed job handed back before its first step leaves no row
behind: the engine discards it with the hand-back, and a dead child's unreported claims are
handed back with theirs deleted (:data:`provisioner.queue.lease.RELEASE_UNREPORTED`). The queue
knows no kind: the steps of each kind come in as data (``first_steps``).

Pinned by ``tests/integration/test_queue.py::
test_the_last_steps_claim_opens_the_next_jobs_first_step`` and, with SIGKILL between the
commits, ``tests/crash/test_handoff_crash.py``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any
from uuid import UUID

from psycopg.types.json import Jsonb

from provisioner.queue.claim import CLAIMING, MORE_QUEUED, claim_params
from provisioner.queue.fence import CLAIM_FENCE

# CLAIM_NEXT, and the claimed job's first pending step opened in the journal (STEP_RUN_OPEN's
# row) by the same statement. ``first_steps``: {job type: its steps in order}; a job with no
# step left (or of a type not in it) opens nothing. ``started_at`` is the clock at the claim.
# Its caller runs it in a savepoint of its own, whose id is the run's fencing token (its commit,
# the last step's before it, waits for the disk: queue/fence.py).
CLAIM_NEXT_OPENING = f"""
WITH {CLAIMING}, opened AS (
    INSERT INTO control.job_step_runs (job_id, tenant_id, run, attempt, step, worker, started_at)
    SELECT c.id, c.tenant_id, c.run, c.attempts, first.step, c.locked_by, clock_timestamp()
      FROM claimed c CROSS JOIN LATERAL (
            SELECT s.step FROM jsonb_array_elements_text(%(first_steps)s -> c.job_type)
                               WITH ORDINALITY AS s(step, n)
             WHERE NOT c.steps_completed ? s.step
             ORDER BY s.n LIMIT 1) first
    RETURNING id, step
)
SELECT claimed.*, t.state AS tenant_state, t.server AS tenant_server, {MORE_QUEUED},
       opened.id AS first_run_id, opened.step AS first_run_step, {CLAIM_FENCE} AS fence_token
  FROM claimed LEFT JOIN control.tenants t ON t.tenant_id = claimed.tenant_id
  LEFT JOIN opened ON true
"""


@dataclass(frozen=True)
class OpenedRun:
    """A journal row opened ahead for a job's first step (by its claim)."""

    job_id: UUID
    run_id: int
    step: str


def claim_opening_params(
    job_types: Sequence[str], worker: str, first_steps: Mapping[str, Sequence[str]]
) -> dict[str, Any]:
    """:data:`CLAIM_NEXT_OPENING`'s parameters."""
    steps = {kind: list(first_steps[kind]) for kind in job_types if kind in first_steps}
    return {**claim_params(job_types, worker), "first_steps": Jsonb(steps)}


def opened_run(row: dict[str, Any] | None) -> OpenedRun | None:
    """The journal row the claim opened, from its row (None: no job, or no step to open)."""
    if row is None or row.get("first_run_id") is None:
        return None
    return OpenedRun(row["id"], int(row["first_run_id"]), str(row["first_run_step"]))
