"""A second, deliberately different tenant template (``tests/second_template``: a help desk with
enum types, a domain, citext, composite keys, a generated column, a partitioned table, a view,
trigger functions and row-level security, 33 tables) and its SQL and Python seeds, driven as its
team would drive it, through the CLI and workers run in its project folder: provision, check,
suspend and restore, purge, the warm pool, a fleet upgrade to a second revision, and the pytest
plugin in the project's own test run (issue 24, "Done means").

The tenants every test only reads are built once per module, in a database of the module's.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import psycopg
import pytest

from provisioner.settings import Settings
from provisioner.testing import SERVER_URL_ENV
from tests.conftest import Database, Server, create_database, drop_database
from tests.second_template import (
    HEAD,
    PROJECT,
    add_upgrade,
    cli,
    copy_project,
    project_env,
    provision,
    tables,
)
from tests.workers import Workers, job_row, running_workers, step_runs, wait_until


@pytest.fixture(scope="module")
def project(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return copy_project(tmp_path_factory.mktemp("second") / "project")


@pytest.fixture(scope="module")
def module_database(pg_server: Server) -> Iterator[Database]:
    name = f"s_{uuid.uuid4().hex[:12]}"
    database = create_database(pg_server, name)
    try:
        yield database
    finally:
        drop_database(pg_server, name)


def settings_for(database: Database, state: Path) -> Settings:
    return Settings(
        migrations_database_url=database.owner_url,
        app_database_url=database.app_url,
        object_store_provider="none",
        state_dir=state,
    )


@pytest.fixture(scope="module")
def module_settings(
    module_database: Database, tmp_path_factory: pytest.TempPathFactory
) -> Settings:
    return settings_for(module_database, tmp_path_factory.mktemp("state"))


@pytest.fixture(scope="module")
def fleet(module_settings: Settings, project: Path) -> list[str]:
    """Two tenants provisioned from the second template (read, never changed, by the tests)."""
    for tenant in ("alpha", "beta"):
        provision(module_settings, project, tenant)
    return ["alpha", "beta"]


def app_session(database: Database, schema: str) -> psycopg.Connection:
    """The application role's session on a tenant, the way an application sets it up."""
    conn = psycopg.connect(database.app_url)
    conn.execute(f'SET search_path TO "{schema}", public')
    return conn


def objects(database: Database, schema: str) -> dict[str, int]:
    """How many of each kind of object the schema holds."""
    with database.owner() as conn:
        row = conn.execute(
            """
            SELECT (SELECT count(*) FROM pg_type t WHERE t.typnamespace = n.oid
                      AND t.typtype = 'e') AS enums,
                   (SELECT count(*) FROM pg_type t WHERE t.typnamespace = n.oid
                      AND t.typtype = 'd') AS domains,
                   (SELECT count(*) FROM pg_class c WHERE c.relnamespace = n.oid
                      AND c.relkind = 'v') AS views,
                   (SELECT count(*) FROM pg_class c WHERE c.relnamespace = n.oid
                      AND c.relkind = 'p') AS partitioned,
                   (SELECT count(*) FROM pg_class c WHERE c.relnamespace = n.oid
                      AND c.relkind = 'r' AND c.relispartition) AS partitions,
                   (SELECT count(*) FROM pg_proc p WHERE p.pronamespace = n.oid) AS functions,
                   (SELECT count(*) FROM pg_trigger g JOIN pg_class c ON c.oid = g.tgrelid
                     WHERE c.relnamespace = n.oid AND NOT g.tgisinternal) AS triggers,
                   (SELECT count(*) FROM pg_policy p JOIN pg_class c ON c.oid = p.polrelid
                     WHERE c.relnamespace = n.oid) AS policies,
                   (SELECT count(*) FROM pg_attribute a JOIN pg_class c ON c.oid = a.attrelid
                     WHERE c.relnamespace = n.oid AND a.attgenerated = 's') AS generated,
                   (SELECT count(*) FROM pg_constraint k WHERE k.connamespace = n.oid
                      AND k.contype = 'f' AND cardinality(k.conkey) > 1) AS composite_fks
              FROM pg_namespace n WHERE n.nspname = %s
            """,
            (schema,),
        ).fetchone()
        assert row is not None, f"no schema {schema}"
    names = ("enums", "domains", "views", "partitioned", "partitions", "functions", "triggers")
    names += ("policies", "generated", "composite_fks")
    return dict(zip(names, row, strict=True))


