"""Values that cross module boundaries: tenant ids, job rows, the ``--json`` view."""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any
from uuid import UUID

from provisioner.naming import DEFAULT_RULE, TenantNaming
from provisioner.settings import tenant_naming

#: The default rule in words (a project may set its own: :mod:`provisioner.naming`).
TENANT_ID_RULE = DEFAULT_RULE


@dataclass(frozen=True)
class TenantId:
    """A validated tenant id; ``schema`` is the PostgreSQL schema it maps to.

    ``naming`` is the project's rule and pattern: by default the configured one
    (:func:`provisioner.settings.tenant_naming`), so every id built anywhere is held to the
    same rule and maps to its schema the same way."""

    value: str
    naming: TenantNaming = field(default_factory=tenant_naming, compare=False, repr=False)

    def __post_init__(self) -> None:
        self.naming.check(self.value)

    @property
    def schema(self) -> str:
        return self.naming.schema(self.value)

    def __str__(self) -> str:
        return self.value


class JobStatus(enum.StrEnum):
    QUEUED = "queued"
    RUNNING = "running"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    CANCELLED = "cancelled"

    @property
    def terminal(self) -> bool:
        return self in (JobStatus.SUCCEEDED, JobStatus.FAILED, JobStatus.CANCELLED)


@dataclass(frozen=True)
class Job:
    """One ``control.platform_jobs`` row."""

    id: UUID
    tenant_id: str | None
    job_type: str
    status: JobStatus
    progress: int
    steps_completed: list[str]
    error_detail: str | None
    attempts: int
    max_attempts: int
    payload: dict[str, Any] = field(default_factory=dict)
    #: the job's run: 1, then one more each time it is re-opened (attempts restart per run)
    run: int = 1
    idempotency_key: str | None = None
    available_at: datetime | None = None
    locked_at: datetime | None = None
    locked_by: str | None = None
    created_at: datetime | None = None
    updated_at: datetime | None = None
    finished_at: datetime | None = None

    @classmethod
    def from_row(cls, row: dict[str, Any]) -> Job:
        return cls(
            id=row["id"],
            tenant_id=row["tenant_id"],
            job_type=row["job_type"],
            status=JobStatus(row["status"]),
            progress=int(row["progress"]),
            steps_completed=list(row["steps_completed"] or []),
            error_detail=row["error_detail"],
            attempts=row["attempts"],
            max_attempts=row["max_attempts"],
            payload=dict(row.get("payload") or {}),
            run=int(row.get("run") or 1),
            idempotency_key=row.get("idempotency_key"),
            available_at=row.get("available_at"),
            locked_at=row.get("locked_at"),
            locked_by=row.get("locked_by"),
            created_at=row.get("created_at"),
            updated_at=row.get("updated_at"),
            finished_at=row.get("finished_at"),
        )

    @property
    def lease(self) -> Lease:
        if self.locked_by is None:
            raise LookupError(f"job {self.id} is not claimed")
        return Lease(job_id=self.id, locked_by=self.locked_by, attempts=self.attempts, run=self.run)

    def view(self) -> dict[str, Any]:
        """The one JSON shape of a job, printed by every ``--json`` (``provision``, ``status``,
        ``enqueue``, ``jobs list``): timestamps in ISO 8601 (``2026-07-28T09:15:02.123456+00:00``)
        or null. Commands may add keys of their own next to these; they never change these."""
        return {
            "tenant_id": self.tenant_id,
            "job_id": str(self.id),
            "job_type": self.job_type,
            "status": self.status.value,
            "progress": self.progress,
            "steps_completed": list(self.steps_completed),
            "run": self.run,
            "attempts": self.attempts,
            "max_attempts": self.max_attempts,
            "error_detail": self.error_detail,
            "locked_by": self.locked_by,
            "available_at": iso(self.available_at),
            "created_at": iso(self.created_at),
            "updated_at": iso(self.updated_at),
            "finished_at": iso(self.finished_at),
        }


def iso(value: datetime | None) -> str | None:
    """ISO 8601 with ``T``, or None."""
    return value.isoformat() if value is not None else None


@dataclass(frozen=True)
class Lease:
    """What fences every write to a running job: its id, holder and attempt number."""

    job_id: UUID
    locked_by: str
    attempts: int
    #: which run of the job the attempt belongs to (for the step history; not part of the fence)
    run: int = 1
