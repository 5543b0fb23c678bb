"""The pytest plugin's fixtures, used as an application would use them.

``tenant`` and ``tenant_factory`` come from :mod:`provisioner.testing.pytest_plugin` (loaded
through its ``pytest11`` entry point), on the suite's own server.
"""

from __future__ import annotations

from collections.abc import Callable

import psycopg
import pytest

import provisioner
from provisioner import service
from provisioner.tenant.fingerprint import fingerprint
from provisioner.testing import ProvisionerDatabase, Tenant, TenantFactory
from tests.conftest import Database
from tests.workers import wait_until


def test_the_tenant_fixture_is_a_provisioned_tenant_the_app_role_can_use(
    tenant: Tenant, provisioner_settings: provisioner.Settings
) -> None:
    assert tenant.schema == f"tenant_{tenant.id}"
    with tenant.connect() as conn:
        conn.execute("INSERT INTO datasets (name) VALUES ('sales')")
        assert conn.execute("SELECT name FROM datasets").fetchall() == [("sales",)]
        assert conn.execute("SELECT count(*) FROM role_profiles").fetchone() == (4,)
    current = provisioner.status(tenant.id, settings=provisioner_settings)
    assert current.job.status is provisioner.JobStatus.SUCCEEDED
    assert current.job.steps_completed == list(provisioner.kinds.provision.STEPS)
    assert current.tenant is not None and current.tenant.state == "onboarding"
    assert current.tenant.schema_name == tenant.schema


def test_a_handed_out_tenant_is_exactly_what_provisioning_builds(
    tenant_factory: Callable[..., Tenant],
    provisioner_tenants: TenantFactory,
    provisioner_database: ProvisionerDatabase,
) -> None:
    settings = provisioner_database.settings
    built = service.provision(settings, "plugin_reference").job
    try:
        handed = tenant_factory("plugin_handed")
        with psycopg.connect(provisioner_database.owner_url) as conn:
            assert fingerprint(conn, handed.schema) == fingerprint(conn, "tenant_plugin_reference")
        job = service.status(settings, handed.id).job
        assert (job.status, job.progress, job.steps_completed, job.attempts) == (
            built.status,
            built.progress,
            built.steps_completed,
            built.attempts,
        )
        assert job.idempotency_key == "provision:plugin_handed"
        assert {run["tenant_id"] for run in service.status(settings, handed.id).step_runs} == {
            "plugin_handed"
        }
        # The engine agrees: nothing is missing, nothing to do.
        assert service.provision(settings, handed.id).already_provisioned
        assert provisioner_tenants.copy_off is None  # it was a verified copy of the model
    finally:
        provisioner_tenants.drop("plugin_reference")


def test_a_tenant_in_another_database_is_what_provisioning_builds_there(
    settings: provisioner.Settings,
    database: Database,
    provisioner_tenants: TenantFactory,
    provisioner_database: ProvisionerDatabase,
) -> None:
    """``tenant_factory(id, settings=...)``: the suite's per-test database, not the plugin's."""
    built = service.provision(settings, "reference").job
    there = provisioner_tenants.create("elsewhere", settings=settings)
    assert (there.owner_url, there.app_url) == (settings.owner_url, settings.app_url)
    with database.owner() as conn:
        assert fingerprint(conn, there.schema) == fingerprint(conn, "tenant_reference")
    current = service.status(settings, there.id)
    assert (current.job.status, current.job.steps_completed) == (
        built.status,
        built.steps_completed,
    )
    assert [(r["job_type"], r["run"], r["started_by"]) for r in current.runs] == [
        ("provision_tenant", 1, "provision")
    ]
    assert service.provision(settings, there.id).already_provisioned
    with there.connect() as conn:
        conn.execute("INSERT INTO datasets (name) VALUES ('here')")
    with pytest.raises(provisioner.InvalidInput, match="already exists"):
        provisioner_tenants.create("elsewhere", settings=settings)
    with pytest.raises(provisioner.UnknownTenant):  # nothing in the plugin's own database
        service.status(provisioner_database.settings, "elsewhere")

    provisioner_tenants.drop(there)
    with database.owner() as conn:
        assert conn.execute(
            "SELECT (SELECT count(*) FROM pg_namespace WHERE nspname = 'tenant_elsewhere'),"
            "       (SELECT count(*) FROM control.tenants WHERE tenant_id = 'elsewhere')"
        ).fetchone() == (0, 0)
    gone = psycopg.conninfo.make_conninfo(settings.owner_url, dbname="no_such_database")
    provisioner_tenants.drop(Tenant("elsewhere", "tenant_elsewhere", gone, gone))  # no error


