"""A take from the warm pool killed by SIGKILL at every boundary leaves a spare or a tenant,
never both, never neither; another worker then finishes the tenant. A spare build killed before
it recorded the spare leaves no spare, and the next builder drops what it built.

A taken spare's six steps run in one transaction (``RunMemo.one_transaction``), so a kill at
any point before its commit leaves the spare whole and no tenant. The worker is frozen at each
boundary by a lock the step needs:

* before the take: the tenant's lock row held (the step's first statement waits for it);
* inside the take (spare row deleted, schema renamed): the tenant's row in
  ``control.tenants``, which ``create_schema`` updates after the take;
* after the take's step recorded its checkpoint: the spare's ``alembic_version`` table, locked
  ACCESS EXCLUSIVE (the lock follows the table through the rename), which the migration step
  reads next;
* after the grant step recorded its checkpoint (``USAGE`` granted on the spare's table
  grants): the spare's ``role_profiles`` table, locked the same way, which the seed step writes
  next.
"""

from __future__ import annotations

import signal
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import replace
from typing import Any

import psycopg
import pytest
from psycopg import sql

from provisioner import pool, service
from provisioner.kinds.provision import STEPS
from provisioner.settings import Settings
from provisioner.tenant import schema as tenant_schema
from tests.conftest import Database, build_spare, fingerprint
from tests.workers import (
    Workers,
    alive,
    job_row,
    step_runs,
    tenant_row_locked,
    wait_blocked_mid_step,
    wait_until,
)

STALE = 3.0
TENANT = "victim"


@pytest.fixture
def fast(settings: Settings) -> Settings:
    return replace(settings, heartbeat_seconds=0.5, job_stale_after_seconds=STALE)


@contextmanager
def step_lock_held(database: Database, tenant: str) -> Iterator[None]:
    """Hold the tenant's lock row FOR KEY SHARE: a step's transaction (which locks it FOR
    UPDATE) waits at its start; a claim (FOR NO KEY UPDATE) does not."""
    with psycopg.connect(database.owner_url) as conn:
        locked = conn.execute(
            "SELECT 1 FROM control.tenant_locks WHERE tenant_id = %s FOR KEY SHARE", (tenant,)
        ).fetchone()
        assert locked, f"tenant {tenant} has no lock row yet: enqueue it first"
        yield
        conn.rollback()


@contextmanager
def table_locked(database: Database, spare: str, table: str) -> Iterator[None]:
    with psycopg.connect(database.owner_url) as conn:
        conn.execute(
            sql.SQL("LOCK TABLE {} IN ACCESS EXCLUSIVE MODE").format(sql.Identifier(spare, table))
        )
        yield
        conn.rollback()


def state(database: Database, spare: str) -> tuple[bool, bool, bool]:
    """(the spare's pool row exists, a schema named like the spare exists, the tenant's does)."""
    with database.owner() as conn:
        row: Any = conn.execute(
            "SELECT EXISTS (SELECT 1 FROM control.tenant_pool WHERE schema_name = %(s)s), "
            "EXISTS (SELECT 1 FROM pg_namespace WHERE nspname = %(s)s), "
            "EXISTS (SELECT 1 FROM pg_namespace WHERE nspname = %(t)s)",
            {"s": spare, "t": f"tenant_{TENANT}"},
        ).fetchone()
    return bool(row[0]), bool(row[1]), bool(row[2])


