"""A one-off provisioning process that freezes in a take from a tenant server's warm pool,
after its claim committed on control and before the spare's rename on the server, for the
parent to SIGKILL.

usage: python tests/crash/claim_child.py TENANT
Runs ``service.provision`` like the CLI does, with the take's rename
(:func:`provisioner.pool.server_spares.take_on_server` calls ``rename_spare``) wrapped to print
``FROZEN create_schema claimed`` and sleep until killed instead: nothing of the real code is
replaced, the process only stops there. Settings come from the environment, as for the CLI.
"""

from __future__ import annotations

import sys
import time
from typing import Any

from provisioner import service
from provisioner.pool import server_spares
from provisioner.settings import Settings


def _frozen(*args: Any, **kwargs: Any) -> Any:
    print("FROZEN create_schema claimed", flush=True)
    time.sleep(3600)
    raise AssertionError("never reached: the parent kills this process")


def main() -> None:
    server_spares.rename_spare = _frozen  # type: ignore[assignment]
    service.provision(Settings.load(), sys.argv[1])
    print("FINISHED", flush=True)


if __name__ == "__main__":
    main()
