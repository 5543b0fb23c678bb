"""Lease holder ids: who holds a job's lease, as the queue's ``locked_by`` and the sessions'
``application_name`` show it.

One id per process (``<kind>:<host>:<pid>``), so that the claims of a dead engine process can be
told from a live one's and handed back to the queue, and an operator sees in
``pg_stat_activity`` which process runs which job. A ground module: it imports nothing
of the package, so the worker, the engine and the service all take it from here.
"""

from __future__ import annotations

import os
import socket


def holder_id(kind: str) -> str:
    """A lease holder name, unique per process, visible as the sessions' application_name."""
    return f"{kind}:{socket.gethostname()[:24]}:{os.getpid()}"
