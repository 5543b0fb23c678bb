"""The ``provisioner`` command: parse, call one library function, render, map errors to exits.

Exit codes: 0 success; 1 the work failed (or the worker is not ready); 2 bad input or a
configuration that cannot work; 3 unknown tenant or job.
"""

from __future__ import annotations

import json
import sys
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import replace
from datetime import UTC, datetime
from functools import wraps
from typing import Any, TypeVar

import click

from provisioner import kinds, logs, service
from provisioner.engine import StepEvent
from provisioner.errors import InvalidInput, ProvisionerError
from provisioner.kinds import lifecycle as tenant_lifecycle
from provisioner.models import Job
from provisioner.settings import DEFAULT_COMPONENT, DEFAULT_JOB_TYPES, Settings, parse_job_types
from provisioner.templates import migrations
from provisioner.version import __version__
from provisioner.worker import WorkerOptions, run_worker

F = TypeVar("F", bound=Callable[..., Any])


def fail_cleanly(func: F) -> F:
    """Turn package errors into one line on stderr and the exit code on their class."""

    @wraps(func)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return func(*args, **kwargs)
        except ProvisionerError as exc:
            click.echo(f"error: {exc}", err=True)
            sys.exit(exc.exit_code)

    return wrapper  # type: ignore[return-value]


def settings_of(ctx: click.Context) -> Settings:
    """The settings, with the embedded database filled in when no URL is set."""
    settings: Settings = ctx.obj
    return service.resolve(settings, notify=say)


def say(message: str) -> None:
    """A note for the person at the terminal (stderr: it never mixes with --json output)."""
    click.echo(message, err=True)


def _json_default(value: Any) -> Any:
    """Timestamps in ISO 8601 (with ``T``), anything else as its string."""
    return value.isoformat() if isinstance(value, datetime) else str(value)


def emit_json(value: Any) -> None:
    click.echo(json.dumps(value, indent=2, sort_keys=True, default=_json_default))


def step_count(job: Job, registry: kinds.KindRegistry = kinds.BUILTIN) -> str:
    """ "3/6" for a job of a kind with six steps ("3/?" for a kind this build does not run)."""
    kind = registry.kinds.get(job.job_type)
    total = str(len(kind.step_names)) if kind is not None and kind.handled else "?"
    return f"{len(job.steps_completed)}/{total}"


def render_job(job: Job, registry: kinds.KindRegistry = kinds.BUILTIN) -> None:
    click.echo(f"tenant    {job.tenant_id}")
    click.echo(f"job       {job.id} ({job.job_type})")
    click.echo(f"status    {job.status.value}")
    click.echo(f"progress  {job.progress}% ({step_count(job, registry)} steps)")
    click.echo(f"steps     {', '.join(job.steps_completed) or '-'}")
    click.echo(f"run       {job.run}")
    click.echo(f"attempts  {job.attempts}/{job.max_attempts}")
    if job.error_detail:
        click.echo(f"error     {job.error_detail}")
    if job.status.value == "queued" and job.attempts and job.available_at:
        click.echo(f"retry at  {job.available_at:%Y-%m-%d %H:%M:%S %Z}")


def run_view(run: dict[str, Any]) -> dict[str, Any]:
    """One row of ``control.job_step_runs`` as JSON-ready values."""
    keys = ("attempt", "step", "worker", "started_at", "finished_at", "outcome", "detail")
    view = {key: run[key] for key in keys}
    view.update(job_id=str(run["job_id"]), job_type=run.get("job_type"), run=run.get("run", 1))
    return view


def job_run_view(run: dict[str, Any]) -> dict[str, Any]:
    """One row of ``control.job_runs`` as JSON-ready values."""
    keys = ("run", "job_type", "started_by", "started_at")
    return {"job_id": str(run["job_id"]), **{key: run[key] for key in keys}}


def render_history(runs: list[dict[str, Any]], step_runs: list[dict[str, Any]]) -> None:
    """What ran for the tenant, run by run and attempt by attempt: which kind, which command
    started each run, and each step's outcome. The answer to "what happened to tenant X"."""
    if not step_runs and not runs:
        return
    click.echo("history")
    by_run: dict[tuple[Any, int], list[dict[str, Any]]] = {}
    started: dict[tuple[Any, int], Any] = {}
    for run in runs:
        key = (run["job_id"], run["run"])
        by_run.setdefault(key, [])
        started[key] = run["started_at"]
    for step_run in step_runs:
        key = (step_run["job_id"], step_run.get("run", 1))
        by_run.setdefault(key, []).append(step_run)
        started.setdefault(key, step_run["started_at"])
    headers = {(r["job_id"], r["run"]): r for r in runs}
    for key in sorted(by_run, key=lambda k: (started[k], k[1])):
        header = headers.get(key)
        kind = header["job_type"] if header else by_run[key][0].get("job_type") or "?"
        by = f"started by `{header['started_by']}`" if header else "started by (unknown)"
        click.echo(f"  run {key[1]}  {kind}  {by}")
        for step_run in by_run[key]:
            click.echo(f"    {history_line(step_run)}")


