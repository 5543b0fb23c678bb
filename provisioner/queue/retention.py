"""The queue's history, pruned: what ``provisioner jobs prune --older-than DAYS`` deletes.

Every step attempt (``control.job_step_runs``), every run of a job (``control.job_runs``) and
every rollout with its tenants (``control.rollouts``, ``rollout_tenants``) is kept until it is
pruned: a fleet of 10,000 tenants adds a run and its step records per tenant at each rollout.
A prune deletes what ended before its cutoff:

* step records whose step ended (an open one, ``running``, is a live engine's: it stays);
* runs of a job before its current one (the current run stays with its job);
* ended rollouts (``completed``, ``aborted``), never the newest, their tenants with them.

The jobs themselves (each tenant's checkpoint and key) are never deleted, nor is anything a
worker reads to decide what to do. Step records go in batches of :data:`BATCH` by id, each its
own transaction, walking the primary key (ids grow with time), so that a prune of millions of
rows holds no lock for long, reports its progress, and, stopped midway, leaves the rest to the
next prune; runs and rollouts, a fraction of that, go in one statement each.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from psycopg.rows import dict_row

from provisioner.queue.rows import Conn

#: Step records deleted per transaction.
BATCH = 10_000

# The cutoff, by the database's clock.
CUTOFF = "SELECT now() - make_interval(days => %(days)s) AS cutoff"

# The step records' ids to walk: up to the newest record begun before the cutoff (a record
# that ended before it began before it).
STEP_RANGE = """
SELECT min(id) AS low, max(id) AS high FROM control.job_step_runs WHERE started_at < %(cutoff)s
"""

# Ended steps' records before the cutoff, in one range of ids.
STEP_FILTER = """
  FROM control.job_step_runs
 WHERE id >= %(low)s AND id < %(high)s AND outcome <> 'running' AND finished_at < %(cutoff)s
"""
DELETE_STEPS = "DELETE" + STEP_FILTER
COUNT_STEPS = "SELECT count(*) AS n" + STEP_FILTER

# A job's runs before its current one, begun before the cutoff.
RUN_FILTER = """
  FROM control.job_runs r USING control.platform_jobs j
 WHERE j.id = r.job_id AND r.run < j.run AND r.started_at < %(cutoff)s
"""
DELETE_RUNS = "DELETE" + RUN_FILTER
COUNT_RUNS = """
SELECT count(*) AS n FROM control.job_runs r JOIN control.platform_jobs j ON j.id = r.job_id
 WHERE r.run < j.run AND r.started_at < %(cutoff)s
"""

# Ended rollouts (provisioner.fleet.rollout.ENDED) last changed before the cutoff, never the
# newest; their tenants go with them (ON DELETE CASCADE), counted first.
OLD_ROLLOUTS = """
SELECT o.id, (SELECT count(*) FROM control.rollout_tenants t WHERE t.rollout_id = o.id) AS n
  FROM control.rollouts o
 WHERE o.state IN ('completed', 'aborted') AND o.updated_at < %(cutoff)s
   AND o.id <> (SELECT max(id) FROM control.rollouts)
"""
DELETE_ROLLOUTS = "DELETE FROM control.rollouts WHERE id = ANY(%(ids)s)"


@dataclass(frozen=True)
class Pruned:
    """What a prune deleted (or, dry, would delete)."""

    cutoff: datetime
    step_records: int
    runs: int
    rollouts: int
    rollout_tenants: int
    dry_run: bool

    def view(self) -> dict[str, Any]:
        return {
            "cutoff": self.cutoff.isoformat(),
            "step_records": self.step_records,
            "runs": self.runs,
            "rollouts": self.rollouts,
            "rollout_tenants": self.rollout_tenants,
            "dry_run": self.dry_run,
        }


def prune(
    conn: Conn,
    days: int,
    *,
    dry_run: bool = False,
    on_batch: Callable[[int], None] = lambda deleted: None,
) -> Pruned:
    """Delete the history that ended more than ``days`` days ago (see the module), or count it
    (``dry_run``). ``conn`` in autocommit: each batch is its own transaction. ``on_batch``: the
    step records deleted so far, after each batch."""
    cutoff = _one(conn, CUTOFF, {"days": days})["cutoff"]
    span = _one(conn, STEP_RANGE, {"cutoff": cutoff})
    steps = 0
    if span["low"] is not None:
        for low in range(int(span["low"]), int(span["high"]) + 1, BATCH):
            window = {"cutoff": cutoff, "low": low, "high": low + BATCH}
            if dry_run:
                steps += int(_one(conn, COUNT_STEPS, window)["n"])
                continue
            with conn.transaction():
                steps += conn.execute(DELETE_STEPS, window).rowcount
            on_batch(steps)
    with conn.transaction(force_rollback=dry_run), conn.cursor(row_factory=dict_row) as cur:
        old = cur.execute(OLD_ROLLOUTS, {"cutoff": cutoff}).fetchall()
        if dry_run:
            runs = int(_one(conn, COUNT_RUNS, {"cutoff": cutoff})["n"])
        else:
            runs = cur.execute(DELETE_RUNS, {"cutoff": cutoff}).rowcount
            cur.execute(DELETE_ROLLOUTS, {"ids": [row["id"] for row in old]})
    return Pruned(
        cutoff=cutoff,
        step_records=steps,
        runs=runs,
        rollouts=len(old),
        rollout_tenants=sum(int(row["n"]) for row in old),
        dry_run=dry_run,
    )


def _one(conn: Conn, query: str, params: dict[str, Any]) -> dict[str, Any]:
    with conn.cursor(row_factory=dict_row) as cur:
        row = cur.execute(query, params).fetchone()
    assert row is not None, "an aggregate returns its row"
    return row
