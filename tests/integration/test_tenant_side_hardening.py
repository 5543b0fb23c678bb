"""Issue 27, the tenant side: what the application role ``app_rw`` could do to a tenant's version
table and to the warm pool's spares, the ``pool_*`` names the pool keeper took for its own, and
a template helper module the stored reference did not cover. Each attack is made as it was
found: over the network as ``app_rw``, with real worker and CLI processes."""

from __future__ import annotations

import json
import os
import shutil
import sys
import uuid
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import psycopg
import pytest
from psycopg import sql

from provisioner import pool, service
from provisioner.settings import Settings
from provisioner.templates import migrations
from tests.conftest import ROOT, Database, build_spare, fingerprint, run_cli
from tests.workers import Workers, step_runs, wait_until

T005 = '''"""{doc}

Revision ID: t005
Revises: t004
"""

from alembic import op
{imports}
revision = "t005"
down_revision = "t004"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.execute({ddl})


def downgrade() -> None:
    pass
'''


@pytest.fixture
def fast(settings: Settings) -> Settings:
    return replace(settings, heartbeat_seconds=0.5, job_stale_after_seconds=10.0)


def copy_tree(tmp_path: Path, name: str) -> Path:
    tree = tmp_path / name
    shutil.copytree(migrations.tenant_tree(), tree, ignore=shutil.ignore_patterns("__pycache__"))
    return tree


def tree_with_t005(tmp_path: Path) -> Path:
    """The shipped tree and a revision t005 that adds a column."""
    tree = copy_tree(tmp_path, "tree_t005")
    ddl = repr("ALTER TABLE audit_events ADD COLUMN source TEXT")
    text = T005.format(doc="Audit event source.", imports="", ddl=ddl)
    tree.joinpath("versions", "t005_source.py").write_text(text)
    return tree


def columns(database: Database, schema: str, table: str) -> list[str]:
    with database.owner() as conn:
        rows = conn.execute(
            "SELECT a.attname FROM pg_attribute a WHERE a.attrelid = %s::regclass "
            "AND a.attnum > 0 AND NOT a.attisdropped ORDER BY a.attnum",
            (f"{schema}.{table}",),
        ).fetchall()
    return [str(r[0]) for r in rows]


def versions(database: Database, tenant: str) -> list[str]:
    with database.owner() as conn:
        rows = conn.execute(f"SELECT version_num FROM tenant_{tenant}.alembic_version").fetchall()
    return [str(r[0]) for r in rows]


# -- item 4: the version table is the owner's ----------------------------------------------------

VERSION_WRITES = (
    "UPDATE {s}.alembic_version SET version_num = 't005'",
    "DELETE FROM {s}.alembic_version",
    "INSERT INTO {s}.alembic_version (version_num) VALUES ('t005')",
    "TRUNCATE {s}.alembic_version",
)


def assert_version_table_read_only(database: Database, tenant: str) -> None:
    """As app_rw, over the network: every write on the tenant's version table is refused,
    reading it is not, and the table still says what the owner wrote."""
    before = versions(database, tenant)
    schema = sql.Identifier(f"tenant_{tenant}")
    with database.app() as conn:
        for statement in VERSION_WRITES:
            with pytest.raises(psycopg.errors.InsufficientPrivilege):
                conn.execute(sql.SQL(statement).format(s=schema))
        read = conn.execute(sql.SQL("SELECT version_num FROM {}.alembic_version").format(schema))
        assert [r[0] for r in read.fetchall()] == before
        # The application's own tables stay writable.
        conn.execute(sql.SQL("DELETE FROM {}.audit_events").format(schema))
    assert versions(database, tenant) == before


