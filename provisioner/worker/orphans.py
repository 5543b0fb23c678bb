"""What the parent settles itself: jobs no engine process will finish.

A child settles its own jobs; the parent steps in only when the child could not (it died, or
the database was down when its step failed). :class:`Orphan` is such a job, :class:`DeadHolder`
a dead child whose claim may never have been reported. Both are settled by
:meth:`~provisioner.worker.database.DatabaseWork._settle_orphans` once the database answers.
"""

from __future__ import annotations

from dataclasses import dataclass
from uuid import UUID

from provisioner.models import Job


@dataclass(frozen=True)
class DeadHolder:
    """An engine process that died: a job it claimed but never reported (it died between the
    claim and the report) goes back to the queue untouched, without waiting for the lease."""

    holder: str
    #: the job it reported and did not end (settled as an :class:`Orphan`)
    reported: UUID | None


@dataclass
class Orphan:
    """A claimed job no child will finish: release it, or retry/fail it, once the DB answers."""

    job: Job
    reason: str
    release: bool = False
    permanent: bool = False
    #: the child died: close the attempt's open step runs first
    child_gone: bool = False
    #: the database cut the attempt short (a lost session): retried at once, no backoff
    cut: bool = False
