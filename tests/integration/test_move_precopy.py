"""A move's DDL restored before the freeze, its rows in it (issue 29's 2-s goal): what a full
restore creates after the rows (a trigger that rewrites rows, foreign keys in a cycle, row
security) is created after them here too, so the trigger does not fire on the copied rows and
the cycle does not stop the copy; the rows read back as written (a dropped and a generated
column, dates, intervals, floats). Two real clusters
(:mod:`tests.move_server`)."""

from __future__ import annotations

import json

import psycopg

from provisioner import servers, service
from provisioner.settings import Settings
from provisioner.tenant import catalog
from tests.conftest import Database, run_cli
from tests.move_server import TenantServer

SHAPED = """
CREATE TABLE tenant_shaped.a (id int PRIMARY KEY, b_id int);
CREATE TABLE tenant_shaped.b (id int PRIMARY KEY, a_id int NOT NULL REFERENCES tenant_shaped.a);
ALTER TABLE tenant_shaped.a ADD FOREIGN KEY (b_id) REFERENCES tenant_shaped.b;
INSERT INTO tenant_shaped.a SELECT g, NULL FROM generate_series(1, 50) g;
INSERT INTO tenant_shaped.b SELECT g, g FROM generate_series(1, 50) g;
UPDATE tenant_shaped.a SET b_id = id;
INSERT INTO tenant_shaped.audit_events (action) SELECT 'seed ' || g FROM generate_series(1, 200) g;
CREATE FUNCTION tenant_shaped.stamp() RETURNS trigger LANGUAGE plpgsql
    AS $$ BEGIN NEW.action := 'rewritten'; RETURN NEW; END $$;
CREATE TRIGGER stamp BEFORE INSERT ON tenant_shaped.audit_events
    FOR EACH ROW EXECUTE FUNCTION tenant_shaped.stamp();
ALTER TABLE tenant_shaped.b ENABLE ROW LEVEL SECURITY;
CREATE POLICY seen ON tenant_shaped.b USING (a_id > 0);
CREATE TABLE tenant_shaped.c (
    id int PRIMARY KEY, gone int, d date, i interval, f float8,
    g int GENERATED ALWAYS AS (id * 2) STORED
);
ALTER TABLE tenant_shaped.c DROP COLUMN gone;
INSERT INTO tenant_shaped.c (id, d, i, f)
SELECT g, date '2020-01-01' + g, g * interval '1 hour 1.5 seconds', 1.0 / 3 * g
  FROM generate_series(1, 40) g;
"""

C_ROWS = "SELECT c::text FROM tenant_shaped.c c ORDER BY id"


def test_what_follows_the_rows_is_created_after_them(
    settings: Settings, database: Database, tenant_server: TenantServer
) -> None:
    service.provision(settings, "shaped")
    with database.owner() as conn:
        conn.execute(SHAPED)
        servers.add(conn, "east", tenant_server.reference)
        before = catalog.read(conn, "tenant_shaped")
        c_rows = conn.execute(C_ROWS).fetchall()
    out = run_cli(settings, "move", "shaped", "--to", "east", "--json", env=tenant_server.env)
    assert out.returncode == 0, out.stdout + out.stderr
    result = json.loads(out.stdout)
    assert result["job"]["steps_completed"][:2] == ["precopy_schema", "freeze_writes"]
    with tenant_server.owner() as conn:
        assert catalog.read(conn, "tenant_shaped") == before
        actions = conn.execute(
            "SELECT count(*) FILTER (WHERE action LIKE 'seed %'), count(*) "
            "FROM tenant_shaped.audit_events"
        ).fetchone()
        cycle = conn.execute(
            "SELECT count(*) FROM tenant_shaped.a JOIN tenant_shaped.b ON b.id = a.b_id "
            "AND b.a_id = a.id"
        ).fetchone()
    assert actions == (200, 200)  # the trigger did not fire on the copied rows
    assert cycle == (50,)
    with tenant_server.owner() as conn:
        assert conn.execute(C_ROWS).fetchall() == c_rows
    with psycopg.connect(tenant_server.app_url, autocommit=True) as app:
        app.execute("INSERT INTO tenant_shaped.audit_events (action) VALUES ('new')")
        # ...and fires on the application's writes there
        assert app.execute(
            "SELECT action FROM tenant_shaped.audit_events ORDER BY id DESC LIMIT 1"
        ).fetchone() == ("rewritten",)
