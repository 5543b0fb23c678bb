"""A one-off ``repair`` that freezes at a chosen point of its job, for the parent to SIGKILL.

usage: python tests/crash/repair_child.py TENANT STEP OUTCOME
Runs ``service.repair`` like the CLI does; when the engine reports OUTCOME for STEP (see
provision_child.py), prints ``FROZEN <step> <outcome>`` and sleeps until killed.
"""

from __future__ import annotations

import sys
import time

from provisioner import service
from provisioner.engine import StepEvent
from provisioner.settings import Settings


def main() -> None:
    tenant, step, outcome = sys.argv[1:4]

    def freeze(event: StepEvent) -> None:
        if event.step == step and event.outcome == outcome:
            print(f"FROZEN {event.step} {event.outcome}", flush=True)
            time.sleep(3600)

    service.repair(Settings.from_env(), [tenant], on_progress=freeze)
    print("FINISHED", flush=True)


if __name__ == "__main__":
    main()
