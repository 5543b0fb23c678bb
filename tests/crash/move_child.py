"""A one-off ``provisioner move`` that freezes at a chosen point, for the parent to SIGKILL.

usage: python tests/crash/move_child.py TENANT SERVER STEP OUTCOME [GO_FILE]
Runs :func:`provisioner.fleet.move.move` as the CLI does; when the engine reports OUTCOME for
STEP, prints ``FROZEN <step> <outcome>`` and sleeps until killed (with GO_FILE: until that file
exists, then goes on, and prints ``FINISHED <job status>``).

``precopy_schema fell_back`` is no engine event: the child freezes inside the step, once its
fallback to the dump is committed in the move's job and before the replication's cleanup (the
window between that commit and the step's record).
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

from provisioner.engine import StepEvent
from provisioner.fleet import move
from provisioner.kinds import move_logical
from provisioner.servers import moves
from provisioner.settings import Settings

FELL_BACK = ("precopy_schema", "fell_back")


def freeze_after_the_fallback() -> None:
    """The next cleanup after the fallback's commit prints ``FROZEN`` and never returns."""
    committed: list[bool] = []
    set_fallback, cleanup = moves.set_fallback, move_logical.cleanup

    def recorded(*args: object, **kwargs: object) -> None:
        set_fallback(*args, **kwargs)  # type: ignore[arg-type]
        committed.append(True)  # its session commits before the next call of the step's

    def frozen(*args: object, **kwargs: object) -> None:
        if committed:
            print(f"FROZEN {' '.join(FELL_BACK)}", flush=True)
            time.sleep(3600)
        cleanup(*args, **kwargs)  # type: ignore[arg-type]

    moves.set_fallback = recorded  # type: ignore[assignment]
    move_logical.cleanup = frozen  # type: ignore[assignment]


def main() -> None:
    tenant, server, step, outcome = sys.argv[1:5]
    go = Path(sys.argv[5]) if len(sys.argv) > 5 else None
    if (step, outcome) == FELL_BACK:
        freeze_after_the_fallback()

    def freeze(event: StepEvent) -> None:
        if event.step == step and event.outcome == outcome:
            print(f"FROZEN {event.step} {event.outcome}", flush=True)
            deadline = time.monotonic() + 3600
            while (go is None or not go.exists()) and time.monotonic() < deadline:
                time.sleep(0.05)

    result = move.move(Settings.from_env(), tenant, server, on_progress=freeze)
    status = "" if result.job is None else f" {result.job.status}"
    print(f"FINISHED{status}", flush=True)


if __name__ == "__main__":
    main()