def history_line(step_run: dict[str, Any]) -> str:
    took = ""
    if step_run["finished_at"] is not None:
        seconds = (step_run["finished_at"] - step_run["started_at"]).total_seconds()
        took = f"{seconds * 1000:.0f} ms"
    detail = f"  {step_run['detail']}" if step_run["detail"] else ""
    return (
        f"attempt {step_run['attempt']}  {step_run['started_at']:%H:%M:%S}  "
        f"{step_run['step']:<22} {step_run['outcome']:<10} {took:>8}  "
        f"{step_run['worker']}{detail}"
    )


class OneLineErrors(click.Group):
    """Click's usage errors (a bad flag value, a missing argument) as ONE line on stderr, exit 2,
    like the package's own errors, instead of click's three-line usage block."""

    def main(self, *args: Any, **kwargs: Any) -> Any:
        kwargs["standalone_mode"] = False
        try:
            code = super().main(*args, **kwargs)
        except click.ClickException as exc:
            ctx: click.Context | None = getattr(exc, "ctx", None)  # set on usage errors
            if type(exc).__name__ == "NoArgsIsHelpError" and ctx is not None:
                click.echo(ctx.get_help())  # a bare group (`provisioner jobs`): its help, exit 0
                sys.exit(0)
            where = f" (see `{ctx.command_path} --help`)" if ctx is not None else ""
            click.echo(f"error: {exc.format_message()}{where}", err=True)
            sys.exit(exc.exit_code)
        except click.Abort:
            click.echo("aborted", err=True)
            sys.exit(1)
        sys.exit(code if isinstance(code, int) else 0)


@click.group(
    cls=OneLineErrors,
    context_settings={"help_option_names": ["-h", "--help"], "show_default": True},
    invoke_without_command=True,
)
@click.version_option(__version__, prog_name="provisioner")
@click.option(
    "--owner-url", envvar="MIGRATIONS_DATABASE_URL", show_envvar=True, help="Owner role URL (DDL)."
)
@click.option(
    "--app-url", envvar="APP_DATABASE_URL", show_envvar=True, help="app_rw role URL (rows only)."
)
@click.pass_context
@fail_cleanly
def main(ctx: click.Context, owner_url: str | None, app_url: str | None) -> None:
    """Resumable tenant provisioning for schema-per-tenant PostgreSQL.

    With no database URL set, commands run on an embedded PostgreSQL under .provisioner/.
    """
    if ctx.invoked_subcommand is None:  # bare `provisioner`: the help, and success
        click.echo(ctx.get_help())
        ctx.exit(0)
    settings = Settings.from_env()
    ctx.obj = replace(
        settings,
        migrations_database_url=owner_url or settings.migrations_database_url,
        app_database_url=app_url or settings.app_database_url,
    )


@main.command()
@click.pass_context
@fail_cleanly
def migrate(ctx: click.Context) -> None:
    """Bring the control schema to head (a no-op when it is there)."""
    settings: Settings = ctx.obj
    settings = service.resolve(settings, migrate=False, notify=say)
    before, after = service.migrate(settings)
    if before == after:
        click.echo(f"control schema already at head ({after})")
    else:
        click.echo(f"control schema upgraded {before or '(empty)'} -> {after}")


class StepPrinter:
    """Prints one line per finished step: position in its kind, name, outcome, duration."""

    def __init__(self, quiet: bool, registry: kinds.KindRegistry = kinds.BUILTIN) -> None:
        self.quiet = quiet
        self.registry = registry

    def __call__(self, event: StepEvent) -> None:
        if self.quiet or event.outcome == "started":
            return
        index, total = self.registry[event.job.job_type].position(event.step)
        timing = f"{event.seconds * 1000:7.0f} ms" if event.outcome != "skipped" else " " * 10
        note = f"  {event.detail}" if event.detail and event.outcome != "done" else ""
        click.echo(f"  [{index}/{total}] {event.step:<22} {event.outcome:<9}{timing}{note}")


