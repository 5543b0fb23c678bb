"""The verified fast path of ``run_tenant_migrations`` (template replay) and its fallbacks, on a
real database: fingerprint mismatch, replay error, identical schemas either way, and a
template-built tenant that Alembic then upgrades normally."""

from __future__ import annotations

import psycopg
import sqlalchemy as sa
from alembic import command

from provisioner import db, service
from provisioner.models import JobStatus
from provisioner.roles import DEFAULT_APP_ROLES
from provisioner.settings import Settings
from provisioner.templates import migrations
from provisioner.templates.replay import TemplateCache
from provisioner.tenant import schema as tenant_schema
from provisioner.tenant.fingerprint import fingerprint as catalog_fingerprint
from tests.conftest import Database

HEAD = ",".join(sorted(migrations.tenant_heads()))


def migration_detail(database: Database, tenant: str) -> str:
    """What the last run of the tenant's migration step recorded."""
    with database.owner() as conn:
        row = conn.execute(
            "SELECT detail FROM control.job_step_runs WHERE tenant_id = %s "
            "AND step = 'run_tenant_migrations' AND outcome = 'succeeded' ORDER BY id DESC",
            (tenant,),
        ).fetchone()
    assert row is not None, f"no migration step recorded for {tenant}"
    return str(row[0])


def provision(settings: Settings, tenant: str) -> None:
    result = service.provision(settings, tenant)
    assert result.job.status is JobStatus.SUCCEEDED, result.job.error_detail


def fingerprint(database: Database, schema: str) -> dict:
    with database.owner() as conn:
        return catalog_fingerprint(conn, schema)


def tamper_reference(database: Database, statements_sql: str) -> None:
    """Rewrite the stored reference's statements (``statements_sql`` is an SQL expression)."""
    with database.owner() as conn:
        updated = conn.execute(
            f"UPDATE control.tenant_template_references SET statements = {statements_sql}"
        ).rowcount
    assert updated == 1


def test_every_tenant_replays_the_template_from_the_first(
    settings: Settings, database: Database
) -> None:
    provision(settings, "one")
    assert migration_detail(database, "one") == f"path=template head={HEAD}"
    provision(settings, "two")
    provision(settings, "three")
    assert migration_detail(database, "two") == f"path=template head={HEAD}"
    assert migration_detail(database, "three") == f"path=template head={HEAD}"
    # Both paths, then grants and seeds on top: the same schema, grants included.
    alembic_built = fingerprint(database, "tenant_one")
    assert fingerprint(database, "tenant_two") == alembic_built
    assert fingerprint(database, "tenant_three") == alembic_built
    assert alembic_built["alembic_version"] == [(HEAD,)]
    with database.app() as conn:  # and the application role can use it
        conn.execute(
            "INSERT INTO tenant_two.members (email, role_profile_id) "
            "SELECT 'a@example.com', id FROM tenant_two.role_profiles WHERE key = 'owner'"
        )


def test_both_paths_build_identical_schemas_step_by_step(database: Database) -> None:
    """At the step itself (no grants yet): Alembic's schema and the replayed one are equal."""
    cache = TemplateCache()
    owner = db.Database(database.owner_url)
    try:
        with owner.transaction() as tx:
            tenant_schema.create_schema(tx.pg, "tenant_by_alembic")
            migrations.upgrade_tenant(tx.sa, "tenant_by_alembic")
        with owner.transaction() as tx:
            tenant_schema.create_schema(tx.pg, "tenant_by_template")
            outcome = cache.migrate(tx, "tenant_by_template")
    finally:
        owner.close()
    assert outcome.path == "template"
    by_alembic = fingerprint(database, "tenant_by_alembic")
    assert fingerprint(database, "tenant_by_template") == by_alembic
    assert len([r for r in by_alembic["relations"] if r[1] == "r"]) >= 9
    assert by_alembic["alembic_version"] == [(HEAD,)]


