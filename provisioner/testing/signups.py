"""What the application under test does on its own: the jobs it queues, run in this process
(:func:`drain`), and the tenants it signs up, removed after the test (:class:`Sweep`).

An application's sign-up writes its tenant row and queues the provisioning job in its own
transaction (:func:`provisioner.enqueue`); in production a worker runs the job. A test wants
that job run now, in the test's process, through the same claim and the same engine as the
worker's (no separate worker to start, nothing to wait for): :func:`drain` claims and runs every
ready job of the owner's kinds until none is left, and returns each as it was settled.

The plugin's database lives for the whole session, so a tenant a test signed up would still be
there for the next test (and its id taken). :class:`Sweep` notes the tenants and jobs present
before a test and, after it, names those the test added that nobody else answers for (the
factory's own tenants are dropped by the factory), for the factory to drop
(:meth:`provisioner.testing.TenantFactory.sweep`).
"""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass
from typing import Any, assert_never

import psycopg

from provisioner import kinds, queue
from provisioner.engine import runner
from provisioner.engine.engine import Engine
from provisioner.errors import InvalidInput, ProvisionerError
from provisioner.models import Job, TenantId
from provisioner.settings import Settings

#: The holder id a drain's claims carry (``jobs list`` shows it).
DRAIN_HOLDER = "pytest-drain"


def owner_job_types(settings: Settings) -> tuple[str, ...]:
    """The kinds the owner's engine runs (provisioning and the lifecycle kinds, and those of
    ``PROVISIONER_JOB_KIND_MODULES`` it has steps for), not the application's own."""
    registry = kinds.for_settings(settings)
    return tuple(sorted(registry.handled - registry.application_kinds))


def drain(settings: Settings, job_types: Collection[str] | None = None) -> list[Job]:
    """Run every ready job of ``job_types`` (default :func:`owner_job_types`) in this process,
    as a worker would, until none is ready; the jobs as settled, in the order they ran. A job
    that failed and waits for its retry is not ready: it is returned failed-for-now (queued,
    its error recorded), not retried here."""
    types = tuple(job_types) if job_types is not None else owner_job_types(settings)
    kinds.for_settings(settings).check(types)
    ran: list[Job] = []
    with Engine.from_settings(settings, DRAIN_HOLDER) as engine:
        while True:
            outcome = runner.claim_next_and_run(
                engine,
                types,
                on_claimed=lambda claim: None,
                on_progress=lambda event: None,
                should_stop=lambda: False,
            )
            match outcome:
                case runner.Settled(job=job):
                    ran.append(job)
                case runner.NothingQueued():
                    return ran
                case runner.ClaimFailed(detail=detail) | runner.Unsettled(detail=detail):
                    raise ProvisionerError(f"drain: {detail}")
                case runner.LostLease(detail=detail):
                    raise ProvisionerError(f"drain: a job was taken over: {detail}")
                case runner.Busy(job=job):  # pragma: no cover - next-claims skip held jobs
                    raise ProvisionerError(f"drain: job {job.id} is held by another process")
                case _:
                    assert_never(outcome)


@dataclass(frozen=True)
class Sweep:
    """The tenants and jobs a test found; :meth:`clean` removes what the test added."""

    tenants: frozenset[str]
    jobs: list[Any]

    @classmethod
    def snapshot(cls, conn: psycopg.Connection[Any]) -> Sweep:
        row = conn.execute(queue.SWEEP_SNAPSHOT).fetchone()
        assert row is not None
        return cls(frozenset(row[0]), list(row[1]))

    def added_tenants(self, conn: psycopg.Connection[Any], keep: Collection[str]) -> list[TenantId]:
        """The tenants added since the snapshot, but those in ``keep`` (someone else's)."""
        now = Sweep.snapshot(conn)
        added: list[TenantId] = []
        for tenant_id in sorted(now.tenants - self.tenants - set(keep)):
            try:
                added.append(TenantId(tenant_id))
            except InvalidInput:  # pragma: no cover - the table's constraint refuses such ids
                continue
        return added

    def delete_added_jobs(self, conn: psycopg.Connection[Any], keep: Collection[str]) -> None:
        """Delete the jobs added since the snapshot that belong to no tenant that was there
        before or is in ``keep`` (a dropped tenant's jobs went with it)."""
        conn.execute(
            queue.SWEEP_NEW_JOBS, {"before": self.jobs, "keep": sorted(self.tenants | set(keep))}
        )