@pytest.mark.parametrize("boundary", ["before_take", "inside_take", "after_take", "after_grant"])
def test_a_take_killed_at_each_boundary_leaves_a_spare_or_a_tenant(
    boundary: str, fast: Settings, database: Database, workers: Workers, clean_fingerprint: dict
) -> None:
    spare = build_spare(fast)
    service.enqueue(fast, TENANT)
    blocker = {
        "before_take": lambda: step_lock_held(database, TENANT),
        "inside_take": lambda: tenant_row_locked(database, TENANT),
        "after_take": lambda: table_locked(database, spare, "alembic_version"),
        "after_grant": lambda: table_locked(database, spare, "role_profiles"),
    }[boundary]
    with blocker():
        first = workers.start()
        holder = wait_blocked_mid_step(database, TENANT)
        children = first.child_pids()
        first.send(signal.SIGKILL)
        assert first.wait() == -signal.SIGKILL
        wait_until(lambda: not any(alive(pid) for pid in children), 10, "the child to die")
        running = [(r["step"], r["worker"]) for r in step_runs(database, TENANT)]
    # Wherever it stood, the only committed journal row is create_schema's (written before its
    # transaction began); the later steps' rows were opened inside the take's transaction.
    assert running == [("create_schema", holder)]
    assert state(database, spare) == (True, True, False)  # rolled back: the spare, whole

    second = workers.start()
    second.wait_for("succeeded", 60, tenant_id=TENANT)
    assert second.stop() == 0, second.output()
    row = job_row(database, TENANT)
    assert (row["status"], row["steps_completed"]) == ("succeeded", list(STEPS))
    assert state(database, spare) == (False, False, True)  # the spare became the tenant
    taken = [
        r["detail"]
        for r in step_runs(database, TENANT)
        if r["step"] == "create_schema" and r["outcome"] == "succeeded"
    ]
    assert taken == [f"taken from the warm pool: {spare}"]
    assert fingerprint(database, TENANT) == clean_fingerprint


def keeper_blocked(database: Database) -> bool:
    """A worker's pool keeper (application_name ``<instance>:pool``) waits on a lock."""
    with psycopg.connect(database.admin_url) as conn:
        row = conn.execute(
            "SELECT count(*) FROM pg_stat_activity WHERE application_name LIKE '%%:pool' "
            "AND wait_event_type = 'Lock'"
        ).fetchone()
    return bool(row and row[0])


def unfinished(database: Database) -> list[str]:
    with database.owner() as conn:
        return [str(row[0]) for row in conn.execute(pool.UNFINISHED_SPARES).fetchall()]


def test_a_spare_build_killed_before_its_record_leaves_no_spare_and_the_next_builder_drops_it(
    fast: Settings, database: Database, workers: Workers
) -> None:
    """A spare is built in several transactions and recorded in its last: a worker killed
    before that leaves a schema with no row. It is never counted ready, the application role is
    refused in it, and the next builder drops it before building."""
    size = {"PROVISIONER_POOL_SIZE": "1"}
    with psycopg.connect(database.owner_url) as blocker:
        blocker.execute("LOCK TABLE control.tenant_pool IN SHARE MODE")  # the record waits
        first = workers.start(env=size)
        wait_until(lambda: keeper_blocked(database), 60, "the build to wait for its record")
        first.send(signal.SIGKILL)
        assert first.wait() == -signal.SIGKILL
        blocker.rollback()
    (left,) = unfinished(database)
    with database.owner() as conn:
        tables, _ = tenant_schema.relations(conn, left)
        assert "members" in tables  # every batch of the replay was committed
        assert pool.counts(conn, fast.app_roles) == pool.PoolCounts(ready=0, stale=0, unfinished=1)
    with database.app() as conn, pytest.raises(psycopg.errors.InsufficientPrivilege):
        conn.execute(sql.SQL("SELECT * FROM {}").format(sql.Identifier(left, "members")))

    second = workers.start(env=size)
    second.wait_for("pool_spare_dropped", 60, schema=left, reason="unfinished build")
    built = second.wait_for("pool_spare_built", 60)
    assert unfinished(database) == []
    with database.owner() as conn:
        assert pool.counts(conn, fast.app_roles) == pool.PoolCounts(ready=1, stale=0, unfinished=0)
        row = conn.execute(
            "SELECT schema_name FROM control.tenant_pool WHERE schema_name = %s", (built["schema"],)
        ).fetchone()
        assert row is not None
    assert second.stop() == 0, second.output()


def ready_and_mid_build(database: Database) -> tuple[list[str], list[str]] | None:
    """(ready spares, unfinished schemas holding at least one relation) once the keeper has
    recorded a spare and committed a batch of the next one; None before."""
    with database.owner() as conn:
        ready = [
            str(r[0])
            for r in conn.execute("SELECT schema_name FROM control.tenant_pool ORDER BY created_at")
        ]
        building = [
            str(r[0])
            for r in conn.execute(
                "SELECT u.schema_name FROM (" + pool.UNFINISHED_SPARES + ") u "
                "WHERE EXISTS (SELECT 1 FROM pg_class c JOIN pg_namespace n "
                "ON n.oid = c.relnamespace WHERE n.nspname = u.schema_name)"
            )
        ]
    return (ready, building) if ready and building else None


