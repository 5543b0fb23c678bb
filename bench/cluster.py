"""The benchmarks' own PostgreSQL: a throwaway durable cluster, and fresh databases in it.

Never the machine's server on 5432: a cluster under a temporary folder, ``fsync`` on (the
default ``durable=True`` of :class:`provisioner.local.cluster.Cluster`), stopped and removed at the
end. Each scenario gets its own database, cloned from a template that has the bootstrap roles
and a migrated control schema.
"""

from __future__ import annotations

import os
import shutil
import sys
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import psycopg
from psycopg import sql

from provisioner.local import cluster as local_pg
from provisioner.settings import Settings
from provisioner.templates import migrations

TEMPLATE_DATABASE = "bench_template"


@dataclass(frozen=True)
class BenchDatabase:
    name: str
    owner_url: str
    app_url: str
    admin_url: str
    objects: Path

    def settings(self, **overrides: object) -> Settings:
        values: dict[str, object] = {
            "migrations_database_url": self.owner_url,
            "app_database_url": self.app_url,
            "object_store_provider": "filesystem",
            "object_store_path": self.objects,
            "state_dir": self.objects.parent / "state",
        }
        values.update(overrides)
        return Settings(**values)  # type: ignore[arg-type]

    def env(self, **extra: str) -> dict[str, str]:
        """Environment for a ``provisioner`` child process pointed at this database."""
        env = {
            k: v
            for k, v in os.environ.items()
            if not k.startswith(("PROVISIONER_", "OBJECT_", "AZURE_", "S3_", "AWS_"))
            and k not in ("MIGRATIONS_DATABASE_URL", "APP_DATABASE_URL", "DATABASE_URL")
        }
        root = str(Path(__file__).resolve().parent.parent)
        env.update(
            MIGRATIONS_DATABASE_URL=self.owner_url,
            APP_DATABASE_URL=self.app_url,
            OBJECT_STORE_PROVIDER="filesystem",
            OBJECT_STORE_PATH=str(self.objects),
            PROVISIONER_STATE_DIR=str(self.objects.parent / "state"),
            PYTHONPATH=root + os.pathsep + env.get("PYTHONPATH", ""),
        )
        env.update(extra)
        return env


class BenchCluster:
    """A durable throwaway cluster with a migrated template database (``durable=False``: fsync
    off, for the smoke test of tests/integration/test_bench_smoke.py, whose figures nobody reads).
    """

    def __init__(self, *, durable: bool = True) -> None:
        # The cluster's folder is chowned to the server's user when we are root, so it is a
        # top-level temporary folder of its own; object-store folders live in another.
        self.cluster = local_pg.Cluster(
            Path(tempfile.mkdtemp(prefix="provisioner-bench-pg-")), durable=durable
        )
        self.work = Path(tempfile.mkdtemp(prefix="provisioner-bench-"))
        self._count = 0

    def start(self) -> None:
        self.cluster.ensure_running()
        local_pg.bootstrap_database(self.cluster.superuser_url(), TEMPLATE_DATABASE)
        migrations.upgrade_control(self.cluster.url(local_pg.OWNER_ROLE, TEMPLATE_DATABASE))

    def stop(self) -> None:
        try:
            self.cluster.stop()
        finally:
            shutil.rmtree(self.cluster.root, ignore_errors=True)
            shutil.rmtree(self.work, ignore_errors=True)

    def server_version(self) -> str:
        with psycopg.connect(self.cluster.superuser_url()) as conn:
            row = conn.execute("SHOW server_version").fetchone()
            fsync = conn.execute("SHOW fsync").fetchone()
            sync = conn.execute("SHOW synchronous_commit").fetchone()
        assert row and fsync and sync
        return f"PostgreSQL {row[0]} (fsync={fsync[0]}, synchronous_commit={sync[0]})"

    def create_database(self, label: str) -> BenchDatabase:
        self._count += 1
        name = f"bench_{label}_{self._count}"
        admin = self.cluster.superuser_url()
        with psycopg.connect(admin, autocommit=True) as conn:
            conn.execute(
                sql.SQL("CREATE DATABASE {} TEMPLATE {} OWNER {}").format(
                    sql.Identifier(name),
                    sql.Identifier(TEMPLATE_DATABASE),
                    sql.Identifier(local_pg.OWNER_ROLE),
                )
            )
        # Database-level grants are not templated. app_ro: a readonly application role, for the
        # grant step's figure with two roles (bench/provisioning.py).
        local_pg.bootstrap_database(admin, name, ("app_ro",))
        objects = self.work / name / "objects"
        objects.mkdir(parents=True)
        return BenchDatabase(
            name=name,
            owner_url=self.cluster.url(local_pg.OWNER_ROLE, name),
            app_url=self.cluster.url(local_pg.APP_ROLE, name),
            admin_url=self.cluster.superuser_url(name),
            objects=objects,
        )

    def drop_database(self, database: BenchDatabase) -> None:
        with psycopg.connect(self.cluster.superuser_url(), autocommit=True) as conn:
            conn.execute(
                sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(
                    sql.Identifier(database.name)
                )
            )
        shutil.rmtree(database.objects.parent, ignore_errors=True)

    @contextmanager
    def database(self, label: str) -> Iterator[BenchDatabase]:
        database = self.create_database(label)
        try:
            yield database
        finally:
            self.drop_database(database)


@contextmanager
def bench_cluster(*, durable: bool = True) -> Iterator[BenchCluster]:
    cluster = BenchCluster(durable=durable)
    try:
        cluster.start()
        yield cluster
    finally:
        cluster.stop()


def say(message: str) -> None:
    """Progress on stderr, so stdout carries only the table."""
    print(message, file=sys.stderr, flush=True)
