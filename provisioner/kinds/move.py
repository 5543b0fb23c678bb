"""The ``move_tenant`` kind: a tenant's schema moved to another server (issue 29).

Its five steps run in the engine like every kind's, each recorded in the engine's control
transaction (which holds the tenant's lock), but their work happens on the move's two ends,
through owner sessions of their own (:mod:`provisioner.kinds.move_copy`); the move's source
and target are its ``control.tenant_moves`` row (:mod:`provisioner.servers.moves`), read in
the step's transaction. So the kind runs whichever server the tenant lives on
(:attr:`JobKind.any_server`). Each step is safe to run again after a SIGKILL anywhere:

1. ``precopy_schema``: the schema's DDL restored on the target while the application still
   writes, less what follows the rows (:mod:`provisioner.kinds.move_precopy`); a copy found
   there is the move's own (``move`` refused a target that had the schema) and is dropped
   first, and so is a dead run's subscription, slot and publication. Then, when the copy's
   method is logical replication (asked for, or ``auto`` and
   :func:`provisioner.kinds.move_logical.probe` finds what it needs), the target subscribes to
   the source's tables and the initial rows are waited for. Should that replication fail
   (:class:`provisioner.kinds.move_logical.ReplicationFailed`: the probe cannot see whether the
   target's server reaches the source), ``auto`` falls back to the dump (:func:`_fall_back`):
   the fallback committed in the job's payload first, the subscription, slots, publication
   and the target's copy dropped, the DDL pre-copied again; ``--method logical`` fails the job
   instead. Effect: the target has the schema.
2. ``freeze_writes``: the application roles lose every privilege on the source's schema
   (committed there), then the writes begun before are waited for. Effect: the source frozen.
3. ``copy_schema``: in the run that pre-copied, by logical replication the catch-up to the
   source's position after the freeze (:func:`provisioner.kinds.move_logical.catch_up`), then
   the sequences and the DDL that follows the rows, the subscription and publication dropped
   meanwhile in a thread (the switch waits for it first; a replication that fails there
   falls back as in step 1, then copies the whole schema by dump); otherwise the rows
   by ``COPY`` and that DDL, in one transaction
   (:func:`provisioner.kinds.move_precopy.copy_rows`); in any other run (resumed: what the
   target holds is not known), a dead run's subscription, slot and publication dropped, the
   target's copy dropped and the whole schema copied, ``pg_dump | pg_restore`` in one
   transaction. Effect: the target has the schema.
4. ``verify_copy``: both ends' catalog inventory (every object, owner and privilege), rows per
   table and sequence values equal, or the job fails and the tenant stays frozen on the source
   (``move --abort`` drops the copy and gives the source its grants back).
5. ``switch_server``: the application roles granted on the target (committed there, the
   grants checked), then the directory's switch (the tenant's server, the move's phase, the
   servers' counts) commits with the step's record. A crash between the two leaves the target
   granted and the directory on the frozen source: the resume switches it. At no point do
   both copies serve. A suspended or archived tenant is moved without grants.

The freeze's four steps run in one control transaction (:attr:`RunMemo.one_transaction`), each
with its own record, committed with the switch. Each step's record says how long its parts
took (the freeze's revoke and wait, the copy's
rows and what follows them), for the freeze's figures (``bench/move.py``).

The source's old copy stays, frozen, until ``provisioner move TENANT --finish`` drops it once
the grace period has passed (:mod:`provisioner.fleet.move`).
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import psycopg

from provisioner import db
from provisioner.db import Transaction
from provisioner.errors import PermanentError
from provisioner.kinds import move_copy, move_logical, move_precopy
from provisioner.kinds.registry import JobKind, keyed_by_tenant
from provisioner.kinds.step import RunMemo, Step, StepContext
from provisioner.servers import moves
from provisioner.servers.directory import CONTROL
from provisioner.tenant import schema as tenant_schema
from provisioner.tenant.state import INACTIVE, TenantState

MOVE_JOB_TYPE = "move_tenant"


@dataclass
class MoveMemo(RunMemo):
    """A move's run: the pre-copy it made (None: not this run, whose copy is then whole)."""

    precopied: move_precopy.PreCopy | None = None
    #: the subscription this run made (None: the rows are copied in the freeze)
    logical: move_logical.Started | None = None
    #: its drop, under way once caught up (the switch waits for it)
    unsubscribing: Future[float] | None = None


def _memo(ctx: StepContext) -> MoveMemo:
    memo = ctx.memo
    assert isinstance(memo, MoveMemo), "the move kind's runs get a MoveMemo"
    return memo


def _move(tx: Transaction, ctx: StepContext) -> moves.Move:
    """The tenant's move, as its row stands in the step's transaction."""
    found = moves.get_move(tx.pg, ctx.tenant)
    if found is None:
        raise PermanentError(f"tenant {ctx.tenant} has no move: start one with `provisioner move`")
    return found


