"""Warming a session: what a job's statements read, touched and planned ahead while the session is
idle.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any
from uuid import UUID

from psycopg.types.json import Jsonb

from provisioner.queue.claim import CLAIM_NEXT
from provisioner.queue.lease import CLOSE_LAST_STEP, CLOSE_STEP_OPEN_NEXT
from provisioner.queue.rows import TENANT_JOB_LOCK_CLASS, Conn

# What a job's statements read, touched without a row read or written: run on a worker child's
# idle sessions after a spare build (Engine.warm) so their catalog caches are loaded again.
WARM = """
SELECT (SELECT 1 FROM control.platform_jobs WHERE id IS NULL),
       (SELECT 1 FROM control.job_step_runs WHERE id IS NULL),
       (SELECT 1 FROM control.tenants WHERE tenant_id IS NULL),
       (SELECT 1 FROM control.tenant_pool WHERE schema_name IS NULL),
       (SELECT 1 FROM pg_namespace WHERE nspname IS NULL)
"""


#: A statement and parameters of the right types for it (values that match nothing), to be
#: planned by :func:`warm` and never run.
PlanAhead = tuple[str, Mapping[str, Any]]


_NOTHING: dict[str, Any] = {
    "id": UUID(int=0),
    "job_id": UUID(int=0),
    "worker": "",
    "attempts": 0,
    "attempt": 0,
    "run": 0,
    "run_id": 0,
    "steps": Jsonb([]),
    "progress": 0,
    "detail": None,
    "tenant_id": "",
    "step": "",
    "next_step": "",
    "job_types": [""],
    "lock_class": TENANT_JOB_LOCK_CLASS,
}


#: What its steps' session runs for every job: the steps' ends, and the claim of the next job
#: that rides on the last one.
STEP_PLANS: tuple[PlanAhead, ...] = (
    (CLOSE_STEP_OPEN_NEXT, _NOTHING),
    (CLOSE_LAST_STEP, _NOTHING),
    (CLAIM_NEXT, _NOTHING),
)


def warm(conn: Conn, plans: Sequence[PlanAhead] = ()) -> None:
    """Run :data:`WARM`, then plan each of ``plans`` without running it (``EXPLAIN``).

    A spare of a large template sends more catalog invalidations than the server's queue
    holds, and every session that sat idle meanwhile then empties all its catalog caches; the
    next statements each session plans reload them (a 200-table take planned its grant check
    in 7 ms instead of 1 ms). Planning them now, while idle, loads every cache entry they
    need; the take then only plans again, which its schema rename would make it do anyway.
    """
    with conn.cursor() as cur:
        cur.execute(WARM)
        for statement, params in plans:
            cur.execute("EXPLAIN " + statement, params)
