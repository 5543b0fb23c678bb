"""``provisioner jobs``: the operator's view of the queue (``list``), its levers (``retry``,
``cancel``) and its history's retention (``prune``)."""

from __future__ import annotations

import shutil
import sys
import textwrap

import click

from provisioner import service
from provisioner.cli.options import BIGINT_COUNT, settings_of
from provisioner.cli.render import emit_json, fail_cleanly, step_count
from provisioner.errors import InvalidInput


@click.group()
def jobs() -> None:
    """Operator view of the queue, and its levers."""


@jobs.command("list")
@click.option("--status", "status_filter", help="Only jobs in this status.")
@click.option("--tenant", "tenant_id", default=None, help="Only this tenant's jobs.")
@click.option("--kind", default=None, help="Only jobs of this job type.")
@click.option("--limit", type=BIGINT_COUNT, default=50, help="At most this many jobs.")
@click.option("--json", "as_json", is_flag=True, help="Print a JSON array of jobs.")
@click.pass_context
@fail_cleanly
def jobs_list(
    ctx: click.Context,
    status_filter: str | None,
    tenant_id: str | None,
    kind: str | None,
    limit: int,
    as_json: bool,
) -> None:
    """Running jobs first (with live progress), then the most recently changed; a job's error
    follows its row, wrapped to the terminal's width (never cut)."""
    found = service.list_jobs(
        settings_of(ctx), status=status_filter, limit=limit, tenant=tenant_id, kind=kind
    )
    if as_json:
        emit_json([j.view() for j in found])
        return
    if not found:
        click.echo("no jobs")
        return
    click.echo(
        f"{'JOB':<36}  {'KIND':<18} {'TENANT':<20} {'STATUS':<9} {'PROG':>4}  RUN  ATT  HOLDER"
    )
    width = max(shutil.get_terminal_size().columns, 60)
    for j in found:
        click.echo(
            f"{j.id!s:<36}  {j.job_type:<18} {(j.tenant_id or '-'):<20} {j.status.value:<9} "
            f"{j.progress:>3}%  {j.run:>3}  {j.attempts}/{j.max_attempts}  {j.locked_by or ''}"
        )
        for line in wrap_error(j.error_detail, width):
            click.echo(line)


def wrap_error(error: str | None, width: int) -> list[str]:
    """A job's error under its row, indented and wrapped at word boundaries, whole."""
    if not error:
        return []
    return textwrap.wrap(
        f"error: {error}",
        width - 1,
        initial_indent="    ",
        subsequent_indent="      ",
        break_long_words=False,
        break_on_hyphens=False,
    )


@jobs.command("retry")
@click.argument("job_id", required=False)
@click.option("--failed", "every_failed", is_flag=True, help="Every failed job, in one command.")
@click.option("--kind", default=None, help="With --failed: only jobs of this job type.")
@click.pass_context
@fail_cleanly
def jobs_retry(
    ctx: click.Context, job_id: str | None, every_failed: bool, kind: str | None
) -> None:
    """Queue a failed or cancelled job again (or every failed one with --failed), attempts
    reset, finished steps kept."""
    if every_failed == bool(job_id):
        raise InvalidInput("name one job to retry, or pass --failed (not both)")
    if kind is not None and not every_failed:
        raise InvalidInput("--kind goes with --failed")
    if every_failed:
        retried = service.retry_failed(settings_of(ctx), kind)
        click.echo(f"{len(retried)} failed job(s) queued again")
        return
    assert job_id is not None
    job = service.retry_job(settings_of(ctx), job_id)
    click.echo(f"job {job.id} queued again, run {job.run} ({step_count(job)} steps done)")


@jobs.command("cancel")
@click.argument("job_id")
@click.pass_context
@fail_cleanly
def jobs_cancel(ctx: click.Context, job_id: str) -> None:
    """Cancel a queued or running job; a running holder stops recording at its next step."""
    job = service.cancel_job(settings_of(ctx), job_id)
    click.echo(f"job {job.id} cancelled")


@jobs.command("prune")
@click.option(
    "--older-than",
    "days",
    type=click.IntRange(0, 36500),
    required=True,
    help="Delete the history that ended more than this many days ago (0: all that ended).",
)
@click.option("--dry-run", is_flag=True, help="Count what would be deleted; delete nothing.")
@click.option("--json", "as_json", is_flag=True, help="Print the counts as one JSON object.")
@click.pass_context
@fail_cleanly
def jobs_prune(ctx: click.Context, days: int, dry_run: bool, as_json: bool) -> None:
    """Delete the queue's history that ended before the cutoff: ended steps' records, a job's
    runs before its current one, ended rollouts but the newest, and each tenant server's
    journal rows that no run reads again. Jobs (each tenant's checkpoint) are never deleted.
    Progress goes to stderr; a tenant server that is down is reported (exit 1)."""

    def progress(deleted: int) -> None:
        if not as_json:
            click.echo(f"... {deleted:,} step records deleted", err=True)

    def server_progress(server: str, rows: int) -> None:
        if not as_json:
            click.echo(f"... server {server}: {rows:,} journal rows", err=True)

    pruned = service.prune_history(
        settings_of(ctx),
        days,
        dry_run=dry_run,
        on_batch=progress,
        on_server_batch=server_progress,
    )
    if as_json:
        emit_json(pruned.view())
    else:
        _print_pruned(pruned, dry_run)
    if pruned.down:
        sys.exit(1)  # what could be pruned was; the down server's journal was not


def _print_pruned(pruned: service.HistoryPruned, dry_run: bool) -> None:
    verb = "would delete" if dry_run else "deleted"
    history = pruned.control
    click.echo(
        f"{verb} {history.step_records:,} step records, {history.runs:,} earlier runs and "
        f"{history.rollouts:,} rollouts ({history.rollout_tenants:,} rollout tenants) that ended "
        f"before {history.cutoff:%Y-%m-%d %H:%M:%S %Z}"
    )
    for server in pruned.journals:
        if server.problem is not None:
            click.echo(f"server {server.server}: DOWN, its journal not pruned ({server.problem})")
        else:
            click.echo(f"server {server.server}: {verb} {server.rows or 0:,} journal rows")
