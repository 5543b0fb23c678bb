"""A tenant's lifecycle commands: ``suspend``, ``restore``, ``deprovision`` (``--purge``), each
run now or queued for a worker with ``--queue``, for one tenant or a batch (several ids,
``--from-file``, ``--state``); and ``tenants list``."""

from __future__ import annotations

import sys
import time
from typing import Any, TextIO

import click

from provisioner import kinds, servers, service
from provisioner.cli.options import settings_of
from provisioner.cli.render import (
    F,
    StepPrinter,
    emit_json,
    ended_line,
    fail_cleanly,
    render_job,
    say,
)
from provisioner.errors import InvalidInput
from provisioner.kinds import lifecycle as tenant_lifecycle
from provisioner.models import JobStatus
from provisioner.tenant import checks
from provisioner.tenant.state import TenantState


def run_lifecycle(
    ctx: click.Context, tenant_id: str, job_type: str, *, as_json: bool, queue_only: bool
) -> None:
    """Run (or queue) one lifecycle kind for the tenant and report it; exits with its code."""
    service.TenantId(tenant_id)
    settings = settings_of(ctx)
    kind = kinds.for_settings(settings)[job_type]
    quiet = as_json or queue_only

    def announce() -> None:
        # Once the request is accepted: a refused one prints nothing but its one-line error.
        if not quiet:
            click.echo(f"{kind.command} tenant {tenant_id}")

    started = time.monotonic()
    result = service.change_lifecycle(
        settings,
        tenant_id,
        job_type,
        queue_only=queue_only,
        on_progress=StepPrinter(quiet, kinds.for_settings(settings)),
        on_start=announce,
    )
    job = result.job
    ok = result.already or result.queued or (job is not None and job.status is JobStatus.SUCCEEDED)
    if as_json:
        view = job.view() if job is not None else {"tenant_id": tenant_id, "job_id": None}
        emit_json(
            {
                **view,
                "job_type": job_type,
                "state": result.state,
                "already": result.already,
                "queued": result.queued,
            }
        )
    elif result.queued and job is not None:
        click.echo(str(job.id))
    elif result.already:
        click.echo(f"tenant {tenant_id} is already {result.state}; nothing to do")
    else:
        click.echo(f"{ended_line(job, time.monotonic() - started)}; state {result.state}")
        if job is not None:
            render_job(job, kinds.for_settings(settings))
    sys.exit(0 if ok else 1)


QUEUE_HELP = "Queue the job for a worker (listed in PROVISIONER_WORKER_JOB_TYPES); print its id."


def batch_options(command: F) -> F:
    """Several tenants at once: ids, a file of ids, every tenant in a state; and how many jobs
    of the batch run here at once."""
    command = click.option(
        "--concurrency",
        type=click.IntRange(1, 16),
        default=2,
        help="With several tenants: jobs run here at once, each by an engine of its own.",
    )(command)
    command = click.option(
        "--state",
        "states",
        multiple=True,
        type=click.Choice([s.value for s in TenantState]),
        help="Every tenant in this state (repeatable).",
    )(command)
    return click.option(
        "--from-file",
        "from_file",
        type=click.File("r"),
        default=None,
        help="Tenant ids, one a line ('-' reads stdin; blank lines and # comments skipped).",
    )(command)


def read_ids(handle: TextIO | None) -> list[str]:
    """The ids of ``--from-file``; bytes that are not text in its encoding are InvalidInput (one
    line, exit 2), read before anything is queued."""
    if handle is None:
        return []
    try:
        lines = [line.split("#", 1)[0].strip() for line in handle]
    except UnicodeDecodeError as exc:
        byte = exc.object[exc.start : exc.start + 1].hex()
        raise InvalidInput(
            f"--from-file {str(getattr(handle, 'name', '-'))[:200]} is not {exc.encoding} text "
            f"(it holds byte 0x{byte}): tenant ids go one a line; nothing was queued"
        ) from None
    return [line for line in lines if line]


def run_batch_or_one(
    ctx: click.Context,
    tenant_ids: tuple[str, ...],
    from_file: TextIO | None,
    states: tuple[str, ...],
    job_type: str,
    *,
    as_json: bool,
    queue_only: bool,
    concurrency: int,
) -> None:
    """One tenant named alone runs as it always did; anything more is one batch."""
    if len(tenant_ids) == 1 and from_file is None and not states:
        run_lifecycle(ctx, tenant_ids[0], job_type, as_json=as_json, queue_only=queue_only)
        return
    run_ids(
        ctx,
        [*tenant_ids, *read_ids(from_file)],
        states,
        job_type,
        as_json=as_json,
        queue_only=queue_only,
        concurrency=concurrency,
    )


