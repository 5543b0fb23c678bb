"""The warm pool with real worker processes: filled while idle, drained by provisioning and
refilled; spares invisible to ``app_rw`` and to users; spares of an older head never handed out.
"""

from __future__ import annotations

import json
import logging
import threading
from dataclasses import replace
from pathlib import Path
from typing import Any

import psycopg
import pytest

from provisioner import db, kinds, pool, queue, service
from provisioner.engine import Engine, StepEvent
from provisioner.errors import ConfigurationError
from provisioner.kinds.provision import STEPS, ensure_provision_job
from provisioner.models import JobStatus, TenantId
from provisioner.settings import Settings
from provisioner.templates import migrations
from provisioner.templates import reference as template_reference
from tests.conftest import Database, build_spare, fingerprint, run_cli
from tests.workers import Workers, job_row, step_runs, wait_until

POOL = {"PROVISIONER_POOL_SIZE": "2"}
TAKEN_GRANTS = "grants already in place (warm pool): USAGE granted with the take, every ACL checked"


@pytest.fixture
def fast(settings: Settings) -> Settings:
    return replace(settings, heartbeat_seconds=0.5, job_stale_after_seconds=10.0)


def spares(database: Database) -> list[dict[str, Any]]:
    """The pool's rows, oldest first, each with whether its schema exists."""
    with psycopg.connect(database.owner_url, row_factory=psycopg.rows.dict_row) as conn:
        return conn.execute(
            "SELECT p.*, EXISTS (SELECT 1 FROM pg_namespace WHERE nspname = p.schema_name) "
            "AS schema_exists FROM control.tenant_pool p ORDER BY created_at"
        ).fetchall()


def ready_spares(database: Database) -> list[str]:
    digest = migrations.tenant_tree_state().digest
    return [
        s["schema_name"]
        for s in spares(database)
        if s["tree_digest"] == digest and s["schema_exists"]
    ]


def step_detail(database: Database, tenant: str, step: str) -> str | None:
    (run,) = [
        r for r in step_runs(database, tenant) if r["step"] == step and r["outcome"] == "succeeded"
    ]
    return run["detail"]


def enqueue_together(settings: Settings, tenants: list[str]) -> None:
    """In one transaction: the worker sees them all at once and never idles in between."""
    with db.connect(settings.app_url) as conn:
        for tenant in tenants:
            ensure_provision_job(conn, TenantId(tenant))
        conn.commit()


def test_the_pool_is_filled_drained_and_refilled(
    fast: Settings, database: Database, workers: Workers, clean_fingerprint: dict
) -> None:
    worker = workers.start(env=POOL)
    wait_until(lambda: len(ready_spares(database)) == 2, 60, "two spares")
    filled = ready_spares(database)
    health = run_cli(fast, "health", "--json")
    (component,) = json.loads(health.stdout)["components"]
    wait_until(
        lambda: (
            json.loads(run_cli(fast, "health", "--json").stdout)["components"][0]["detail"]
            .get("pool", {})
            .get("ready")
            == 2
        ),
        30,
        "the heartbeat to report the pool",
    )
    assert component["detail"]["pool"]["size"] == 2

    tenants = ["p1", "p2", "p3"]
    enqueue_together(fast, tenants)
    wait_until(
        lambda: all(job_row(database, t)["status"] == "succeeded" for t in tenants),
        60,
        "three tenants",
    )
    taken = [step_detail(database, t, "create_schema") for t in tenants]
    # The two spares went, oldest first, to the first two; the third was built as before.
    assert taken == [f"taken from the warm pool: {name}" for name in filled] + [None]
    assert [step_detail(database, t, "run_tenant_migrations") for t in tenants] == [
        f"path=current (already at head) head={migrations.head_label(migrations.tenant_heads())}",
    ] * 2 + [f"path=template head={migrations.head_label(migrations.tenant_heads())}"]
    # A taken spare already carried every grant but USAGE; the built one was granted in full.
    assert [step_detail(database, t, "grant_app_rw") for t in tenants] == [TAKEN_GRANTS] * 2 + [
        None
    ]
    for tenant in tenants:
        assert job_row(database, tenant)["steps_completed"] == list(STEPS)
        assert fingerprint(database, tenant) == clean_fingerprint
    with database.app() as conn:  # taken spares are ordinary tenants for the application
        conn.execute(
            "INSERT INTO tenant_p1.members (email, role_profile_id) "
            "SELECT 'a@example.com', id FROM tenant_p1.role_profiles WHERE key = 'owner'"
        )

    wait_until(lambda: len(ready_spares(database)) == 2, 60, "the pool to be refilled")
    assert not set(ready_spares(database)) & set(filled)
    assert worker.stop() == 0, worker.output()