def _moving(tx: Transaction, ctx: StepContext) -> moves.Move:
    found = _move(tx, ctx)
    if found.phase is not moves.MovePhase.MOVING:
        raise PermanentError(f"tenant {ctx.tenant}'s move is {found.phase}: nothing to do")
    return found


@contextmanager
def _session(tx: Transaction, ctx: StepContext, server: str | None) -> Iterator[Any]:
    """An owner session on ``server`` (None: the control database), closed on leaving."""
    end = moves.end(tx.pg, server, ctx.owner_url)
    conn: psycopg.Connection[Any] = move_copy.connect(end)
    try:
        yield conn
    finally:
        conn.close()


def _past(phase: moves.MovePhase) -> bool:
    """The move went past its copy (switched or finished): the earlier steps are done."""
    return phase in (moves.MovePhase.SWITCHED, moves.MovePhase.FINISHED)


def _precopy(tx: Transaction, ctx: StepContext) -> str | None:
    move = _moving(tx, ctx)
    schema = ctx.tenant.schema
    source = moves.end(tx.pg, move.source, ctx.owner_url)
    target = moves.end(tx.pg, move.target, ctx.owner_url)
    name = move_logical.name(move.job_id)
    left = move_logical.cleanup(source, target, name)  # a dead run's: it would hold WAL
    dropped = _drop_copy(tx, ctx, move.target)
    asked, method, why, capability = _method(tx, move, source, target, schema)
    pre = move_precopy.precopy(source, target, schema, ctx.app_roles)
    logical = ""
    if method is move_logical.MoveMethod.LOGICAL:
        try:
            started = move_logical.start(source, target, schema, name, capability.conninfo)
        except move_logical.ReplicationFailed as failed:
            why = _fall_back(tx, ctx, move, asked, failed, committed=True)
            pre = move_precopy.precopy(source, target, schema, ctx.app_roles)
            method = move_logical.MoveMethod.DUMP
        else:
            _memo(ctx).logical = started
            logical = (
                f"; subscribed to {started.tables} tables, initial rows in {started.sync_ms:.0f} ms"
            )
    _memo(ctx).precopied = pre
    return (
        f"method {method}{why}; {target.server}: {pre.entries - pre.after_rows} of "
        f"{pre.entries} DDL entries restored before the freeze (dump {pre.dump_ms:.0f} ms, "
        f"restore {pre.restore_ms:.0f} ms){logical}"
        + ("; an earlier run's copy dropped first" if dropped else "")
        + (f"; an earlier run's {', '.join(left)} dropped" if left else "")
    )


def _drop_copy(tx: Transaction, ctx: StepContext, server: str | None) -> bool:
    """Drop the tenant's schema on the move's target if it is there (the move's own: ``move``
    refused a target that had it; what a dead or failed run left there is not trusted)."""
    with _session(tx, ctx, server) as conn:
        found = move_copy.schema_exists(conn, ctx.tenant.schema)
        if found:
            move_copy.drop(conn, ctx.tenant.schema, lock_timeout_ms=ctx.lock_timeout_ms)
    return found


def _fall_back(
    tx: Transaction,
    ctx: StepContext,
    move: moves.Move,
    asked: move_logical.MoveMethod,
    failed: move_logical.ReplicationFailed,
    *,
    committed: bool,
) -> str:
    """After a logical replication that failed once the probe had passed: its subscription,
    slots and publication dropped (a slot left would hold the source's WAL), the target's
    copy dropped (a table synchronised, or half applied, is not trusted). Asked for
    (``--method logical``), the job fails with one line saying what to do; in ``auto`` the
    fallback is recorded in the move's job, so that no later run tries replication again
    (``committed``: on a control session of its own at once, before the step's commit: a
    crash in between does not try it again either; else in the step's transaction), and the
    record's reason is returned."""
    source = moves.end(tx.pg, move.source, ctx.owner_url)
    target = moves.end(tx.pg, move.target, ctx.owner_url)
    if asked is move_logical.MoveMethod.LOGICAL:
        move_logical.cleanup(source, target, move_logical.name(move.job_id))
        raise PermanentError(
            f"{failed}; its subscription, slot and publication dropped: `provisioner move "
            f"{ctx.tenant} --abort`, then `provisioner move {ctx.tenant} --to "
            f"{move.target or CONTROL} --method dump`"
        )
    assert move.job_id is not None, "a move's job is recorded with its row"
    if committed:
        with _session(tx, ctx, None) as conn:
            moves.set_fallback(conn, move.job_id, failed.reason)
    else:
        moves.set_fallback(tx.pg, move.job_id, failed.reason)
    move_logical.cleanup(source, target, move_logical.name(move.job_id))
    _drop_copy(tx, ctx, move.target)
    _memo(ctx).logical = None
    return f" (logical replication failed: {failed.reason})"


