"""Rollouts: the ``rollouts pause ID`` and ``rollouts resume ID`` levers, and how a rollout is
shown: ``upgrade --watch`` (a progress bar redrawn in place on a terminal, plain lines when
piped), the summary it ends with, the failure list, its JSON frame, and the exit code a watch
ends with.

Exit codes of ``upgrade --watch`` (and of ``--watch --json`` once the rollout has stopped):
0 the rollout completed (or its canary succeeded and waits for review) and no tenant failed;
1 it halted on its brake, was paused, was aborted, or a tenant failed.
Exit codes of ``rollouts pause`` / ``resume``: 0 done; 2 no such rollout, or one in a state the
lever does not apply to (pausing a finished, aborted, halted or paused rollout).
"""

from __future__ import annotations

import getpass
import shutil
import socket
import sys
import textwrap
import time
from typing import Any, TextIO

import click

from provisioner import service
from provisioner.cli.options import settings_of
from provisioner.cli.render import emit_json, fail_cleanly
from provisioner.fleet.rollout import PHASES, Failure, Progress, Resumed, Summary
from provisioner.settings import Settings

#: Exit code of a watch whose rollout halted, was aborted, or has a failed tenant.
EXIT_NOT_CLEAN = 1

#: Failures listed by name in text; ``--json`` lists up to a hundred.
LISTED_FAILURES = 10

BAR_WIDTH = 24

#: Tenants listed by name when a resume skips some.
LISTED = 10


@click.group("rollouts")
def rollouts_group() -> None:
    """Levers on one rollout, by id (`upgrade --watch` shows the latest).

    A paused rollout starts no new upgrade (its queued jobs are held); the jobs already running
    finish. Exit 0 done, 2 no such rollout or not in a state the lever applies to.
    """


def operator() -> str:
    """Who pulls a lever from this terminal, as ``paused_by`` records it: user@host."""
    try:
        user = getpass.getuser()
    except (OSError, KeyError):  # no login name and no passwd entry (a bare container)
        user = "?"
    return f"{user}@{socket.gethostname()[:32]}"


@rollouts_group.command()
@click.argument("rollout_id", type=click.IntRange(min=1), metavar="ID")
@click.pass_context
@fail_cleanly
def pause(ctx: click.Context, rollout_id: int) -> None:
    """Pause a running rollout: hold its queued upgrades; running ones finish."""
    paused = service.rollout_pause(
        settings_of(ctx), rollout_id, paused_by=f"rollouts pause ({operator()})"
    )
    click.echo(
        f"rollout {paused.rollout.id} {paused.rollout.state_label}: {paused.held} queued "
        f"job(s) held, {paused.running} running job(s) finish; "
        f"`provisioner rollouts resume {paused.rollout.id}` continues it"
    )


@rollouts_group.command()
@click.argument("rollout_id", type=click.IntRange(min=1), metavar="ID")
@click.pass_context
@fail_cleanly
def resume(ctx: click.Context, rollout_id: int) -> None:
    """Resume a paused or halted rollout, or one whose canary waits for review."""
    click.echo(resumed_line(service.upgrade_resume(settings_of(ctx), rollout_id=rollout_id)))


def resumed_line(resumed: Resumed) -> str:
    skipped = ", ".join(f"{s.tenant_id} ({s.state})" for s in resumed.skipped[:LISTED])
    more = len(resumed.skipped) - LISTED
    return (
        f"rollout {resumed.rollout.id} resumed: {resumed.queued} tenant(s) queued, "
        f"{resumed.released} held job(s) released"
        + (
            f"; {len(resumed.skipped)} skipped, left the fleet: {skipped}"
            + (f" and {more} more" if more > 0 else "")
            if resumed.skipped
            else ""
        )
        + ("; nothing left to run: completed" if resumed.state == "completed" else "")
    )