def warmed_sessions(database: Database) -> int:
    """Sessions of the database whose last statement was the engine's warm-up: queue.warm's
    catalog read, or the plan of a statement (``EXPLAIN``), which only queue.warm sends."""
    with psycopg.connect(database.owner_url) as conn:
        row = conn.execute(
            "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
            "AND state = 'idle' AND (query LIKE 'EXPLAIN %%' OR query = %s)",
            (queue.touch_statement(kinds.BUILTIN.warm_touches),),
        ).fetchone()
    assert row is not None
    return int(row[0])


def test_a_spare_build_warms_the_idle_engine_sessions(
    fast: Settings, database: Database, workers: Workers
) -> None:
    """After the build that fills the pool, the worker has its idle child reload its sessions'
    catalog caches (both of them, once the child has run a job), not the next sign-up."""
    worker = workers.start(env={**POOL, "PROVISIONER_POLL_SECONDS": "600"})
    wait_until(lambda: len(ready_spares(database)) == 2, 60, "two spares")
    enqueue_together(fast, ["w1"])  # the child's steps session opens with its first job
    wait_until(lambda: job_row(database, "w1")["status"] == "succeeded", 60, "w1")
    wait_until(lambda: len(ready_spares(database)) == 2, 60, "the pool to be refilled")
    # The child's control session and its steps session, warmed after the refill's build.
    wait_until(lambda: warmed_sessions(database) == 2, 30, "both engine sessions warmed")
    assert worker.stop() == 0, worker.output()


CLAIM_PLANS = (
    "SELECT generic_plans, custom_plans FROM pg_prepared_statements "
    "WHERE statement LIKE '%%WITH next AS%%' AND statement LIKE %s"
)


def test_the_warm_up_keeps_the_claims_plan_for_the_next_sign_up(
    fast: Settings, database: Database
) -> None:
    """The engine's control session keeps generic plans, and its warm-up runs the claim of no
    job type, prepared: a spare build's schema resets every plan, the warm-up after the build
    makes the claim's plan again, and the next sign-up's claim uses it instead of planning
    while the sign-up waits. (``generic_plans`` counts the executions that used the generic
    plan; none was planned for one execution alone.)"""
    with Engine.from_settings(fast, "warmed") as engine:
        assert engine.claim(("provision_tenant",)) is None  # the control session is open
        engine.warm()
        control = engine.control
        plans = control.execute(CLAIM_PLANS, ("%UPDATE control.platform_jobs%",)).fetchone()
        assert plans == {"generic_plans": 1, "custom_plans": 0}
        with psycopg.connect(database.owner_url, autocommit=True) as other:
            other.execute("CREATE SCHEMA resets_every_plan")  # as a spare build does
        engine.warm()
        with psycopg.connect(database.owner_url) as app:
            ensure_provision_job(app, TenantId("w1"))
        plans = control.execute(CLAIM_PLANS, ("%UPDATE control.platform_jobs%",)).fetchone()
        assert plans == {"generic_plans": 2, "custom_plans": 0}
        claimed = engine.claim(("provision_tenant",))
        assert claimed is not None and claimed.job.tenant_id == "w1"
        plans = control.execute(CLAIM_PLANS, ("%UPDATE control.platform_jobs%",)).fetchone()
        assert plans == {"generic_plans": 3, "custom_plans": 0}  # the same prepared claim
        engine.release(claimed.job)


TAKE_PLANS = (
    "SELECT statement LIKE '%%DELETE FROM control.tenant_pool%%' AS take, generic_plans, "
    "custom_plans FROM pg_prepared_statements WHERE statement LIKE ANY (%s) ORDER BY 1, 2"
)