def _method(
    tx: Transaction, move: moves.Move, source: moves.End, target: moves.End, schema: str
) -> tuple[move_logical.MoveMethod, move_logical.MoveMethod, str, move_logical.Capability]:
    """The method asked for (``move --method``, else ``PROVISIONER_MOVE_METHOD``), the copy's
    method for this run, why (for the record), and the probe's answer: ``auto`` takes logical
    replication when the probe finds everything it needs, unless an earlier run's replication
    failed (recorded in the job: :func:`_fall_back`)."""
    asked = move_logical.MoveMethod(moves.requested_method(tx.pg, move.job_id) or "auto")
    if asked is move_logical.MoveMethod.DUMP:
        return asked, asked, " (asked for)", move_logical.Capability(())
    failed = moves.fallback(tx.pg, move.job_id)
    if failed is not None and asked is move_logical.MoveMethod.AUTO:
        why = f" (logical replication failed: {failed})"
        return asked, move_logical.MoveMethod.DUMP, why, move_logical.Capability(())
    capability = move_logical.probe(source, target, schema)
    if capability.ok:
        return asked, move_logical.MoveMethod.LOGICAL, "", capability
    missing = "; ".join(capability.missing)
    if asked is move_logical.MoveMethod.LOGICAL:
        raise PermanentError(f"logical replication cannot be used for this move: {missing}")
    why = f" (logical replication not possible: {missing})"
    return asked, move_logical.MoveMethod.DUMP, why, capability


def _freeze(tx: Transaction, ctx: StepContext) -> str | None:
    move = _moving(tx, ctx)
    with _session(tx, ctx, move.source) as conn:
        done = move_copy.freeze(
            conn, ctx.tenant.schema, ctx.app_roles, lock_timeout_ms=ctx.lock_timeout_ms
        )
    # The steps of the freeze share its control transaction: one commit (the switch's) in the
    # freeze instead of four. A crash or a failure before it leaves them all to run again; the
    # source stays frozen (its revoke is committed there), and a re-run's copy is whole.
    ctx.memo.one_transaction = True
    return (
        f"{move.source or CONTROL}: writes frozen ({done.tables} tables; revoke "
        f"{done.revoke_ms:.0f} ms, wait for writes begun {done.wait_ms:.0f} ms)"
    )


def _frozen(tx: Transaction, ctx: StepContext) -> bool:
    move = _move(tx, ctx)
    if _past(move.phase):
        return True
    with _session(tx, ctx, move.source) as conn, conn.transaction():
        return move_copy.frozen(conn, ctx.tenant.schema, ctx.app_roles)


def _copy(tx: Transaction, ctx: StepContext) -> str | None:
    move = _moving(tx, ctx)
    schema = ctx.tenant.schema
    source = moves.end(tx.pg, move.source, ctx.owner_url)
    target = moves.end(tx.pg, move.target, ctx.owner_url)
    pre, logical = _memo(ctx).precopied, _memo(ctx).logical
    if pre is not None and logical is not None:
        try:
            return _caught_up(ctx, source, target, pre, logical)
        except move_logical.ReplicationFailed as failed:
            asked = move_logical.MoveMethod(moves.requested_method(tx.pg, move.job_id) or "auto")
            why = _fall_back(tx, ctx, move, asked, failed, committed=False)
            return f"method dump{why}: " + _copy_whole(source, target, schema)
    if pre is not None:
        done = move_precopy.copy_rows(source, target, schema, pre)
        return (
            f"rows copied from {source.server} to {target.server} in {done.rows_ms:.0f} ms "
            f"({done.rows} rows, {done.tables} tables), then {pre.after_rows} DDL entries "
            f"and the commit in {done.after_ms:.0f} ms"
        )
    left = move_logical.cleanup(source, target, move_logical.name(move.job_id))
    dropped = _drop_copy(tx, ctx, move.target)  # a resumed run: what is there is not trusted
    return (
        _copy_whole(source, target, schema)
        + " (a resumed run)"
        + ("; an earlier run's copy dropped first" if dropped else "")
        + (f"; an earlier run's {', '.join(left)} dropped" if left else "")
    )


def _caught_up(
    ctx: StepContext,
    source: moves.End,
    target: moves.End,
    pre: move_precopy.PreCopy,
    logical: move_logical.Started,
) -> str:
    """The freeze's part of a copy by logical replication: the catch-up, the subscription's
    drop begun in a thread, then the sequences and the DDL after the rows; its record."""
    with move_copy.connect(source) as here, move_copy.connect(target) as there:
        wait_ms = move_logical.catch_up(here, there, logical)
        _memo(ctx).unsubscribing = move_logical.unsubscribe(source, target, logical)
        after_ms = move_precopy.after_replication(here, there, ctx.tenant.schema, pre)
    return (
        f"logical replication caught up in {wait_ms:.0f} ms, then the sequences, "
        f"{pre.after_rows} DDL entries and the commit in {after_ms:.0f} ms"
    )


