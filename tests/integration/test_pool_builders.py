"""The keeper's builds side by side (``PoolKeeper(builders=N)``, the worker's children count):
a refill builds on N sessions at once, and every one of them yields to a job."""

from __future__ import annotations

import logging
import re
import tempfile
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager

import psycopg
from psycopg import pq

from provisioner import db, pool
from provisioner.pool.refill import Builder
from provisioner.pool.spares import spare_name
from provisioner.settings import Settings
from provisioner.templates.reference import Reference
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


def _round_trips(conn: psycopg.Connection, work: Callable[[], object]) -> list[str]:
    """What ``work()`` sent on ``conn``, one entry per round trip (the client's messages up to
    the server's ReadyForQuery), read from libpq's own trace of the wire: a simple query's
    text, or the extended protocol's message names."""
    with tempfile.TemporaryFile() as trace:
        conn.pgconn.trace(trace.fileno())
        conn.pgconn.set_trace_flags(pq.Trace.SUPPRESS_TIMESTAMPS | pq.Trace.REGRESS_MODE)
        try:
            work()
        finally:
            conn.pgconn.untrace()
        trace.seek(0)
        text = trace.read().decode(errors="replace")
    trips: list[str] = []
    sent: list[str] = []
    starts = list(re.finditer(r"^([FB])\t\d+\t(\w+)", text, re.MULTILINE))
    for at, found in enumerate(starts):
        end = starts[at + 1].start() if at + 1 < len(starts) else len(text)
        side, kind = found.group(1), found.group(2)
        if side == "F":
            sent.append(text[found.end() : end].strip().strip('"') if kind == "Query" else kind)
        elif kind == "ReadyForQuery":
            trips.append(" ".join(sent))
            sent = []
    return trips


def test_a_spares_record_begins_the_next_spare_and_two_round_trips_lie_between_them(
    settings: Settings, database: Database
) -> None:
    """build.py ``_record``: the last grant batch's commit begins the record's transaction
    with the spare's row, the grants' check follows, and the record's commit begins the next
    spare's first batch (its name asked for just before it): two round trips between one
    spare's last DDL and the next spare's first (the row, the check), where there were five
    (the last batch's commit, BEGIN, the check, the row, COMMIT). The fingerprint's
    search_path rides the last replay batch. Both spares are whole and recorded, each in its
    own last transaction."""
    build_spare(settings)  # the template's reference computed and stored before
    second = spare_name()
    owner = db.Database(settings.owner_url)
    try:
        with owner.session() as session, pool.builder_lock(session) as locked:
            assert locked

            def two() -> list[str]:
                asked: list[str] = []
                references: dict[str, Reference] = {}  # a refill reads it once, before

                def next_spare() -> str:
                    asked.append(second)
                    return second

                first = pool.build_spare(
                    session,
                    "test",
                    settings.app_roles,
                    go_on=lambda: True,
                    references=references,
                    next_spare=next_spare,
                )
                assert asked == [second]
                return [
                    first,
                    pool.build_spare(
                        session,
                        "test",
                        settings.app_roles,
                        go_on=lambda: True,
                        references=references,
                        name=second,
                    ),
                ]

            built: list[list[str]] = []
            trips = _round_trips(session.driver, lambda: built.append(two()))
    finally:
        owner.close()
    first = built[0][0]
    assert built[0][1] == second
    recorded = [at for at, trip in enumerate(trips) if "INSERT INTO control.tenant_pool (" in trip]
    begun = [
        at for at, trip in enumerate(trips) if "INSERT INTO control.tenant_pool_schemas" in trip
    ]
    assert len(recorded) == 2 and len(begun) == 2
    # The first spare's row rides its last grant batch's commit; the second spare's first
    # batch rides the first spare's record's commit, after the check alone.
    assert f"'{first}'" in trips[recorded[0]] and trips[recorded[0]].startswith("COMMIT; BEGIN;")
    assert "GRANT" in trips[recorded[0] - 1], trips[recorded[0] - 1]
    assert f"'{second}'" in trips[begun[1]] and trips[begun[1]].startswith("COMMIT; BEGIN;")
    # Between them, the grants' check alone (prepared at its first run on the session, then
    # bound); the second spare's record's commit begins nothing.
    assert trips[recorded[0] + 1 : begun[1]] == ["Parse Sync", "Bind Describe Execute Sync"]
    assert trips[recorded[1] + 1 :] == ["Bind Describe Execute Sync", "COMMIT"]
    assert not any("search_path TO DEFAULT" in trip and "CREATE" not in trip for trip in trips)
    with psycopg.connect(database.owner_url) as conn:
        rows = conn.execute(
            "SELECT p.schema_name FROM control.tenant_pool p ORDER BY p.created_at"
        ).fetchall()
    assert [r[0] for r in rows][-2:] == [first, second]
    assert _unfinished(database) == []


def test_a_refills_first_build_does_not_wait_for_the_other_builders_sessions(
    settings: Settings, database: Database
) -> None:
    """refill.py ``_build_side_by_side``: each other builder opens its sessions in its own
    thread, so the first builder's build begins at once, not after their connections (a new
    server process each). Here the other builder's session opens only once a spare is built:
    a refill that opened it before building would never get there."""
    build_spare(settings)
    built = threading.Event()
    owner = db.Database(settings.owner_url, most_sessions=2)

    @contextmanager
    def late() -> Iterator[Builder]:
        assert built.wait(60), "the first builder waited for this one's session"
        with owner.session() as other:
            yield Builder(other)

    try:
        with owner.session() as session:
            tended = pool.refill(
                session,
                4,
                "test",
                settings.app_roles,
                on_built=lambda name, ready: built.set(),
                helpers=[late],
            )
    finally:
        owner.close()
    assert len(tended.built) == 3  # the one built before, and three more
    assert len(_spans(database)) == 4 and _unfinished(database) == []