@main.command()
@click.argument("tenant_id")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object, no progress.")
@click.option(
    "--reuse-deleted", is_flag=True, help="Provision a purged (deleted) tenant id from scratch."
)
@click.pass_context
@fail_cleanly
def provision(ctx: click.Context, tenant_id: str, as_json: bool, reuse_deleted: bool) -> None:
    """Provision TENANT_ID now; resume it if half done. Exit 0 done, 1 failed, 2 bad input
    or a suspended, archived or deleted tenant."""
    service.TenantId(tenant_id)  # bad input is refused before anything starts or is created
    settings = settings_of(ctx)
    if not as_json:
        click.echo(f"provisioning tenant {tenant_id}")
    started = time.monotonic()
    result = service.provision(
        settings,
        tenant_id,
        on_progress=StepPrinter(as_json, kinds.for_settings(settings)),
        reuse_deleted=reuse_deleted,
    )
    job = result.job
    if as_json:
        emit_json({**job.view(), "already_provisioned": result.already_provisioned})
    else:
        if result.already_provisioned:
            click.echo(f"tenant {tenant_id} is already provisioned; nothing to do")
        else:
            click.echo(f"finished in {time.monotonic() - started:.2f} s")
        render_job(job, kinds.for_settings(settings))
    sys.exit(0 if job.status.value == "succeeded" else 1)


EMBEDDED_WORKER_HINT = (
    "note: no worker serves the embedded database on its own; run one against it with "
    '`eval "$(provisioner local env)" && provisioner worker`, '
    "or provision now with `provisioner provision {tenant}`"
)


@main.command()
@click.argument("tenant_id")
@click.option("--json", "as_json", is_flag=True, help="Print the job as one JSON object.")
@click.pass_context
@fail_cleanly
def enqueue(ctx: click.Context, tenant_id: str, as_json: bool) -> None:
    """Queue TENANT_ID for a worker (idempotent); print the job id."""
    service.TenantId(tenant_id)
    embedded = ctx.obj.embedded
    result = service.enqueue(settings_of(ctx), tenant_id)
    if as_json:
        emit_json({**result.job.view(), "created": result.created, "requeued": result.requeued})
    else:
        click.echo(str(result.job.id))
    if embedded and not result.job.status.terminal:
        click.echo(EMBEDDED_WORKER_HINT.format(tenant=tenant_id), err=True)


@main.command()
@click.argument("tenant_ids", nargs=-1, metavar="[TENANT_ID]...")
@click.option("--all", "every", is_flag=True, help="Every provisioned tenant.")
@click.option("--dry-run", is_flag=True, help="Say which tenants are behind; queue nothing.")
@click.option("--details", is_flag=True, help="List every tenant behind, not the first ten.")
@click.option(
    "--canary",
    type=click.IntRange(min=1),
    default=None,
    help="Queue N tenants first, then stop for review.",
)
@click.option("--then-all", is_flag=True, help="With --canary: continue once the canary succeeded.")
@click.option(
    "--max-failures",
    type=click.IntRange(min=1),
    default=None,
    help="Hold the rest after K failures.",
)
@click.option("--resume", is_flag=True, help="Continue the rollout after review or a halt.")
@click.option("--abort", is_flag=True, help="Drop what the rollout has not started.")
@click.option("--watch", is_flag=True, help="Follow the latest rollout live.")
@click.option(
    "--interval",
    type=click.FloatRange(min=0, min_open=True),
    default=1.0,
    show_default=True,
    help="Seconds between --watch frames.",
)
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object.")
@click.pass_context
@fail_cleanly
def upgrade(
    ctx: click.Context,
    tenant_ids: tuple[str, ...],
    every: bool,
    dry_run: bool,
    details: bool,
    canary: int | None,
    then_all: bool,
    max_failures: int | None,
    resume: bool,
    abort: bool,
    watch: bool,
    interval: float,
    as_json: bool,
) -> None:
    """Queue provisioned tenants whose schema is behind the template's head for a worker.

    Run it after a release that adds tenant_template revisions (migrate, roll the workers,
    then upgrade --all). Only run_tenant_migrations runs again, in place. Exit 0 done,
    1 the canary failed (--then-all), 2 bad input or no rollout to resume/abort, 3 unknown tenant.
    """
    levers = [
        name for name, on in (("--resume", resume), ("--abort", abort), ("--watch", watch)) if on
    ]
    if levers:
        if len(levers) > 1 or every or tenant_ids:
            raise InvalidInput(f"{' '.join(levers)} goes alone (no tenants, no --all)")
        settings = settings_of(ctx)
        if resume:
            resumed = service.upgrade_resume(settings)
            click.echo(
                f"rollout {resumed.rollout.id} resumed: {resumed.queued} tenant(s) queued, "
                f"{resumed.released} held job(s) released"
            )
        elif abort:
            aborted = service.upgrade_abort(settings)
            click.echo(
                f"rollout {aborted.rollout.id} aborted: {aborted.dropped_jobs} job(s) not started "
                "dropped (those tenants stay at their old head); running jobs finish"
            )
        else:
            watch_rollout(settings, interval, as_json)
        return
    if every == bool(tenant_ids):
        raise InvalidInput("name tenants to upgrade, or pass --all (not both)")
    if then_all and canary is None:
        raise InvalidInput("--then-all goes with --canary N")
    for tenant_id in tenant_ids:
        service.TenantId(tenant_id)
    settings = settings_of(ctx)
    report = service.upgrade(
        settings,
        list(tenant_ids) or None,
        dry_run=dry_run,
        canary=canary,
        max_failures=max_failures,
    )
    if as_json:
        emit_json(upgrade_view(report))
    else:
        print_upgrade(report, details)
    if report.rollout_id is not None and canary is not None and canary < len(report.behind):
        if not then_all:
            if not as_json:
                click.echo(
                    f"rollout {report.rollout_id}: canary of {canary} queued; review it, then "
                    "`provisioner upgrade --resume` (or `--abort`)"
                )
            return
        counts = service.wait_for_canary(settings, report.rollout_id)
        if set(counts) - {"succeeded"}:
            click.echo(
                f"rollout {report.rollout_id}: the canary did not succeed "
                f"({', '.join(f'{n} {s}' for s, n in sorted(counts.items()))}); the rest is "
                "not queued: see `provisioner upgrade --watch`, then --resume or --abort",
                err=True,
            )
            sys.exit(1)
        resumed = service.upgrade_resume(settings)
        if not as_json:
            click.echo(
                f"rollout {report.rollout_id}: canary succeeded; {resumed.queued} more tenant(s) "
                "queued"
            )