def watch(settings: Settings, interval: float, as_json: bool) -> None:
    """Follow the latest rollout until it stops (ends, halts, or its canary waits for review),
    then print its summary and exit with :func:`exit_code`. With ``as_json``, one frame."""
    frame = service.upgrade_progress(settings)
    if as_json:
        emit_json(progress_view(frame))
        sys.exit(exit_code(frame) if frame.stopped else 0)
    if frame.rollout is None:
        click.echo("no rollout yet: `provisioner upgrade --all` starts one")
        return
    screen = Screen(sys.stdout)
    while True:
        screen.show(frame_lines(frame, live=screen.live))
        if frame.stopped:
            break
        time.sleep(interval)
        frame = service.upgrade_progress(settings)
    screen.close()
    for line in final_lines(frame, service.tenants_per_head(settings)):
        click.echo(line)
    sys.exit(exit_code(frame))


def exit_code(frame: Progress) -> int:
    return 0 if frame.clean else EXIT_NOT_CLEAN


class Screen:
    """On a terminal, each frame replaces the last in place (cursor up, clear to the end of
    the screen); elsewhere a frame is printed as plain lines only when it changed."""

    def __init__(self, out: TextIO) -> None:
        self.out = out
        self.live = out.isatty()
        self.drawn = 0
        self.last: list[str] = []

    def show(self, lines: list[str]) -> None:
        if not self.live:
            if lines != self.last:
                self.out.write("".join(f"{line}\n" for line in lines))
                self.out.flush()
            self.last = lines
            return
        width = shutil.get_terminal_size().columns
        clipped = [line[: max(width - 1, 20)] for line in lines]
        up = f"\x1b[{self.drawn}F" if self.drawn else "\r"
        self.out.write(up + "\x1b[J" + "\n".join(clipped) + "\n")
        self.out.flush()
        self.drawn = len(clipped)

    def close(self) -> None:
        self.out.flush()