def test_provisioning_builds_every_kind_of_object_and_applies_both_kinds_of_seed(
    fleet: list[str], module_database: Database, module_settings: Settings, project: Path
) -> None:
    database = module_database
    assert len(tables(database, "tenant_alpha")) >= 34  # 33 of the template's, and its version
    assert objects(database, "tenant_alpha") == {
        "enums": 3,
        "domains": 1,
        "views": 1,
        "partitioned": 1,
        "partitions": 3,
        "functions": 3,
        "triggers": 3,
        "policies": 3,
        "generated": 1,
        "composite_fks": 2,  # tickets -> projects, tickets -> team_members
    }
    status = json.loads(cli(module_settings, project, "status", "alpha", "--json").stdout)
    assert status["status"] == "succeeded" and status["attempts"] == 1
    with database.owner() as conn:
        seeds = conn.execute(
            "SELECT seed FROM control.tenant_seeds WHERE tenant_id = 'alpha' ORDER BY seed"
        ).fetchall()
        assert seeds == [
            ("001_reference_data.sql",),
            ("002_calendar.sql",),
            ("second_seeds:seed_workspace",),
        ]
        # SQL seeds with the tenant's id; the Python seed's ticket audited by its trigger.
        assert conn.execute(
            "SELECT value->>'tenant' FROM tenant_beta.settings WHERE key = 'workspace'"
        ).fetchone() == ("beta",)
        assert conn.execute("SELECT count(*) FROM tenant_beta.business_hours").fetchone() == (5,)
        assert conn.execute(
            "SELECT a.email::text, l.action FROM tenant_beta.tickets t "
            "JOIN tenant_beta.accounts a ON a.id = t.requester_id "
            "JOIN tenant_beta.audit_log l ON l.row_id = t.id AND l.table_name = 'tickets'"
        ).fetchall() == [("owner@beta.example", "INSERT")]


def test_the_app_role_works_through_views_partitions_triggers_and_policies(
    fleet: list[str], module_database: Database
) -> None:
    with app_session(module_database, "tenant_alpha") as conn:
        # citext: the owner's address, whatever its case; the view reads through the join.
        (owner,) = conn.execute(
            "SELECT id FROM accounts WHERE email = 'OWNER@Alpha.Example'"
        ).fetchone()
        assert conn.execute("SELECT subject, requester::text FROM open_tickets").fetchall() == [
            ("Welcome to your help desk", "owner@alpha.example")
        ]
        with pytest.raises(psycopg.errors.UniqueViolation):
            with conn.transaction():
                conn.execute(
                    "INSERT INTO accounts (email, display_name) VALUES ('Owner@ALPHA.example', 'x')"
                )
        # The generated column; the partitioned table routes rows to their partition.
        conn.execute("INSERT INTO customers (name) VALUES ('Initech')")
        conn.execute("INSERT INTO products (sku, name, price) VALUES ('TPS-1', 'Cover', 250)")
        conn.execute(
            "INSERT INTO orders (customer_id) SELECT id FROM customers WHERE name = 'Initech'"
        )
        conn.execute(
            "INSERT INTO order_lines (order_id, line_no, product_id, quantity, unit_cents) "
            "SELECT o.id, 1, p.id, 3, p.price FROM orders o, products p"
        )
        assert conn.execute("SELECT total_cents FROM order_lines").fetchone() == (750,)
        conn.execute(
            "INSERT INTO events (occurred_at, kind) VALUES ('2026-03-01', 'a'), "
            "('2026-09-01', 'b'), ('2030-01-01', 'c')"
        )
        assert conn.execute(
            "SELECT tableoid::regclass::text, kind FROM events ORDER BY kind"
        ).fetchall() == [("events_2026h1", "a"), ("events_2026h2", "b"), ("events_default", "c")]
        # Triggers: the pinned audit function writes its row whatever the session's path.
        conn.execute("SET search_path TO public")
        conn.execute("UPDATE tenant_alpha.tickets SET status = 'open'")
        assert conn.execute(
            "SELECT action FROM tenant_alpha.audit_log ORDER BY id"
        ).fetchall() == [("INSERT",), ("UPDATE",)]
        conn.execute('SET search_path TO "tenant_alpha", public')
        # Row-level security: an internal comment is seen only by a session of an agent.
        conn.execute(
            "INSERT INTO ticket_comments (ticket_id, author_id, body, internal) "
            "SELECT id, %s, 'note to self', true FROM tickets",
            (owner,),
        )
        assert conn.execute("SELECT count(*) FROM ticket_comments").fetchone() == (0,)
        conn.execute("SELECT set_config('app.agent', 'on', true)")
        assert conn.execute("SELECT count(*) FROM ticket_comments").fetchone() == (1,)
        # ...and it cannot change the schema.
        with pytest.raises(psycopg.errors.InsufficientPrivilege):
            conn.execute("CREATE TABLE sneaky (id int)")
        conn.rollback()
