"""The provisioner worker: recover, heartbeat, listen, claim, run, finish, drain.

One parent process and ``concurrency`` engine processes (:mod:`provisioner.worker.processes`).

* The **parent** supervises: recovery of abandoned jobs at start and every heartbeat interval
  (a holder that stopped beating, or a lease older than the stale threshold);
  ``LISTEN provisioner_jobs`` on its own autocommit connection, with polling as the backstop
  for a lost notification; asking each idle child to drain the queue (at most
  ``concurrency`` jobs at once); settling only what a child could not (the child died, or the
  database was down when the step failed) and handing back a dead child's claim it never
  reported; signals and the drain.
* Each **engine process** owns its jobs' lives (:mod:`provisioner.engine.runner`): it claims a job
  under its own holder id, runs its kind's steps, settles it, and reports a typed outcome; the
  job's last step claims the next one, and the child goes on unasked until a claim finds
  nothing (:mod:`provisioner.worker.processes`).
* A **heartbeat thread**, on its own connection, upserts the component's row in
  ``control.runtime_heartbeats`` every interval and, in the same transaction, beats for each
  child's lease holder in ``control.lease_holders`` and renews ``locked_at`` of every job the
  children hold: a long step on a live worker is never taken for abandoned, and a worker that
  stops beating loses its jobs to recovery once it missed three beats (``MISSED_BEATS``).
  Every write of the engine is fenced by the lease, so a worker that was presumed dead (frozen,
  partitioned) and wakes up records nothing.

Each claim is logged with how the worker woke: ``start``, ``notify`` (an enqueue's NOTIFY),
``poll`` (the backstop timer), ``drain`` (the last claim or job end: the queue may hold more),
``reconnect`` (after a database outage, when wake-ups may have been lost).

A database outage is logged once (and once more when it is over); the parent reconnects with a
capped backoff, the engine's pool reconnects on its own, and a job whose failure could not be
recorded is settled as soon as the database answers.

On SIGTERM or SIGINT the worker stops claiming and lets each running step finish (the engine
releases the job between steps, progress kept), bounded by the drain timeout; then it
interrupts the step (its transaction rolls back) and releases the job. A second signal ends the
drain at once. The last heartbeat says ``stopped``; the exit code is 0.

Where each part lives:

    loop.py        Worker and run_worker: start, the event loop, signals, the drain, shutdown
    supervisor.py  the parent's side of the engine processes and their messages
    database.py    the parent's connections, stale recovery, claims, settling orphans
    state.py       the parent's fields and the heartbeat's snapshot
    orphans.py     jobs the parent settles itself (a dead child's, or one a child could not)
    options.py     WorkerOptions and the parent's fixed timings
    concurrency.py how many engine children: the flag, the setting, else one per core
    processes.py   the engine processes (the child's loop) and the typed messages both ways
    heartbeat.py   the heartbeat thread and the one-line outage log
    metrics.py     the Prometheus metrics: counters kept here, gauges read at each scrape
    startup.py     what the worker refuses to start without
"""

from __future__ import annotations

from provisioner.worker.loop import Worker, run_worker
from provisioner.worker.options import WorkerOptions

__all__ = ["Worker", "WorkerOptions", "run_worker"]
