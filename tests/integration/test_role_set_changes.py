"""A change of the configured application roles (issue 24): what was built for the old set (a
warm spare, which carries its roles' grants; an upgrade's reference, whose fingerprint holds
them) records that set, is never used for another, and is replaced: the spare dropped, said so
and rebuilt; the reference computed again for the new set, so the replay still serves."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import psycopg
import pytest

from provisioner import db, pool, roles, service
from provisioner.local import cluster as local_pg
from provisioner.models import JobStatus
from provisioner.roles import AppRole, AppRoles, Privileges
from provisioner.settings import Settings
from provisioner.templates import migrations
from provisioner.templates.replay import TemplateCache
from provisioner.templates.upgrade import UpgradeCache, upgrade_reference_key
from provisioner.tenant import schema as tenant_schema
from provisioner.testing.server import BOOTSTRAP_LOCK_KEY
from tests.conftest import Database, Server, build_spare, run_cli
from tests.integration.test_fleet_upgrade import make_tree, use_tree
from tests.integration.test_schema_pattern import NAMED, RULE
from tests.workers import Workers, step_runs

RW = AppRole("app_rw", Privileges.READWRITE)
RO = AppRole("app_ro", Privileges.READONLY)
RO_WRITES = AppRole("app_ro", Privileges.READWRITE)


@pytest.fixture
def fast(settings: Settings) -> Settings:
    return replace(settings, heartbeat_seconds=0.5, job_stale_after_seconds=30.0)


@pytest.fixture
def with_ro(fast: Settings, database: Database, pg_server: Server) -> Settings:
    """The test's settings (app_rw alone); the role app_ro exists and may connect, so that a
    test can configure it."""
    with psycopg.connect(pg_server.admin_url, autocommit=True) as lock:
        lock.execute("SELECT pg_advisory_lock(%s)", (BOOTSTRAP_LOCK_KEY,))
        with psycopg.connect(database.admin_url, autocommit=True) as conn:
            local_pg.add_app_roles(conn, ("app_ro",))
    return fast


def pool_rows(database: Database) -> list[tuple[str, str]]:
    with database.owner() as conn:
        rows = conn.execute(
            "SELECT schema_name, app_roles FROM control.tenant_pool ORDER BY created_at"
        ).fetchall()
    return [(str(r[0]), str(r[1])) for r in rows]


def create_detail(database: Database, tenant: str) -> str | None:
    (run,) = [
        r
        for r in step_runs(database, tenant)
        if r["step"] == "create_schema" and r["outcome"] == "succeeded"
    ]
    return None if run["detail"] is None else str(run["detail"])


def schema_exists(database: Database, schema: str) -> bool:
    with database.owner() as conn:
        row = conn.execute("SELECT 1 FROM pg_namespace WHERE nspname = %s", (schema,)).fetchone()
    return row is not None


@pytest.mark.parametrize(
    ("built_for", "configured"),
    [
        pytest.param((RW,), (RW, RO), id="a-role-added"),
        pytest.param((RW, RO), (RW,), id="a-role-removed"),
        pytest.param((RW, RO_WRITES), (RW, RO), id="a-role-given-fewer-privileges"),
    ],
)
def test_a_spare_built_for_another_role_set_is_never_handed_out_and_is_dropped(
    with_ro: Settings, database: Database, built_for: AppRoles, configured: AppRoles
) -> None:
    spare = build_spare(replace(with_ro, app_roles=built_for))
    assert pool_rows(database) == [(spare, roles.identity(built_for))]
    now = replace(with_ro, app_roles=configured)
    with database.owner() as conn:
        assert pool.counts(conn, configured) == pool.PoolCounts(ready=0, stale=1)
        assert pool.counts(conn, built_for) == pool.PoolCounts(ready=1, stale=0)

    assert service.provision(now, "signed_up").job.status is JobStatus.SUCCEEDED
    assert create_detail(database, "signed_up") is None  # built, not taken
    assert [name for name, _ in pool_rows(database)] == [spare]
    with database.owner() as conn:  # the tenant holds exactly the configured roles' grants
        assert tenant_schema.missing_app_grants(conn, "tenant_signed_up", configured) == []
    assert service.check(now, ["signed_up"]).drifted == []

    owner = db.Database(with_ro.owner_url)
    try:
        with owner.transaction() as tx:
            dropped = pool.drop_stale_spare(tx, configured)
    finally:
        owner.close()
    assert dropped == pool.Dropped(
        spare,
        f"built for roles {roles.identity(built_for)}, configured {roles.identity(configured)}",
    )
    assert pool_rows(database) == [] and not schema_exists(database, spare)


def test_the_keeper_drops_a_spare_of_the_old_role_set_says_why_and_builds_one_for_the_new(
    with_ro: Settings, database: Database, workers: Workers
) -> None:
    old = build_spare(with_ro)  # app_rw alone
    both = {
        "PROVISIONER_APP_ROLES": "app_rw=readwrite,app_ro=readonly",
        "PROVISIONER_POOL_SIZE": "1",
    }
    worker = workers.start(env=both)
    worker.wait_for(
        "pool_spare_dropped",
        60,
        schema=old,
        reason="built for roles app_rw=readwrite, configured app_ro=readonly,app_rw=readwrite",
    )
    built = worker.wait_for("pool_spare_built", 60)
    assert pool_rows(database) == [(built["schema"], "app_ro=readonly,app_rw=readwrite")]
    assert not schema_exists(database, old)
    assert worker.stop() == 0, worker.output()

    two = replace(with_ro, app_roles=(RW, RO))
    assert service.provision(two, "pooled").job.status is JobStatus.SUCCEEDED
    assert create_detail(database, "pooled") == f"taken from the warm pool: {built['schema']}"
    with database.owner() as conn:
        assert tenant_schema.missing_app_grants(conn, "tenant_pooled", two.app_roles) == []
    assert service.check(two, ["pooled"]).drifted == []


def test_the_roles_order_is_not_a_change(with_ro: Settings, database: Database) -> None:
    spare = build_spare(replace(with_ro, app_roles=(RO, RW)))
    two = replace(with_ro, app_roles=(RW, RO))
    assert service.provision(two, "reordered").job.status is JobStatus.SUCCEEDED
    assert create_detail(database, "reordered") == f"taken from the warm pool: {spare}"


def test_a_spare_recorded_before_roles_were_recorded_is_rebuilt(
    with_ro: Settings, database: Database
) -> None:
    """A spare of an earlier release (the control revision says 'not recorded') may carry any
    set's grants: never handed out."""
    spare = build_spare(with_ro)
    with database.owner() as conn:
        conn.execute("UPDATE control.tenant_pool SET app_roles = DEFAULT")
        assert pool.counts(conn, with_ro.app_roles) == pool.PoolCounts(ready=0, stale=1)
    assert service.provision(with_ro, "after_upgrade").job.status is JobStatus.SUCCEEDED
    assert create_detail(database, "after_upgrade") is None
    assert [name for name, _ in pool_rows(database)] == [spare]