def run_ids(
    ctx: click.Context,
    ids: list[str],
    states: tuple[str, ...],
    job_type: str,
    *,
    as_json: bool,
    queue_only: bool,
    concurrency: int,
) -> None:
    """Tenants named (and those in ``states``) as one batch; naming none is refused."""
    if not ids and not states:
        raise InvalidInput("name tenants, --from-file PATH or --state S")
    run_batch(
        ctx,
        ids,
        [TenantState(s) for s in states],
        job_type,
        as_json=as_json,
        queue_only=queue_only,
        concurrency=concurrency,
    )


def run_batch(
    ctx: click.Context,
    ids: list[str],
    states: list[TenantState],
    job_type: str,
    *,
    as_json: bool,
    queue_only: bool,
    concurrency: int,
) -> None:
    """Check, queue as one batch, drain here (or leave to the workers), report; exit 0 when
    every tenant ended as asked, 1 when one failed."""
    service.parse_tenant_ids(ids)  # every bad id named, before anything is opened
    settings = settings_of(ctx)
    kind = kinds.for_settings(settings)[job_type]
    started = time.monotonic()

    def show(outcome: service.TenantOutcome) -> None:
        if not as_json and not queue_only:
            click.echo(_outcome_line(outcome))

    report = service.change_lifecycle_many(
        settings,
        job_type,
        ids,
        states=states,
        queue_only=queue_only,
        on_tenant=show,
        concurrency=concurrency,
    )
    failed = [o for o in report.tenants if not o.ok and not report.queued]
    already = [o for o in report.tenants if o.already]
    per_server = report.by_server()
    if as_json:
        emit_json(
            {
                "job_type": job_type,
                "queued": report.queued,
                "batch_size": report.batch_size,
                "tenants": [_outcome_view(o) for o in report.tenants],
                "failed": len(failed),
                "already": len(already),
            }
            | ({"servers": [b.view() for b in per_server]} if per_server else {})
        )
    elif queue_only:
        for outcome in report.tenants:
            job_id = outcome.job.id if outcome.job is not None else "-"
            click.echo(
                f"{outcome.tenant_id}  {'already ' + outcome.state if outcome.already else job_id}"
            )
        say(f"{report.batch_size} {kind.command or job_type} job(s) queued in one batch")
    else:
        click.echo(
            f"{kind.command or job_type}: {len(report.tenants)} tenant(s), {report.batch_size} "
            f"queued in one batch ({report.queue_seconds:.2f} s) and run here, "
            f"{len(already)} already {tenant_lifecycle.RULES[job_type].verb}"
        )
        click.echo(
            f"{len(report.tenants) - len(failed) - len(already)} succeeded, {len(failed)} failed "
            f"in {time.monotonic() - started:.2f} s"
        )
    if not as_json:
        for part in per_server:
            click.echo(
                f"server {part.server}: {part.tenants} tenant(s)"
                + ("" if queue_only else f", {part.succeeded} succeeded, {part.failed} failed")
                + f", {part.already} already"
            )
    sys.exit(1 if failed else 0)


def _outcome_line(outcome: service.TenantOutcome) -> str:
    status = outcome.job.status.value if outcome.job is not None else "-"
    took = f"{outcome.seconds * 1000:7.0f} ms"
    line = f"  {outcome.tenant_id:<24} {status:<10} {outcome.state:<12} {took}"
    return line + (f"  {outcome.error}" if outcome.error else "")


def _outcome_view(outcome: service.TenantOutcome) -> dict[str, Any]:
    return {
        "tenant_id": outcome.tenant_id,
        "job_id": None if outcome.job is None else str(outcome.job.id),
        "status": None if outcome.job is None else outcome.job.status.value,
        "state": outcome.state.value,
        "already": outcome.already,
        "error": outcome.error,
    }