def test_a_refill_killed_between_chained_batches_keeps_its_recorded_spares_whole(
    fast: Settings, database: Database, workers: Workers, clean_fingerprint: dict
) -> None:
    """With one child (one builder), a refill builds its spares one after the other under
    one lock, and each spare's batches back to back, a batch's commit beginning the next one
    (``COMMIT; BEGIN; <batch>``). Killed with one spare recorded and the next one's batches
    under way, the recorded spare is whole (a tenant takes it and matches a clean
    provisioning) and the unfinished schema is never counted ready, is refused to the
    application role, and is dropped by the next builder."""
    size = {"PROVISIONER_POOL_SIZE": "6"}
    first = workers.start(env=size)
    found = wait_until(
        lambda: ready_and_mid_build(database), 120, "a spare recorded, the next mid-build", 0.005
    )
    first.send(signal.SIGKILL)
    assert first.wait() == -signal.SIGKILL
    ready, building = found
    (left,) = unfinished(database)
    assert left in building
    with database.owner() as conn:
        counted = pool.counts(conn, fast.app_roles)
        assert counted.unfinished == 1 and counted.ready >= len(ready)
    with database.app() as conn:
        refused = conn.execute(
            "SELECT has_schema_privilege(current_user, %(s)s, 'USAGE'), "
            "has_schema_privilege(current_user, %(s)s, 'CREATE')",
            {"s": left},
        ).fetchone()
        assert refused == (False, False)

    assert service.provision(fast, TENANT).job.status.value == "succeeded"
    taken = [
        r["detail"]
        for r in step_runs(database, TENANT)
        if r["step"] == "create_schema" and r["outcome"] == "succeeded"
    ]
    assert taken == [f"taken from the warm pool: {ready[0]}"]  # the oldest, recorded before
    assert fingerprint(database, TENANT) == clean_fingerprint

    second = workers.start(env=size)
    second.wait_for("pool_spare_dropped", 60, schema=left, reason="unfinished build")
    second.wait_for("pool_spare_built", 60)
    assert second.stop() == 0, second.output()
    assert left not in unfinished(database)


def test_a_refill_killed_with_two_builds_under_way_keeps_its_recorded_spares_whole(
    fast: Settings, database: Database, workers: Workers, clean_fingerprint: dict
) -> None:
    """A worker with two children builds two spares at once (its keeper's two builders).
    Killed with a spare recorded and two builds under way, the recorded spares are whole (a
    tenant takes the oldest and matches a clean provisioning); every schema left unfinished is
    never counted ready, is refused to the application role, and is dropped by the next
    builder, which fills the pool."""
    env = {"PROVISIONER_POOL_SIZE": "6", "PROVISIONER_WORKER_CONCURRENCY": "2"}
    first = workers.start(env=env)

    def two_under_way() -> tuple[list[str], list[str]] | None:
        found = ready_and_mid_build(database)
        return found if found is not None and len(found[1]) >= 2 else None

    ready, _ = wait_until(two_under_way, 120, "a spare recorded and two builds under way", 0.005)
    first.send(signal.SIGKILL)
    assert first.wait() == -signal.SIGKILL
    left = unfinished(database)
    assert left
    with database.owner() as conn:
        counted = pool.counts(conn, fast.app_roles)
        assert counted.unfinished == len(left) and counted.ready >= len(ready)
    with database.app() as conn:
        for schema in left:
            refused = conn.execute(
                "SELECT has_schema_privilege(current_user, %(s)s, 'USAGE')", {"s": schema}
            ).fetchone()
            assert refused == (False,)

    assert service.provision(fast, TENANT).job.status.value == "succeeded"
    taken = [
        r["detail"]
        for r in step_runs(database, TENANT)
        if r["step"] == "create_schema" and r["outcome"] == "succeeded"
    ]
    assert taken == [f"taken from the warm pool: {ready[0]}"]
    assert fingerprint(database, TENANT) == clean_fingerprint

    second = workers.start(env=env)
    wait_until(
        lambda: unfinished(database) == [] and pool_ready(database) >= 6, 120, "the pool refilled"
    )
    assert second.stop() == 0, second.output()


def pool_ready(database: Database) -> int:
    with database.owner() as conn:
        row = conn.execute("SELECT count(*) FROM control.tenant_pool").fetchone()
    return int(row[0]) if row else 0
