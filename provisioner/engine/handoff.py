"""A worker child's engine going from one job to the next without a round trip of its own.

The last step's transaction of a job already completes it and claims the holder's next job
(:meth:`provisioner.engine.Engine.claim`). Two more things ride on that transaction:

* **the next job's first journal row** is opened by the claim
  (:mod:`provisioner.queue.handoff`), so the next job's first step has no row to commit on its
  own before its work;
* **its commit begins the next job's first transaction** (``COMMIT; BEGIN; <tenant lock>``:
  :meth:`provisioner.db.Transaction.begin_next_with`), and the steps' session stays checked out
  between the two jobs (:meth:`provisioner.engine.sessions.EngineSessions.job`), so the next
  job's first step finds its transaction open, with its tenant's lock held. Not for a job on a
  tenant server: its first transaction on control follows its step's commit on the server
  (:mod:`provisioner.engine.remote`), and one begun ahead would sit idle over that work until
  the session's idle timeout ended it (:func:`provisioner.engine.step_lock.next_lock`).

Invariant: nothing of the next job runs before its claim, its journal row and the last job's
success are durable together (the commit waits for the disk: ``queue.RECORD_LAST_STEP``); a
journal row opened for a step the run does not begin with (a repair, a stop request, a wrong
state, a hand-back) is discarded, never left open under a live holder; a transaction begun
ahead that nobody takes is rolled back. SIGKILL between the commits is pinned by
``tests/crash/test_handoff_crash.py``; the saved round trips by
``tests/integration/test_job_kinds.py::test_a_handed_off_job_begins_without_a_round_trip_of_its_own``;
a job on a tenant server begun by nothing by
``tests/integration/test_server_jobs.py::test_no_control_transaction_waits_over_a_server_step``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from provisioner import queue
from provisioner.kinds import KindRegistry, Step


@dataclass(frozen=True)
class HandOff:
    """The next job, claimed by the last one's commit, and its first step's journal row."""

    claim: queue.Claim
    opened: queue.OpenedRun | None

    @classmethod
    def of(cls, closed: queue.ClosedStep) -> HandOff | None:
        """What a last step's close claimed (None: nothing)."""
        return None if closed.claimed is None else cls(closed.claimed, closed.opened)


def first_steps(kinds: KindRegistry, job_types: Sequence[str]) -> Mapping[str, Sequence[str]]:
    """Each claimable kind's steps in order, for the claim to open the first one not done."""
    return {name: kinds[name].step_names for name in job_types if name in kinds}


def usable(opened: queue.OpenedRun | None, pending: Sequence[Step]) -> bool:
    """True when the row opened ahead is for the step the run begins with."""
    return opened is not None and bool(pending) and pending[0].name == opened.step
