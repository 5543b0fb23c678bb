"""The failover lane: a real pg_auto_failover formation (``tests/failover.py``: a monitor, a
primary and a synchronous standby), its primary SIGKILLed while a worker drains 300 tenants
through a libpq multi-host URL with ``target_session_attrs=read-write``
(``tests/failover_drain.py``, which ``python -m bench --only failover`` runs too).

One test, in order, on one formation for the session: the crash mid-drain, ``health`` while
the new primary has no standby, the old primary rejoining as a standby, then a planned
switchover back while workers roll the fleet out to a new tenant template head
(``upgrade --all``). It asserts outcomes; the seconds (writes refused, the worker back, the
drain's end after the crash, the switchover) are printed, and measured by the bench.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import psycopg
import pytest

from provisioner.templates.migrations import TENANT_TREE_ENV
from tests.failover import Formation
from tests.failover_drain import (
    CONCURRENCY,
    DATABASE,
    DRAIN_DEADLINE_SECONDS,
    TENANTS,
    cli,
    crash_mid_drain,
    prepare,
    start_worker,
)
from tests.integration.test_fleet_upgrade import make_tree

pytestmark = pytest.mark.failover

#: For the formation's own orchestration (the old primary's pg_rewind and catch-up, the
#: switchover settling): about 1-2 minutes, and past 180 s twice on a busy machine.
FORMATION_DEADLINE_SECONDS = 360


def test_a_primary_crash_mid_drain_loses_nothing_and_the_old_primary_rejoins(
    formation: Formation, tmp_path: Path
) -> None:
    env = prepare(formation, tmp_path)
    health = json.loads(cli(env, "health", "--json").stdout)
    assert health["database"]["synchronous_standby"] is True, health

    drain = crash_mid_drain(formation, tmp_path, env)
    print(f"\nfailover: {drain.summary()}")  # the figures: python -m bench --only failover
    assert drain.counts == {"succeeded": TENANTS}, drain.counts
    assert drain.retried <= CONCURRENCY, f"{drain.retried} retried; {CONCURRENCY} were in flight"
    # The crash cut the in-flight jobs' sessions: no fault of theirs, so no retry backoff.
    assert len(drain.retry_delays) == drain.retried, drain.retry_delays
    assert all(delay == 0 for delay in drain.retry_delays), drain.retry_delays
    assert drain.open_runs == 0, "a step run was left 'running'"
    # Nothing acknowledged was lost (synchronous standby): no job the worker saw succeed ran
    # again, and every probe write acknowledged before or after the crash is on node2.
    assert drain.lost_jobs == 0
    assert drain.probe_kept >= drain.probe_acknowledged
    assert drain.health_alone["database"]["synchronous_standby"] is False, drain.health_alone

    # The old primary rejoins as the new primary's standby.
    formation.run(formation.nodes["node1"])
    deadline = time.monotonic() + FORMATION_DEADLINE_SECONDS
    while not formation.settled("node2"):
        assert time.monotonic() < deadline, f"node1 did not rejoin: {formation.states()}"
        time.sleep(0.5)
    rejoined = json.loads(cli(env, "health", "--json").stdout)
    assert rejoined["database"]["synchronous_standby"] is True, rejoined

    _switchover_during_a_rollout(formation, env, tmp_path)


def _upgraded(env: dict[str, str]) -> int:
    shown = cli(env, "upgrade", "--watch", "--json")
    if shown.returncode != 0:
        return 0  # no primary answers right now
    return int(json.loads(shown.stdout)["phases"].get("done", 0))


def _switchover_during_a_rollout(formation: Formation, env: dict[str, str], tmp: Path) -> None:
    """A planned switchover (node2 back to node1) while workers roll the fleet out to a new
    tenant template head: every tenant reaches it, no job fails, no step run stays open."""
    env = {**env, TENANT_TREE_ENV: str(make_tree(tmp))}
    with (tmp / "worker-rollout.log").open("w") as log:
        worker = start_worker(env, log)
    try:
        started = cli(env, "upgrade", "--all")
        assert started.returncode == 0, started.stderr
        deadline = time.monotonic() + DRAIN_DEADLINE_SECONDS
        while _upgraded(env) < 30:
            assert time.monotonic() < deadline, "the rollout did not start"
            time.sleep(0.5)
        switched = time.monotonic()
        formation.switchover()
        while formation.primary() != "node1":
            assert time.monotonic() < switched + FORMATION_DEADLINE_SECONDS, (
                f"no switchover: {formation.states()}"
            )
            time.sleep(0.1)
        switchover_seconds = time.monotonic() - switched
        deadline = time.monotonic() + DRAIN_DEADLINE_SECONDS
        while _upgraded(env) < TENANTS:
            assert time.monotonic() < deadline, f"rollout unfinished: {_upgraded(env)}"
            assert worker.poll() is None, (tmp / "worker-rollout.log").read_text()[-3000:]
            time.sleep(1)
    finally:
        worker.terminate()
        worker.wait(60)
    print(
        f"switchover during the rollout: node1 primary again {switchover_seconds:.1f} s after "
        "it was asked for"
    )
    deadline = time.monotonic() + FORMATION_DEADLINE_SECONDS
    while not formation.settled("node1"):
        assert time.monotonic() < deadline, (
            f"not settled after the switchover: {formation.states()}"
        )
        time.sleep(0.5)
    with psycopg.connect(formation.url("provisioner_owner", DATABASE)) as conn:
        failed = conn.execute(
            "SELECT count(*) FROM control.platform_jobs WHERE status <> 'succeeded'"
        ).fetchone()[0]
        open_runs = conn.execute(
            "SELECT count(*) FROM control.job_step_runs WHERE outcome = 'running'"
        ).fetchone()[0]
    assert failed == 0 and open_runs == 0
    checked = cli(env, "check", "--all")
    assert checked.returncode == 0, checked.stdout[-2000:]
