"""Placement counts the moves under way: a new tenant no longer takes a place a move holds.

``provisioner move TENANT --to SERVER`` takes its room on the target (revision
``20261203_h31move``; :func:`provisioner.servers.moves.take_room`): under the server's row lock,
``placed`` plus the moves under way into it (``control.tenant_moves`` rows with that
``target`` in phase ``moving``) must stay below its capacity. Placement of a new tenant
(``control.place_tenant``, revisions ``20261202_h29servers`` and ``20261204_h32pool``)
counted ``placed`` alone, so a
sign-up could take the place a move had reserved and overfill the server once the move
switched. This revision redefines the function to count the moves under way, as the move does:

* in the room it checks (``placed + moves < capacity``) for a named server and for the least
  loaded one, and in the load it orders by, ``(placed + moves + 1) / weight``, ties by
  ``placed + moves`` then name;
* once the server's row is locked, by a statement of its own: its snapshot, taken then, sees
  a move that took its room while the enqueue waited for the row (under read committed, the
  locking statement re-reads the row it waited for, not a count it made before the wait).
  A server found full then is passed over (its row stays locked to the end of the
  transaction, as a chosen one's does) and the next least loaded one is tried; a named one
  is refused as one at its capacity. Two enqueues that each pass over a server and then wait
  for the other's (moves into both landing while they choose) are a deadlock PostgreSQL
  breaks by failing one of them, its transaction rolled back: nothing of it is created.

Everything else is as before: a tenant already registered keeps its server, the same
``PV001`` errors, the control database when no server is in the directory but retired ones.
A partial index finds the moves under way into a server without reading the finished ones.
A server with a spare to spare still comes first (revision ``20261204_h32pool``), then the
least loaded. The downgrade restores revision ``20261204_h32pool``'s definition and drops the
index.

Revision ID: 20261204_h32room
Revises: 20261204_h32pool
Create Date: 2026-12-04
"""

import importlib.util
from pathlib import Path
from types import ModuleType

from alembic import op

revision = "20261204_h32room"
down_revision = "20261204_h32pool"
branch_labels = None
depends_on = None


def _below() -> ModuleType:
    """Revision ``20261204_h32pool`` (a revision's file name is no module name): its
    definition is what the downgrade restores, byte for byte, and its spare-first order is
    kept here."""
    path = Path(__file__).with_name("20261204_h32pool.py")
    spec = importlib.util.spec_from_file_location("control_revision_20261204_h32pool", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


# The moves under way into a server: the same rows servers/moves.py's COMING counts.
WITH_MOVES = """
CREATE OR REPLACE FUNCTION control.place_tenant() RETURNS trigger
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog AS $place$
DECLARE
    chosen TEXT;
    found_status TEXT;
    room INTEGER;          -- the locked row's capacity (NULL: no limit)
    taken INTEGER;         -- the locked row's placed
    coming BIGINT;         -- the moves under way into it, counted once the row is locked
    passed TEXT[] := '{}'; -- servers found full once locked: not tried again
BEGIN
    -- A tenant already registered keeps its server: this insert will do nothing
    -- (ON CONFLICT), and a tenant is placed once.
    IF EXISTS (SELECT FROM control.tenants t WHERE t.tenant_id = NEW.tenant_id) THEN
        RETURN NEW;
    END IF;
    IF NEW.server IS NOT NULL THEN
        -- Named: that server, if it takes new tenants (checked on its locked row, the
        -- moves under way into it counted once the lock is held).
        SELECT s.name, s.capacity, s.placed INTO chosen, room, taken
          FROM control.tenant_servers s
         WHERE s.name = NEW.server AND s.status = 'active'
           AND (s.capacity IS NULL OR s.placed < s.capacity)
           FOR UPDATE;
        IF chosen IS NOT NULL AND room IS NOT NULL THEN
            SELECT count(*) INTO coming FROM control.tenant_moves m
             WHERE m.target = chosen AND m.phase = 'moving';
            IF taken + coming >= room THEN
                chosen := NULL;
            END IF;
        END IF;
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
        -- The least loaded for its weight, the moves under way into each counted in its
        -- load and its room. Once its row is locked (READ COMMITTED re-reads the row, not
        -- the count), the moves are counted again by a statement of its own, whose snapshot
        -- sees a move that took its room meanwhile: a server found full then is passed over
        -- and the next one tried, so a server is never overfilled.
        LOOP
            SELECT s.name, s.capacity, s.placed INTO chosen, room, taken
              FROM control.tenant_servers s
             CROSS JOIN LATERAL (SELECT s.placed + count(*) AS held FROM control.tenant_moves m
                                  WHERE m.target = s.name AND m.phase = 'moving') c
             WHERE s.status = 'active' AND s.name <> ALL (passed)
               AND (s.capacity IS NULL OR c.held < s.capacity)
             ORDER BY {spare_first} DESC, (c.held + 1)::float8 / s.weight, c.held, s.name
             LIMIT 1
               FOR UPDATE OF s;
            EXIT WHEN chosen IS NULL OR room IS NULL;
            SELECT count(*) INTO coming FROM control.tenant_moves m
             WHERE m.target = chosen AND m.phase = 'moving';
            EXIT WHEN taken + coming < room;
            passed := passed || chosen;
            chosen := NULL;
        END LOOP;
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
    op.execute(
        """
        -- The moves under way are few (one per tenant being moved) and the table holds one
        -- row per tenant ever moved: the index is built in one brief scan of it.
        -- squawk-ignore require-concurrent-index-creation
        CREATE INDEX tenant_moves_coming_idx
            ON control.tenant_moves (target) WHERE phase = 'moving'
        """
    )
    op.execute(WITH_MOVES.replace("{spare_first}", _below().SPARE_PREFERENCE))


def downgrade() -> None:
    below = _below()
    op.execute(below._place_tenant(below.SPARE_FIRST))
    op.execute(
        """
        -- squawk-ignore require-concurrent-index-deletion
        DROP INDEX control.tenant_moves_coming_idx
        """
    )
