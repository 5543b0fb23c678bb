"""The bench's scenarios, each run at a tiny size through the bench's own entry point
(:func:`bench.__main__.main`, what ``make bench`` and ``python -m bench --only NAME`` run), so a
change in the library that breaks a scenario fails here rather than in a 20-minute bench run
nobody starts (a move that began refusing unmigrated tenant servers once broke ``move``
silently).

What it proves: every scenario completes, and writes each of its figures with samples to the
results file, its goals computed and its table rendered. What it does not: any time. Nothing
here is measured against anything; the sizes are far too small for the figures to mean
anything, and the cluster runs with ``fsync`` off.

The cluster is the bench's own (:class:`bench.cluster.BenchCluster`, one per pytest-xdist
process, ``durable=False``), not the suite's server: the scenarios reach tenant servers
through its password file and port, start worker processes pointed at it, and the move
scenario starts a second cluster of PostgreSQL 16 (the ``pgserver`` wheel's binaries, a dev
dependency).

Left out:

* ``failover``: it starts a pg_auto_failover formation of its own (a monitor, a primary, a
  synchronous standby) and drains 300 tenants through a primary's crash; the failover lane
  (``tests/failover``, ``-m failover``) runs the same crash (``tests/failover_drain.py``) and
  asserts its outcome.

The smallest sizes that still run: ``fixture`` needs 2 rounds (its note's p90 needs two
samples), ``--scale`` 20 tenants (its fleet upgrade is timed by blocks of a tenth, of at least
two jobs).
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterator
from pathlib import Path

import pytest

from bench import burst
from bench.__main__ import main
from bench.cluster import BenchCluster
from bench.cluster import bench_cluster as started_cluster

K = burst.cores()
LARGE_TABLES = 10

#: (the arguments of ``python -m bench``, the figures the scenario must write)
SCENARIOS: dict[str, tuple[str, str]] = {
    "provision": (
        "--only provision --rounds 1",
        "raw raw_ddl alembic replay provision provision_alembic engine fingerprint_open "
        "grants_now grants_two_roles provision_cold",
    ),
    "pool": (
        f"--only pool --pool-tenants 1 --pool-size 1 --pool-large-tables {LARGE_TABLES}",
        f"pool_raw_9 pool_off_9 pool_on_9 pool_raw_{LARGE_TABLES} pool_off_{LARGE_TABLES} "
        f"pool_on_{LARGE_TABLES}",
    ),
    "burst": (
        f"--only burst --burst-tenants {K} --burst-runs 1 --warm-up 1",
        f"burst_raw_1 burst_raw_{K} burst_default burst_one burst_children_{K}",
    ),
    "pool-burst": (
        "--only pool-burst --pool-burst-runs 1 --pool-burst-size 4 --warm-up 1 "
        "--pool-burst-raw-tenants 1 --pool-burst-during 1",
        "poolb_build_raw poolb_build_async poolb_raw poolb_burst poolb_refill "
        "poolb_refill_raw_parallel poolb_during poolb_alone poolb_wait",
    ),
    "worker": (
        "--only worker --worker-tenants 2 --worker-runs 1",
        "raw_par_1 raw_par_2 worker_1 worker_2 worker_4",
    ),
    "wake": (
        "--only wake --wake-notify-samples 2 --wake-poll-samples 2",
        "wake_poll wake_notify",
    ),
    "claim": ("--only claim --claim-rows 1000", "claim_0 claim_100k claim_1m claim_1m_commit"),
    "fixture": ("--only fixture --fixture-rounds 2", "fixture_raw fixture_provision fixture"),
    "fleet": (
        "--only fleet --fleet-tenants 2 --fleet-runs 1",
        "fleet_raw fleet_alembic fleet_worker_1 fleet_worker_2 fleet_behind",
    ),
    "move": (
        "--only move --move-rows 10 --move-rounds 1",
        "move_copy_raw move_freeze move_freeze_dump16 move_freeze_logical",
    ),
    "fleet-servers": (
        "--only fleet-servers --fleet-servers-tenants 2 --fleet-servers-runs 1",
        "fleet_servers_one fleet_servers_two fleet_servers_east fleet_servers_east_west",
    ),
    "server-jobs": (
        "--only server-jobs --server-jobs-tenants 1",
        "server_jobs_one server_jobs_two",
    ),
    "placement": (
        "--only placement --placement-rounds 1 --placement-block 2",
        "placement_off placement_control placement_two",
    ),
    "bulk": ("--only bulk --bulk-tenants 2 --bulk-singles 1", "bulk-one-by-one bulk-batch"),
    "storage": ("--only storage --storage-checks 2", "storage_check_new storage_check_kept"),
    "fleet-scale": (
        "--only fleet-scale --fleet-scale-tenants 10",
        "fleet_scale_raw fleet_scale_behind_before fleet_scale_behind fleet_scale_check "
        "fleet_scale_first fleet_scale_last fleet_scale_all",
    ),
    "scale": (
        "--scale --scale-tenants 20",
        "scale_first scale_last fleet_scale_behind fleet_scale_first fleet_scale_last",
    ),
}


@pytest.fixture(scope="session")
def bench_cluster() -> Iterator[BenchCluster]:
    """The bench's own cluster, fsync off (nothing here is timed), for this process's tests."""
    with started_cluster(durable=False) as cluster:
        yield cluster


@pytest.mark.slow
@pytest.mark.parametrize("scenario", list(SCENARIOS))
def test_every_bench_scenario_runs_at_a_tiny_size_and_writes_its_figures(
    scenario: str, bench_cluster: BenchCluster, tmp_path: Path
) -> None:
    argv, figures = SCENARIOS[scenario]
    output = tmp_path / "results.json"
    assert main([*argv.split(), "--output", str(output)], cluster=bench_cluster) == 0
    written = json.loads(output.read_text())
    missing = [key for key in figures.split() if key not in written["figures"]]
    assert not missing, f"{scenario} wrote {sorted(written['figures'])}, not {missing}"
    for key, figure in written["figures"].items():
        assert figure["n"] >= 1 and math.isfinite(figure["median"]), (key, figure)
    assert isinstance(written["goals"], list)