def test_a_take_binds_the_plans_made_before_it(fast: Settings, database: Database) -> None:
    """The steps' sessions keep generic plans; after a build, the warm-up prepares the take's
    statements that come before its rename (pool.plan_take), and the take binds them as they
    are: one more execution of each generic plan, no plan made for the take's values. (The
    grants' statement is prepared for each privilege set; this project's one role is readwrite,
    so the readonly one stays unused.)"""
    spare = build_spare(fast)
    steps = db.Database(fast.owner_url)
    patterns = (["%DELETE FROM control.tenant_pool%", "%lacking_defaults%"],)
    try:
        with steps.transaction() as tx:
            assert tx.pg.execute("SHOW plan_cache_mode").fetchone() == ("force_generic_plan",)
        steps.on_idle_session(pool.plan_take)
        with steps.transaction() as tx:
            prepared = tx.pg.execute(TAKE_PLANS, patterns).fetchall()
            assert prepared == [(False, 1, 0), (False, 1, 0), (True, 1, 0)]
            taken = pool.take(tx, "tenant_bound", fast.app_roles)
            assert taken is not None and taken.spare == spare and taken.all_but_usage
            prepared = tx.pg.execute(TAKE_PLANS, patterns).fetchall()
            assert prepared == [(False, 1, 0), (False, 2, 0), (True, 2, 0)]
    finally:
        steps.close()


def test_spares_are_refused_to_app_rw_and_invisible_to_users(
    fast: Settings, database: Database
) -> None:
    spare = build_spare(fast)
    assert spare.startswith("pool_") and not spare.startswith("tenant_")
    with database.owner() as conn:
        oid: Any = conn.execute("SELECT %s::regclass::oid", (f"{spare}.members",)).fetchone()
    members = oid[0]
    with database.app() as conn:
        row = conn.execute(
            "SELECT has_schema_privilege(current_user, %s, 'USAGE'), "
            "has_schema_privilege(current_user, %s, 'CREATE')",
            (spare, spare),
        ).fetchone()
        assert row == (False, False)
        with pytest.raises(psycopg.errors.InsufficientPrivilege):
            conn.execute(f'SELECT * FROM "{spare}".members')
        # The table grants are there already (so that a take only grants USAGE), and give
        # nothing without USAGE on the schema: no statement reaches a spare's table.
        # (By oid: even resolving the table's name is refused without USAGE.)
        assert conn.execute(
            "SELECT has_table_privilege(current_user, %s::oid, 'INSERT')", (members,)
        ).fetchone() == (True,)
        for statement in (
            f"INSERT INTO \"{spare}\".role_profiles (key, name) VALUES ('x', 'x')",
            f'UPDATE "{spare}".members SET email = email',
            f'DELETE FROM "{spare}".members',
            f"SELECT nextval('\"{spare}\".members_id_seq')",
        ):
            with pytest.raises(psycopg.errors.InsufficientPrivilege):
                conn.execute(statement)
    with database.owner() as conn:
        held = pool.grants_held(conn, spare, fast.app_roles[0])
    assert held is not None and held.all_but_usage and not held.usage
    for args in (("jobs", "list", "--json"), ("upgrade", "--all", "--dry-run")):
        shown = run_cli(fast, *args)
        assert shown.returncode == 0, shown.stderr
        assert spare not in shown.stdout and "pool_" not in shown.stdout


def test_spares_of_an_older_head_are_never_handed_out_and_are_rebuilt(
    fast: Settings, database: Database, workers: Workers
) -> None:
    old = build_spare(fast)
    with database.owner() as conn:  # as if a release with an older template built it
        conn.execute(
            "UPDATE control.tenant_pool SET tree_digest = repeat('0', 64), heads = '{t003}'"
        )
    result = service.provision(fast, "after_deploy")
    assert step_detail(database, "after_deploy", "create_schema") is None  # built, not taken
    assert [s["schema_name"] for s in spares(database)] == [old]

    worker = workers.start(env={"PROVISIONER_POOL_SIZE": "1"})
    wait_until(lambda: len(ready_spares(database)) == 1, 60, "a spare at the current head")
    assert old not in [s["schema_name"] for s in spares(database)]
    with database.owner() as conn:
        assert (
            conn.execute("SELECT 1 FROM pg_namespace WHERE nspname = %s", (old,)).fetchone() is None
        )
    assert result.job.status.value == "succeeded"
    assert worker.stop() == 0, worker.output()


def test_a_spare_whose_schema_was_dropped_by_hand_is_not_counted_and_is_cleared(
    fast: Settings, database: Database
) -> None:
    owner = db.Database(fast.owner_url)
    try:
        with owner.session() as session:
            with pool.builder_lock(session):
                kept, gone = pool.build_spare(session, "test"), pool.build_spare(session, "test")
            with database.owner() as conn:
                conn.execute(f'DROP SCHEMA "{gone}" CASCADE')
            with session.transaction() as tx:
                assert pool.counts(tx.pg) == pool.PoolCounts(ready=1, stale=1)
                assert pool.drop_stale_spare(tx) == pool.Dropped(gone, "schema gone")
                assert pool.drop_stale_spare(tx) is None
            # Already full: nothing more is built.
            assert pool.refill(session, 1, "test") == pool.Tended()
    finally:
        owner.close()
    assert [s["schema_name"] for s in spares(database)] == [kept]