def test_template_tenant_is_upgraded_by_alembic_normally(
    settings: Settings, database: Database
) -> None:
    provision(settings, "reference")
    provision(settings, "fast")
    assert migration_detail(database, "fast") == f"path=template head={HEAD}"
    before = fingerprint(database, "tenant_fast")
    engine = db.engine(database.owner_url, poolclass=sa.pool.NullPool)
    try:
        with engine.begin() as conn:
            # Alembic reads the version the replay stamped and walks down from it...
            command.downgrade(migrations.tenant_config("tenant_fast", connection=conn), "t002")
        with database.owner() as conn:
            assert not migrations.tenant_at_head(conn, "tenant_fast")
            tables = {r[0] for r in fingerprint(database, "tenant_fast")["relations"]}
            assert "invitations" not in tables and "audit_events" not in tables
        with engine.begin() as conn:
            migrations.upgrade_tenant(conn, "tenant_fast")  # ...and back up to head
    finally:
        engine.dispose()
    with database.owner() as conn:
        assert migrations.tenant_at_head(conn, "tenant_fast")
    after = fingerprint(database, "tenant_fast")
    # The tables came back through Alembic; default privileges cover them for app_rw.
    assert after["columns"] == before["columns"]
    assert after["indexes"] == before["indexes"]
    assert after["constraints"] == before["constraints"]
    assert after["alembic_version"] == [(HEAD,)]


def test_fingerprint_mismatch_rolls_back_the_replay_and_runs_alembic(
    settings: Settings, database: Database
) -> None:
    provision(settings, "reference")  # computes and stores the reference
    tamper_reference(
        database,
        "ARRAY(SELECT s FROM unnest(statements) s WHERE s NOT LIKE '%api_keys_member_idx%')",
    )

    provision(settings, "victim")
    detail = migration_detail(database, "victim")
    assert detail.startswith(
        "path=alembic (fallback: fingerprint mismatch: indexes differ (missing "
    ), detail
    assert "api_keys_member_idx" in detail and detail.endswith(f"head={HEAD}")
    # The replay was rolled back to its savepoint and Alembic built the schema from empty.
    assert fingerprint(database, "tenant_victim") == fingerprint(database, "tenant_reference")
    # A cache that found a mismatch keeps the fast path off for this tree, and says why.
    cache = TemplateCache()
    owner = db.Database(database.owner_url)
    try:
        details = []
        for schema in ("tenant_first", "tenant_later"):
            with owner.transaction() as tx:
                tenant_schema.create_schema(tx.pg, schema)
                details.append(cache.migrate(tx, schema).detail)
    finally:
        owner.close()
    assert details[0].startswith("path=alembic (fallback: fingerprint mismatch: "), details
    assert details[1].startswith(
        "path=alembic (fallback: fast path off: fingerprint mismatch: indexes differ"
    ), details
    assert "(on tenant_first)" in details[1]


def test_replay_error_rolls_back_and_runs_alembic(settings: Settings, database: Database) -> None:
    provision(settings, "reference")
    tamper_reference(database, "statements || 'CREATE TABLE members (id int);'::text")

    provision(settings, "victim")
    detail = migration_detail(database, "victim")
    assert detail.startswith("path=alembic (fallback: replay failed: database error: "), detail
    assert 'relation "members" already exists' in detail
    assert fingerprint(database, "tenant_victim") == fingerprint(database, "tenant_reference")


def test_a_schema_already_at_head_is_left_as_it_is(database: Database) -> None:
    cache = TemplateCache()
    owner = db.Database(database.owner_url)
    try:
        outcomes = []
        for run in range(2):  # the second run finds every table there, at head
            with owner.transaction() as tx:
                if run == 0:
                    tenant_schema.create_schema(tx.pg, "tenant_twice")
                outcomes.append(cache.migrate(tx, "tenant_twice"))
    finally:
        owner.close()
    assert [o.path for o in outcomes] == ["template", "current"]
    assert outcomes[1].detail == f"path=current (already at head) head={HEAD}"


# -- the catalog queries behind the fast path stay correct ----------------------------------------

