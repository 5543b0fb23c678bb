"""Placement believes only a live worker's heartbeat, written by the owner side.

Revision ``20261205_h33spares`` has placement (``control.place_tenant``) count a server's spare
only when a worker's heartbeat (``control.runtime_heartbeats``, ``detail.pool``) reports the
tree state and role set a take hands out. It read any such row, however old, and whoever wrote
it:

* a worker that stopped leaves its row behind, so a server with spares kept being preferred
  while no worker ran a pool (its tenants then got no spare, and the load went unbalanced);
* ``app_rw`` may write heartbeat rows of its own (revision ``20261202_h27_approws`` lets it
  beat, and stamps ``written_by`` with its role), so the application could steer sign-ups onto
  the server of its choice.

This revision counts a heartbeat only when it is **fresh** (younger than the lease its worker
promises: ``detail.pool.alive_seconds``, three heartbeat intervals,
:func:`provisioner.pool.server_spares.takes_for`; a beat that does not say, from a worker older
than this revision, counts for :data:`UNSAID_ALIVE_SECONDS`) and **written by the owner side**
(``written_by`` is a role with the control tables' owner's privileges, as ``provisioner health``
already requires of a beat it believes).

Everything else is revision ``20261205_h33spares``'s definition, word for word (its text, with
the preference replaced). The downgrade restores that definition, byte for byte.

Revision ID: 20261206_h35beats
Revises: 20261205_h33spares
Create Date: 2026-12-06
"""

from alembic import op

from provisioner.control_migrations import revisions

revision = "20261206_h35beats"
down_revision = "20261205_h33spares"
branch_labels = None
depends_on = None

#: How long a pool heartbeat that does not say its lease counts (three beats of the longest
#: interval a worker older than this revision would normally run with).
UNSAID_ALIVE_SECONDS = 60


#: A spare to spare that a take would hand out (revision 20261205_h33spares's count), as
#: reported by a heartbeat that is fresh and was written by the owner side.
LIVE_SPARE_PREFERENCE = (
    "(SELECT count(*) FROM control.tenant_pool p"
    " WHERE p.server = s.name AND p.claimed_by IS NULL"
    " AND EXISTS (SELECT FROM control.runtime_heartbeats h"
    " WHERE h.detail -> 'pool' ->> 'digest' = p.tree_digest"
    " AND p.app_roles IN (h.detail -> 'pool' ->> 'roles', '')"
    " AND h.heartbeat_at > now() - make_interval(secs => coalesce("
    "(h.detail -> 'pool' ->> 'alive_seconds')::float8, "
    f"{UNSAID_ALIVE_SECONDS}))"
    " AND EXISTS (SELECT FROM pg_catalog.pg_roles r, pg_catalog.pg_class c"
    " WHERE c.oid = 'control.runtime_heartbeats'::regclass AND r.rolname = h.written_by"
    " AND pg_catalog.pg_has_role(r.oid, c.relowner, 'USAGE'))))"
    " > (SELECT count(*) FROM control.platform_jobs j"
    " JOIN control.tenants t ON t.tenant_id = j.tenant_id"
    " WHERE j.status = 'queued' AND j.job_type = 'provision_tenant' AND t.server = s.name)"
)


def upgrade() -> None:
    room = revisions.load("20261204_h32room")
    op.execute(room.WITH_MOVES.replace("{spare_first}", LIVE_SPARE_PREFERENCE))


def downgrade() -> None:
    room = revisions.load("20261204_h32room")
    spares = revisions.load("20261205_h33spares")
    op.execute(room.WITH_MOVES.replace("{spare_first}", spares.USABLE_SPARE_PREFERENCE))