def _copy_whole(source: moves.End, target: moves.End, schema: str) -> str:
    """The whole schema by ``pg_dump | pg_restore`` onto a target without it; its record."""
    began = time.perf_counter()
    move_copy.copy_schema(source, target, schema)
    return (
        f"copied whole from {source.server} to {target.server} in "
        f"{(time.perf_counter() - began) * 1000:.0f} ms"
    )


def _copied(tx: Transaction, ctx: StepContext) -> bool:
    move = _move(tx, ctx)
    if _past(move.phase):
        return True
    with _session(tx, ctx, move.target) as conn:
        return move_copy.schema_exists(conn, ctx.tenant.schema)


def _snapshot(end: moves.End, schema: str) -> move_copy.Snapshot | None:
    conn = move_copy.connect(end)
    try:
        return move_copy.snapshot(conn, schema)
    finally:
        conn.close()


def _verify(tx: Transaction, ctx: StepContext) -> str | None:
    move = _moving(tx, ctx)
    schema = ctx.tenant.schema
    ends = [moves.end(tx.pg, server, ctx.owner_url) for server in (move.source, move.target)]
    # Both ends read at once (each its own session), the writes being frozen meanwhile.
    with ThreadPoolExecutor(max_workers=2, thread_name_prefix="move-verify") as pool:
        before, after = pool.map(lambda end: _snapshot(end, schema), ends)
    if before is None or after is None:
        where = move.source if before is None else move.target
        raise PermanentError(f"schema {schema} is missing on {where or CONTROL}")
    lines = move_copy.differences(before, after)
    if lines:
        raise PermanentError(
            f"the copy on {move.target or CONTROL} differs from the source: "
            + "; ".join(lines[:10])
            + (f" (and {len(lines) - 10} more)" if len(lines) > 10 else "")
        )
    rows = sum(before.rows.values())
    return (
        f"{len(before.inventory)} catalog objects, {len(before.rows)} tables ({rows} rows), "
        f"{len(before.sequences)} sequences equal"
    )


def _switch(tx: Transaction, ctx: StepContext) -> str | None:
    move = _move(tx, ctx)
    unsubscribed = ""
    dropping = _memo(ctx).unsubscribing
    if dropping is not None:  # the subscription's drop, begun once caught up: done first
        with db.translated():
            unsubscribed = f"; subscription and publication dropped ({dropping.result():.0f} ms)"
    state = moves.tenant_server(tx.pg, ctx.tenant)
    granted = state is not None and TenantState(state[1]) not in INACTIVE
    if move.phase is moves.MovePhase.MOVING and granted:
        with _session(tx, ctx, move.target) as conn, conn.transaction():
            tenant_schema.grant_app_roles(conn, ctx.tenant.schema, ctx.app_roles)
    if not moves.switch(tx.pg, ctx.tenant) and not _switched(tx, ctx):
        where = CONTROL if state is None or state[0] is None else state[0]
        raise PermanentError(
            f"tenant {ctx.tenant} lives on {where}, not on the move's source "
            f"{move.source or CONTROL}: the directory was changed under the move"
        )
    target = move.target or CONTROL
    return f"lives on {target}" + ("; app roles granted there" if granted else "") + unsubscribed


def _switched(tx: Transaction, ctx: StepContext) -> bool:
    move = _move(tx, ctx)
    state = moves.tenant_server(tx.pg, ctx.tenant)
    return _past(move.phase) and state is not None and state[0] == move.target


MOVE_STEPS: tuple[Step, ...] = (
    Step("precopy_schema", _precopy, _copied, works_elsewhere=True),
    Step("freeze_writes", _freeze, _frozen, works_elsewhere=True),
    Step("copy_schema", _copy, _copied, works_elsewhere=True),
    Step("verify_copy", _verify, _copied, works_elsewhere=True),
    Step("switch_server", _switch, _switched, works_elsewhere=True),
)

JOB_KINDS: tuple[JobKind, ...] = (
    JobKind(
        MOVE_JOB_TYPE,
        f"{__name__}:MOVE_STEPS",
        idempotency_key=keyed_by_tenant(MOVE_JOB_TYPE),
        command="move",
        description="pre-copy, freeze, copy, verify and switch a tenant to another server",
        refused_states=(TenantState.PENDING, TenantState.PROVISIONING, TenantState.DELETED),
        any_server=True,
        memo=MoveMemo,
    ),
)
