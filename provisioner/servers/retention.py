"""The tenant servers' step journals, pruned: the part of ``provisioner jobs prune`` that runs on
each tenant server.

Every step a job runs on a tenant server leaves a row in that server's journal
(:mod:`provisioner.servers.journal`), read only by a later attempt of the same run of the same
job, to adopt a step whose checkpoint in ``control`` had not followed. A fleet of 10,000
tenants adds 10,000 rows to its servers at each rollout, and the rows of tenants moved away or
purged stay where they were: nothing else ever deletes them.

A row is **dead** when no attempt can read it again, which ``control`` alone can tell:

* its job is gone from ``control``;
* its run is before the job's current run (a retry, a rollout's re-opening or a requeue of an
  ended job begins a new run, and an attempt reads its own run's rows only);
* its run is the current one and the job has ended (``succeeded``, ``failed``, ``cancelled``:
  nothing runs it again but a new run);
* it names no run (written before the journal's version 2, read by any run) and the job has
  ended.

Deadness only grows: a dead row never comes back to life, so the answer read from ``control``
stays true while the server deletes. A prune deletes dead rows that finished before its
cutoff, in batches of :data:`BATCH` runs, each batch its own transaction on the server; a run
still live (its job queued or running) is never touched. The fences (one row per tenant ever
placed there) stay: a fence is what keeps a holder taken over from writing, and costs one row a
tenant. Each server is reached through :func:`provisioner.servers.fanout.fan_out`: one that is
down is reported, the others are pruned. Pinned by ``tests/integration/test_retention.py``.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from typing import Any
from uuid import UUID

import psycopg
from psycopg.rows import tuple_row

from provisioner import db
from provisioner.servers.directory import CONTROL, directory
from provisioner.servers.fanout import Reached, Target, fan_out, targets

Conn = psycopg.Connection[Any]

#: The journal's runs (job, run) looked up in ``control`` and deleted per transaction.
BATCH = 5_000

# The journal's runs with a row finished before the cutoff, after the last batch's (keyset
# order; a run of NULL sorts first, as -1).
SERVER_RUNS = """
SELECT job_id, run FROM provisioner_server.step_journal
 WHERE finished_at < %(cutoff)s AND (job_id, coalesce(run, -1)) > (%(after_job)s, %(after_run)s)
 GROUP BY job_id, run
 ORDER BY job_id, coalesce(run, -1)
 LIMIT %(limit)s
"""

# Of those runs, the dead ones (see the module), read on control.
DEAD_RUNS = """
SELECT t.job_id, t.run
  FROM unnest(%(jobs)s::uuid[], %(runs)s::int[]) AS t(job_id, run)
  LEFT JOIN control.platform_jobs j ON j.id = t.job_id
 WHERE j.id IS NULL
    OR t.run < j.run
    OR (t.run IS NULL OR t.run = j.run) AND j.status IN ('succeeded', 'failed', 'cancelled')
"""

# The dead runs' rows finished before the cutoff, on the server.
_DEAD = "unnest(%(jobs)s::uuid[], %(runs)s::int[]) AS d(job_id, run)"
_MATCH = "s.job_id = d.job_id AND s.run IS NOT DISTINCT FROM d.run AND s.finished_at < %(cutoff)s"
DELETE_ROWS = f"DELETE FROM provisioner_server.step_journal s USING {_DEAD} WHERE {_MATCH}"
COUNT_ROWS = f"SELECT count(*) FROM provisioner_server.step_journal s, {_DEAD} WHERE {_MATCH}"

#: Run numbers start at 1: a run of NULL sorts as this, before them all.
NO_RUN = -1


@dataclass(frozen=True)
class JournalPruned:
    """One tenant server's journal rows a prune deleted (or, dry, would delete)."""

    server: str
    rows: int | None
    #: why the server was not pruned (None: it was): down, or its login refused
    problem: str | None = None

    def view(self) -> dict[str, Any]:
        return {"server": self.server, "rows": self.rows, "problem": self.problem}


def prune_journals(
    control: Conn,
    owner_url: str,
    cutoff: datetime,
    *,
    dry_run: bool = False,
    on_batch: Callable[[str, int], None] = lambda server, rows: None,
) -> list[JournalPruned]:
    """Delete (or count: ``dry_run``) the dead journal rows finished before ``cutoff`` on every
    tenant server not retired (see the module), by name. ``control``: the owner's connection to
    the control database, in autocommit; ``on_batch``: a server's rows so far, after each
    batch. A server that is down is reported in its entry; the others are pruned."""
    with db.translated():
        found = directory(control)
    servers = [t for t in targets(found, owner_url) if t.name != CONTROL]
    lock = _Serialized(control)

    def work(conn: Conn, target: Target) -> int:
        return _prune_one(conn, target.name, lock, cutoff, dry_run, on_batch)

    reached = fan_out(servers, work, application_name="prune")
    return [_entry(r) for r in reached.values()]


def _entry(reached: Reached[int]) -> JournalPruned:
    return JournalPruned(reached.server, reached.result, reached.problem)


class _Serialized:
    """The control connection, shared by the fan-out's threads one query at a time."""

    def __init__(self, conn: Conn) -> None:
        self.conn = conn
        self._lock = threading.Lock()

    def dead(self, runs: list[tuple[UUID, int | None]]) -> list[tuple[UUID, int | None]]:
        params = {"jobs": [job for job, _ in runs], "runs": [run for _, run in runs]}
        with self._lock, db.translated(), self.conn.cursor(row_factory=tuple_row) as cur:
            return [(row[0], row[1]) for row in cur.execute(DEAD_RUNS, params).fetchall()]


def _prune_one(
    conn: Conn,
    server: str,
    control: _Serialized,
    cutoff: datetime,
    dry_run: bool,
    on_batch: Callable[[str, int], None],
) -> int:
    """One server's journal: walk its runs in batches, ask control which are dead, delete
    their rows (each batch one transaction on the server). Returns the rows deleted."""
    rows = 0
    after: tuple[UUID, int] = (UUID(int=0), NO_RUN - 1)
    while True:
        runs = _server_runs(conn, cutoff, after)
        if not runs:
            return rows
        last_job, last_run = runs[-1]
        after = (last_job, NO_RUN if last_run is None else last_run)
        dead = control.dead(runs)
        if dead:
            rows += _delete(conn, dead, cutoff, dry_run)
            on_batch(server, rows)
        if len(runs) < BATCH:
            return rows


def _server_runs(
    conn: Conn, cutoff: datetime, after: tuple[UUID, int]
) -> list[tuple[UUID, int | None]]:
    params = {"cutoff": cutoff, "after_job": after[0], "after_run": after[1], "limit": BATCH}
    with conn.cursor(row_factory=tuple_row) as cur:
        return [(row[0], row[1]) for row in cur.execute(SERVER_RUNS, params).fetchall()]


def _delete(
    conn: Conn, dead: list[tuple[UUID, int | None]], cutoff: datetime, dry_run: bool
) -> int:
    params = {"jobs": [job for job, _ in dead], "runs": [run for _, run in dead], "cutoff": cutoff}
    with conn.cursor(row_factory=tuple_row) as cur:
        if dry_run:
            row = cur.execute(COUNT_ROWS, params).fetchone()
            return int(row[0]) if row else 0
        with conn.transaction():
            return cur.execute(DELETE_ROWS, params).rowcount
