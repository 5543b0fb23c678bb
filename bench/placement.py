"""What placement adds to a sign-up's enqueue (opt-in: ``python -m bench --only placement``).

The library's enqueue of a new tenant as the application role, enqueue and commit timed
together, in three setups taken in turn, a block of each per round (so that the machine's
drift hits all three alike):

* ``placement_off``: the control database's placement trigger disabled, i.e. the enqueue as it
  was before the directory of tenant servers existed (the baseline);
* ``placement_control``: the trigger on, no tenant server (a single-server deployment: the
  tenant stays on the control database);
* ``placement_two``: the trigger on, two active tenant servers (the least loaded is chosen and
  its row locked).

Each setup works in a database of its own, so that one's tenants never weigh on another's.
"""

from __future__ import annotations

import time

import psycopg

import provisioner
from bench.cluster import BenchCluster, BenchDatabase
from bench.figures import Figure, Results
from provisioner import servers

ROUNDS = 10
BLOCK = 50


def _enqueue_block(database: BenchDatabase, prefix: str, start: int, block: int) -> list[float]:
    samples = []
    with psycopg.connect(database.app_url) as conn:
        for n in range(start, start + block):
            began = time.perf_counter()
            provisioner.enqueue(conn, f"{prefix}{n}")
            conn.commit()
            samples.append((time.perf_counter() - began) * 1000)
    return samples


def run(cluster: BenchCluster, results: Results, rounds: int = ROUNDS, block: int = BLOCK) -> None:
    with (
        cluster.database("place_off") as off,
        cluster.database("place_control") as control,
        cluster.database("place_two") as two,
    ):
        with psycopg.connect(off.owner_url, autocommit=True) as conn:
            conn.execute("ALTER TABLE control.tenants DISABLE TRIGGER tenants_place")
        with psycopg.connect(two.owner_url, autocommit=True) as conn:
            servers.add(conn, "east", "host=127.0.0.1 port=1 dbname=east")
            servers.add(conn, "west", "host=127.0.0.1 port=2 dbname=west")
        samples: dict[str, list[float]] = {"off": [], "control": [], "two": []}
        for round_ in range(rounds):
            start = round_ * block
            samples["off"] += _enqueue_block(off, "t", start, block)
            samples["control"] += _enqueue_block(control, "t", start, block)
            samples["two"] += _enqueue_block(two, "t", start, block)
    results.add(
        Figure(
            "placement_off",
            "enqueue + commit, placement trigger disabled",
            "ms",
            samples["off"],
            note="baseline",
        )
    )
    results.add(
        Figure(
            "placement_control",
            "enqueue + commit, no tenant server (the control database)",
            "ms",
            samples["control"],
            baseline="placement_off",
        )
    )
    results.add(
        Figure(
            "placement_two",
            "enqueue + commit, placed on one of two tenant servers",
            "ms",
            samples["two"],
            baseline="placement_off",
        )
    )
