"""``provisioner move``: start (or resume) a tenant's move to another server, finish it, or
abort it (the ``move_tenant`` kind's steps: :mod:`provisioner.kinds.move`).

* :func:`move` checks everything it can before anything changes (the tenant, its state, the
  target: known, active, not the tenant's own server, reachable as the owner and without the
  tenant's schema), then records the move (``control.tenant_moves``) and queues its job in one
  control transaction, which takes the target's room under its row lock (the moves under way
  to it count: two moves at once into its last place do not both start), and runs it here (or
  leaves it to a worker). Asked again for the same target while the move is under way, it
  resumes the job, taking over from a holder that died, or queueing a failed one again; once
  switched, it reports the move done. While a live process runs it, it is refused. A move
  elsewhere, or a new move before the last one is finished, is refused.
* :func:`finish` drops the old copy on the source once the grace period since the switch has
  passed: until then a route cached before the switch fails loudly (the old copy has no
  grants) and the old copy is still there to look at.
* :func:`abort` stops a move that has not switched: its job cancelled, the target's copy
  dropped, the application roles granted again on the source.

Bad input raises before anything changes: InvalidInput (exit 2) for a bad name, the same
server, a target that takes no tenants or whose tool schema is behind this build (never
``provisioner migrate``d), an open move; UnknownTenant or UnknownServer (3).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Any

import psycopg

from provisioner import db, kinds, queue
from provisioner.control.schema import require_control_at_head
from provisioner.engine import Engine, ignore_progress, never_stop, runner
from provisioner.engine.events import ProgressCallback, StopRequested
from provisioner.engine.holder import holder_id
from provisioner.errors import InvalidInput, TenantBusy, UnknownTenant, WrongState
from provisioner.kinds import move_copy, move_logical
from provisioner.kinds.move import MOVE_JOB_TYPE
from provisioner.models import Job, JobStatus, TenantId
from provisioner.servers import journal, moves
from provisioner.servers.directory import CONTROL, ServerStatus, get, server_name
from provisioner.settings import MAX_SECONDS, Settings
from provisioner.tenant import row as tenants
from provisioner.tenant import schema as tenant_schema
from provisioner.tenant.state import LIVE, ONBOARDED

Conn = psycopg.Connection[Any]

#: How long after the switch ``move --finish`` waits before it drops the old copy.
DEFAULT_GRACE_SECONDS = 300


@dataclass(frozen=True)
class MoveResult:
    """A move's row and its job as this command left them (``queued``: left to a worker)."""

    move: moves.Move
    job: Job | None
    queued: bool = False
    resumed: bool = False

    def view(self) -> dict[str, Any]:
        return {
            **self.move.view(),
            "job": None if self.job is None else self.job.view(),
            "queued": self.queued,
            "resumed": self.resumed,
        }


def target_name(raw: str) -> str | None:
    """The target as the directory stores it: None for ``control``, else a valid name."""
    return None if raw == CONTROL else server_name(raw)


def move(
    settings: Settings,
    tenant_id: str,
    to: str,
    *,
    queue_only: bool = False,
    on_progress: ProgressCallback = ignore_progress,
    should_stop: StopRequested = never_stop,
    holder: str | None = None,
    method: str | None = None,
) -> MoveResult:
    """Move the tenant to server ``to`` (``control``: the control database), its rows copied
    by ``method`` (None: ``PROVISIONER_MOVE_METHOD``); see the module."""
    tenant = TenantId(tenant_id)
    target = target_name(to)
    asked = move_logical.MoveMethod(method or settings.move_method)
    with Engine.from_settings(settings, holder or holder_id("cli")) as engine:
        conn = engine.control
        require_control_at_head(conn)
        with db.translated():
            source = _movable(conn, tenant)
            current = moves.get_move(conn, tenant)
        if current is not None and current.phase.open:
            if current.target == target:  # asked again: resumed, or already there
                return _resume(engine, current, queue_only, on_progress, should_stop)
            raise InvalidInput(moves.refusal(current))
        with db.translated():
            _check_target(conn, tenant, source, target, settings.owner_url)
            if asked is move_logical.MoveMethod.LOGICAL:
                _check_logical(conn, tenant, source, target, settings.owner_url)
            with conn.transaction():
                if target is not None:  # checked again under the target's row lock
                    moves.take_room(conn, target)
                started = moves.start(conn, tenant, source, target)
                kind = kinds.for_settings(settings)[MOVE_JOB_TYPE]
                key = kind.idempotency_key(tenant) if kind.idempotency_key else None
                command = f"move --to {to}{' (queued)' if queue_only else ''}"
                job = queue.ensure_tenant_job(
                    conn, tenant, MOVE_JOB_TYPE, key, retry_terminal=True, started_by=command
                ).job
                if job.status is JobStatus.SUCCEEDED:
                    job = queue.reopen(conn, job.id, wake_workers=queue_only, started_by=command)
                moves.set_job(conn, tenant, job.id)
                moves.set_method(conn, job.id, asked.value)
        started = replace(started, job_id=job.id)
        if queue_only:
            return MoveResult(started, job, queued=True)
        return _run(engine, started, job, on_progress, should_stop, resumed=False)


