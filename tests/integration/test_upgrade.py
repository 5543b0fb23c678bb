"""``provisioner upgrade``: tenants left behind by a new tenant_template head are queued, and a
real worker brings them to head by re-running the migration step alone."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator

import pytest
from psycopg import sql

from provisioner import db, queue, service
from provisioner.db import DatabaseError
from provisioner.errors import InvalidInput, UnknownTenant
from provisioner.fleet import versions as fleet_versions
from provisioner.kinds.provision import PROVISION_JOB_TYPE, STEPS
from provisioner.models import JobStatus, TenantId
from provisioner.settings import Settings
from provisioner.templates import migrations
from provisioner.testing import Tenant
from tests.conftest import Database, downgrade_tenant, fingerprint, run_cli

HEAD = ",".join(sorted(migrations.tenant_heads()))


def job_of(database: Database, tenant: str) -> dict:
    with database.owner() as conn:
        job = queue.latest_for_tenant(conn, TenantId(tenant), PROVISION_JOB_TYPE)
    assert job is not None
    return {"status": job.status.value, "attempts": job.attempts, "updated_at": job.updated_at}


@pytest.fixture
def settings(provisioner_settings: Settings) -> Settings:
    """The plugin's settings: these tests run in its database, where its tenants are."""
    return provisioner_settings


@pytest.fixture
def database(tenant_database: Database) -> Database:
    return tenant_database


@pytest.fixture
def fleet(database: Database, tenant_factory: Callable[..., Tenant]) -> list[str]:
    """Three provisioned tenants (the plugin's); two of them behind the head."""
    for tenant in ("current", "older", "oldest"):
        tenant_factory(tenant)
    downgrade_tenant(database, "older", "t003")
    downgrade_tenant(database, "oldest", "t002")
    return ["current", "older", "oldest"]


def test_dry_run_names_the_tenants_behind_and_changes_nothing(
    settings: Settings, database: Database, fleet: list[str]
) -> None:
    before = {t: job_of(database, t) for t in fleet}
    report = service.upgrade(settings, dry_run=True)
    assert report.checked == 3 and report.unfinished == []
    assert [(i.job.tenant_id, sorted(i.versions), i.action) for i in report.behind] == [
        ("older", ["t003"], "would queue"),
        ("oldest", ["t002"], "would queue"),
    ]
    assert {t: job_of(database, t) for t in fleet} == before


def test_a_worker_brings_the_queued_tenants_to_head_running_only_the_migrations(
    settings: Settings, database: Database, fleet: list[str]
) -> None:
    untouched = job_of(database, "current")
    report = service.upgrade(settings)
    assert [(i.job.tenant_id, i.job.status.value, i.action) for i in report.behind] == [
        ("older", "queued", "queued"),
        ("oldest", "queued", "queued"),
    ]
    assert job_of(database, "current") == untouched

    drained = run_cli(settings, "worker", "--once", "--log-format", "json")
    assert drained.returncode == 0, drained.stderr

    reference = fingerprint(database, "current")
    with database.owner() as conn:
        for tenant in ("older", "oldest"):
            assert migrations.tenant_at_head(conn, f"tenant_{tenant}")
            assert fingerprint(database, tenant) == reference
            job = queue.latest_for_tenant(conn, TenantId(tenant), PROVISION_JOB_TYPE)
            assert job is not None and job.status is JobStatus.SUCCEEDED
            assert job.steps_completed == list(STEPS)
            reran = conn.execute(
                "SELECT step, detail FROM control.job_step_runs WHERE tenant_id = %s "
                "ORDER BY id OFFSET %s",
                (tenant, len(STEPS)),
            ).fetchall()
            assert [step for step, _ in reran] == ["run_tenant_migrations"]
            assert reran[0][1].startswith("path=replay from="), reran
    assert job_of(database, "current") == untouched
    assert service.upgrade(settings).behind == []


def test_named_tenants_only_and_unfinished_jobs_are_left_alone(
    settings: Settings, database: Database, fleet: list[str]
) -> None:
    with database.owner() as conn:  # app_rw may not change a provisioning row
        job = queue.latest_for_tenant(conn, TenantId("oldest"), PROVISION_JOB_TYPE)
        assert job is not None
        conn.execute("UPDATE control.platform_jobs SET status = 'failed' WHERE id = %s", (job.id,))
    report = service.upgrade(settings, ["current", "older", "oldest"])
    assert [i.job.tenant_id for i in report.behind] == ["older"]
    assert [(j.tenant_id, j.status.value) for j in report.unfinished] == [("oldest", "failed")]
    assert job_of(database, "oldest")["status"] == "failed"


def test_unknown_or_bad_tenants_are_refused_before_anything_is_queued(
    settings: Settings, database: Database, fleet: list[str]
) -> None:
    before = {t: job_of(database, t) for t in fleet}
    with pytest.raises(UnknownTenant, match="ghost"):
        service.upgrade(settings, ["older", "ghost"])
    with pytest.raises(InvalidInput):
        service.upgrade(settings, ["Not-A-Tenant"])
    assert {t: job_of(database, t) for t in fleet} == before