def test_app_rw_cannot_write_the_version_table_and_upgrade_all_upgrades(
    settings: Settings, database: Database, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Found: app_rw set a tenant's version to the coming head and ``upgrade --all`` skipped it
    (job succeeded, column missing); set back, the upgrade failed with ``already exists``."""
    service.provision(settings, "ver")
    assert_version_table_read_only(database, "ver")

    tree = tree_with_t005(tmp_path)
    monkeypatch.setenv(migrations.TENANT_TREE_ENV, str(tree))
    env = {migrations.TENANT_TREE_ENV: str(tree)}
    queued = run_cli(settings, "upgrade", "--all", "--json", env=env)
    assert queued.returncode == 0, queued.stderr
    assert [b["tenant_id"] for b in json.loads(queued.stdout)["behind"]] == ["ver"]
    drained = run_cli(settings, "worker", "--once", env=env)
    assert drained.returncode == 0, drained.stderr
    assert versions(database, "ver") == ["t005"]
    assert "source" in columns(database, "tenant_ver", "audit_events")
    assert_version_table_read_only(database, "ver")


def grant_as_an_earlier_release(database: Database, tenant: str) -> None:
    """The grant step of an earlier release gave app_rw DML on every table, the version table's
    too: a tenant provisioned then still holds it."""
    with database.owner() as conn:
        conn.execute(f"GRANT INSERT, UPDATE, DELETE ON tenant_{tenant}.alembic_version TO app_rw")
    with database.app() as conn:  # as the attack found it
        conn.execute(f"UPDATE tenant_{tenant}.alembic_version SET version_num = version_num")


def test_a_tenant_granted_by_an_earlier_release_loses_the_version_writes_on_repair_and_upgrade(
    settings: Settings,
    database: Database,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    clean_fingerprint: dict[str, Any],
) -> None:
    for tenant in ("repaired", "upgraded"):
        service.provision(settings, tenant)
        grant_as_an_earlier_release(database, tenant)

    # A repair (provision again) checks the grants, finds the version table writable, and
    # runs the grant step again.
    again = service.provision(settings, "repaired")
    assert again.job.status.value == "succeeded"
    assert_version_table_read_only(database, "repaired")
    assert fingerprint(database, "repaired") == clean_fingerprint

    # An upgrade runs the migration step alone: it takes the writes away before it trusts the
    # table, and its verified replay then matches the reference.
    tree = tree_with_t005(tmp_path)
    monkeypatch.setenv(migrations.TENANT_TREE_ENV, str(tree))
    env = {migrations.TENANT_TREE_ENV: str(tree)}
    assert run_cli(settings, "upgrade", "upgraded", env=env).returncode == 0
    drained = run_cli(settings, "worker", "--once", env=env)
    assert drained.returncode == 0, drained.stderr
    assert versions(database, "upgraded") == ["t005"]
    assert_version_table_read_only(database, "upgraded")
    migrated = [r for r in step_runs(database, "upgraded") if r["step"] == "run_tenant_migrations"]
    assert str(migrated[-1]["detail"]).startswith("path=replay from=t004"), migrated[-1]


# -- item 5: a spare's sequences ------------------------------------------------------------------


def spare_sequences(database: Database, spare: str) -> list[int]:
    with database.owner() as conn:
        rows = conn.execute(
            "SELECT c.oid FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace "
            "WHERE n.nspname = %s AND c.relkind = 'S' ORDER BY c.relname",
            (spare,),
        ).fetchall()
    return [int(r[0]) for r in rows]


def test_app_rw_cannot_advance_a_spares_sequences_by_oid_and_a_taken_tenant_starts_at_one(
    settings: Settings, database: Database, clean_fingerprint: dict[str, Any]
) -> None:
    """Found: without USAGE on a spare, app_rw still advanced each of its sequences by oid
    (``nextval(oid::regclass)``, no name to look up), and the next tenant's ids began at 1001."""
    spare = build_spare(settings)
    oids = spare_sequences(database, spare)
    assert len(oids) >= 5
    with database.app() as conn:
        for oid in oids:
            for call in ("nextval", "setval", "currval"):
                args = "%s::regclass, 1000" if call == "setval" else "%s::regclass"
                with pytest.raises(psycopg.errors.InsufficientPrivilege):
                    conn.execute(f"SELECT {call}({args})", (oid,))

    taken = service.provision(settings, "from_pool")
    assert taken.job.status.value == "succeeded"
    created = [r for r in step_runs(database, "from_pool") if r["step"] == "create_schema"]
    assert created[-1]["detail"] == f"taken from the warm pool: {spare}"
    with database.app() as conn:
        row = conn.execute(
            "INSERT INTO tenant_from_pool.audit_events (action) VALUES ('signed_up') RETURNING id"
        ).fetchone()
        assert row == (1,)
        # The tenant's sequences are the application's now, as in any tenant.
        assert conn.execute("SELECT nextval(%s::regclass) > 0", (oids[0],)).fetchone() == (True,)
    assert fingerprint(database, "from_pool") == clean_fingerprint


def test_a_spare_whose_sequence_app_rw_may_use_is_not_as_built(
    settings: Settings, database: Database
) -> None:
    """The build's check and the take's ACL check list a sequence the role may use: such a
    spare is refused by the build, and a take of it runs the full grant step."""
    spare = build_spare(settings)
    with psycopg.connect(database.owner_url) as conn:  # rolled back
        conn.execute(f'GRANT USAGE ON SEQUENCE "{spare}".members_id_seq TO app_rw')
        held = pool.grants_held(conn, spare, settings.app_roles[0])
        assert held is not None and held.lacking == ["members_id_seq"]
        assert not held.all_but_usage and "members_id_seq" in held.sequences
        with pytest.raises(pool.SpareRejected, match="members_id_seq"):
            pool.check_spare_grants(conn, spare, settings.app_roles)
        conn.rollback()


# -- item 7: the pool's names ---------------------------------------------------------------------


@pytest.fixture
def other_role(database: Database) -> Iterator[str]:
    """A role of another team (cluster-wide, so named for this test alone)."""
    role = f"h27_other_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(database.admin_url, autocommit=True) as conn:
        conn.execute(sql.SQL("CREATE ROLE {}").format(sql.Identifier(role)))
    try:
        yield role
    finally:
        with psycopg.connect(database.admin_url, autocommit=True) as conn:
            conn.execute(sql.SQL("DROP OWNED BY {}").format(sql.Identifier(role)))
            conn.execute(sql.SQL("DROP ROLE {}").format(sql.Identifier(role)))


def rows_in(database: Database, table: str) -> int | None:
    with database.owner() as conn:
        if conn.execute("SELECT to_regclass(%s)", (table,)).fetchone() == (None,):
            return None
        row = conn.execute(sql.SQL("SELECT count(*) FROM {}").format(sql.SQL(table))).fetchone()
    return None if row is None else int(row[0])


def pool_status(settings: Settings) -> dict[str, Any]:
    shown = run_cli(settings, "health", "--json")
    view = json.loads(shown.stdout)
    (component,) = view["components"]
    return dict(component["detail"].get("pool") or {})


def test_the_keeper_drops_no_pool_schema_it_did_not_record_and_goes_on(
    fast: Settings, database: Database, workers: Workers, other_role: str
) -> None:
    """Found: a product schema ``pool_reports`` owned by the owner role, 1,000 rows, dropped as
    an 'unfinished build'; a ``pool_*`` schema owned by another role stopped the pool for good
    (ready 0, no log line, health ready)."""
    squatted = "pool_00000000000000ff"
    with database.owner() as conn:
        conn.execute("CREATE SCHEMA pool_reports")
        conn.execute(
            "CREATE TABLE pool_reports.daily AS SELECT g AS n FROM generate_series(1, 1000) g"
        )
    with psycopg.connect(database.admin_url, autocommit=True) as conn:
        conn.execute(
            sql.SQL("CREATE SCHEMA {} AUTHORIZATION {}").format(
                sql.Identifier(squatted), sql.Identifier(other_role)
            )
        )

    worker = workers.start(env={"PROVISIONER_POOL_SIZE": "2"})
    for name, owner in (("pool_reports", "provisioner_owner"), (squatted, other_role)):
        line = worker.wait_for("pool_schema_not_ours", 60, schema=name)
        assert (line["level"], line["owner"]) == ("warning", owner)
    wait_until(lambda: pool_status(fast).get("ready") == 2, 90, "two spares built")
    status = pool_status(fast)
    assert sorted(status["foreign"]) == sorted(["pool_reports", squatted])
    assert status.get("error") is None
    text = run_cli(fast, "health")
    assert "pool_reports" in text.stdout and squatted in text.stdout, text.stdout
    assert worker.stop() == 0, worker.output()

    assert rows_in(database, "pool_reports.daily") == 1000
    with database.owner() as conn:
        owned = conn.execute(
            "SELECT pg_get_userbyid(nspowner) FROM pg_namespace WHERE nspname = %s", (squatted,)
        ).fetchone()
    assert owned == (other_role,)
    assert not worker.events("pool_spare_dropped")


def test_a_spare_name_already_taken_is_skipped_for_another(
    settings: Settings, database: Database, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A build never adopts a schema it finds under the name it drew: it draws another."""
    with database.owner() as conn:
        conn.execute("CREATE SCHEMA pool_abababababababab")
        conn.execute("CREATE TABLE pool_abababababababab.kept (n int)")
    drawn = iter(["abababababababab", "cdcdcdcdcdcdcdcd"])
    monkeypatch.setattr(pool.spares.secrets, "token_hex", lambda _n: next(drawn))
    assert build_spare(settings) == "pool_cdcdcdcdcdcdcdcd"
    assert rows_in(database, "pool_abababababababab.kept") == 0
    with database.owner() as conn:
        assert [n for n, _ in pool.foreign_schemas(conn)] == ["pool_abababababababab"]
        assert pool.counts(conn, settings.app_roles) == pool.PoolCounts(
            ready=1, stale=0, unfinished=0, foreign=("pool_abababababababab",)
        )


# -- item 14: the template's helper modules --------------------------------------------------------

HELPER = 'EXTRAS = "CREATE TABLE extras (id BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY{})"\n'


def tree_with_helper(tmp_path: Path) -> Path:
    """A tree whose revision t005 takes its DDL from a helper module beside ``versions/``."""
    tree = copy_tree(tmp_path, "tree_helper")
    helpers = tree / "h27_tenant_helpers"
    helpers.mkdir()
    helpers.joinpath("__init__.py").write_text("")
    helpers.joinpath("ddl.py").write_text(HELPER.format(""))
    text = T005.format(
        doc="Extras, from a helper.",
        imports="\nfrom h27_tenant_helpers import ddl\n",
        ddl="ddl.EXTRAS",
    )
    tree.joinpath("versions", "t005_extras.py").write_text(text)
    return tree


def change_helper(tree: Path) -> None:
    tree.joinpath("h27_tenant_helpers", "ddl.py").write_text(HELPER.format(", colour TEXT"))


def test_a_changed_helper_module_gives_the_next_tenant_the_new_ddl(
    settings: Settings, database: Database, tmp_path: Path
) -> None:
    """Found: the reference's digest covered env.py and versions/*.py only; after the helper
    changed, new tenants were replayed the old DDL (``path=template``)."""
    tree = tree_with_helper(tmp_path)
    env = {
        migrations.TENANT_TREE_ENV: str(tree),
        "PYTHONPATH": os.pathsep.join([str(tree), str(ROOT)]),
    }
    first = run_cli(settings, "provision", "before_change", env=env)
    assert first.returncode == 0, first.stderr
    assert columns(database, "tenant_before_change", "extras") == ["id"]

    change_helper(tree)
    second = run_cli(settings, "provision", "after_change", env=env)
    assert second.returncode == 0, second.stderr
    assert columns(database, "tenant_after_change", "extras") == ["id", "colour"]


def test_a_long_running_process_reads_the_changed_helper_too(
    settings: Settings, database: Database, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """In one process (a worker's), the helper module imported for the first tenant is not the
    one the next tenant's reference is built with once the file changed."""
    tree = tree_with_helper(tmp_path)
    monkeypatch.setenv(migrations.TENANT_TREE_ENV, str(tree))
    monkeypatch.syspath_prepend(str(tree))
    try:
        service.provision(settings, "in_process_before")
        assert columns(database, "tenant_in_process_before", "extras") == ["id"]
        change_helper(tree)
        service.provision(settings, "in_process_after")
        assert columns(database, "tenant_in_process_after", "extras") == ["id", "colour"]
    finally:
        for name in [m for m in sys.modules if m.startswith("h27_tenant_helpers")]:
            del sys.modules[name]
