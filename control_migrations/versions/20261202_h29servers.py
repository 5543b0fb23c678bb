"""Tenants on several PostgreSQL servers: the directory of tenant servers, and each tenant's.

* ``control.tenant_servers``: one row per tenant server (issue 29). ``conninfo`` is how to reach
  it and holds no secret (a libpq service name, or ``host=... port=... dbname=...``; the
  password comes from ``.pgpass``, ``PGPASSWORD`` or a service file); the library refuses a
  password before it gets here, and a CHECK refuses the obvious forms again. ``status``:
  ``active`` takes new tenants; ``draining``, ``full`` and ``retired`` take none. ``capacity``
  (NULL: no limit) bounds ``placed``, the number of tenants on the server that are not purged,
  which the triggers below keep (a purged tenant frees its place; taken up again with
  ``--reuse-deleted``, it returns to its server, whatever its room); ``weight`` shares new
  tenants between active servers.
* ``control.tenants.server``: the tenant's server; NULL is the control database itself, the
  implicit default, so a deployment with no tenant server changes nothing.
* **Placement** is a BEFORE INSERT trigger on ``control.tenants`` (``control.place_tenant``),
  so it happens in the enqueue's own transaction, in the statement that creates the tenant's
  row, before any DDL, and once: a retry re-uses the row and never places again. A tenant
  named to a server (``enqueue --server``) goes there if it is active and has room; otherwise
  the active server with room that is least loaded for its weight, its row locked (``FOR
  UPDATE``, capacity re-checked on the locked row), so concurrent enqueues never overfill one.
  With no server in the directory but retired ones, the tenant stays on the control database;
  with servers, but none active with room, the insert fails with SQLSTATE ``PV001`` (the
  library's ``NoServerRoom``): nothing is created.
* The application role learns where a tenant lives from ``control.tenant_location(tenant)``
  (``provisioner.locate``; a SECURITY DEFINER function), reads each server's name, status and
  load (``health`` shows them) but no reference, and may name a server when it registers a
  tenant; it writes nothing else here.

Revision ID: 20261202_h29servers
Revises: 20261202_h28_rollouts
Create Date: 2026-12-02
"""

from alembic import op

from provisioner.control_migrations.privileges import grant_to_app_role, revoke_from_app_role

revision = "20261202_h29servers"
down_revision = "20261202_h28rest"
branch_labels = None
depends_on = None

#: No secret in a reference: no password key in a conninfo, no password in a URL's user info.
#: (the text of a CHECK, which holds no password)
WITHOUT_SECRET = r"conninfo !~* '(^|\s)password\s*=' AND conninfo !~ '^[a-z]+://[^/@]*:[^/@]*@'"  # noqa: S105


def upgrade() -> None:
    op.execute(
        f"""
        CREATE TABLE control.tenant_servers (
            name       TEXT PRIMARY KEY
                       CHECK (name ~ '^[a-z][a-z0-9_]{{0,47}}$' AND name <> 'control'),
            conninfo   TEXT NOT NULL CHECK (length(conninfo) BETWEEN 1 AND 1000
                                            AND {WITHOUT_SECRET}),
            status     TEXT NOT NULL DEFAULT 'active'
                       CHECK (status IN ('active', 'draining', 'full', 'retired')),
            capacity   INTEGER CHECK (capacity IS NULL OR capacity >= 0),
            weight     INTEGER NOT NULL DEFAULT 1 CHECK (weight BETWEEN 1 AND 1000000),
            placed     INTEGER NOT NULL DEFAULT 0 CHECK (placed >= 0),
            added_at   TIMESTAMPTZ NOT NULL DEFAULT now(),
            updated_at TIMESTAMPTZ NOT NULL DEFAULT now()
        )
        """
    )
    revoke_from_app_role("ALL", "TABLE control.tenant_servers")
    # What ``health`` shows of each server, which runs as the application role: no reference.
    grant_to_app_role(
        "SELECT (name, status, capacity, weight, placed)", "TABLE control.tenant_servers"
    )
    op.execute("ALTER TABLE control.tenants ADD COLUMN server TEXT")
    # NOT VALID: every existing row holds NULL (the control database), and new rows are checked.
    op.execute(
        """
        ALTER TABLE control.tenants ADD CONSTRAINT tenants_server_fkey
        FOREIGN KEY (server) REFERENCES control.tenant_servers (name) NOT VALID
        """
    )
    grant_to_app_role("INSERT (server)", "TABLE control.tenants")
    _placement()
    _counting()
    _location()


def _location() -> None:
    """Where a tenant lives, for the application role, which reads no directory row itself."""
    op.execute(
        """
        CREATE FUNCTION control.tenant_location(tenant TEXT)
        RETURNS TABLE (server TEXT, conninfo TEXT)
        LANGUAGE sql STABLE SECURITY DEFINER SET search_path = pg_catalog AS $locate$
            SELECT t.server, s.conninfo
              FROM control.tenants t LEFT JOIN control.tenant_servers s ON s.name = t.server
             WHERE t.tenant_id = tenant
        $locate$
        """
    )
    op.execute("REVOKE ALL ON FUNCTION control.tenant_location(TEXT) FROM PUBLIC")
    grant_to_app_role("EXECUTE", "FUNCTION control.tenant_location(TEXT)")


