"""What a worker run is asked to do (``provisioner worker``'s own flags), and the fixed timings
its parent runs by. Everything else comes from :class:`~provisioner.settings.Settings`."""

from __future__ import annotations

from dataclasses import dataclass

#: Longest wait between two reconnection attempts after the database went away. Short: an
#: attempt costs the server one refused or rejected connection, and after a failover the worker
#: is back within a second of the new primary (a 5 s cap cost 2.4 s on average there).
RECONNECT_CAP_SECONDS = 1.0
#: How long the children get to start (imports, engine) before the worker gives up.
CHILD_START_TIMEOUT_SECONDS = 120.0
#: After the drain timeout, how long an interrupted child gets to roll back and report.
INTERRUPT_GRACE_SECONDS = 5.0


@dataclass(frozen=True)
class WorkerOptions:
    """``--once`` (drain the queue, then exit), ``--concurrency`` (engine processes; 0: the
    setting's, else one per core, resolved by :func:`~provisioner.worker.run_worker` through
    :mod:`provisioner.worker.concurrency`), ``--allow-superuser`` (run although the owner URL
    connects as a superuser)."""

    once: bool = False
    concurrency: int = 0
    allow_superuser: bool = False