def bar(done: int, total: int, width: int = BAR_WIDTH) -> str:
    filled = width if total == 0 else min(width, done * width // total)
    return "[" + "#" * filled + "-" * (width - filled) + "]"


def _duration(seconds: float) -> str:
    if seconds < 60:
        return f"{seconds:.1f} s"
    minutes, rest = divmod(int(seconds), 60)
    if minutes < 60:
        return f"{minutes} min {rest:02d} s"
    return f"{minutes // 60} h {minutes % 60:02d} min"


def frame_lines(frame: Progress, *, live: bool) -> list[str]:
    """One frame: the rollout, its bar (on a terminal), counts, rate and ETA; on a terminal,
    the first failures under it."""
    rollout = frame.rollout
    assert rollout is not None
    phases = frame.phases
    total = sum(n for p, n in phases.items() if p not in ("skipped", "dropped"))
    settled = phases.get("done", 0) + phases.get("failed", 0)
    counts = ", ".join(f"{phases.get(p, 0)} {p}" for p in PHASES if phases.get(p) or p == "done")
    rate = f"{frame.rate_per_minute:.0f} tenants/min" if frame.rate_per_minute else "rate -"
    eta = f"ETA {_duration(frame.eta_minutes * 60)}" if frame.eta_minutes is not None else "ETA -"
    head = f"rollout {rollout.id} to {rollout.head} ({rollout.state_label})"
    if not live:
        return [f"{time.strftime('%H:%M:%S')} {head}: {settled}/{total}; {counts}; {rate}, {eta}"]
    lines = [f"{head} {bar(settled, total)} {settled}/{total}  {rate}  {eta}", f"  {counts}"]
    lines += [f"  {_failure_head(f)}: {f.error}" for f in frame.failures[:5]]
    for server, by_phase in frame.servers.items():
        lines.append(f"  server {server}: " + ", ".join(f"{n} {p}" for p, n in by_phase.items()))
    return lines


def _failure_head(failure: Failure) -> str:
    return f"{failure.tenant_id} ({failure.phase}, attempt {failure.attempts})"


def summary_line(state: str, rollout_id: int, summary: Summary) -> str:
    started = ", ".join(f"{n} from {rev}" for rev, n in summary.upgraded_from.items())
    rate = f"; {summary.rate_per_minute:.0f} tenants/min" if summary.rate_per_minute else ""
    parts = [
        f"{summary.upgraded} upgraded" + (f" ({started})" if started else ""),
        f"{summary.failed} failed",
        f"{summary.skipped} skipped (left the fleet)",
    ]
    if summary.held:
        parts.append(f"{summary.held} held")
    if summary.dropped:
        parts.append(f"{summary.dropped} dropped (not started)")
    return (
        f"rollout {rollout_id} {state} after {_duration(summary.seconds)}: "
        + ", ".join(parts)
        + rate
    )


NEXT_STEP = {
    "halted": "halted by its brake: fix, `provisioner jobs retry --failed`, then "
    "`provisioner upgrade --resume` (or `--abort`)",
    "canary": "the canary waits for review: `provisioner upgrade --resume` (or `--abort`)",
    "paused": "paused: what ran has finished, nothing more starts until "
    "`provisioner rollouts resume {id}` (or `provisioner upgrade --abort`)",
}


def final_lines(frame: Progress, heads: dict[str, int]) -> list[str]:
    """What a watch ends with: the summary, the revisions the fleet is at, what to do next,
    and the failures, each with its phase and its error wrapped (never cut)."""
    rollout, summary = frame.rollout, frame.summary
    assert rollout is not None and summary is not None
    lines = [summary_line(rollout.state_label, rollout.id, summary)]
    lines.append("tenants per head: " + (", ".join(f"{h} {n}" for h, n in heads.items()) or "-"))
    if rollout.state in NEXT_STEP:
        lines.append(NEXT_STEP[rollout.state].format(id=rollout.id))
    lines += failure_lines(frame.failures, summary.failed)
    return lines


def failure_lines(failures: list[Failure], failed: int) -> list[str]:
    if not failures:
        return []
    others = len(failures) - sum(1 for f in failures if f.phase == "failed")
    title = f"failures: {failed} failed" + (
        f", {others} more with an earlier attempt's error" if others else ""
    )
    width = max(shutil.get_terminal_size().columns, 60)
    lines = [title]
    for failure in failures[:LISTED_FAILURES]:
        lines.append(f"  {_failure_head(failure)}")
        lines += textwrap.wrap(
            failure.error, width - 6, initial_indent="    ", subsequent_indent="    "
        )
    if len(failures) > LISTED_FAILURES:
        more = len(failures) - LISTED_FAILURES
        lines.append(f"  ... and {more} more (`upgrade --watch --json` lists them)")
    return lines


def progress_view(frame: Progress) -> dict[str, Any]:
    rollout, summary = frame.rollout, frame.summary
    return {
        "rollout": None
        if rollout is None
        else {
            "id": rollout.id,
            "head": rollout.head,
            "state": rollout.state.value,
            "canary": rollout.canary,
            "max_failures": rollout.max_failures,
            "created_at": rollout.created_at,
            "finished_at": rollout.finished_at,
            "paused_by": rollout.paused_by,
            "paused_at": rollout.paused_at,
        },
        "phases": frame.phases,
        **({"servers": frame.servers} if frame.servers else {}),
        "rate_per_minute": frame.rate_per_minute,
        "eta_minutes": frame.eta_minutes,
        "failures": [
            {"tenant_id": f.tenant_id, "phase": f.phase, "attempts": f.attempts, "error": f.error}
            for f in frame.failures
        ],
        "finished": frame.finished,
        "stopped": frame.stopped,
        "summary": None
        if summary is None
        else {
            "state": rollout.state_label if rollout else None,
            "upgraded": summary.upgraded,
            "failed": summary.failed,
            "skipped": summary.skipped,
            "dropped": summary.dropped,
            "held": summary.held,
            "upgraded_from": summary.upgraded_from,
            "seconds": round(summary.seconds, 3),
            "rate_per_minute": summary.rate_per_minute,
        },
    }
