"""Warming a session: what a job's statements read, touched and planned ahead while the session is
idle.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any
from uuid import UUID

from psycopg.types.json import Jsonb

from provisioner.db.plans import PlanAhead, explain_ahead
from provisioner.queue.claim import CLAIM_NEXT
from provisioner.queue.handoff import CLAIM_NEXT_OPENING
from provisioner.queue.lease import CLOSE_LAST_STEP, CLOSE_STEP_OPEN_NEXT
from provisioner.queue.rows import TENANT_JOB_LOCK_CLASS, Conn

#: What every job's statements read (the queue's tables, the tenant's row, the schema names),
#: touched without a row read or written. A kind adds its own tables (``JobKind.warm_touches``).
QUEUE_TOUCHES: tuple[str, ...] = (
    "SELECT 1 FROM control.platform_jobs WHERE id IS NULL",
    "SELECT 1 FROM control.job_step_runs WHERE id IS NULL",
    "SELECT 1 FROM control.tenants WHERE tenant_id IS NULL",
    "SELECT 1 FROM pg_namespace WHERE nspname IS NULL",
)


def touch_statement(touches: Sequence[str] = ()) -> str:
    """One statement touching :data:`QUEUE_TOUCHES` and ``touches``: a single round trip that
    reloads the catalog cache entries of every table a job reads."""
    selects = dict.fromkeys((*QUEUE_TOUCHES, *touches))
    return "SELECT " + ",\n       ".join(f"({select})" for select in selects)


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
    "first_steps": Jsonb({}),
}


#: What its steps' session runs for every job: the steps' ends, and the claim of the next job
#: that rides on the last one.
STEP_PLANS: tuple[PlanAhead, ...] = (
    (CLOSE_STEP_OPEN_NEXT, _NOTHING),
    (CLOSE_LAST_STEP, _NOTHING),
    (CLAIM_NEXT, _NOTHING),
    (CLAIM_NEXT_OPENING, _NOTHING),
)


def warm(conn: Conn, plans: Sequence[PlanAhead] = (), touches: Sequence[str] = ()) -> None:
    """Run :func:`touch_statement` of ``touches``, then plan each of ``plans`` without running
    it (:func:`~provisioner.db.plans.explain_ahead`).

    A spare of a large template sends more catalog invalidations than the server's queue
    holds, and every session that sat idle meanwhile then empties all its catalog caches; the
    next statements each session plans reload them (a 200-table take planned its grant check
    in 7 ms instead of 1 ms). Planning them now, while idle, loads every cache entry they
    need; the take then only plans again, which its schema rename would make it do anyway.
    """
    with conn.cursor() as cur:
        cur.execute(touch_statement(touches))
    explain_ahead(conn, plans)