@click.command()
@click.argument("tenant_ids", nargs=-1, metavar="[TENANT_ID]...")
@batch_options
@click.option("--queue", "queue_only", is_flag=True, help=QUEUE_HELP)
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object, no progress.")
@click.pass_context
@fail_cleanly
def suspend(
    ctx: click.Context,
    tenant_ids: tuple[str, ...],
    from_file: TextIO | None,
    states: tuple[str, ...],
    concurrency: int,
    queue_only: bool,
    as_json: bool,
) -> None:
    """Take app_rw's access to the tenants' schemas away at once; data untouched.

    Several tenants (ids, --from-file, --state) are checked, queued as one batch, then run
    here; a bad id, an unknown tenant or a wrong state refuses the whole batch. Exit 0 done,
    1 failed, 2 bad input or wrong state, 3 unknown tenant.
    """
    run_batch_or_one(
        ctx,
        tenant_ids,
        from_file,
        states,
        tenant_lifecycle.SUSPEND_JOB_TYPE,
        as_json=as_json,
        queue_only=queue_only,
        concurrency=concurrency,
    )


@click.command()
@click.argument("tenant_ids", nargs=-1, metavar="[TENANT_ID]...")
@batch_options
@click.option("--queue", "queue_only", is_flag=True, help=QUEUE_HELP)
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object, no progress.")
@click.pass_context
@fail_cleanly
def restore(
    ctx: click.Context,
    tenant_ids: tuple[str, ...],
    from_file: TextIO | None,
    states: tuple[str, ...],
    concurrency: int,
    queue_only: bool,
    as_json: bool,
) -> None:
    """Give suspended or archived tenants their access back, as provisioning grants it.

    The state returns to what it was before suspension. Batches and exit codes as for suspend.
    """
    run_batch_or_one(
        ctx,
        tenant_ids,
        from_file,
        states,
        tenant_lifecycle.RESTORE_JOB_TYPE,
        as_json=as_json,
        queue_only=queue_only,
        concurrency=concurrency,
    )


@click.command()
@click.argument("tenant_ids", nargs=-1, metavar="[TENANT_ID]...")
@batch_options
@click.option("--purge", is_flag=True, help="Drop the tenants' schemas and data (state deleted).")
@click.option("--yes", is_flag=True, help="Do not ask before --purge (needed off a terminal).")
@click.option("--queue", "queue_only", is_flag=True, help=QUEUE_HELP)
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object, no progress.")
@click.pass_context
@fail_cleanly
def deprovision(
    ctx: click.Context,
    tenant_ids: tuple[str, ...],
    from_file: TextIO | None,
    states: tuple[str, ...],
    concurrency: int,
    purge: bool,
    yes: bool,
    queue_only: bool,
    as_json: bool,
) -> None:
    """Offboard tenants: revoke app_rw's access and archive them (data kept, restorable).

    With --purge (also on archived tenants) the schemas are dropped and the state is deleted;
    control rows and job history are kept. Batches and exit codes as for suspend.
    """
    ids = [*tenant_ids, *read_ids(from_file)]
    if len(ids) == 1 and from_file is None and not states:
        service.TenantId(ids[0])
    else:
        service.parse_tenant_ids(ids)
    if purge and not yes:
        if not sys.stdin.isatty() or from_file is not None:
            raise InvalidInput("--purge drops the tenants' data: pass --yes to confirm")
        what = (
            f"schema {service.TenantId(ids[0]).schema}"
            if len(ids) == 1 and not states
            else "the tenants' schemas"
        )
        click.confirm(f"Drop {what} and every row in it? This cannot be undone", abort=True)
    job_type = tenant_lifecycle.PURGE_JOB_TYPE if purge else tenant_lifecycle.DEPROVISION_JOB_TYPE
    if len(ids) == 1 and from_file is None and not states:
        run_lifecycle(ctx, ids[0], job_type, as_json=as_json, queue_only=queue_only)
        return
    run_ids(
        ctx, ids, states, job_type, as_json=as_json, queue_only=queue_only, concurrency=concurrency
    )


@click.group("tenants")
def tenants_group() -> None:
    """The fleet's tenants."""


