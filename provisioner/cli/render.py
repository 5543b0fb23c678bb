"""How the command line talks to the person at the terminal: one-line errors with the exit code
on their class, notes on stderr, JSON on stdout, a job's block, its history, and step progress.

Every command renders through these, so a job looks the same (and its JSON has the same shape)
whichever command printed it.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable
from datetime import datetime
from functools import wraps
from typing import TYPE_CHECKING, Any, TypeVar
from uuid import UUID

import click

from provisioner.errors import ProvisionerError
from provisioner.models import Job, JobStatus

# The kinds, the engine and the queue are imported where a job is rendered, not here: the
# top-level group imports this module for its errors, and `provisioner --help` should not load
# every kind's steps (docs/performance.md "Start-up").
if TYPE_CHECKING:
    from provisioner.engine import StepEvent
    from provisioner.kinds import KindRegistry
    from provisioner.queue import JobRunRecord, StepRunRecord

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


def say(message: str) -> None:
    """A note for the person at the terminal (stderr: it never mixes with --json output)."""
    click.echo(message, err=True)


def json_default(value: Any) -> Any:
    """Timestamps in ISO 8601 (with ``T``), anything else as its string."""
    return value.isoformat() if isinstance(value, datetime) else str(value)


def emit_json(value: Any) -> None:
    click.echo(json.dumps(value, indent=2, sort_keys=True, default=json_default))


def builtin_kinds() -> KindRegistry:
    """The built-in kinds: what a job is rendered against when the command names no registry."""
    from provisioner.kinds import BUILTIN

    return BUILTIN


def step_count(job: Job, registry: KindRegistry | None = None) -> str:
    """ "3/6" for a job of a kind with six steps ("3/?" for a kind this build does not run)."""
    kind = (registry or builtin_kinds()).kinds.get(job.job_type)
    total = str(len(kind.step_names)) if kind is not None and kind.handled else "?"
    return f"{len(job.steps_completed)}/{total}"


def ended_line(job: Job | None, seconds: float) -> str:
    """The line after a one-off run's steps: "finished" only when its job did; a job left
    failed or queued for a retry says so (its error is in the job's block printed next)."""
    if job is None or job.status is JobStatus.SUCCEEDED:
        return f"finished in {seconds:.2f} s"
    return f"stopped after {seconds:.2f} s: the job is {job.status.value}, not done (see below)"


def render_job(job: Job, registry: KindRegistry | None = None) -> None:
    click.echo(f"tenant    {job.tenant_id}")
    click.echo(f"job       {job.id} ({job.job_type})")
    click.echo(f"status    {job.status.value}")
    click.echo(f"progress  {job.progress}% ({step_count(job, registry)} steps)")
    click.echo(f"steps     {', '.join(job.steps_completed) or '-'}")
    click.echo(f"run       {job.run}")
    click.echo(f"attempts  {job.attempts}/{job.max_attempts}")
    if job.error_detail:
        click.echo(f"error     {job.error_detail}")
    if job.status is JobStatus.QUEUED and job.attempts and job.available_at:
        click.echo(f"retry at  {job.available_at:%Y-%m-%d %H:%M:%S %Z}")


def run_view(run: StepRunRecord) -> dict[str, Any]:
    """One row of ``control.job_step_runs`` as JSON-ready values."""
    return {
        "attempt": run.attempt,
        "step": run.step,
        "worker": run.worker,
        "started_at": run.started_at,
        "finished_at": run.finished_at,
        "outcome": run.outcome.value,
        "detail": run.detail,
        "job_id": str(run.job_id),
        "job_type": run.job_type,
        "run": run.run,
    }


def job_run_view(run: JobRunRecord) -> dict[str, Any]:
    """One row of ``control.job_runs`` as JSON-ready values."""
    return {
        "job_id": str(run.job_id),
        "run": run.run,
        "job_type": run.job_type,
        "started_by": run.started_by,
        "started_at": run.started_at,
    }


def render_history(runs: list[JobRunRecord], step_runs: list[StepRunRecord]) -> None:
    """What ran for the tenant, run by run and attempt by attempt: which kind, which command
    started each run, and each step's outcome. The answer to "what happened to tenant X"."""
    if not step_runs and not runs:
        return
    click.echo("history")
    by_run: dict[tuple[UUID, int], list[StepRunRecord]] = {}
    started: dict[tuple[UUID, int], datetime] = {}
    for run in runs:
        key = (run.job_id, run.run)
        by_run.setdefault(key, [])
        started[key] = run.started_at
    for step_run in step_runs:
        key = (step_run.job_id, step_run.run)
        by_run.setdefault(key, []).append(step_run)
        started.setdefault(key, step_run.started_at)
    headers = {(r.job_id, r.run): r for r in runs}
    for key in sorted(by_run, key=lambda k: (started[k], k[1])):
        header = headers.get(key)
        kind = header.job_type if header else by_run[key][0].job_type or "?"
        by = f"started by `{header.started_by}`" if header else "started by (unknown)"
        click.echo(f"  run {key[1]}  {kind}  {by}")
        for step_run in by_run[key]:
            click.echo(f"    {history_line(step_run)}")


def history_line(step_run: StepRunRecord) -> str:
    took = ""
    if step_run.finished_at is not None:
        seconds = (step_run.finished_at - step_run.started_at).total_seconds()
        took = f"{seconds * 1000:.0f} ms"
    detail = f"  {step_run.detail}" if step_run.detail else ""
    return (
        f"attempt {step_run.attempt}  {step_run.started_at:%H:%M:%S}  "
        f"{step_run.step:<22} {step_run.outcome:<10} {took:>8}  "
        f"{step_run.worker}{detail}"
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


class StepPrinter:
    """Prints one line per finished step: position in its kind, name, outcome, duration."""

    def __init__(self, quiet: bool, registry: KindRegistry | None = None) -> None:
        self.quiet = quiet
        self.registry = registry or builtin_kinds()

    def __call__(self, event: StepEvent) -> None:
        from provisioner.engine import StepOutcome

        if self.quiet or event.outcome in (StepOutcome.STARTED, StepOutcome.ON_SERVER):
            return
        index, total = self.registry[event.job.job_type].position(event.step)
        skipped, done = event.outcome is StepOutcome.SKIPPED, event.outcome is StepOutcome.DONE
        timing = " " * 10 if skipped else f"{event.seconds * 1000:7.0f} ms"
        note = f"  {event.detail}" if event.detail and not done else ""
        click.echo(f"  [{index}/{total}] {event.step:<22} {event.outcome:<9}{timing}{note}")
