"""The claim's cost as ``control.platform_jobs`` fills with finished rows.

One queued job at a time is enqueued (committed, not timed) and claimed through the queue's own
statement (:data:`provisioner.queue.CLAIM_NEXT`): the statement is timed, then its commit on its
own. Measured with 0 finished rows (the baseline), then 100,000 and 1,000,000, inserted in bulk
by ``INSERT ... SELECT generate_series`` and analysed. The EXPLAIN (ANALYZE) of the claim at
1,000,000 rows goes into the output: the partial index on queued rows keeps it flat.
"""

from __future__ import annotations

import time
from typing import Any

import psycopg

from bench.cluster import BenchCluster, say
from bench.figures import Figure, Results
from provisioner import queue
from provisioner.kinds.provision import PROVISION_JOB_TYPE

CLAIMS = 200
#: Finished rows at the last measure (a tenth of them at the one before).
ROWS = 1_000_000

# Finished rows as the queue leaves them: mostly succeeded, some failed or cancelled, each with
# its idempotency key (the unique index grows with them), all long past.
FILL_FINISHED = """
INSERT INTO control.platform_jobs
    (job_type, status, progress, steps_completed, attempts, max_attempts, idempotency_key,
     available_at, finished_at, created_at, updated_at)
SELECT 'provision_tenant',
       CASE WHEN g %% 50 = 0 THEN 'failed' WHEN g %% 97 = 0 THEN 'cancelled'
            ELSE 'succeeded' END,
       100, '[]'::jsonb, 1, 5, 'bench:' || g,
       now() - interval '30 days' + g * interval '1 second',
       now() - interval '30 days' + g * interval '1 second',
       now() - interval '30 days' + g * interval '1 second',
       now() - interval '30 days' + g * interval '1 second'
  FROM generate_series(%(start)s::bigint, %(stop)s::bigint) AS g
"""


def _fill(url: str, start: int, stop: int) -> float:
    began = time.perf_counter()
    with psycopg.connect(url) as conn:
        conn.execute(FILL_FINISHED, {"start": start, "stop": stop})
        conn.commit()
        conn.autocommit = True
        conn.execute("VACUUM ANALYZE control.platform_jobs")
    return time.perf_counter() - began


def _claims(url: str) -> tuple[list[float], list[float]]:
    statement: list[float] = []
    commit: list[float] = []
    # The owner's: the worker claims as the owner (control c005), app_rw may not.
    with psycopg.connect(url) as conn:
        for _ in range(CLAIMS):
            queue.enqueue(conn, PROVISION_JOB_TYPE, payload={"bench": True})
            conn.commit()
            with conn.cursor() as cur:
                began = time.perf_counter()
                cur.execute(queue.CLAIM_NEXT, CLAIM_PARAMS)
                row = cur.fetchone()
                middle = time.perf_counter()
            conn.commit()
            ended = time.perf_counter()
            assert row is not None, "the claim found no queued job"
            statement.append((middle - began) * 1000)
            commit.append((ended - middle) * 1000)
            # Finish it, as a worker would, so the queue holds one claimable job at a time.
            conn.execute(
                "UPDATE control.platform_jobs SET status = 'succeeded', finished_at = now() "
                "WHERE id = %s",
                (row[0],),
            )
            conn.commit()
    return statement, commit


CLAIM_PARAMS = {
    "job_types": [PROVISION_JOB_TYPE],
    "worker": "bench",
    "lock_class": queue.TENANT_JOB_LOCK_CLASS,
}


def _explain(url: str) -> str:
    with psycopg.connect(url) as conn:
        queue.enqueue(conn, PROVISION_JOB_TYPE, payload={"bench": True})
        conn.commit()
        rows: list[Any] = conn.execute(
            "EXPLAIN (ANALYZE, BUFFERS, COSTS OFF) " + queue.CLAIM_NEXT,
            CLAIM_PARAMS,
        ).fetchall()
        conn.rollback()
    return "\n".join(row[0] for row in rows)


def run(cluster: BenchCluster, results: Results, rows: int = ROWS) -> None:
    """The claim at 0, ``rows // 10`` and ``rows`` finished rows (``claim_100k`` and ``claim_1m``
    at the default)."""
    first = rows // 10
    with cluster.database("claim") as database:
        statement, commit = _claims(database.owner_url)
        results.add(
            Figure("claim_0", "claim statement, 0 finished rows", "ms", statement, note="baseline")
        )
        seconds = _fill(database.owner_url, 1, first)
        say(f"  claim: {first:,} finished rows inserted and analysed in {seconds:.1f} s")
        statement, commit = _claims(database.owner_url)
        results.add(
            Figure(
                "claim_100k",
                f"claim statement, {first:,} finished rows",
                "ms",
                statement,
                baseline="claim_0",
            )
        )
        seconds = _fill(database.owner_url, first + 1, rows)
        say(f"  claim: {rows:,} finished rows in place after {seconds:.1f} s more")
        statement, commit = _claims(database.owner_url)
        results.add(
            Figure(
                "claim_1m",
                f"claim statement, {rows:,} finished rows",
                "ms",
                statement,
                baseline="claim_0",
            )
        )
        results.add(
            Figure(
                "claim_1m_commit",
                f"  its commit (fsync), {rows:,} finished rows",
                "ms",
                commit,
                note="commit only",
            )
        )
        results.notes[f"claim plan at {rows:,} finished rows (EXPLAIN ANALYZE)"] = _explain(
            database.owner_url
        )