@tenants_group.command("list")
@click.option(
    "--state",
    "states",
    multiple=True,
    type=click.Choice([s.value for s in TenantState]),
    help="Only tenants in this state (repeatable).",
)
@click.option("--behind", is_flag=True, help="Only tenants behind the template's head.")
@click.option(
    "--drifted",
    is_flag=True,
    help="Only tenants whose last stored check found drift, and those never checked.",
)
@click.option(
    "--check-now",
    is_flag=True,
    help="With --drifted: check the tenants at the head first, list only those found drifted.",
)
@click.option("--include-deleted", is_flag=True, help="List purged tenants too.")
@click.option(
    "--server", default=None, help="Only tenants on this server ('control': the control database)."
)
@click.option("--json", "as_json", is_flag=True, help="Print a JSON array.")
@click.pass_context
@fail_cleanly
def tenants_list(
    ctx: click.Context,
    states: tuple[str, ...],
    behind: bool,
    drifted: bool,
    check_now: bool,
    include_deleted: bool,
    server: str | None,
    as_json: bool,
) -> None:
    """Every tenant (purged ones only with --include-deleted or --state deleted): its state,
    the revision its schema records, whether it is behind, its provisioning job's status.

    A tenant on a tenant server has its revision read there; a server that is down is named
    on stderr and its tenants listed with no revision (exit 0 all the same)."""
    if check_now and not drifted:
        raise InvalidInput("--check-now goes with --drifted")
    wanted = None if server in (None, servers.CONTROL) else servers.server_name(server)
    found = service.list_tenants(
        settings_of(ctx),
        states=[TenantState(s) for s in states] or None,
        behind=behind,
        drifted=drifted,
        check_now=check_now,
        include_deleted=include_deleted,
    )
    if server is not None:
        found = [e for e in found if e.server == wanted]
    # The server column appears once a tenant lives on a tenant server: a deployment with none
    # lists as it always did.
    spread = server is not None or any(e.server is not None for e in found)
    if as_json:
        emit_json([_entry_view(e, spread, drifted) for e in found])
        _report_down(found)
        return
    if not found:
        click.echo("no tenants")
        return
    click.echo(
        f"{'TENANT':<24} {'STATE':<12} {'REVISION':<12} {'BEHIND':<6} {'PROVISIONING':<12}"
        + (f" {'SERVER':<20}" if spread else "")
    )
    for entry in found:
        click.echo(
            f"{entry.tenant_id:<24} {entry.state:<12} {entry.revision or '-':<12} "
            f"{'yes' if entry.behind else 'no':<6} "
            f"{entry.job_status.value if entry.job_status else '-':<12}"
            + (f" {entry.server or servers.CONTROL:<20}" if spread else "")
            + (f"  {_drift_word(entry)}" if drifted else "")
        )
    click.echo(f"{len(found)} tenant(s)")
    if drifted:
        click.echo(_last_checked_line(found))
    _report_down(found)


def _report_down(found: list[service.TenantEntry]) -> None:
    """One line on stderr per tenant server that could not be read (its tenants' revisions
    are unknown), after the list."""
    down: dict[str, tuple[str, int]] = {}
    for entry in found:
        if entry.server is not None and entry.server_down is not None:
            _, count = down.get(entry.server, (entry.server_down, 0))
            down[entry.server] = (entry.server_down, count + 1)
    for server, (why, count) in sorted(down.items()):
        click.echo(
            f"server {server}: DOWN, {count} tenant(s) with no revision read ({why})", err=True
        )


def _drift_word(entry: service.TenantEntry) -> str:
    """What ``--drifted`` says of a listed tenant: drifted (and when checked), or never checked."""
    if entry.last_check is None or entry.last_check.checked_at is None:
        return checks.NEVER_CHECKED
    return f"drifted (checked {entry.last_check.checked_at:%Y-%m-%d %H:%M:%S %Z})"


def _last_checked_line(found: list[service.TenantEntry]) -> str:
    stamps = [e.last_check.checked_at for e in found if e.last_check and e.last_check.checked_at]
    never = sum(1 for e in found if e.last_check is None)
    newest = f"last check {max(stamps):%Y-%m-%d %H:%M:%S %Z}" if stamps else "no stored check"
    hint = "; `provisioner check --all` checks them" if never else ""
    return f"{newest}; {never} tenant(s) never checked{hint}"


def _entry_view(entry: service.TenantEntry, spread: bool, drifted: bool) -> dict[str, Any]:
    located = (
        {"server": entry.server or servers.CONTROL, "server_reachable": entry.server_down is None}
        if spread
        else {}
    )
    checked = entry.last_check.checked_at if entry.last_check else None
    drift = {"checked_at": checked} if drifted else {}
    return (
        located
        | drift
        | {
            "tenant_id": entry.tenant_id,
            "state": entry.state.value,
            "revision": entry.revision or None,
            "behind": entry.behind,
            "provisioning": None if entry.job_status is None else entry.job_status.value,
            "drifted": entry.drifted,
            "updated_at": entry.updated_at,
        }
    )
