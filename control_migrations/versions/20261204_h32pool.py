"""The warm pool on tenant servers: spares per server, and placement that prefers one.

* ``control.tenant_pool.server`` and ``control.tenant_pool_schemas.server``: the tenant server
  a spare's schema lives on (NULL: the control database, as every spare before this revision).
  The spare's schema is built on that server; its record stays here, so that placement reads it.
* ``control.tenant_pool.claimed_by``: the tenant whose provisioning claimed a spare on a tenant
  server. A take there spans two databases: the claim commits here first, the rename commits on
  the server with the step's journal row and fence, and the step's checkpoint here deletes the
  claimed row. A run that resumes finds its own claim again (never a second spare); a crash
  after the server's commit is adopted from the journal and its checkpoint deletes the row.
* **Placement** (``control.place_tenant``) prefers, among the active servers with room, one
  with a ready spare to spare: more unclaimed spares than provisioning jobs queued for its
  tenants (so that a burst of sign-ups does not pile onto one server's last spare); then the
  least loaded for its weight, as before, on the locked row with its capacity checked again
  (never overfilled). Still chosen once, in the enqueue's transaction.

Revision ID: 20261204_h32pool
Revises: 20261203_h31move
Create Date: 2026-12-04
"""

from alembic import op

revision = "20261204_h32pool"
down_revision = "20261203_h31move"
branch_labels = None
depends_on = None

#: The least loaded order of control revision ``20261202_h29servers``.
LOAD_ORDER = "(s.placed + 1)::float8 / s.weight, s.placed, s.name"
#: This revision's: first a server with a ready spare left once the provisioning jobs queued
#: for its tenants take theirs (the queued jobs are few, read by the queue's partial index;
#: the pool's rows are a few per server).
SPARE_PREFERENCE = (
    "(SELECT count(*) FROM control.tenant_pool p"
    " WHERE p.server = s.name AND p.claimed_by IS NULL)"
    " > (SELECT count(*) FROM control.platform_jobs j"
    " JOIN control.tenants t ON t.tenant_id = j.tenant_id"
    " WHERE j.status = 'queued' AND j.job_type = 'provision_tenant' AND t.server = s.name)"
)
SPARE_FIRST = SPARE_PREFERENCE + " DESC, " + LOAD_ORDER


def _place_tenant(order: str) -> str:
    """``control.place_tenant()`` as revision ``20261202_h29servers`` wrote it, ordering the
    servers with room by ``order``."""
    return f"""
        CREATE OR REPLACE FUNCTION control.place_tenant() RETURNS trigger
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
                -- The first in order among those with room; the capacity is checked again on
                -- the row once locked (READ COMMITTED re-reads it), so a server is never
                -- overfilled.
                SELECT s.name INTO chosen FROM control.tenant_servers s
                 WHERE s.status = 'active' AND (s.capacity IS NULL OR s.placed < s.capacity)
                 ORDER BY {order}
                 LIMIT 1
                   FOR UPDATE OF s;
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


def upgrade() -> None:
    op.execute("ALTER TABLE control.tenant_pool ADD COLUMN server TEXT")
    op.execute("ALTER TABLE control.tenant_pool ADD COLUMN claimed_by TEXT")
    op.execute("ALTER TABLE control.tenant_pool_schemas ADD COLUMN server TEXT")
    op.execute(_place_tenant(SPARE_FIRST))


def downgrade() -> None:
    op.execute(_place_tenant(LOAD_ORDER))
    # Spares on tenant servers: the rows go (their schemas stay on the servers, unrecorded).
    op.execute("DELETE FROM control.tenant_pool WHERE server IS NOT NULL")
    op.execute("DELETE FROM control.tenant_pool_schemas WHERE server IS NOT NULL")
    op.execute(
        """
        -- squawk-ignore ban-drop-column
        ALTER TABLE control.tenant_pool_schemas DROP COLUMN server
        """
    )
    op.execute(
        """
        -- squawk-ignore ban-drop-column
        ALTER TABLE control.tenant_pool DROP COLUMN claimed_by
        """
    )
    op.execute(
        """
        -- squawk-ignore ban-drop-column
        ALTER TABLE control.tenant_pool DROP COLUMN server
        """
    )
