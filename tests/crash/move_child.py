"""A one-off ``provisioner move`` that freezes at a chosen point, for the parent to SIGKILL.

usage: python tests/crash/move_child.py TENANT SERVER STEP OUTCOME [GO_FILE]
Runs :func:`provisioner.fleet.move.move` as the CLI does; when the engine reports OUTCOME for
STEP, prints ``FROZEN <step> <outcome>`` and sleeps until killed (with GO_FILE: until that file
exists, then goes on, and prints ``FINISHED <job status>``).
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

from provisioner.engine import StepEvent
from provisioner.fleet import move
from provisioner.settings import Settings


def main() -> None:
    tenant, server, step, outcome = sys.argv[1:5]
    go = Path(sys.argv[5]) if len(sys.argv) > 5 else None

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