def print_upgrade(report: service.UpgradeReport, details: bool) -> None:
    at = ", ".join(f"{n} at {v}" for v, n in report.versions_behind().items())
    click.echo(
        f"tenant template head {migrations.head_label(report.heads)}: {report.checked} provisioned "
        f"tenant(s) checked, {len(report.behind)} behind" + (f" ({at})" if at else "")
    )
    actions = Counter(item.action for item in report.behind)
    if report.behind:
        click.echo(
            ", ".join(f"{actions[a]} tenant(s) {a}" for a in ACTIONS if actions[a])
            + ("" if report.rollout_id is None else f" (rollout {report.rollout_id})")
        )
    shown = report.behind if details else report.behind[:LISTED]
    for item in shown:
        at_label = migrations.head_label(item.versions) or "(no version table)"
        click.echo(f"  {item.job.tenant_id:<24} at {at_label:<20} {item.action}  job {item.job.id}")
    if len(report.behind) > len(shown):
        click.echo(f"  ... and {len(report.behind) - len(shown)} more (--details lists them all)")
    if report.skipped:
        names = ", ".join(f"{s.tenant_id} ({s.state})" for s in report.skipped[:LISTED])
        more = len(report.skipped) - LISTED
        click.echo(
            f"{len(report.skipped)} tenant(s) skipped, suspended, archived or deleted: {names}"
            + (f" and {more} more" if more > 0 else "")
        )
    if report.unfinished:
        names = ", ".join(f"{j.tenant_id} ({j.status.value})" for j in report.unfinished[:LISTED])
        more = len(report.unfinished) - LISTED
        click.echo(
            f"{len(report.unfinished)} tenant(s) not checked, their job has not succeeded "
            f"(they reach head when it runs; see `provisioner jobs list`): {names}"
            + (f" and {more} more" if more > 0 else "")
        )


@main.command()
@click.argument("tenant_ids", nargs=-1, metavar="[TENANT_ID]...")
@click.option("--all", "every", is_flag=True, help="Every provisioned tenant.")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object.")
@click.pass_context
@fail_cleanly
def check(ctx: click.Context, tenant_ids: tuple[str, ...], every: bool, as_json: bool) -> None:
    """Compare tenants' catalogs with what the template head builds (read-only).

    Reports extra, missing and altered objects and missing grants. Exit 0 clean, 1 drift found.
    """
    if every == bool(tenant_ids):
        raise InvalidInput("name tenants to check, or pass --all (not both)")
    for tenant_id in tenant_ids:
        service.TenantId(tenant_id)
    report = service.check(settings_of(ctx), list(tenant_ids) or None)
    if as_json:
        emit_json(
            {
                "heads": sorted(report.heads),
                "tenants": [
                    {
                        "tenant_id": t.tenant_id,
                        "state": t.state.value,
                        "versions": sorted(t.versions),
                        "drift": [
                            {
                                "kind": d.kind.value,
                                "section": d.section,
                                "name": d.name,
                                "detail": d.detail,
                            }
                            for d in t.drifts
                        ],
                    }
                    for t in report.tenants
                ],
            }
        )
    else:
        states = Counter(t.state.value for t in report.tenants)
        click.echo(
            f"tenant template head {migrations.head_label(report.heads)}: "
            f"{len(report.tenants)} tenant(s) checked: "
            + ", ".join(f"{n} {state}" for state, n in sorted(states.items()))
        )
        for tenant in report.tenants:
            if tenant.state.value == "behind":
                at = migrations.head_label(tenant.versions)
                click.echo(f"  {tenant.tenant_id}: behind (at {at}; see `provisioner upgrade`)")
            for drift in tenant.drifts:
                click.echo(
                    f"  {tenant.tenant_id}: {drift.kind.value} {drift.section} {drift.name}: "
                    f"{drift.detail}"
                )
    sys.exit(1 if report.drifted else 0)


