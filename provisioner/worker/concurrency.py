"""How many engine children a worker runs: ``--concurrency``, else the setting
(``PROVISIONER_WORKER_CONCURRENCY``), else one per core this process may use, at most
:data:`DEFAULT_CAP`.

Why one per core: a tenant's build is mostly the server's DDL and its disk syncs (every index
an empty table gets is written and fsynced on its own; see docs/performance.md), with the
child's round trips and Python in between. One child leaves the server idle while it talks and
the disk idle while it computes; a second child fills those gaps. The usable cores are the
process's CPU affinity (what a container's cpuset allows) and, when a cgroup v2 CPU quota is
set (``docker --cpus``), the quota rounded up.

Why a cap: each child holds two database sessions and an engine's memory; past eight, a bigger
machine is better served by more workers (or an explicit ``--concurrency``) than by one
process opening more connections.

Invariant: the result is a whole number from 1 to :data:`~provisioner.settings.MAX_CONCURRENCY`;
an explicit value (flag or setting) is used as given. Tested by
``tests/integration/test_worker.py::test_a_worker_at_its_defaults_runs_one_child_per_core``.
"""

from __future__ import annotations

import math
import os
from pathlib import Path

from provisioner.settings import MAX_CONCURRENCY, Settings

#: The most children the machine's default gives (an explicit value may say more).
DEFAULT_CAP = 8
#: cgroup v2's CPU quota of this process's group: "max 100000" (none) or "200000 100000".
CGROUP_CPU_MAX = Path("/sys/fs/cgroup/cpu.max")


def worker_concurrency(flag: int | None, settings: Settings) -> int:
    """The children to start: the flag, else the setting, else :func:`machine_default`."""
    chosen = flag or settings.worker_concurrency or machine_default()
    return max(1, min(chosen, MAX_CONCURRENCY))


def machine_default() -> int:
    """One child per usable core, at most :data:`DEFAULT_CAP`."""
    return max(1, min(usable_cores(), DEFAULT_CAP))


def usable_cores() -> int:
    """The cores this process may run on: its CPU affinity, bounded by a cgroup CPU quota."""
    try:
        cores = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # not on Linux
        cores = os.cpu_count() or 1
    quota = _cgroup_quota()
    return max(1, min(cores, quota) if quota else cores)


def _cgroup_quota() -> int | None:
    """The cgroup v2 quota in whole cores, rounded up (None: none set, or no cgroup v2)."""
    try:
        limit, period = CGROUP_CPU_MAX.read_text().split()[:2]
    except (OSError, ValueError):
        return None
    if limit == "max":
        return None
    try:
        return max(1, math.ceil(int(limit) / int(period)))
    except (ValueError, ZeroDivisionError):
        return None
