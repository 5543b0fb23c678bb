"""Lifecycle changes of many tenants at once: ``suspend``, ``restore``, ``deprovision`` and
``deprovision --purge`` of several tenants, a file of ids, or every tenant in a state.

The whole batch is checked first (ids, unknown tenants, states), then queued as ONE batch (one
statement, one transaction: :func:`provisioner.queue.batch.ensure_batch`), then drained in this
process by one engine, job after job (or left to the workers with ``queue_only``). A bad id,
an unknown tenant or a tenant whose state does not allow the change refuses the whole batch,
naming them, before anything is queued. Each job runs exactly as a one-off command runs it:
the same kind, steps, checkpoints and history. A batch over tenants on several servers is
reported per server as well (:meth:`BatchReport.by_server`).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace

from provisioner import db, kinds, queue
from provisioner.control.schema import require_control_at_head
from provisioner.engine import Engine, ignore_progress, never_stop, runner
from provisioner.engine.holder import holder_id
from provisioner.errors import InvalidInput, ProvisionerError, UnknownTenant, WrongState
from provisioner.kinds import lifecycle
from provisioner.models import Job, JobStatus, TenantId
from provisioner.servers import CONTROL
from provisioner.settings import Settings, tenant_naming
from provisioner.tenant import row as tenants
from provisioner.tenant.state import TenantState


@dataclass(frozen=True)
class TenantOutcome:
    """How one tenant of a batch ended."""

    tenant_id: str
    #: the tenant's job of the kind (None: already there, and no job of that kind yet)
    job: Job | None
    #: control.tenants.state afterwards
    state: TenantState
    #: already in the target state (the catalog agreeing): nothing ran
    already: bool = False
    #: the job's error, or why it could not run here
    error: str | None = None
    seconds: float = 0.0
    #: the tenant server it lives on (None: the control database)
    server: str | None = None

    @property
    def ok(self) -> bool:
        return self.already or (self.job is not None and self.job.status is JobStatus.SUCCEEDED)


@dataclass(frozen=True)
class BatchReport:
    job_type: str
    #: every tenant of the batch, by tenant id
    tenants: list[TenantOutcome]
    #: the jobs were left for the workers (``queue_only``)
    queued: bool
    #: jobs queued (created or queued again) in the batch
    batch_size: int
    #: seconds the checks and the one-transaction queueing took
    queue_seconds: float

    def by_server(self) -> list[ServerBatch]:
        """Each server's tenants of the batch and how they ended, the control database first;
        empty when every tenant lives on the control database (a report as it always was)."""
        if all(o.server is None for o in self.tenants):
            return []
        out: dict[str, ServerBatch] = {}
        for o in sorted(self.tenants, key=lambda o: (o.server is not None, o.server or "")):
            name = o.server or CONTROL
            was = out.get(name, ServerBatch(name))
            out[name] = ServerBatch(
                name,
                was.tenants + 1,
                was.succeeded + (o.ok and not o.already and not self.queued),
                was.failed + (not o.ok and not self.queued),
                was.already + o.already,
            )
        return list(out.values())


@dataclass(frozen=True)
class ServerBatch:
    """One server's part of a batch: its tenants, and how many ended each way."""

    server: str
    tenants: int = 0
    succeeded: int = 0
    failed: int = 0
    already: int = 0

    def view(self) -> dict[str, int | str]:
        return {
            "server": self.server,
            "tenants": self.tenants,
            "succeeded": self.succeeded,
            "failed": self.failed,
            "already": self.already,
        }


def parse_ids(raw: list[str]) -> list[TenantId]:
    """Every id validated; InvalidInput naming all the bad ones (one line)."""
    bad, good = [], []
    naming = tenant_naming()  # once: each TenantId below is checked against it
    for text in raw:
        try:
            good.append(TenantId(text, naming))
        except InvalidInput:
            bad.append(text if len(text) <= 60 else text[:57] + "...")
    if bad:
        raise InvalidInput(
            f"invalid tenant id(s) {', '.join(repr(b) for b in bad[:10])}"
            + (f" and {len(bad) - 10} more" if len(bad) > 10 else "")
            + f" ({naming.rule}): nothing was queued"
        )
    return list(dict.fromkeys(good))