def watch_rollout(settings: Settings, interval: float, as_json: bool) -> None:
    """Frames of the latest rollout until nothing is queued or running (one with --json). On a
    terminal each frame replaces the last (the screen is cleared); piped, frames follow each
    other, one block per interval."""
    redraw = sys.stdout.isatty()
    while True:
        frame = service.upgrade_progress(settings)
        if as_json:
            emit_json(progress_view(frame))
            return
        if frame.rollout is None:
            click.echo("no rollout yet: `provisioner upgrade --all` starts one")
            return
        heads = service.tenants_per_head(settings)
        phases = ", ".join(
            f"{frame.phases.get(p, 0)} {p}"
            for p in ("done", "running", "queued", "held", "failed", "pending", "dropped")
        )
        if redraw:
            click.clear()
        rate = f"{frame.rate_per_minute:.0f} tenants/min" if frame.rate_per_minute else "-"
        eta = f"{frame.eta_minutes * 60:.0f} s" if frame.eta_minutes is not None else "-"
        click.echo(
            f"{time.strftime('%H:%M:%S')} rollout {frame.rollout.id} to {frame.rollout.head} "
            f"({frame.rollout.state}): {phases}; rate {rate}, ETA {eta}"
        )
        click.echo("  tenants per head: " + ", ".join(f"{h} {n}" for h, n in heads.items()))
        for failure in frame.failures:
            click.echo(
                f"  {failure.tenant_id} ({failure.status}, attempt {failure.attempts}): "
                f"{failure.error[:160]}"
            )
        if frame.finished:
            return
        time.sleep(interval)


def progress_view(frame: Any) -> dict[str, Any]:
    rollout = frame.rollout
    return {
        "rollout": None
        if rollout is None
        else {
            "id": rollout.id,
            "head": rollout.head,
            "state": rollout.state,
            "canary": rollout.canary,
            "max_failures": rollout.max_failures,
        },
        "phases": frame.phases,
        "rate_per_minute": frame.rate_per_minute,
        "eta_minutes": frame.eta_minutes,
        "failures": [
            {"tenant_id": f.tenant_id, "status": f.status, "attempts": f.attempts, "error": f.error}
            for f in frame.failures
        ],
        "finished": frame.finished,
    }


#: The actions of an upgrade report, in the order a summary lists them.
ACTIONS = ("queued", "pending", "would queue")

#: Tenants listed by name in a text report; --details (or --json) lists every one.
LISTED = 10


def upgrade_view(report: service.UpgradeReport) -> dict[str, Any]:
    return {
        "heads": sorted(report.heads),
        "checked": report.checked,
        "behind_by_version": report.versions_behind(),
        "behind": [
            {
                "tenant_id": item.job.tenant_id,
                "versions": sorted(item.versions),
                "action": item.action,
                "job_id": str(item.job.id),
            }
            for item in report.behind
        ],
        "unfinished": [
            {"tenant_id": j.tenant_id, "job_id": str(j.id), "status": j.status.value}
            for j in report.unfinished
        ],
        "skipped": [{"tenant_id": s.tenant_id, "state": s.state} for s in report.skipped],
        "rollout_id": report.rollout_id,
    }


