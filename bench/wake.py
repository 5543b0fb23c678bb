"""How long a queued tenant waits for an idle worker: enqueue commit to claim, NOTIFY vs poll.

One real ``provisioner worker`` (concurrency 1) sits idle. Each sample waits until the previous
job has finished and the worker is idle again (plus a random pause, so polls fall anywhere in
their period), enqueues one tenant and commits; the latency runs from the enqueue's COMMIT being
sent (so its own fsync counts) to the claim statement executing (recorded by the bench's trigger,
see :mod:`bench.worker_process`).

* NOTIFY: enqueued through :func:`provisioner.queue.ensure_provision_job`, which sends the
  wake-up with the commit.
* poll: the same row inserted with the queue's own statements but no ``pg_notify``: only the
  worker's backstop poll (``--poll-interval``) finds it. Its p50 is about half the interval.
"""

from __future__ import annotations

import random
import time
from typing import Any

import psycopg

from bench import worker_process
from bench.cluster import BenchCluster, BenchDatabase, say
from bench.figures import Figure, Results
from provisioner import queue
from provisioner.kinds.provision import ensure_provision_job, provision_key
from provisioner.models import TenantId

NOTIFY_SAMPLES = 60
POLL_SAMPLES = 20
POLL_INTERVAL = 0.25


def _silent_enqueue(conn: psycopg.Connection[object], tenant: TenantId) -> None:
    """The queue's own insert statements, without the NOTIFY."""
    with conn.cursor() as cur:
        cur.execute(queue.ENSURE_TENANT, {"tenant_id": tenant.value, "schema": tenant.schema})
        cur.execute(
            queue.ENQUEUE,
            {
                "tenant_id": tenant.value,
                "job_type": "provision_tenant",
                "payload": psycopg.types.json.Jsonb({}),
                "idempotency_key": provision_key(tenant),
                "max_attempts": 5,
            },
        )


def _sample(
    database: BenchDatabase, app: psycopg.Connection[Any], name: str, notify: bool
) -> float:
    tenant = TenantId(name)
    time.sleep(random.uniform(0.02, 0.06))
    if notify:
        ensure_provision_job(app, tenant)
    else:
        _silent_enqueue(app, tenant)
    committed = time.time()  # from the COMMIT being sent: its own fsync is counted too
    app.commit()

    def claimed() -> tuple[Any, ...] | None:
        return app.execute(
            "SELECT extract(epoch FROM b.claimed_at), j.status FROM public.bench_claims b "
            "JOIN control.platform_jobs j ON j.id = b.job_id WHERE j.tenant_id = %s",
            (name,),
        ).fetchone()

    def finished() -> bool:
        row = app.execute(
            "SELECT status FROM control.platform_jobs WHERE tenant_id = %s", (name,)
        ).fetchone()
        app.commit()
        return row is not None and row[0] == "succeeded"

    if not worker_process.wait_for(finished, timeout=30):
        with psycopg.connect(database.admin_url) as admin:
            activity = admin.execute(
                "SELECT pid, application_name, state, wait_event_type, wait_event, "
                "left(query, 120), pg_blocking_pids(pid) FROM pg_stat_activity "
                "WHERE datname = current_database()"
            ).fetchall()
        raise RuntimeError(f"the worker did not finish {name} within 30 s: {activity}")
    row = claimed()
    app.commit()
    assert row is not None
    return (float(row[0]) - committed) * 1000


def run(
    cluster: BenchCluster,
    results: Results,
    notify_samples: int = NOTIFY_SAMPLES,
    poll_samples: int = POLL_SAMPLES,
) -> None:
    if not worker_process.worker_available():
        results.notes["wake"] = "not measured: this tree has no `provisioner worker --once`"
        return
    with cluster.database("wake") as database:
        worker_process.instrument(database)
        worker = worker_process.WorkerProcess(
            database, "--concurrency", "1", "--poll-interval", str(POLL_INTERVAL)
        )
        try:
            with psycopg.connect(database.app_url) as app:
                # A first tenant gives the worker's child its reference schema; not a sample.
                _sample(database, app, "wake_warmup", notify=True)
                notify = [
                    _sample(database, app, f"wake_n{i}", notify=True) for i in range(notify_samples)
                ]
                say(f"  wake: {notify_samples} NOTIFY samples taken")
                poll = [
                    _sample(database, app, f"wake_p{i}", notify=False) for i in range(poll_samples)
                ]
        except BaseException:
            worker.close()
            say("  wake: the worker's log ends with:\n" + worker.log()[-3000:])
            raise
        worker.close()
        log = worker.log()
    woke_notify = log.count('"woke": "notify"')
    woke_poll = log.count('"woke": "poll"')
    results.add(
        Figure(
            "wake_poll",
            f"wake: enqueue -> claim, poll every {POLL_INTERVAL * 1000:.0f} ms",
            "ms",
            poll,
            note="baseline",
            percentiles=True,
        )
    )
    results.add(
        Figure(
            "wake_notify",
            "wake: enqueue -> claim, LISTEN/NOTIFY",
            "ms",
            notify,
            baseline="wake_poll",
            percentiles=True,
        )
    )
    results.notes["wake"] = (
        f"real `provisioner worker --concurrency 1 --poll-interval {POLL_INTERVAL}`; its log "
        f"says it woke by notify {woke_notify} times and by poll {woke_poll} times "
        f"(expected about {notify_samples + 1} and {poll_samples})"
    )
