"""A one-off ``provisioner move`` that freezes at a chosen point, for the parent to SIGKILL.

usage: python tests/crash/move_child.py TENANT SERVER STEP OUTCOME
Runs :func:`provisioner.fleet.move.move` as the CLI does; when the engine reports OUTCOME for
STEP, prints ``FROZEN <step> <outcome>`` and sleeps until killed.
"""

from __future__ import annotations

import sys
import time

from provisioner.engine import StepEvent
from provisioner.fleet import move
from provisioner.settings import Settings


def main() -> None:
    tenant, server, step, outcome = sys.argv[1:5]

    def freeze(event: StepEvent) -> None:
        if event.step == step and event.outcome == outcome:
            print(f"FROZEN {event.step} {event.outcome}", flush=True)
            time.sleep(3600)

    move.move(Settings.from_env(), tenant, server, on_progress=freeze)
    print("FINISHED", flush=True)


if __name__ == "__main__":
    main()