# The straightforward form of the lookups (a join on pg_class.relnamespace, which scans every
# relation in the database): what the indexed forms in tenant_schema must agree with.
PLAIN_RELATIONS = """
SELECT c.relname, c.relkind::text, coalesce(c.relacl::text, '') FROM pg_class c
  JOIN pg_namespace n ON n.oid = c.relnamespace
 WHERE n.nspname = %(schema)s AND c.relkind IN ('r', 'p', 'S', 'v', 'm', 'i') ORDER BY 1
"""
PLAIN_INDEXES = (
    "SELECT indexname, indexdef FROM pg_indexes WHERE schemaname = %(schema)s ORDER BY 1"
)
PLAIN_CONSTRAINTS = """
SELECT c.relname, k.conname, pg_get_constraintdef(k.oid) FROM pg_constraint k
  JOIN pg_class c ON c.oid = k.conrelid JOIN pg_namespace n ON n.oid = k.connamespace
 WHERE n.nspname = %(schema)s ORDER BY 1, 2
"""


def test_indexed_catalog_lookups_see_what_a_plain_scan_sees(
    settings: Settings, database: Database
) -> None:
    provision(settings, "reference")
    provision(settings, "shape")
    with database.owner() as conn:
        conn.execute("CREATE VIEW tenant_shape.v AS SELECT id FROM tenant_shape.members")
        conn.execute("CREATE MATERIALIZED VIEW tenant_shape.mv AS SELECT 1 AS one")
        conn.execute("CREATE INDEX mv_one ON tenant_shape.mv (one)")
        conn.execute("CREATE TABLE tenant_shape.later (id int PRIMARY KEY CHECK (id > 0))")
        conn.execute("CREATE SEQUENCE tenant_shape.free_seq")
        shape = catalog_fingerprint(conn, "tenant_shape")

        def plain(query: str) -> list[tuple]:
            rows = conn.execute(query, {"schema": "tenant_shape"}).fetchall()
            return [
                tuple(
                    v.replace("tenant_shape.", "<tenant>.") if isinstance(v, str) else v
                    for v in row
                )
                for row in rows
            ]

        assert shape["relations"] == plain(PLAIN_RELATIONS)
        assert shape["indexes"] == plain(PLAIN_INDEXES)
        assert shape["constraints"] == plain(PLAIN_CONSTRAINTS)
        tables, sequences = tenant_schema.relations(conn, "tenant_shape")
        # Views and materialized views are granted as tables are.
        assert "later" in tables and "mv" in tables and "v" in tables
        assert "free_seq" in sequences and "members_id_seq" in sequences
        assert tenant_schema.object_count(conn, "tenant_shape") > 0
        assert tenant_schema.object_count(conn, "tenant_nowhere") is None
        # The grant check reports the new table, not yet granted, by name.
        missing = tenant_schema.missing_app_grants(conn, "tenant_shape", DEFAULT_APP_ROLES)
        assert "later: DELETE" not in missing  # default privileges covered it at creation
        conn.execute("REVOKE DELETE ON tenant_shape.later FROM app_rw")
        assert tenant_schema.missing_app_grants(conn, "tenant_shape", DEFAULT_APP_ROLES) == [
            "later: DELETE"
        ]


def test_grants_fail_loudly_when_a_table_is_not_granted(database: Database) -> None:
    """The grant step's check is the real has_table_privilege on every table."""
    with psycopg.connect(database.owner_url) as conn:
        conn.execute("CREATE SCHEMA tenant_g")
        conn.execute("CREATE TABLE tenant_g.a (id int)")
        tenant_schema.grant_app_roles(conn, "tenant_g", DEFAULT_APP_ROLES)
        assert tenant_schema.missing_app_grants(conn, "tenant_g", DEFAULT_APP_ROLES) == []
        conn.execute("REVOKE UPDATE ON tenant_g.a FROM app_rw")
        assert tenant_schema.missing_app_grants(conn, "tenant_g", DEFAULT_APP_ROLES) == [
            "a: UPDATE"
        ]
