"""``provisioner move TENANT --to SERVER``: move a tenant's schema to another server, as a
resumable job (freeze, copy, verify, switch); ``--finish`` drops the old copy after the grace
period, ``--abort`` stops a move that has not switched (:mod:`provisioner.fleet.move`).

Exit codes: 0 done (or queued); 1 the move failed, or another process is running it; 2 bad
input (a bad name, the tenant's own server, a server that takes no tenants or whose tool schema
was never migrated, a target that already has the schema, a move already open, a grace period
not over or out of range, a flag the chosen action does not use, nothing to finish or abort);
3 an unknown tenant or server.
"""

from __future__ import annotations

import sys
import time

import click

from provisioner import kinds
from provisioner.cli.options import WAIT_SECONDS, settings_of
from provisioner.cli.render import StepPrinter, emit_json, ended_line, fail_cleanly, render_job
from provisioner.errors import InvalidInput
from provisioner.fleet import move as moving
from provisioner.models import JobStatus
from provisioner.servers.directory import CONTROL


@click.command("move")
@click.argument("tenant_id")
@click.option(
    "--to",
    "to",
    default=None,
    metavar="SERVER",
    help="The target server (control: the control database).",
)
@click.option("--finish", is_flag=True, help="Drop the old copy on the source (after --grace).")
@click.option(
    "--grace",
    type=WAIT_SECONDS,
    default=None,
    help="With --finish: seconds since the switch before the old copy may be dropped "
    f"(0 to a week; default {moving.DEFAULT_GRACE_SECONDS}).",
)
@click.option("--abort", is_flag=True, help="Stop a move that has not switched; drop its copy.")
@click.option(
    "--method",
    type=click.Choice(["auto", "dump", "logical"]),
    default=None,
    help="How the rows are copied (default PROVISIONER_MOVE_METHOD, auto): logical "
    "replication (a shorter freeze) when the servers grant it, else dump.",
)
@click.option("--queue", "queue_only", is_flag=True, help="Queue the move for a worker.")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object, no progress.")
@click.pass_context
@fail_cleanly
def move(
    ctx: click.Context,
    tenant_id: str,
    to: str | None,
    finish: bool,
    grace: float | None,
    abort: bool,
    method: str | None,
    queue_only: bool,
    as_json: bool,
) -> None:
    """Move TENANT_ID's schema to --to SERVER: DDL pre-copied (with --method logical or auto,
    the rows too, by logical replication), writes frozen (app roles revoked on the source),
    the rows copied or caught up as the owner, verified (catalog, rows, sequences, grants),
    directory switched and grants given on the target. Run it again to resume after a crash. The old
    copy stays, frozen, until `move TENANT_ID --finish`.

    Exit 0 done, 1 failed or running elsewhere, 2 bad input, 3 unknown tenant or server.
    """
    chosen = [
        name
        for name, on in (("--to", to is not None), ("--finish", finish), ("--abort", abort))
        if on
    ]
    if len(chosen) != 1:
        raise InvalidInput("move takes exactly one of --to SERVER, --finish, --abort")
    ignored = [
        flag
        for flag, given in (
            ("--grace", grace is not None and not finish),
            ("--method", method is not None and to is None),
            ("--queue", queue_only and to is None),
        )
        if given
    ]
    if ignored:
        raise InvalidInput(
            f"{', '.join(ignored)} {'does' if len(ignored) == 1 else 'do'} not apply to move "
            f"{chosen[0]} (--grace: with --finish "
            "only; --method, --queue: with --to only)"
        )
    settings = settings_of(ctx)
    if finish or abort:
        ended = (
            moving.finish(
                settings,
                tenant_id,
                grace_seconds=moving.DEFAULT_GRACE_SECONDS if grace is None else grace,
            )
            if finish
            else moving.abort(settings, tenant_id)
        )
        if as_json:
            emit_json(ended.view())
        else:
            where = ended.source if finish else ended.target
            click.echo(
                f"tenant {tenant_id}: move {ended.phase}; the copy on {where or CONTROL} dropped"
            )
        return
    assert to is not None
    registry = kinds.for_settings(settings)
    if not (as_json or queue_only):
        click.echo(f"move tenant {tenant_id} to {to}")
    started = time.monotonic()
    result = moving.move(
        settings,
        tenant_id,
        to,
        queue_only=queue_only,
        method=method,
        on_progress=StepPrinter(as_json or queue_only, registry),
    )
    job = result.job
    ok = result.queued or (job is not None and job.status is JobStatus.SUCCEEDED)
    if as_json:
        emit_json(result.view())
    elif result.queued and job is not None:
        click.echo(str(job.id))
    else:
        click.echo(f"{ended_line(job, time.monotonic() - started)}; move {result.move.phase}")
        if job is not None:
            render_job(job, registry)
    sys.exit(0 if ok else 1)