def test_a_spare_is_built_in_batches_and_recorded_in_its_own_last_transaction(
    fast: Settings, database: Database
) -> None:
    """One transaction of a large template's DDL would make every other session of the
    database reset its caches: the replay and the grants commit pool.BATCH at a time, and the
    spare's row only after every check."""
    spare = build_spare(fast)
    with database.owner() as conn:
        row = conn.execute(
            "SELECT (SELECT count(DISTINCT c.xmin::text) FROM pg_class c"
            "         WHERE c.relnamespace = n.oid AND c.relkind IN ('r', 'i', 'S')),"
            "       (SELECT p.xmin::text FROM control.tenant_pool p WHERE p.schema_name = %(s)s)"
            "       NOT IN (SELECT c.xmin::text FROM pg_class c WHERE c.relnamespace = n.oid)"
            "  FROM pg_namespace n WHERE n.nspname = %(s)s",
            {"s": spare},
        ).fetchone()
    assert row is not None
    transactions, recorded_apart = row
    statements = len(template_reference.Template.capture().statements)
    # pg_class rows are rewritten by their grants, in batches too.
    assert transactions > 1 and statements > pool.BATCH
    assert recorded_apart


def test_a_stopped_or_failed_spare_build_leaves_nothing(fast: Settings, database: Database) -> None:
    """Between two of its transactions a build can be stopped (the worker is stopping); what
    it built is dropped, and no row was written."""
    asked: list[int] = []

    def stop_at_third() -> bool:
        asked.append(1)
        return len(asked) == 3

    owner = db.Database(fast.owner_url)
    try:
        with owner.session() as session, pytest.raises(pool.BuildStopped):
            pool.build_spare(session, "test", fast.app_roles, stop=stop_at_third)
    finally:
        owner.close()
    with database.owner() as conn:
        assert conn.execute(pool.UNFINISHED_SPARES).fetchall() == []
        assert pool.counts(conn) == pool.PoolCounts(ready=0, stale=0, unfinished=0)


@pytest.mark.parametrize(("raw", "size"), [(None, 0), ("", 0), ("0", 0), ("3", 3)])
def test_pool_size_setting(raw: str | None, size: int) -> None:
    env = {} if raw is None else {"PROVISIONER_POOL_SIZE": raw}
    assert Settings.from_env(env).pool_size == size


@pytest.mark.parametrize("raw", ["-1", "two", "1.5"])
def test_a_bad_pool_size_is_refused_in_one_line(raw: str) -> None:
    with pytest.raises(ConfigurationError, match="PROVISIONER_POOL_SIZE must be"):
        Settings.from_env({"PROVISIONER_POOL_SIZE": raw})


def test_a_taken_spares_steps_commit_together_or_leave_the_spare(
    settings: Settings, database: Database, objects_dir: Path, clean_fingerprint: dict
) -> None:
    """The steps after a take run in the take's transaction: when a later one fails, the spare
    is back in the pool, whole, and no tenant schema exists; the journal's one committed row
    (create_schema's) names the step that failed. Done is reported only once committed."""
    spare = build_spare(settings)
    objects_dir.rmdir()  # the storage check, the fifth step, fails (permanently)
    events: list[StepEvent] = []
    failed = service.provision(settings, "acme", on_progress=events.append).job
    assert failed.status is JobStatus.FAILED
    assert (failed.error_detail or "").startswith("verify_object_storage: filesystem store")
    assert failed.steps_completed == []
    assert ready_spares(database) == [spare]
    with database.owner() as conn:
        assert conn.execute(
            "SELECT count(*) FROM pg_namespace WHERE nspname = 'tenant_acme'"
        ).fetchone() == (0,)
    (run,) = step_runs(database, "acme")
    assert (run["step"], run["outcome"]) == ("create_schema", "failed")
    assert run["detail"].startswith(
        "rolled back with verify_object_storage, in the same transaction: filesystem store"
    )
    assert [(e.step, e.outcome) for e in events if e.outcome != "started"] == [
        ("verify_object_storage", "failed")
    ]

    objects_dir.mkdir()
    events.clear()
    again = service.provision(settings, "acme", on_progress=events.append).job
    assert again.status is JobStatus.SUCCEEDED, again.error_detail
    assert [(e.step, e.outcome) for e in events if e.outcome != "started"] == [
        (step, "done") for step in STEPS
    ]
    assert step_detail(database, "acme", "create_schema") == f"taken from the warm pool: {spare}"
    assert ready_spares(database) == []
    assert fingerprint(database, "acme") == clean_fingerprint


