"""What several commands share before they call the library: the resolved settings, and the
worker's ``--component`` / ``--job-types`` options (``worker`` and ``health`` take the same)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace

import click

from provisioner import service
from provisioner.cli.render import F, say
from provisioner.settings import DEFAULT_COMPONENT, DEFAULT_JOB_TYPES, Settings, parse_job_types


def settings_of(ctx: click.Context) -> Settings:
    """The settings, with the embedded database filled in when no URL is set."""
    settings: Settings = ctx.obj
    return service.resolve(settings, notify=say)


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