def _placement() -> None:
    op.execute(
        """
        CREATE FUNCTION control.place_tenant() RETURNS trigger
        LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog AS $place$
        DECLARE
            chosen TEXT;
            found_status TEXT;
        BEGIN
            -- A tenant already registered keeps its server: this insert will do nothing
            -- (ON CONFLICT), and a tenant is placed once.
            IF EXISTS (SELECT FROM control.tenants t WHERE t.tenant_id = NEW.tenant_id) THEN
                RETURN NEW;
            END IF;
            IF NEW.server IS NOT NULL THEN
                -- Named: that server, if it takes new tenants (checked on its locked row).
                SELECT s.name INTO chosen FROM control.tenant_servers s
                 WHERE s.name = NEW.server AND s.status = 'active'
                   AND (s.capacity IS NULL OR s.placed < s.capacity)
                   FOR UPDATE;
                IF chosen IS NULL THEN
                    SELECT s.status INTO found_status FROM control.tenant_servers s
                     WHERE s.name = NEW.server;
                    RAISE EXCEPTION USING ERRCODE = 'PV001', MESSAGE = CASE
                        WHEN found_status IS NULL
                        THEN format('no tenant server named %s', NEW.server)
                        WHEN found_status = 'active'
                        THEN format('tenant server %s is at its capacity', NEW.server)
                        ELSE format('tenant server %s is %s: it takes no new tenants',
                                    NEW.server, found_status) END;
                END IF;
            ELSE
                -- The least loaded for its weight; the capacity is checked again on the row
                -- once locked (READ COMMITTED re-reads it), so a server is never overfilled.
                SELECT s.name INTO chosen FROM control.tenant_servers s
                 WHERE s.status = 'active' AND (s.capacity IS NULL OR s.placed < s.capacity)
                 ORDER BY (s.placed + 1)::float8 / s.weight, s.placed, s.name
                 LIMIT 1
                   FOR UPDATE;
                IF chosen IS NULL THEN
                    IF NOT EXISTS (SELECT FROM control.tenant_servers s
                                    WHERE s.status <> 'retired') THEN
                        RETURN NEW;  -- no tenant server: the control database, as ever
                    END IF;
                    RAISE EXCEPTION USING ERRCODE = 'PV001', MESSAGE =
                        'no tenant server takes new tenants (each is draining, full, retired '
                        'or at its capacity)';
                END IF;
            END IF;
            -- The row stays locked to the end of the transaction; the AFTER INSERT trigger
            -- counts the tenant once it is really inserted (not on an ON CONFLICT no-op).
            NEW.server := chosen;
            RETURN NEW;
        END
        $place$
        """
    )
    op.execute("REVOKE ALL ON FUNCTION control.place_tenant() FROM PUBLIC")
    op.execute(
        """
        CREATE TRIGGER tenants_place BEFORE INSERT ON control.tenants
        FOR EACH ROW EXECUTE FUNCTION control.place_tenant()
        """
    )


def _counting() -> None:
    """``placed`` counts the tenants on a server that are not purged: inserted, purged
    (``deleted``) or taken up again, deleted, or moved by the owner."""
    op.execute(
        """
        CREATE FUNCTION control.count_tenant_servers() RETURNS trigger
        LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog AS $count$
        BEGIN
            IF TG_OP IN ('UPDATE', 'DELETE') AND OLD.server IS NOT NULL
               AND OLD.state <> 'deleted' THEN
                UPDATE control.tenant_servers SET placed = placed - 1 WHERE name = OLD.server;
            END IF;
            IF TG_OP IN ('INSERT', 'UPDATE') AND NEW.server IS NOT NULL
               AND NEW.state <> 'deleted' THEN
                UPDATE control.tenant_servers SET placed = placed + 1 WHERE name = NEW.server;
            END IF;
            RETURN NULL;
        END
        $count$
        """
    )
    op.execute("REVOKE ALL ON FUNCTION control.count_tenant_servers() FROM PUBLIC")
    op.execute(
        """
        CREATE TRIGGER tenants_join_server AFTER INSERT ON control.tenants
        FOR EACH ROW WHEN (NEW.server IS NOT NULL)
        EXECUTE FUNCTION control.count_tenant_servers()
        """
    )
    op.execute(
        """
        CREATE TRIGGER tenants_leave_server AFTER DELETE ON control.tenants
        FOR EACH ROW WHEN (OLD.server IS NOT NULL)
        EXECUTE FUNCTION control.count_tenant_servers()
        """
    )
    op.execute(
        """
        CREATE TRIGGER tenants_move_server AFTER UPDATE OF server, state ON control.tenants
        FOR EACH ROW WHEN (OLD.server IS DISTINCT FROM NEW.server
                           OR (OLD.state = 'deleted') <> (NEW.state = 'deleted'))
        EXECUTE FUNCTION control.count_tenant_servers()
        """
    )


def downgrade() -> None:
    op.execute("DROP FUNCTION control.tenant_location(TEXT)")
    op.execute("DROP TRIGGER tenants_move_server ON control.tenants")
    op.execute("DROP TRIGGER tenants_leave_server ON control.tenants")
    op.execute("DROP TRIGGER tenants_join_server ON control.tenants")
    op.execute("DROP FUNCTION control.count_tenant_servers()")
    op.execute("DROP TRIGGER tenants_place ON control.tenants")
    op.execute("DROP FUNCTION control.place_tenant()")
    revoke_from_app_role("INSERT (server)", "TABLE control.tenants")
    op.execute(
        """
        -- squawk-ignore ban-drop-column
        ALTER TABLE control.tenants DROP COLUMN server
        """
    )
    op.execute(
        """
        -- squawk-ignore ban-drop-table
        DROP TABLE control.tenant_servers
        """
    )