@main.command()
@click.argument("tenant_id")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object.")
@click.option("--watch", is_flag=True, help="Follow the tenant until its job ends.")
@click.option(
    "--interval",
    type=click.FloatRange(min=0, min_open=True),
    default=1.0,
    help="Seconds between --watch polls.",
)
@click.pass_context
@fail_cleanly
def status(ctx: click.Context, tenant_id: str, as_json: bool, watch: bool, interval: float) -> None:
    """Show TENANT_ID's provisioning state. Exit 3 if the tenant is unknown."""
    service.TenantId(tenant_id)
    settings = settings_of(ctx)
    last: tuple[Any, ...] | None = None
    while True:
        current = service.status(settings, tenant_id)
        job = current.job
        if as_json and not watch:
            emit_json(
                {
                    **job.view(),
                    "state": current.tenant.state if current.tenant else None,
                    "step_runs": [run_view(run) for run in current.step_runs],
                    "runs": [job_run_view(run) for run in current.runs],
                }
            )
            return
        snapshot = (job.status, job.progress, job.attempts, job.error_detail)
        if not watch:
            render_job(job, kinds.for_settings(settings))
            if current.tenant:
                click.echo(f"state     {current.tenant.state}")
            render_history(current.runs, current.step_runs)
            return
        if snapshot != last:
            now = datetime.now(UTC).astimezone()
            if as_json:
                line = {**job.view(), "at": now.isoformat()}
                click.echo(json.dumps(line, default=_json_default))
            else:
                click.echo(
                    f"{now:%H:%M:%S}  {job.status.value:<9} {job.progress:3d}%  "
                    f"attempt {job.attempts}  {', '.join(job.steps_completed) or '-'}"
                    + (f"  error: {job.error_detail}" if job.error_detail else "")
                )
            last = snapshot
        if job.status.terminal:
            sys.exit(0 if job.status.value == "succeeded" else 1)
        time.sleep(interval)


def run_lifecycle(
    ctx: click.Context, tenant_id: str, job_type: str, *, as_json: bool, queue_only: bool
) -> None:
    """Run (or queue) one lifecycle kind for the tenant and report it; exits with its code."""
    service.TenantId(tenant_id)
    settings = settings_of(ctx)
    kind = kinds.for_settings(settings)[job_type]
    quiet = as_json or queue_only
    if not quiet:
        click.echo(f"{kind.command} tenant {tenant_id}")
    started = time.monotonic()
    result = service.change_lifecycle(
        settings,
        tenant_id,
        job_type,
        queue_only=queue_only,
        on_progress=StepPrinter(quiet, kinds.for_settings(settings)),
    )
    job = result.job
    ok = result.already or result.queued or (job is not None and job.status.value == "succeeded")
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
        click.echo(f"finished in {time.monotonic() - started:.2f} s; state {result.state}")
        if job is not None:
            render_job(job, kinds.for_settings(settings))
    sys.exit(0 if ok else 1)


QUEUE_HELP = "Queue the job for a worker (listed in PROVISIONER_WORKER_JOB_TYPES); print its id."


@main.command()
@click.argument("tenant_id")
@click.option("--queue", "queue_only", is_flag=True, help=QUEUE_HELP)
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object, no progress.")
@click.pass_context
@fail_cleanly
def suspend(ctx: click.Context, tenant_id: str, queue_only: bool, as_json: bool) -> None:
    """Take app_rw's access to TENANT_ID's schema away at once; data untouched.

    Exit 0 done, 1 failed, 2 bad input or wrong state, 3 unknown tenant.
    """
    run_lifecycle(
        ctx, tenant_id, tenant_lifecycle.SUSPEND_JOB_TYPE, as_json=as_json, queue_only=queue_only
    )


@main.command()
@click.argument("tenant_id")
@click.option("--queue", "queue_only", is_flag=True, help=QUEUE_HELP)
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object, no progress.")
@click.pass_context
@fail_cleanly
def restore(ctx: click.Context, tenant_id: str, queue_only: bool, as_json: bool) -> None:
    """Give a suspended or archived TENANT_ID its access back, as provisioning grants it.

    The state returns to what it was before suspension. Exit codes as for suspend.
    """
    run_lifecycle(
        ctx, tenant_id, tenant_lifecycle.RESTORE_JOB_TYPE, as_json=as_json, queue_only=queue_only
    )


@main.command()
@click.argument("tenant_id")
@click.option("--purge", is_flag=True, help="Drop the tenant's schema and data (state deleted).")
@click.option("--yes", is_flag=True, help="Do not ask before --purge (needed off a terminal).")
@click.option("--queue", "queue_only", is_flag=True, help=QUEUE_HELP)
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object, no progress.")
@click.pass_context
@fail_cleanly
def deprovision(
    ctx: click.Context, tenant_id: str, purge: bool, yes: bool, queue_only: bool, as_json: bool
) -> None:
    """Offboard TENANT_ID: revoke app_rw's access and archive it (data kept, restorable).

    With --purge (also on an archived tenant) the schema is dropped and the state is deleted;
    control rows and job history are kept. Exit codes as for suspend.
    """
    service.TenantId(tenant_id)
    if purge and not yes:
        if not sys.stdin.isatty():
            raise InvalidInput("--purge drops the tenant's data: pass --yes to confirm")
        click.confirm(
            f"Drop schema tenant_{tenant_id} and every row in it? This cannot be undone",
            abort=True,
        )
    job_type = tenant_lifecycle.PURGE_JOB_TYPE if purge else tenant_lifecycle.DEPROVISION_JOB_TYPE
    run_lifecycle(ctx, tenant_id, job_type, as_json=as_json, queue_only=queue_only)