def _movable(conn: Conn, tenant: TenantId) -> str | None:
    """The tenant's server (None: the control database), once its state allows a move."""
    found = tenants.get_tenant(conn, tenant)
    if found is None:
        raise UnknownTenant(f"unknown tenant {tenant}: it has no control row")
    if found.state not in ONBOARDED:
        raise WrongState(
            f"tenant {tenant} is {found.state}: move applies to {' or '.join(ONBOARDED)} tenants"
        )
    return found.server


def _check_target(
    conn: Conn, tenant: TenantId, source: str | None, target: str | None, owner_url: str
) -> None:
    """InvalidInput unless ``target`` can take the tenant now: not its own server, active,
    reachable as the owner, without the tenant's schema, its tool schema at this build's
    version (:func:`provisioner.servers.journal.behind`). Its room is taken in the
    transaction that records the move (:func:`provisioner.servers.moves.take_room`)."""
    if source == target:
        raise InvalidInput(f"tenant {tenant} already lives on {target or CONTROL}")
    if target is not None:
        server = get(conn, target)  # UnknownServer (exit 3)
        if server.status is not ServerStatus.ACTIVE:
            raise InvalidInput(
                f"tenant server {target} is {server.status}: it takes no tenants (`provisioner "
                f"servers activate {target}` first)"
            )
    end = moves.end(conn, target, owner_url)
    with move_copy.connect(end) as there:
        if move_copy.schema_exists(there, tenant.schema):
            raise InvalidInput(
                f"{end.server} already has a schema {tenant.schema}: the move will not "
                "overwrite what it did not create"
            )
        # What a worker refuses to start with: every later job of the tenant would fail there.
        behind = None if target is None else journal.behind(there)
    if behind is not None:
        raise InvalidInput(f"tenant server {target}: {behind}")


def _check_logical(
    conn: Conn, tenant: TenantId, source: str | None, target: str | None, owner_url: str
) -> None:
    """InvalidInput (one line: what is missing) unless the move can copy by logical
    replication (:func:`provisioner.kinds.move_logical.probe`)."""
    here, there = (moves.end(conn, s, owner_url) for s in (source, target))
    found = move_logical.probe(here, there, tenant.schema)
    if not found.ok:
        raise InvalidInput(
            "--method logical: logical replication cannot be used for this move: "
            + "; ".join(found.missing)
        )


def _resume(
    engine: Engine,
    current: moves.Move,
    queue_only: bool,
    on_progress: ProgressCallback,
    should_stop: StopRequested,
) -> MoveResult:
    assert current.job_id is not None, "a move's job is recorded with its row"
    with db.translated():
        job = queue.get_job(engine.control, current.job_id)
        if current.phase is moves.MovePhase.SWITCHED:
            return MoveResult(current, job, resumed=True)
        if job.status in (JobStatus.FAILED, JobStatus.CANCELLED):
            job = queue.retry(engine.control, job.id, started_by="move (resumed)")
    if queue_only:
        return MoveResult(current, job, queued=True, resumed=True)
    return _run(engine, current, job, on_progress, should_stop, resumed=True)


def _run(
    engine: Engine,
    current: moves.Move,
    job: Job,
    on_progress: ProgressCallback,
    should_stop: StopRequested,
    *,
    resumed: bool,
) -> MoveResult:
    """Claim the move's job now (a dead holder's is taken over) and run it; refused while a
    live process holds it."""
    with db.translated():
        claimed = queue.claim_job_with_state(engine.control, job.id, engine.holder)
        if claimed is None:
            job = queue.get_job(engine.control, job.id)
    if claimed is None:
        if job.status.terminal:
            return MoveResult(_reread(engine, current), job, resumed=resumed)
        raise TenantBusy(
            f"tenant {current.tenant_id} is being moved to {current.target or CONTROL} by "
            f"another process (job {job.id}, {job.status.value}"
            + (f" under {job.locked_by})" if job.locked_by else ")")
        )
    outcome = runner.run_claimed(engine, claimed, on_progress=on_progress, should_stop=should_stop)
    return MoveResult(_reread(engine, current), runner.settled_job(outcome), resumed=resumed)