def test_a_spare_built_without_grants_is_taken_and_granted_in_full(
    fast: Settings, database: Database, clean_fingerprint: dict
) -> None:
    """A spare left by a release that built them without grants is still handed out: the grant
    step finds a grant missing and names every table, as for a new schema."""
    owner = db.Database(fast.owner_url)
    try:
        with owner.session() as session:
            spare = pool.build_spare(session, "test")  # no app_roles: no grants at all
            with session.transaction() as tx:
                held = pool.grants_held(tx.pg, spare, fast.app_roles[0])
        assert held is not None and not held.usage and not held.all_but_usage
    finally:
        owner.close()
    service.provision(fast, "old_spare")
    assert (
        step_detail(database, "old_spare", "create_schema") == f"taken from the warm pool: {spare}"
    )
    assert step_detail(database, "old_spare", "grant_app_rw") is None  # the full grant step
    assert fingerprint(database, "old_spare") == clean_fingerprint


def test_the_take_grant_check_fails_when_any_grant_is_missing(
    fast: Settings, database: Database
) -> None:
    """The one-query check reads the ACLs themselves: one privilege missing on one table or a
    default privilege, and the fast path refuses (the full grant step runs). (A spare's
    sequences carry no grant until the take: tests/integration/test_tenant_side_hardening.py.)"""
    spare = build_spare(fast)
    revokes = (
        f'REVOKE DELETE ON "{spare}".members FROM app_rw',
        f'ALTER DEFAULT PRIVILEGES IN SCHEMA "{spare}" REVOKE UPDATE ON TABLES FROM app_rw',
        f'GRANT CREATE ON SCHEMA "{spare}" TO app_rw',
    )
    expected = (
        ["members"],
        ["r"],
        [],
    )
    for revoke, lacking in zip(revokes, expected, strict=True):
        with psycopg.connect(database.owner_url) as conn:  # each case rolled back
            assert pool.grant_usage_if_in_place(conn, spare, fast.app_roles)  # all in place
            conn.rollback()
            conn.execute(revoke)
            held = pool.grants_held(conn, spare, fast.app_roles[0])
            assert held is not None
            assert (held.lacking or held.lacking_defaults or []) == lacking
            assert not pool.grant_usage_if_in_place(conn, spare, fast.app_roles)
            conn.rollback()


def test_the_take_grant_check_counts_only_grants_made_by_the_owner(
    fast: Settings, database: Database
) -> None:
    """A privilege that reaches app_rw only through another grantor is not the grant step's
    own: the check lists the table, and the full grant step runs (grants again, as the owner)."""
    spare = build_spare(fast)
    with psycopg.connect(database.admin_url) as conn:  # all of it rolled back, the role too
        conn.execute("CREATE ROLE pool_test_grantor")
        conn.execute(f'GRANT USAGE ON SCHEMA "{spare}" TO pool_test_grantor')
        conn.execute(f'REVOKE DELETE ON "{spare}".members FROM app_rw')
        conn.execute(f'GRANT DELETE ON "{spare}".members TO pool_test_grantor WITH GRANT OPTION')
        conn.execute("SET ROLE pool_test_grantor")
        conn.execute(f'GRANT DELETE ON "{spare}".members TO app_rw')
        conn.execute("RESET ROLE")
        row = conn.execute(
            "SELECT has_table_privilege('app_rw', %s::regclass, 'DELETE')",
            (f'"{spare}".members',),
        ).fetchone()
        assert row == (True,)  # app_rw can delete, by the other grantor's grant
        held = pool.grants_held(conn, spare, fast.app_roles[0])
        assert held is not None and held.lacking == ["members"]
        assert not pool.grant_usage_if_in_place(conn, spare, fast.app_roles)
        conn.rollback()


def test_a_spare_whose_grants_reach_the_schema_is_rejected(
    fast: Settings, database: Database
) -> None:
    """The build's check: a spare the application role could use (USAGE held) is refused."""
    spare = build_spare(fast)
    with psycopg.connect(database.owner_url) as conn:
        conn.execute(f'GRANT USAGE ON SCHEMA "{spare}" TO app_rw')
        with pytest.raises(pool.SpareRejected, match="USAGE is held"):
            pool.check_spare_grants(conn, spare, fast.app_roles)
        conn.rollback()