def test_tenants_are_dropped_after_use_and_ids_are_unique(
    provisioner_tenants: TenantFactory, provisioner_database: ProvisionerDatabase
) -> None:
    first = provisioner_tenants.create()
    second = provisioner_tenants.create()
    assert first.id != second.id
    # The spares and their model are schemas only: the application never sees them.
    listed = service.list_jobs(provisioner_database.settings, limit=1000)
    assert not [job for job in listed if str(job.tenant_id).startswith("zzspare")]
    assert {first.id, second.id} <= {str(job.tenant_id) for job in listed}
    with pytest.raises(provisioner.InvalidInput, match="already exists"):
        provisioner_tenants.create(first.id)
    service.enqueue(provisioner_database.settings, "only_queued")  # a control row, no schema
    with pytest.raises(provisioner.InvalidInput, match="already exists"):
        provisioner_tenants.create("only_queued")
    provisioner_tenants.drop("only_queued")
    provisioner_tenants.drop(first)
    provisioner_tenants.drop(second)
    with psycopg.connect(provisioner_database.owner_url) as conn:
        schemas = conn.execute(
            "SELECT count(*) FROM pg_namespace WHERE nspname = ANY(%s)",
            ([first.schema, second.schema],),
        ).fetchone()
        rows = conn.execute(
            "SELECT count(*) FROM control.tenants WHERE tenant_id = ANY(%s)",
            ([first.id, second.id],),
        ).fetchone()
    assert schemas == (0,) and rows == (0,)


def test_the_factory_gives_each_tenant_its_own_rows(tenant_factory: Callable[..., Tenant]) -> None:
    one, two = tenant_factory(), tenant_factory()
    with one.connect() as conn:
        conn.execute("INSERT INTO datasets (name) VALUES ('only-in-one')")
    with two.connect() as conn:
        assert conn.execute("SELECT count(*) FROM datasets").fetchone() == (0,)


def test_a_copy_that_differs_from_the_model_falls_back_to_the_engine(
    provisioner_database: ProvisionerDatabase,
) -> None:
    factory = TenantFactory(provisioner_database, batch=1, background=False)
    try:
        factory.drop(factory.create())  # the model, and one verified copy
        assert factory.copy_off is None
        factory._model_fingerprint["relations"].append(("a_table_no_copy_has", "r", ""))
        handed = factory.create()
        assert factory.copy_off is not None and "differs from the model" in factory.copy_off
        assert service.status(provisioner_database.settings, handed.id).job.status.value == (
            "succeeded"
        )
        with handed.connect() as conn:
            assert conn.execute("SELECT count(*) FROM role_profiles").fetchone() == (4,)
        factory.drop(handed)  # the session's database is shared: leave no tenant behind
    finally:
        factory.close()


def test_the_app_role_writes_rows_but_runs_no_ddl_in_a_handed_out_tenant(tenant: Tenant) -> None:
    with tenant.connect(autocommit=True) as conn:
        conn.execute(
            "INSERT INTO members (email, display_name, role_profile_id) "
            "SELECT 'a@example.com', 'A', id FROM role_profiles WHERE key = 'viewer'"
        )
        conn.execute("UPDATE members SET display_name = 'B'")
        conn.execute("DELETE FROM members")
        with pytest.raises(psycopg.errors.InsufficientPrivilege):
            conn.execute("CREATE TABLE sneaky (id int)")
        with pytest.raises(psycopg.errors.InsufficientPrivilege):
            conn.execute("DROP TABLE datasets")


def test_spares_are_built_ahead_in_the_background(
    provisioner_database: ProvisionerDatabase,
) -> None:
    """No test pays for a batch: a thread refills the spares as they are handed out, and drops
    the retired schemas, while the tests run."""
    factory = TenantFactory(provisioner_database, batch=3)
    try:
        first = factory.create()  # the model on this thread, the spares on the builder's
        assert factory._builder is not None and factory._builder.is_alive()
        wait_until(lambda: len(factory.spares) == 3, 120, "three spares ready")
        built = factory.built
        second = factory.create()  # a ready spare: nothing built on this thread
        assert factory.built in (built, built + 1)  # (the builder may already refill)
        with psycopg.connect(provisioner_database.owner_url) as conn:
            oids = [
                row[0]
                for row in conn.execute(
                    "SELECT oid FROM pg_namespace WHERE nspname = ANY(%s)",
                    ([first.schema, second.schema],),
                )
            ]
        assert len(oids) == 2
        factory.drop(first)  # renamed out of the way now, dropped by the builder
        factory.drop(second)

        def left() -> int:
            with psycopg.connect(provisioner_database.owner_url) as conn:
                found = conn.execute(
                    "SELECT count(*) FROM pg_namespace WHERE oid = ANY(%s)", (oids,)
                ).fetchone()
            return int(found[0])

        # The builder takes the retired list, then drops its schemas: wait for the drop itself.
        wait_until(
            lambda: len(factory.spares) == 3 and not factory.retired and left() == 0,
            120,
            "the spare handed out replaced, the retired schemas dropped, by the builder",
        )
        assert factory.built == built + 1
        assert factory.copy_off is None
        assert factory.model is not None
        spares = [spare.schema for spare in factory.spares] + [factory.model.schema]
    finally:
        factory.close()
    assert factory._builder is None and factory.spares == []
    assert factory.retired == []
    with psycopg.connect(provisioner_database.owner_url) as conn:
        left = conn.execute(
            "SELECT count(*) FROM pg_namespace WHERE nspname = ANY(%s)", (spares,)
        ).fetchone()
    assert left == (0,)
