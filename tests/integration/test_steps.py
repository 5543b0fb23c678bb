"""Each step, run a second time on its own, changes nothing: every step is idempotent."""

from __future__ import annotations

import pytest

from provisioner import db
from provisioner.kinds.provision import PROVISION_STEPS, StepContext
from provisioner.models import TenantId
from provisioner.roles import DEFAULT_APP_ROLES
from provisioner.settings import Settings
from provisioner.storage import store_from_settings
from provisioner.tenant.fingerprint import fingerprint
from tests.conftest import Database, build_spare


def state(database: Database, schema: str) -> tuple:
    """The schema's catalog fingerprint plus the rows the steps write."""
    with database.owner() as conn:
        shape = fingerprint(conn, schema)
        tenants = conn.execute(
            "SELECT tenant_id, state, onboarding_started_at FROM control.tenants ORDER BY 1"
        ).fetchall()
        profiles = (
            conn.execute(f"SELECT id, key, name FROM {schema}.role_profiles ORDER BY id").fetchall()
            if any(r[0] == "role_profiles" for r in shape["relations"])
            else []
        )
    return shape, tenants, profiles


@pytest.mark.parametrize(
    "index", range(len(PROVISION_STEPS)), ids=[s.name for s in PROVISION_STEPS]
)
def test_running_a_step_twice_is_a_noop_the_second_time(
    settings: Settings, database: Database, index: int
) -> None:
    tenant = TenantId("twice")
    with database.app() as conn:
        conn.execute(
            "INSERT INTO control.tenants (tenant_id, schema_name) VALUES (%s, %s)",
            (tenant.value, tenant.schema),
        )
    ctx = StepContext(
        tenant=tenant, app_roles=DEFAULT_APP_ROLES, store=store_from_settings(settings)
    )
    owner = db.Database(settings.owner_url)
    try:
        for step in PROVISION_STEPS[:index]:  # the steps before it, once
            with owner.transaction() as tx:
                step.run(tx, ctx)
        step = PROVISION_STEPS[index]
        with owner.transaction() as tx:
            step.run(tx, ctx)
        first = state(database, tenant.schema)
        with owner.transaction() as tx:
            assert step.effect_present(tx, ctx)
            step.run(tx, ctx)
        assert state(database, tenant.schema) == first
    finally:
        owner.close()


def test_a_run_remembers_whether_it_took_a_spare_for_its_grant_step(
    settings: Settings, database: Database
) -> None:
    """create_schema tells the grant step of the same run whether the schema is a taken spare
    (its grants but USAGE in place: one grant and one check) or a new one (granted in full at
    once, without trying the check first); a run that did not run it (a resume) tries both."""
    owner = db.Database(settings.owner_url)
    try:
        for tenant, spare in ((TenantId("fresh"), False), (TenantId("spared"), True)):
            with database.app() as conn:
                conn.execute(
                    "INSERT INTO control.tenants (tenant_id, schema_name) VALUES (%s, %s)",
                    (tenant.value, tenant.schema),
                )
            if spare:
                build_spare(settings)
            ctx = StepContext(
                tenant=tenant, app_roles=DEFAULT_APP_ROLES, store=store_from_settings(settings)
            )
            assert ctx.memo.spare_taken is None
            create, _, grant = PROVISION_STEPS[:3]
            with owner.transaction() as tx:
                create.run(tx, ctx)
            assert ctx.memo.spare_taken is spare
            for step in PROVISION_STEPS[1:]:
                with owner.transaction() as tx:
                    detail = step.run(tx, ctx)
                if step is grant:
                    assert (detail is not None) is spare  # the one-query path only for a spare
            with owner.transaction() as tx:
                assert all(s.effect_present(tx, ctx) for s in PROVISION_STEPS)
            resumed = StepContext(
                tenant=tenant, app_roles=DEFAULT_APP_ROLES, store=store_from_settings(settings)
            )
            with owner.transaction() as tx:  # a later run knows nothing, and checks
                assert grant.run(tx, resumed) is not None  # all in place: the check passes
    finally:
        owner.close()


def test_the_migration_step_of_a_taken_spare_reads_its_version_and_sets_the_lock_timeout(
    settings: Settings, database: Database
) -> None:
    """A spare this run took has its version table: the migration step sets the lock timeout
    and reads the version in one simple query. A version table that is gone after all fails
    the step (rolled back), as the resume's catalog check would see."""
    tenant = TenantId("spared")
    with database.app() as conn:
        conn.execute(
            "INSERT INTO control.tenants (tenant_id, schema_name) VALUES (%s, %s)",
            (tenant.value, tenant.schema),
        )
    build_spare(settings)
    ctx = StepContext(
        tenant=tenant,
        app_roles=DEFAULT_APP_ROLES,
        store=store_from_settings(settings),
        lock_timeout_ms=1234,
    )
    create, migrate = PROVISION_STEPS[:2]
    with db.Database(settings.owner_url) as owner:
        with owner.transaction() as tx:
            create.run(tx, ctx)
        assert ctx.memo.spare_taken is True
        with owner.transaction() as tx:
            assert "path=current" in (migrate.run(tx, ctx) or "")
            assert tx.pg.execute("SHOW lock_timeout").fetchone() == ("1234ms",)
        with owner.transaction() as tx:
            tx.pg.execute(f"DROP TABLE {tenant.schema}.alembic_version")
        with pytest.raises(db.DatabaseError, match="alembic_version"), owner.transaction() as tx:
            migrate.run(tx, ctx)
        with owner.transaction() as tx:  # the catalog check of a resume sees it, too
            assert not migrate.effect_present(tx, ctx)
