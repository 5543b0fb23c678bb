"""A primary crash mid-drain (opt-in: ``python -m bench --only failover``; needs
``make ha-tools``): where the seconds after the crash go.

Each run starts a pg_auto_failover formation of its own (``tests/failover.py``: a monitor, a
primary, a synchronous standby, the failover lane's shortened detection timeouts), queues 300
tenants, and runs the lane's crash (``tests/failover_drain.py``): the primary's keeper and
PostgreSQL SIGKILLed once half the tenants succeeded, while a worker of one child per core
drains them. The suite's failover lane asserts the outcome of the same crash; this prints its
seconds, each counted from the SIGKILL: the primary declared unhealthy (the monitor's event
table), the standby promoted, writes refused (a probe writing every 50 ms through the
multi-host URL), the worker's first claim after that, the drain's end; and the jobs retried and
the acknowledged jobs lost (a job the worker logged as succeeded whose row shows another
attempt: must be 0).
"""

from __future__ import annotations

import shutil
import tempfile
import time
from pathlib import Path

from bench.cluster import say
from bench.figures import Figure, Goal, Results
from tests.failover import start_formation
from tests.failover_drain import CONCURRENCY as CONCURRENCY
from tests.failover_drain import CRASH_AFTER as CRASH_AFTER
from tests.failover_drain import CrashDrain, crash_mid_drain, prepare

#: What the issue asked of the whole drain.
GOAL_SECONDS = 30.0


def _one(concurrency: int, crash_after: int) -> CrashDrain:
    tmp = Path(tempfile.mkdtemp(prefix="bench-failover-"))
    formation = start_formation()
    try:
        env = prepare(formation, tmp)
        return crash_mid_drain(
            formation, tmp, env, crash_after=crash_after, concurrency=concurrency
        )
    finally:
        stopping = time.monotonic()
        formation.stop()
        say(f"failover: formation stopped in {time.monotonic() - stopping:.1f} s")
        shutil.rmtree(formation.root, ignore_errors=True)
        shutil.rmtree(tmp, ignore_errors=True)


def run(
    results: Results,
    runs: int,
    concurrency: int = CONCURRENCY,
    crash_after: int = CRASH_AFTER,
) -> None:
    drains: list[CrashDrain] = []
    for n in range(runs):
        drain = _one(concurrency, crash_after)
        say(f"failover run {n + 1}: {drain.summary()}")
        drains.append(drain)
    rows = {
        "failover_detected": ("primary declared unhealthy after the crash", "detected"),
        "failover_promoted": ("standby reported primary after the crash", "promoted"),
        "failover_refused": ("writes refused after the crash (probe)", "writable"),
        "failover_back": ("worker's first claim after writes came back", "back"),
        "failover_drained": ("drain of 300 done after the crash", "drained"),
        "failover_rate_after": ("jobs/s after the worker came back", "rate_after"),
    }
    for key, (label, attribute) in rows.items():
        results.add(
            Figure(
                key,
                label,
                "jobs/s" if attribute == "rate_after" else "s",
                [getattr(d, attribute) for d in drains],
                note=f"--concurrency {concurrency}, crash after {crash_after} succeeded",
            )
        )
    results.notes["failover"] = "\n".join(
        f"run {n + 1}: {d.summary()}; retry delays {d.retry_delays}" for n, d in enumerate(drains)
    )
    results.extra["failover_lost"] = sum(d.lost_jobs for d in drains) + sum(
        max(0, d.probe_acknowledged - d.probe_kept) for d in drains
    )
    results.extra["failover_succeeded"] = [d.counts.get("succeeded", 0) for d in drains]


def goals(results: Results) -> list[Goal]:
    """The issue's goal for the whole drain, and nothing acknowledged lost."""
    if "failover_drained" not in results.figures:
        return []
    worst = results.figures["failover_drained"].high
    succeeded = results.extra["failover_succeeded"]
    lost = results.extra["failover_lost"]
    return [
        Goal(
            "failover: drain done within 30 s of the crash",
            "<= 30 s, 300/300 succeeded",
            f"{worst:.1f} s (worst of {len(succeeded)}); succeeded {succeeded}",
            worst <= GOAL_SECONDS and all(n == 300 for n in succeeded),
        ),
        Goal("failover: acknowledged jobs and writes lost", "0", str(lost), lost == 0),
    ]