def test_cli_upgrade(settings: Settings, database: Database, fleet: list[str]) -> None:
    neither = run_cli(settings, "upgrade")
    assert neither.returncode == 2
    assert neither.stderr.strip() == "error: name tenants to upgrade, or pass --all (not both)"
    assert run_cli(settings, "upgrade", "older", "--all").returncode == 2
    bad = run_cli(settings, "upgrade", "Bad Id")
    assert bad.returncode == 2 and len(bad.stderr.strip().splitlines()) == 1
    unknown = run_cli(settings, "upgrade", "ghost")
    assert unknown.returncode == 3 and "ghost" in unknown.stderr

    preview = run_cli(settings, "upgrade", "--all", "--dry-run")
    assert preview.returncode == 0, preview.stderr
    assert f"tenant template head {HEAD}: 3 provisioned tenant(s) checked, 2 behind" in (
        preview.stdout
    )
    assert "older" in preview.stdout and "would queue" in preview.stdout
    assert job_of(database, "older")["status"] == "succeeded"

    done = run_cli(settings, "upgrade", "--all", "--json")
    assert done.returncode == 0, done.stderr
    view = json.loads(done.stdout)
    assert view["heads"] == [HEAD] and view["checked"] == 3
    assert [(b["tenant_id"], b["versions"], b["action"]) for b in view["behind"]] == [
        ("older", ["t003"], "queued"),
        ("oldest", ["t002"], "queued"),
    ]
    assert job_of(database, "older")["status"] == "queued"

    again = run_cli(settings, "upgrade", "--all")
    assert again.returncode == 0, again.stderr
    assert "1 provisioned tenant(s) checked, 0 behind" in again.stdout
    assert "2 tenant(s) not checked, their job has not succeeded" in again.stdout
    assert "older (queued), oldest (queued)" in again.stdout


# Version tables of every shape "who is behind" must read: one row, two rows (two heads), a
# version with CSV's special characters, a partitioned table; a schema without one.
VERSION_TABLES = {
    "tenant_vr_one": (
        "CREATE TABLE {s}.alembic_version (version_num VARCHAR(32) PRIMARY KEY)",
        ["t004"],
    ),
    "tenant_vr_two": (
        "CREATE TABLE {s}.alembic_version (version_num VARCHAR(32) PRIMARY KEY)",
        ["t004a", "t004b"],
    ),
    "tenant_vr_odd": (
        "CREATE TABLE {s}.alembic_version (version_num VARCHAR(32) PRIMARY KEY)",
        ['x,"y\\z', " t 9 "],
    ),
    "tenant_vr_parted": (
        "CREATE TABLE {s}.alembic_version (version_num VARCHAR(32) NOT NULL) "
        "PARTITION BY LIST (version_num); CREATE TABLE {s}.versions_t003 "
        "PARTITION OF {s}.alembic_version FOR VALUES IN ('t003')",
        ["t003"],
    ),
    "tenant_vr_empty": ("CREATE TABLE {s}.alembic_version (version_num VARCHAR(32))", []),
    "tenant_vr_none": ("CREATE TABLE {s}.other (id int)", None),
}


@pytest.fixture
def version_tables(database: Database) -> Iterator[dict[str, frozenset[str] | None]]:
    with database.owner() as conn:
        for schema, (ddl, versions) in VERSION_TABLES.items():
            name = sql.Identifier(schema)
            conn.execute(sql.SQL("CREATE SCHEMA {}").format(name))
            conn.execute(sql.SQL(ddl).format(s=name))  # type: ignore[arg-type]
            for version in versions or []:
                conn.execute(
                    sql.SQL("INSERT INTO {}.alembic_version VALUES (%s)").format(name), [version]
                )
    expected = {s: None if v is None else frozenset(v) for s, (_, v) in VERSION_TABLES.items()}
    yield expected
    with database.owner() as conn:
        for schema in VERSION_TABLES:
            conn.execute(sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(sql.Identifier(schema)))


def test_versions_are_read_from_every_kind_of_version_table_over_several_sessions(
    database: Database,
    version_tables: dict[str, frozenset[str] | None],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(fleet_versions, "VERSION_CHUNK", 2)  # several strings, two sessions
    schemas = [*version_tables, "tenant_vr_missing"]
    expected = {**version_tables, "tenant_vr_missing": None}
    with db.connect(database.owner_url, autocommit=True) as conn:
        assert fleet_versions.schema_versions(conn, schemas) == expected
    present = {s: v for s, v in expected.items() if v is not None}
    assert fleet_versions.read_versions(database.owner_url, schemas) == present
    everything = fleet_versions.read_versions(database.owner_url, None)
    assert {s: v for s, v in everything.items() if s in expected} == present


def test_an_unreadable_version_table_fails_the_read_and_leaves_the_session_usable(
    database: Database, version_tables: dict[str, frozenset[str] | None]
) -> None:
    with database.owner() as conn:
        conn.execute("REVOKE SELECT ON tenant_vr_two.alembic_version FROM CURRENT_USER")
    with db.connect(database.owner_url, autocommit=True) as conn:
        with pytest.raises(DatabaseError, match="permission denied"), db.translated():
            fleet_versions.schema_versions(conn, list(version_tables))
        assert conn.execute("SELECT 1 AS one").fetchone() == {"one": 1}
        assert fleet_versions.schema_versions(conn, ["tenant_vr_one"]) == {
            "tenant_vr_one": frozenset({"t004"})
        }
