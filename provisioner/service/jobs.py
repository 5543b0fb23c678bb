"""The operator's levers on the queue: list jobs, retry or cancel one, retry every failed one,
prune the history (control's and each tenant server's journal)."""

from __future__ import annotations

from collections.abc import Callable
from contextlib import closing
from dataclasses import dataclass
from typing import Any
from uuid import UUID

import psycopg

from provisioner import db, kinds, queue, servers
from provisioner.control.schema import app_connection, writer_connection
from provisioner.errors import ConfigurationError, InvalidInput
from provisioner.models import Job, JobStatus, TenantId
from provisioner.queue import journal
from provisioner.settings import Settings


def retry_failed(settings: Settings, kind: str | None = None) -> list[Job]:
    """Queue every failed job (of job type ``kind``, or all) again, as the owner; a ``kind``
    this build does not know is InvalidInput (the registry's, with the settings' kind modules).
    """
    if kind is not None:
        kinds.for_settings(settings).check([kind])
    conn = db.connect(settings.owner_url, application_name="retry")
    with closing(conn), db.translated():
        jobs = queue.retry_failed(conn, kind)
        conn.commit()
    return jobs


@dataclass(frozen=True)
class HistoryPruned:
    """What ``jobs prune`` deleted: the control database's history and, per tenant server not
    retired, its step journal's dead rows (a server that is down says why)."""

    control: queue.Pruned
    journals: list[servers.JournalPruned]

    @property
    def down(self) -> list[servers.JournalPruned]:
        return [s for s in self.journals if s.problem is not None]

    def view(self) -> dict[str, Any]:
        return {**self.control.view(), "servers": [s.view() for s in self.journals]}


def prune_history(
    settings: Settings,
    days: int,
    *,
    dry_run: bool = False,
    on_batch: Callable[[int], None] = lambda deleted: None,
    on_server_batch: Callable[[str, int], None] = lambda server, rows: None,
) -> HistoryPruned:
    """Delete the queue's history that ended more than ``days`` days ago, as the owner (or
    count it: ``dry_run``): control's (:mod:`provisioner.queue.retention`), then each tenant
    server's journal (:mod:`provisioner.servers.retention`), by the same cutoff."""
    conn = db.connect(settings.owner_url, application_name="prune", autocommit=True)
    with closing(conn), db.translated():
        pruned = queue.prune_history(conn, days, dry_run=dry_run, on_batch=on_batch)
        journals = servers.prune_journals(
            conn, settings.owner_url, pruned.cutoff, dry_run=dry_run, on_batch=on_server_batch
        )
    return HistoryPruned(pruned, journals)


def list_jobs(
    settings: Settings,
    *,
    status: str | None = None,
    limit: int = 50,
    tenant: str | None = None,
    kind: str | None = None,
) -> list[Job]:
    """The queue for the operator; of one status, tenant (validated) or job type when asked."""
    wanted = None if tenant is None else TenantId(tenant)
    if status is not None and status not in {s.value for s in JobStatus}:
        raise InvalidInput(
            f"unknown status {status!r}; one of {', '.join(s.value for s in JobStatus)}"
        )
    if limit < 1:
        raise InvalidInput(f"--limit must be at least 1, got {limit}")
    if kind is not None:
        kinds.for_settings(settings).check([kind])  # an unknown one matched nothing, silently
    with app_connection(settings) as conn:
        return queue.list_jobs(conn, status=status, limit=limit, tenant=wanted, kind=kind)


def parse_job_id(raw: str) -> UUID:
    try:
        return UUID(raw)
    except ValueError:
        raise InvalidInput(f"invalid job id {raw!r}: expected a UUID") from None


def retry_job(settings: Settings, job_id: str, *, started_by: str = "jobs retry") -> Job:
    """Queue a failed or cancelled job again; its new run records ``started_by``."""
    with writer_connection(settings) as conn:
        _require_owner_for(settings, conn, parse_job_id(job_id))
        return queue.retry(conn, parse_job_id(job_id), started_by=started_by)


def cancel_job(settings: Settings, job_id: str, *, cancelled_by: str = "jobs cancel") -> Job:
    """Cancel a queued or running job; with the owner URL, its run records ``cancelled_by``
    as what ended it (the application role may not write the run's record)."""
    with writer_connection(settings) as conn:
        _require_owner_for(settings, conn, parse_job_id(job_id))
        job = queue.cancel(conn, parse_job_id(job_id))
        if settings.migrations_database_url:
            journal.record_run_ended(conn, job.id, job.run, cancelled_by)
        return job


def _require_owner_for(settings: Settings, conn: psycopg.Connection[Any], job_id: UUID) -> None:
    """Only the owner changes an owner job (control c005): say so rather than match no row."""
    if settings.migrations_database_url:
        return
    job = queue.get_job(conn, job_id)  # UnknownJob (exit 3) first
    if job.job_type not in kinds.for_settings(settings).application_kinds:
        raise ConfigurationError(
            f"job {job_id} is a {job.job_type} job: only the owner role may change it; set "
            "MIGRATIONS_DATABASE_URL"
        )
