"""The help desk's own tests, on tenants of its own template from the provisioner's plugin."""

import psycopg


def test_a_tenant_of_the_project_template(tenant):
    with tenant.connect() as conn:
        conn.execute("SET search_path TO " + tenant.schema + ", public")
        assert conn.execute("SELECT count(*) FROM sla_policies").fetchone() == (4,)
        assert conn.execute("SELECT subject FROM open_tickets").fetchone() == (
            "Welcome to your help desk",
        )
        conn.execute("INSERT INTO labels (name) VALUES ('urgent')")
        # The audit trigger's function keeps the tenant's schema, whatever the session's path.
        conn.execute("SET search_path TO public")
        conn.execute("UPDATE " + tenant.schema + ".tickets SET status = 'open'")
        actions = conn.execute("SELECT action FROM " + tenant.schema + ".audit_log ORDER BY id")
        assert actions.fetchall() == [("INSERT",), ("UPDATE",)]


def test_each_test_gets_a_fresh_one(tenant_factory):
    first, second = tenant_factory(), tenant_factory()
    for made in (first, second):
        with psycopg.connect(made.app_url) as conn:
            conn.execute("SET search_path TO " + made.schema + ", public")
            assert conn.execute("SELECT count(*) FROM labels").fetchone() == (3,)
            assert conn.execute("SELECT count(*) FROM audit_log").fetchone() == (1,)
