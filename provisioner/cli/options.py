"""What several commands share before they call the library: the resolved settings, and the
worker's ``--component`` / ``--job-types`` options (``worker`` and ``health`` take the same)."""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import replace
from typing import Any

import click

from provisioner import service
from provisioner.cli.render import F, say
from provisioner.settings import (
    DEFAULT_COMPONENT,
    DEFAULT_JOB_TYPES,
    MAX_SECONDS,
    MIN_SECONDS,
    Settings,
    parse_job_types,
    seconds_problem,
)


def settings_of(ctx: click.Context) -> Settings:
    """The settings, with the embedded database filled in when no URL is set."""
    settings: Settings = ctx.obj
    return service.resolve(settings, notify=say)


class Seconds(click.FloatRange):
    """A duration flag: the range of every duration setting (:data:`MIN_SECONDS` to
    :data:`MAX_SECONDS`), and NaN refused, which a plain range lets through."""

    def __init__(self) -> None:
        super().__init__(min=MIN_SECONDS, max=MAX_SECONDS)

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        seconds = super().convert(value, param, ctx)
        if seconds_problem(seconds) is not None:
            self.fail(f"{value!r} is not a finite number of seconds", param, ctx)
        return seconds


SECONDS = Seconds()


class WaitSeconds(click.FloatRange):
    """A duration flag that may be 0 (no wait): 0 to :data:`MAX_SECONDS`, NaN refused."""

    def __init__(self) -> None:
        super().__init__(min=0, max=MAX_SECONDS)

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        seconds = super().convert(value, param, ctx)
        if not math.isfinite(seconds):
            self.fail(f"{value!r} is not a finite number of seconds", param, ctx)
        return seconds


#: 0 (no wait) to a week: ``move --finish --grace``.
WAIT_SECONDS = WaitSeconds()
#: Counts that reach SQL: a number PostgreSQL cannot hold is a bad flag (exit 2), not a
#: ``bigint out of range`` from the server. ``LIMIT`` takes a bigint; the rollout's canary and
#: brake are INTEGER columns.
BIGINT_COUNT = click.IntRange(1, 2**63 - 1)
INTEGER_COUNT = click.IntRange(1, 2**31 - 1)


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
