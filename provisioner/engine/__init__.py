"""The step engine and the one owner of a job's life in a process.

* :mod:`provisioner.engine.engine`: :class:`Engine` (check the checkpoint, run, record);
* :mod:`provisioner.engine.job_run`: :class:`JobRun`, the one value a job's run is, and where
  it stands between steps;
* :mod:`provisioner.engine.sessions`: the control and steps sessions, and their warm-up;
* :mod:`provisioner.engine.events`: :class:`StepEvent` and the progress callbacks;
* :mod:`provisioner.engine.runner`: claim, run, settle, with a typed :data:`runner.Outcome`;
* :mod:`provisioner.engine.step_lock`: a step transaction's first statement (tenant lock);
* :mod:`provisioner.engine.handoff`: one job's final commit handing the next one over.
"""

from __future__ import annotations

from provisioner.engine.engine import Engine
from provisioner.engine.events import (
    ProgressCallback,
    StepEvent,
    StepOutcome,
    StopRequested,
    describe,
    ignore_progress,
    never_stop,
)
from provisioner.engine.job_run import (
    UNREAD,
    JobRun,
    RunState,
    Turn,
    Unread,
)
from provisioner.engine.sessions import EngineSessions, idle_timeout_ms
from provisioner.engine.step_lock import LOCK_ASYNC_COMMIT
from provisioner.errors import StepFailed

__all__ = [
    "LOCK_ASYNC_COMMIT",
    "UNREAD",
    "Engine",
    "EngineSessions",
    "JobRun",
    "ProgressCallback",
    "RunState",
    "StepEvent",
    "StepFailed",
    "StepOutcome",
    "StopRequested",
    "Turn",
    "Unread",
    "describe",
    "idle_timeout_ms",
    "ignore_progress",
    "never_stop",
]