def _reread(engine: Engine, current: moves.Move) -> moves.Move:
    with db.translated():
        found = moves.get_move(engine.control, TenantId(current.tenant_id))
    return found or current


def finish(settings: Settings, tenant_id: str, *, grace_seconds: float) -> moves.Move:
    """Drop the old copy of a switched move on its source, once ``grace_seconds`` have passed
    since the switch; the move is then finished. Safe to run again after a crash.
    InvalidInput (before anything is read) for a grace that is not 0 to a week."""
    tenant = TenantId(tenant_id)
    if not (math.isfinite(grace_seconds) and 0 <= grace_seconds <= MAX_SECONDS):
        raise InvalidInput(
            f"the grace period must be 0 to {MAX_SECONDS:g} seconds (a week), got "
            f"{str(grace_seconds)[:40]}"
        )
    with db.connect(settings.owner_url, autocommit=True) as conn, db.translated():
        require_control_at_head(conn)
        current = moves.get_move(conn, tenant)
        if current is None or current.phase is not moves.MovePhase.SWITCHED:
            raise InvalidInput(f"tenant {tenant} has no switched move to finish")
        due, over = moves.grace_over(conn, tenant, grace_seconds)
        if not over:
            raise InvalidInput(
                f"the grace period of tenant {tenant}'s move ends at {due.isoformat()}: "
                "run again then, or with --grace 0"
            )
        lives = moves.tenant_server(conn, tenant)
        if lives is None or lives[0] == current.source:
            raise InvalidInput(f"tenant {tenant} lives on the move's source: nothing dropped")
        end = moves.end(conn, current.source, settings.owner_url)
        with move_copy.connect(end) as there:
            move_copy.drop(there, tenant.schema, lock_timeout_ms=_lock_ms(settings))
        return moves.end_move(conn, tenant, moves.MovePhase.FINISHED) or current


def abort(settings: Settings, tenant_id: str) -> moves.Move:
    """Stop a move that has not switched: its job cancelled (refused while a live process runs
    it), the target's copy dropped, the source's grants given back (to a tenant in use). Safe
    to run again after a crash."""
    tenant = TenantId(tenant_id)
    with db.connect(settings.owner_url, autocommit=True) as conn, db.translated():
        require_control_at_head(conn)
        current = moves.get_move(conn, tenant)
        if current is None or current.phase is not moves.MovePhase.MOVING:
            raise InvalidInput(f"tenant {tenant} has no move under way to abort")
        if current.job_id is not None:
            job = queue.get_job(conn, current.job_id)
            if job.status is JobStatus.RUNNING and _holder_live(conn, job):
                raise TenantBusy(
                    f"tenant {tenant}'s move is running under {job.locked_by}: stop it first"
                )
            if not job.status.terminal:
                queue.cancel(conn, job.id)
        target = moves.end(conn, current.target, settings.owner_url)
        source = moves.end(conn, current.source, settings.owner_url)
        move_logical.cleanup(source, target, move_logical.name(current.job_id))
        with move_copy.connect(target) as there:
            move_copy.drop(there, tenant.schema, lock_timeout_ms=_lock_ms(settings))
        found = tenants.get_tenant(conn, tenant)
        if found is not None and found.state in LIVE:
            with move_copy.connect(source) as here, here.transaction():
                tenant_schema.grant_app_roles(here, tenant.schema, settings.app_roles)
        return moves.end_move(conn, tenant, moves.MovePhase.ABORTED) or current


# A holder is live while a session carries its name (as the queue's take-over decides).
HOLDER_LIVE = "SELECT 1 FROM pg_stat_activity WHERE application_name = %(holder)s"


def _holder_live(conn: Conn, job: Job) -> bool:
    return conn.execute(HOLDER_LIVE, {"holder": job.locked_by}).fetchone() is not None


def _lock_ms(settings: Settings) -> int:
    return max(1, int(settings.lock_timeout_seconds * 1000))