def _unfinished(database: Database) -> list[str]:
    with psycopg.connect(database.owner_url) as conn:
        rows = conn.execute(
            "SELECT s.schema_name FROM control.tenant_pool_schemas s WHERE NOT EXISTS "
            "(SELECT 1 FROM control.tenant_pool p WHERE p.schema_name = s.schema_name)"
        ).fetchall()
    return [str(r[0]) for r in rows]


def _relations_in(database: Database, schema: str) -> int:
    with psycopg.connect(database.owner_url) as conn:
        row = conn.execute(
            "SELECT count(*) FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace "
            "WHERE n.nspname = %s",
            (schema,),
        ).fetchone()
    assert row is not None
    return int(row[0])


class BusyAtTheFirstBatch:
    """A worker's ``idle()`` for the keeper: idle when asked whether to build and before the
    first batch (which creates the schema), then busy from the first batch's commit (which
    asks whether to begin the next batch with it), until released."""

    def __init__(self, database: Database | None = None) -> None:
        self.calls = 0
        self.busy = threading.Event()
        self.database = database
        #: the unfinished schemas when it turned busy (read then: a short pause limit may
        #: drop the schema before the test looks)
        self.seen: list[str] = []

    def __call__(self) -> bool:
        self.calls += 1
        if self.calls == 3:  # asked at the first batch's commit: the job arrived
            self.busy.set()
        elif self.calls == 4 and self.database is not None:  # between the first two batches
            self.seen = _unfinished(self.database)
        return not self.busy.is_set()


def test_a_spare_build_pauses_while_the_worker_has_a_job(
    fast: Settings, database: Database
) -> None:
    """A job arriving mid-build stops the build's progress at the next transaction boundary;
    once the worker is idle again the same schema is finished and becomes the ready spare."""
    idle = BusyAtTheFirstBatch()
    keeper = pool.PoolKeeper(
        fast.owner_url, 1, "test:pool", idle, logging.getLogger("test"), app_roles=fast.app_roles
    )
    keeper.start()
    try:
        wait_until(lambda: idle.calls >= 5, 60, "the build to pause after its first batch")
        (paused,) = _unfinished(database)
        built = _relations_in(database, paused)
        asked = idle.calls
        wait_until(lambda: idle.calls >= asked + 5, 30, "the paused build to ask again")
        assert ready_spares(database) == [] and _unfinished(database) == [paused]
        assert _relations_in(database, paused) == built > 0  # not one batch ran while busy

        idle.busy.clear()
        wait_until(lambda: ready_spares(database) == [paused], 60, "the build to go on")
        assert _unfinished(database) == [] and keeper.pauses == 1
        assert _relations_in(database, paused) > built
    finally:
        keeper.stop()


def test_a_build_paused_past_its_limit_gives_up_and_drops_its_schema(
    fast: Settings, database: Database
) -> None:
    idle = BusyAtTheFirstBatch(database)
    keeper = pool.PoolKeeper(
        fast.owner_url,
        1,
        "test:pool",
        idle,
        logging.getLogger("test"),
        app_roles=fast.app_roles,
        pause_limit_seconds=0.2,
    )
    keeper.start()
    try:
        wait_until(lambda: idle.calls >= 5, 60, "the build to pause after its first batch")
        (paused,) = idle.seen
        wait_until(lambda: _unfinished(database) == [], 30, "the build to give up")
        assert ready_spares(database) == [] and keeper.pauses == 0
        with psycopg.connect(database.owner_url) as conn:
            assert (
                conn.execute("SELECT 1 FROM pg_namespace WHERE nspname = %s", (paused,)).fetchone()
                is None
            )
    finally:
        keeper.stop()


def test_the_keepers_sessions_commit_without_waiting_for_the_disk(
    fast: Settings, database: Database
) -> None:
    """A spare's build does not wait for a flush per transaction (its sessions say so
    themselves, whatever the server's default); other sessions keep the server's setting."""
    keeper = pool.PoolKeeper(
        fast.owner_url, 1, "test:pool", lambda: False, logging.getLogger("test")
    )
    read = "SELECT setting, source FROM pg_settings WHERE name = 'synchronous_commit'"
    try:
        with keeper._db.transaction() as tx:
            assert tx.pg.execute(read).fetchone() == ("off", "client")
    finally:
        keeper._db.close()
    with psycopg.connect(database.owner_url) as conn:
        row = conn.execute(read).fetchone()
    assert row is not None and row[1] != "client"