def change_many(
    settings: Settings,
    job_type: str,
    tenant_ids: list[str],
    *,
    states: list[TenantState] | None = None,
    queue_only: bool = False,
    on_tenant: Callable[[TenantOutcome], None] = lambda outcome: None,
    holder: str | None = None,
    concurrency: int = 1,
) -> BatchReport:
    """Apply one lifecycle kind to the named tenants and every tenant in ``states``: checked,
    queued as one batch, then run here by ``concurrency`` engines, each job after job
    (``on_tenant`` hears each, from the engine's thread), or left to the workers with
    ``queue_only``."""
    if concurrency < 1:
        raise InvalidInput(f"concurrency must be at least 1, got {concurrency}")
    named = parse_ids(tenant_ids)
    kind = kinds.for_settings(settings)[job_type]
    rule = lifecycle.RULES[job_type]
    started_by = f"{kind.command or job_type} (batch)"
    began = time.monotonic()
    with Engine.from_settings(settings, holder or holder_id("cli")) as engine:
        conn = engine.control
        require_control_at_head(conn, tenant_naming())  # and the recorded naming, as a worker
        with db.translated():
            found = tenants.select_tenants(conn, [t.value for t in named], states)
            by_id = {t.tenant_id: t for t in found}
            unknown = [t.value for t in named if t.value not in by_id]
            if unknown:
                raise UnknownTenant(
                    f"unknown tenant(s) {', '.join(unknown[:10])}"
                    + (f" and {len(unknown) - 10} more" if len(unknown) > 10 else "")
                    + ": no control row; nothing was queued"
                )
            latest = {
                str(j.tenant_id): j
                for j in queue.latest_jobs(conn, job_type, [TenantId(t) for t in by_id])
            }
        todo, already, wrong = [], [], []
        for tenant in found:
            job = latest.get(tenant.tenant_id)
            unfinished = job is not None and job.status is not JobStatus.SUCCEEDED
            if tenant.state in rule.from_states or (
                unfinished and tenant.state in rule.done_states
            ):
                todo.append(tenant)
            elif tenant.state in rule.done_states and job_type != lifecycle.RESTORE_JOB_TYPE:
                if engine.missing_effects(TenantId(tenant.tenant_id), job_type):
                    todo.append(tenant)
                else:
                    already.append(
                        TenantOutcome(
                            tenant.tenant_id, job, tenant.state, True, server=tenant.server
                        )
                    )
            else:
                wrong.append(f"{tenant.tenant_id} ({tenant.state})")
        if wrong:
            raise WrongState(
                f"{kind.command or job_type} applies to {' or '.join(rule.from_states)} "
                f"tenants, not {', '.join(wrong[:10])}"
                + (f" and {len(wrong) - 10} more" if len(wrong) > 10 else "")
                + ": nothing was queued"
            )
        keys = {t.tenant_id: _key(kind, t.tenant_id) for t in todo}
        with db.translated(), conn.transaction():
            jobs = queue.ensure_batch(
                conn, job_type, keys, started_by=started_by, wake_workers=queue_only
            )
        queued_in = time.monotonic() - began
        states_now = {t.tenant_id: t.state for t in todo}
        if queue_only:
            outcomes = [
                TenantOutcome(str(j.tenant_id), j, states_now[str(j.tenant_id)]) for j in jobs
            ]
        else:
            outcomes = _drain(settings, engine, jobs, on_tenant, concurrency)
    placed = {t.tenant_id: t.server for t in todo}
    outcomes = [replace(o, server=placed.get(o.tenant_id)) for o in outcomes]
    every = sorted([*outcomes, *already], key=lambda o: o.tenant_id)
    return BatchReport(job_type, every, queue_only, len(jobs), queued_in)


def _key(kind: kinds.JobKind, tenant_id: str) -> str:
    if kind.idempotency_key is None:
        raise InvalidInput(f"{kind.name} has no idempotency key: it cannot be batched")
    return kind.idempotency_key(TenantId(tenant_id))


def _drain(
    settings: Settings,
    engine: Engine,
    jobs: list[Job],
    on_tenant: Callable[[TenantOutcome], None],
    concurrency: int,
) -> list[TenantOutcome]:
    """Run the batch's jobs here: this engine takes one share, and each further share gets an
    engine of its own (its own sessions) in a thread, so commits and catalog work overlap."""
    shares = [jobs[i::concurrency] for i in range(min(concurrency, len(jobs)))]
    if len(shares) <= 1:
        return [_drain_one(engine, engine.control, job, on_tenant) for job in jobs]

    def run_share(index: int) -> list[TenantOutcome]:
        with Engine.from_settings(settings, f"{engine.holder}-{index}") as other:
            return [_drain_one(other, other.control, job, on_tenant) for job in shares[index]]

    with ThreadPoolExecutor(len(shares) - 1) as pool:
        others = [pool.submit(run_share, i) for i in range(1, len(shares))]
        mine = [_drain_one(engine, engine.control, job, on_tenant) for job in shares[0]]
        return mine + [outcome for share in others for outcome in share.result()]


def _drain_one(
    engine: Engine, conn: tenants.Conn, job: Job, on_tenant: Callable[[TenantOutcome], None]
) -> TenantOutcome:
    """Run one job of the batch here, as a one-off command would; never raises for the job."""
    tenant = TenantId(str(job.tenant_id))
    began = time.monotonic()
    error = None
    try:
        outcome = runner.claim_and_run(
            engine, job.id, on_progress=ignore_progress, should_stop=never_stop
        )
        job = runner.settled_job(outcome)
        error = job.error_detail if job.status is not JobStatus.SUCCEEDED else None
    except ProvisionerError as exc:
        error = str(exc)
    with db.translated():
        state = tenants.state_of(conn, tenant) or TenantState.PENDING
    result = TenantOutcome(tenant.value, job, state, error=error, seconds=time.monotonic() - began)
    on_tenant(result)
    return result