def test_a_spare_built_under_one_naming_is_taken_under_another(
    with_ro: Settings, database: Database, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The naming is not recorded with a spare: nothing in it depends on the naming (its
    statements are schema-less; the take renames it to the schema the configured naming
    gives)."""
    spare = build_spare(with_ro)  # under the default naming, tenant_{id}
    migrated = run_cli(with_ro, "migrate", env=RULE)  # no tenant yet: the rule may change
    assert migrated.returncode == 0, migrated.stderr
    for name, value in RULE.items():
        monkeypatch.setenv(name, value)
    assert service.provision(with_ro, "renamed").job.status is JobStatus.SUCCEEDED
    assert create_detail(database, "renamed") == f"taken from the warm pool: {spare}"
    assert schema_exists(database, NAMED.schema("renamed")) and not schema_exists(database, spare)
    assert service.check(with_ro, ["renamed"]).drifted == []


# -- the upgrade's reference -----------------------------------------------------------------------


def references(database: Database) -> list[tuple[str, str]]:
    with database.owner() as conn:
        rows = conn.execute(
            "SELECT tree_digest, start FROM control.tenant_upgrade_references ORDER BY created_at"
        ).fetchall()
    return [(str(r[0]), str(r[1])) for r in rows]


def migrate_step(
    upgrades: UpgradeCache, database: Database, tenant: str, app_roles: AppRoles
) -> str:
    """The migration step of a fleet upgrade's job (``existing``: the engine's plan first)."""
    owner = db.Database(database.owner_url)
    try:
        with owner.transaction() as tx:
            return upgrades.migrate(
                tx,
                f"tenant_{tenant}",
                lock_timeout_ms=5000,
                templates=TemplateCache(),
                app_roles=app_roles,
                existing=True,
            )
    finally:
        owner.close()


def test_an_upgrade_reference_is_computed_again_for_a_new_role_set_and_the_replay_serves(
    with_ro: Settings,
    database: Database,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The reference's fingerprint holds the grants of the roles it was granted for: one of the
    old set made every tenant of the new set fall back to Alembic (a fingerprint mismatch).
    Keyed by the role set, a new reference is computed and the tenants replay, in the same
    process (its cached reference and plan) and in a new one (the stored reference)."""
    one, two = (RW,), (RW, RO)
    for tenant in ("before", "after", "later"):
        assert service.provision(with_ro, tenant).job.status is JobStatus.SUCCEEDED
    with database.owner() as conn:  # the project adds app_ro; its tenants get its grants
        for tenant in ("after", "later"):
            tenant_schema.grant_app_roles(conn, f"tenant_{tenant}", two)
    tree = make_tree(tmp_path)
    use_tree(monkeypatch, tree)
    digest = migrations.tenant_tree_state().digest
    replayed = "path=replay from=t004 head=t005"

    upgrades = UpgradeCache()  # one worker process, across the change
    assert migrate_step(upgrades, database, "before", one) == replayed
    assert migrate_step(upgrades, database, "after", two) == replayed
    assert migrate_step(UpgradeCache(), database, "later", two) == replayed  # a new process
    assert references(database) == [
        (upgrade_reference_key(digest, one), "t004"),
        (upgrade_reference_key(digest, two), "t004"),
    ]
    assert upgrade_reference_key(digest, two).endswith("/roles=app_ro=readonly,app_rw=readwrite")
