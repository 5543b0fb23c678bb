"""What the engine tells its caller while a job runs: :class:`StepEvent` and the callbacks.

The library never prints: a command renders these events, a worker logs them.
"""

from __future__ import annotations

import enum
from collections.abc import Callable
from dataclasses import dataclass

from provisioner import queue
from provisioner.errors import ProvisionerError
from provisioner.models import Job


class StepOutcome(enum.StrEnum):
    """What happened to one step (a ``str``: compared and rendered as its value)."""

    STARTED = "started"
    #: committed on the tenant's server, its checkpoint in control next (engine/remote.py)
    ON_SERVER = "on_server"
    DONE = "done"
    #: ran again: its effect was gone from the catalog
    REPAIRED = "repaired"
    SKIPPED = "skipped"
    FAILED = "failed"


@dataclass(frozen=True)
class StepEvent:
    """One thing the engine did, for progress output and logs."""

    job: Job
    step: str
    outcome: StepOutcome
    seconds: float = 0.0
    detail: str | None = None


ProgressCallback = Callable[[StepEvent], None]
StopRequested = Callable[[], bool]


def ignore_progress(event: StepEvent) -> None:
    """The default progress callback: report nothing."""
    return None


def never_stop() -> bool:
    """The default stop request: run every step."""
    return False


def describe(exc: BaseException) -> str:
    """A one-line, secret-free account of an error for ``error_detail`` and logs."""
    text = " ".join(str(exc).split())
    if isinstance(exc, ProvisionerError):
        return queue.bounded_error(text or type(exc).__name__)
    return queue.bounded_error(f"{type(exc).__name__}: {text}" if text else type(exc).__name__)
