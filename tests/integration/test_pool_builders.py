"""The keeper's builds side by side (``PoolKeeper(builders=N)``, the worker's children count):
a refill builds on N sessions at once, and every one of them yields to a job."""

from __future__ import annotations

import logging
import threading

import psycopg

from provisioner import db, pool
from provisioner.settings import Settings
from tests.conftest import Database, build_spare
from tests.workers import wait_until

HOLDER = "test:builders"


def _spans(database: Database) -> list[tuple[str, float, float]]:
    """Each ready spare: its name, when its build began (its schema's record) and when it was
    recorded ready (each a transaction's start, ``now()``)."""
    with psycopg.connect(database.owner_url) as conn:
        rows = conn.execute(
            "SELECT s.schema_name, extract(epoch FROM s.created_at),"
            "       extract(epoch FROM p.created_at)"
            "  FROM control.tenant_pool_schemas s"
            "  JOIN control.tenant_pool p USING (schema_name) ORDER BY 2"
        ).fetchall()
    return [(str(name), float(began), float(ready)) for name, began, ready in rows]


def _unfinished(database: Database) -> list[str]:
    with psycopg.connect(database.owner_url) as conn:
        rows = conn.execute(pool.UNFINISHED_SPARES).fetchall()
    return sorted(str(r[0]) for r in rows)


def _relations(database: Database, schemas: list[str]) -> list[int]:
    with psycopg.connect(database.owner_url) as conn:
        return [
            int(
                conn.execute(
                    "SELECT count(*) FROM pg_class c JOIN pg_namespace n"
                    " ON n.oid = c.relnamespace WHERE n.nspname = %s",
                    (schema,),
                ).fetchone()[0]  # type: ignore[index]
            )
            for schema in schemas
        ]


def _keeper_states(database: Database) -> list[str]:
    with psycopg.connect(database.owner_url) as conn:
        rows = conn.execute(
            "SELECT state FROM pg_stat_activity WHERE application_name = %s", (HOLDER,)
        ).fetchall()
    return sorted(str(r[0]) for r in rows)


def test_a_refill_builds_spares_side_by_side(settings: Settings, database: Database) -> None:
    """With two builders, a spare's build begins while another's is under way; every spare is
    whole and recorded."""
    keeper = pool.PoolKeeper(
        settings.owner_url,
        5,
        HOLDER,
        lambda: True,
        logging.getLogger("test"),
        app_roles=settings.app_roles,
        builders=2,
    )
    keeper.start()
    try:
        wait_until(lambda: len(_spans(database)) == 5, 120, "the pool to fill")
    finally:
        keeper.stop()
    spans = _spans(database)
    overlapping = [
        (a, b)
        for a, a_began, a_ready in spans
        for b, b_began, _ in spans
        if a != b and a_began < b_began < a_ready
    ]
    assert overlapping, spans
    assert _unfinished(database) == []


def test_every_builder_pauses_while_the_worker_has_a_job(
    settings: Settings, database: Database
) -> None:
    """A job arriving while two spares are being built stops both at their next transaction
    boundary (no statement of either runs until the worker is idle again); then both go on
    with the same schemas."""
    busy = threading.Event()
    asked = [0]
    helper_asked = [0]

    def idle() -> bool:
        # The job arrives at the second builder's first commit (its schema is there, and the
        # first builder, which began with it, is mid-build too).
        asked[0] += 1
        if threading.current_thread().name == "pool-builder":
            helper_asked[0] += 1
            if helper_asked[0] == 2:  # before its first batch, then at its commit
                busy.set()
        return not busy.is_set()

    keeper = pool.PoolKeeper(
        settings.owner_url,
        3,
        HOLDER,
        idle,
        logging.getLogger("test"),
        app_roles=settings.app_roles,
        builders=2,
    )
    keeper.start()
    try:
        wait_until(busy.is_set, 120, "the second builder's first commit")
        wait_until(
            lambda: _keeper_states(database) == ["idle", "idle"],
            60,
            "both builders to end their transaction and pause",
        )
        paused = _unfinished(database)
        assert len(paused) == 2
        before = _relations(database, paused)
        calls = asked[0]
        wait_until(lambda: asked[0] >= calls + 20, 30, "the paused builders to ask again")
        assert _relations(database, paused) == before
        assert _unfinished(database) == paused and _spans(database) == []

        busy.clear()
        wait_until(lambda: len(_spans(database)) == 3, 120, "the builds to go on")
        assert set(paused) <= {name for name, _, _ in _spans(database)}
        assert keeper.pauses >= 2 and _unfinished(database) == []
    finally:
        keeper.stop()


def test_a_builders_checks_are_planned_once_per_session_not_per_spare(
    settings: Settings, database: Database
) -> None:
    """db/plans.py ``preparing_again``: a builder's session (opened for one refill) prepares
    the spare's fingerprint and grants check at their first run, inside the replay's batches
    (where psycopg otherwise prepares nothing), and the next spare binds those plans: each
    statement is prepared once and run once per spare."""
    build_spare(settings)  # the template's reference computed and stored before
    owner = db.Database(settings.owner_url)
    try:
        with owner.session() as session, pool.builder_lock(session) as locked:
            assert locked
            for _ in range(2):
                pool.build_spare(session, "test", settings.app_roles)
            rows = session.driver.execute(
                "SELECT statement, generic_plans + custom_plans FROM pg_prepared_statements"
            ).fetchall()
    finally:
        owner.close()
    checks = {
        "fingerprint": [runs for text, runs in rows if ", idx AS (" in text],
        "grants": [runs for text, runs in rows if "lacking_defaults" in text],
    }
    assert checks == {"fingerprint": [2], "grants": [2]}, rows
