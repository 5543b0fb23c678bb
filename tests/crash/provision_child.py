"""A one-off provisioning process that freezes at a chosen point, for the parent to SIGKILL.

usage: python tests/crash/provision_child.py TENANT STEP OUTCOME
Runs ``service.provision`` like the CLI does; when the engine reports OUTCOME ('done': the
step's transaction has committed; 'started': the step runs inside its open transaction) for
STEP, prints ``FROZEN <step> <outcome>`` and sleeps until killed. Settings come from the
environment and the project file of the working directory, as for the CLI.
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

    service.provision(Settings.load(), tenant, on_progress=freeze)
    print("FINISHED", flush=True)


if __name__ == "__main__":
    main()
