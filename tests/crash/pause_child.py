"""A one-off provisioning that pauses at a chosen point until told to go on, for the parent to
SIGSTOP it there, let another process take its job over, then wake it (a zombie holder).

usage: python tests/crash/pause_child.py TENANT STEP OUTCOME GO_FILE
When the engine reports OUTCOME for STEP, prints ``PAUSED <step> <outcome>`` and waits until
GO_FILE exists, then goes on; prints ``FINISHED <status>`` or ``REFUSED <error class>: <message>``.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

from provisioner import service
from provisioner.engine import StepEvent
from provisioner.errors import ProvisionerError
from provisioner.settings import Settings


def main() -> None:
    tenant, step, outcome, go = sys.argv[1:5]

    def pause(event: StepEvent) -> None:
        if event.step == step and event.outcome == outcome:
            print(f"PAUSED {event.step} {event.outcome}", flush=True)
            while not Path(go).exists():
                time.sleep(0.05)

    try:
        result = service.provision(Settings.load(), tenant, on_progress=pause)
    except ProvisionerError as exc:
        print(f"REFUSED {type(exc).__name__}: {exc}", flush=True)
        return
    print(f"FINISHED {result.job.status}", flush=True)


if __name__ == "__main__":
    main()