SECONDS = click.FloatRange(min=0, min_open=True)


def component_options(*, component_help: str, job_types_help: str) -> Callable[[F], F]:
    """``--component`` and ``--job-types``: which heartbeat component (and the job types it
    advertises) a command is about; the worker and ``health`` take the same two options."""

    def decorate(command: F) -> F:
        command = click.option(
            "--job-types",
            envvar="PROVISIONER_WORKER_JOB_TYPES",
            show_envvar=True,
            default=",".join(DEFAULT_JOB_TYPES),
            help=job_types_help,
        )(command)
        return click.option(
            "--component",
            envvar="PROVISIONER_WORKER_COMPONENT",
            show_envvar=True,
            default=DEFAULT_COMPONENT,
            help=component_help,
        )(command)

    return decorate


def for_component(base: Settings, component: str | None, job_types: str | None) -> Settings:
    """``base`` with the component and job types the options named (else as configured)."""
    return replace(
        base,
        worker_component=component or base.worker_component,
        worker_job_types=(
            parse_job_types(job_types) if job_types is not None else base.worker_job_types
        ),
    )


@main.command()
@click.option("--once", is_flag=True, help="Drain every claimable job, then exit 0.")
@click.option(
    "--concurrency",
    type=click.IntRange(1, 64),
    default=1,
    show_default=True,
    help="Jobs at once, each in its own child process.",
)
@click.option(
    "--log-format",
    type=click.Choice(logs.LOG_FORMATS),
    default="human",
    show_default=True,
    help="One line per event: human-readable or JSON.",
)
@click.option(
    "--poll-interval",
    type=SECONDS,
    envvar="PROVISIONER_POLL_SECONDS",
    show_envvar=True,
    default=Settings.poll_interval_seconds,
    help="Seconds between polls when no wake-up arrives.",
)
@click.option(
    "--stale-after",
    type=SECONDS,
    envvar="PROVISIONER_JOB_STALE_AFTER_SECONDS",
    show_envvar=True,
    default=Settings.job_stale_after_seconds,
    help="Seconds after which a running job's lease has expired.",
)
@click.option(
    "--heartbeat",
    type=SECONDS,
    envvar="PROVISIONER_HEARTBEAT_SECONDS",
    show_envvar=True,
    default=Settings.heartbeat_seconds,
    help="Seconds between heartbeats and lease renewals.",
)
@click.option(
    "--drain-timeout",
    type=SECONDS,
    envvar="PROVISIONER_DRAIN_TIMEOUT_SECONDS",
    show_envvar=True,
    default=Settings.drain_timeout_seconds,
    help="On SIGTERM/SIGINT, seconds the running step gets to finish.",
)
@component_options(
    component_help="Heartbeat component name.",
    job_types_help="Comma-separated job types to claim.",
)
@click.option(
    "--allow-superuser",
    is_flag=True,
    help="Run even when MIGRATIONS_DATABASE_URL connects as a superuser.",
)
@click.pass_context
@fail_cleanly
def worker(
    ctx: click.Context,
    once: bool,
    concurrency: int,
    log_format: str,
    poll_interval: float | None,
    stale_after: float | None,
    heartbeat: float | None,
    drain_timeout: float | None,
    component: str | None,
    job_types: str | None,
    allow_superuser: bool,
) -> None:
    """The long-running worker: claim and provision queued tenants. Exit 0 on a clean stop.

    Needs MIGRATIONS_DATABASE_URL and APP_DATABASE_URL (never the embedded database).
    """
    base: Settings = ctx.obj
    settings = replace(
        base,
        poll_interval_seconds=poll_interval or base.poll_interval_seconds,
        job_stale_after_seconds=stale_after or base.job_stale_after_seconds,
        heartbeat_seconds=heartbeat or base.heartbeat_seconds,
        drain_timeout_seconds=drain_timeout or base.drain_timeout_seconds,
    )
    settings = for_component(settings, component, job_types)
    options = WorkerOptions(once=once, concurrency=concurrency, allow_superuser=allow_superuser)
    sys.exit(run_worker(settings, options, logs.configure(log_format)))


