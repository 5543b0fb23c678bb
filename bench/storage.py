"""The object store's readiness check (``verify_object_storage``, every sign-up's fifth step):
one store kept for every check, as an engine holds it, against a new store per check, as each
check built its own boto3 session and client before (:mod:`provisioner.storage.base`).

Against moto's S3 server, started in this process on 127.0.0.1 (so its own handling of each
``HeadBucket`` is in both figures: a real endpoint answers in the network's time instead).
Interleaved, one check of each in turn. Opt-in (``python -m bench --only storage``).
"""

from __future__ import annotations

import os
import time

import boto3

from bench.cluster import say
from bench.figures import Figure, Results
from provisioner.storage import S3Store
from tests.object_servers import MotoS3Server

CHECKS = 30
BUCKET = "bench-readiness"


def _timed(store: S3Store) -> float:
    began = time.perf_counter()
    store.check()
    return (time.perf_counter() - began) * 1000


def run(results: Results, checks: int = CHECKS) -> None:
    os.environ.setdefault("AWS_ACCESS_KEY_ID", "bench")
    os.environ.setdefault("AWS_SECRET_ACCESS_KEY", "bench")
    server = MotoS3Server()
    server.start()
    try:
        maker = boto3.client("s3", endpoint_url=server.endpoint_url, region_name="us-east-1")
        maker.create_bucket(Bucket=BUCKET)

        def store() -> S3Store:
            return S3Store(BUCKET, server.endpoint_url, "us-east-1", "path")

        kept = store()
        kept.check()  # its client built, as by an engine child's first sign-up
        fresh: list[float] = []
        reused: list[float] = []
        for _ in range(checks):
            fresh.append(_timed(store()))
            reused.append(_timed(kept))
    finally:
        server.stop()
    results.add(
        Figure(
            "storage_check_new",
            "S3 readiness check, a new store (client) per check",
            "ms",
            fresh,
            note="baseline: each check built its boto3 session and client",
        )
    )
    results.add(
        Figure(
            "storage_check_kept",
            "S3 readiness check, one store kept",
            "ms",
            reused,
            baseline="storage_check_new",
            note="its client built by its first check",
        )
    )
    say(f"  storage: {checks} checks each against moto on {server.endpoint_url}")
