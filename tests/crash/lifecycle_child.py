"""A one-off lifecycle command (suspend, restore, deprovision, purge) that freezes at a chosen
point, for the parent to SIGKILL.

usage: python tests/crash/lifecycle_child.py TENANT JOB_TYPE STEP OUTCOME
Runs ``service.change_lifecycle`` like the CLI does; when the engine reports OUTCOME for STEP
(see provision_child.py), prints ``FROZEN <step> <outcome>`` and sleeps until killed.
"""

from __future__ import annotations

import sys
import time

from provisioner import service
from provisioner.engine import StepEvent
from provisioner.settings import Settings


def main() -> None:
    tenant, job_type, step, outcome = sys.argv[1:5]

    def freeze(event: StepEvent) -> None:
        if event.step == step and event.outcome == outcome:
            print(f"FROZEN {event.step} {event.outcome}", flush=True)
            time.sleep(3600)

    service.change_lifecycle(Settings.from_env(), tenant, job_type, on_progress=freeze)
    print("FINISHED", flush=True)


if __name__ == "__main__":
    main()