@main.command()
@click.option("--json", "as_json", is_flag=True, help="Print what was seen as JSON.")
@component_options(
    component_help="Component to check.",
    job_types_help="Comma-separated job types the component must advertise.",
)
@click.option("--check-storage", is_flag=True, help="Also check the object store from here.")
@click.pass_context
@fail_cleanly
def health(
    ctx: click.Context,
    as_json: bool,
    component: str | None,
    job_types: str | None,
    check_storage: bool,
) -> None:
    """Ready (exit 0) when the worker's heartbeat is fresh and advertises its job types."""
    settings = for_component(settings_of(ctx), component, job_types)
    report = service.health(settings)
    view = report.view()
    ready = report.ready
    if check_storage:
        storage = service.check_storage(settings)
        view["storage"] = storage
        ready = ready and bool(storage["ready"])
    view["ready"] = ready
    if as_json:
        emit_json(view)
    else:
        for c in report.components:
            click.echo(f"{c.component}: {'ready' if c.ready else 'NOT READY'} ({c.reason})")
        if check_storage:
            click.echo(
                f"object store: {'ready' if view['storage']['ready'] else 'NOT READY'} "
                f"({view['storage']['detail']})"
            )
    sys.exit(0 if ready else 1)


@main.group()
def jobs() -> None:
    """Operator view of the queue, and its levers."""


@jobs.command("list")
@click.option("--status", "status_filter", help="Only jobs in this status.")
@click.option("--limit", type=click.IntRange(min=1), default=50, help="At most this many jobs.")
@click.option("--json", "as_json", is_flag=True, help="Print a JSON array of jobs.")
@click.pass_context
@fail_cleanly
def jobs_list(ctx: click.Context, status_filter: str | None, limit: int, as_json: bool) -> None:
    """Running jobs first (with live progress), then the most recently changed."""
    found = service.list_jobs(settings_of(ctx), status=status_filter, limit=limit)
    if as_json:
        emit_json([j.view() for j in found])
        return
    if not found:
        click.echo("no jobs")
        return
    click.echo(
        f"{'JOB':<36}  {'KIND':<18} {'TENANT':<20} {'STATUS':<9} {'PROG':>4}  RUN  ATT  "
        "HOLDER / ERROR"
    )
    for j in found:
        tail = j.locked_by or (j.error_detail or "")[:60]
        click.echo(
            f"{j.id!s:<36}  {j.job_type:<18} {(j.tenant_id or '-'):<20} {j.status.value:<9} "
            f"{j.progress:>3}%  {j.run:>3}  {j.attempts}/{j.max_attempts}  {tail}"
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


@main.group()
def local() -> None:
    """The embedded PostgreSQL under .provisioner/ (used when no database URL is set)."""


@local.command("stop")
@click.pass_context
@fail_cleanly
def local_stop(ctx: click.Context) -> None:
    """Stop the embedded PostgreSQL (its data stays for the next run)."""
    settings: Settings = ctx.obj
    state_dir = service.local_pg.locate_state_dir(settings.state_dir)
    stopped = service.local_pg.stop_embedded(state_dir)
    click.echo("embedded PostgreSQL stopped" if stopped else "embedded PostgreSQL is not running")


def export_lines(urls: service.local_pg.EmbeddedUrls) -> list[str]:
    return [
        f"export MIGRATIONS_DATABASE_URL={urls.owner}",
        f"export APP_DATABASE_URL={urls.app}",
        f"export OBJECT_STORE_PATH={urls.objects}",
    ]


@local.command("status")
@click.pass_context
@fail_cleanly
def local_status(ctx: click.Context) -> None:
    """Say whether the embedded PostgreSQL runs, where, and its URLs. Exit 0 running, 1 not."""
    settings: Settings = ctx.obj
    state_dir = service.local_pg.locate_state_dir(settings.state_dir)
    cluster = service.local_pg.embedded_cluster(state_dir)
    if not cluster.running():
        click.echo(f"not running (state folder {state_dir})")
        sys.exit(1)
    click.echo(f"running on 127.0.0.1:{cluster.port}, data in {cluster.data}")
    click.echo(f"state folder {state_dir}")
    for line in export_lines(service.local_pg.embedded_urls(state_dir)):
        click.echo(line.removeprefix("export "))


@local.command("env")
@click.pass_context
@fail_cleanly
def local_env(ctx: click.Context) -> None:
    """Print export lines for the embedded database's URLs (starting it if needed), so that a
    worker can serve it: eval "$(provisioner local env)" && provisioner worker"""
    settings: Settings = ctx.obj
    resolved = service.resolve(
        replace(settings, migrations_database_url=None, app_database_url=None), notify=say
    )
    urls = service.local_pg.embedded_urls(resolved.state_dir)
    for line in export_lines(urls):
        click.echo(line)
