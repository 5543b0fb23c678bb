"""Opt-in (``python -m bench --only bulk``): purging many tenants, one command per tenant (as
before batches) against one batched command (``deprovision --purge --yes --from-file -``:
checked, queued as one batch in one transaction, then run by one engine).

N + K tenants are provisioned; K of them are purged one ``provisioner`` process each (the
per-command figure, projected to N), then the N others in one command. Both are timed from the
outside, process start-up included: what an operator waits for.
"""

from __future__ import annotations

import subprocess
import sys
import time

from bench.cluster import BenchCluster, say
from bench.figures import Figure, Results
from provisioner import service


def _run(env: dict[str, str], *args: str, stdin: str | None = None) -> float:
    began = time.perf_counter()
    done = subprocess.run(
        [sys.executable, "-m", "provisioner", *args],
        input=stdin,
        capture_output=True,
        text=True,
        env=env,
        check=False,
    )
    took = (time.perf_counter() - began) * 1000
    if done.returncode != 0:
        raise RuntimeError(f"provisioner {' '.join(args[:3])} failed: {done.stderr.strip()}")
    return took


def run(cluster: BenchCluster, results: Results, tenants: int, singles: int = 20) -> None:
    with cluster.database("bulk") as database:
        settings = database.settings()
        env = database.env()
        names = [f"b{i:05d}" for i in range(tenants + singles)]
        say(f"bulk: provisioning {len(names)} tenants")
        for name in names:
            service.provision(settings, name)
        one_by_one = [
            _run(env, "deprovision", "--purge", "--yes", name) for name in names[:singles]
        ]
        batch = names[singles:]
        say(f"bulk: purging {len(batch)} tenants in one command")
        total = _run(
            env, "deprovision", "--purge", "--yes", "--from-file", "-", stdin="\n".join(batch)
        )
    projected = sum(one_by_one) / len(one_by_one) * tenants / 1000
    per_command = Figure(
        "bulk-one-by-one",
        "purge: one command per tenant (ms per tenant)",
        "ms",
        one_by_one,
        note=f"projected for {tenants} tenants: {projected:.0f} s",
    )
    batched = Figure(
        "bulk-batch",
        f"purge {tenants} tenants in one batched command (ms per tenant)",
        "ms",
        [total / tenants],
        baseline="bulk-one-by-one",
        note=f"whole command: {total / 1000:.1f} s, start-up included",
    )
    results.add(per_command)
    results.add(batched)
