"""Placement prefers a server for its spares only when a take would hand them out.

Revision ``20261204_h32pool`` had placement (``control.place_tenant``) prefer a server with a
spare to spare: more unclaimed spares than provisioning jobs queued for its tenants. It counted
every unclaimed spare, whatever the tree state and role set it was built for; a take hands out
only a spare at the tree state on disk and for the configured application roles (or built
without grants), and only with the warm pool on. A server holding only stale spares (a
release changed the template or the roles, and its keeper had not dropped them yet; or the
pool was turned off, and no keeper runs) was preferred over a less loaded one, and its new
tenants got no spare.

This revision counts a spare only when a worker with the pool on would take it: its
``tree_digest`` is the one a worker's heartbeat reports (``control.runtime_heartbeats``,
``detail.pool.digest``: :func:`provisioner.pool.server_spares.takes_for`) and its
``app_roles`` that heartbeat's ``detail.pool.roles``, or ``''`` (built without grants, as a
take allows). No heartbeat with a pool: no server is preferred for its spares, the least loaded
goes first. The heartbeats are one row per component, the pool's rows a few per server.

Everything else is revision ``20261204_h32room``'s definition, word for word (its text, with
the preference replaced). The downgrade restores that definition, byte for byte.

Revision ID: 20261205_h33spares
Revises: 20261204_h32room
Create Date: 2026-12-05
"""

from alembic import op

from provisioner.control_migrations import revisions

revision = "20261205_h33spares"
down_revision = "20261204_h32room"
branch_labels = None
depends_on = None


#: A spare to spare that a take would hand out: unclaimed, at the tree state and role set a
#: worker with the pool on reports, more of them than provisioning jobs queued for the
#: server's tenants (revision 20261204_h32pool's count, its spares filtered).
USABLE_SPARE_PREFERENCE = (
    "(SELECT count(*) FROM control.tenant_pool p"
    " WHERE p.server = s.name AND p.claimed_by IS NULL"
    " AND EXISTS (SELECT FROM control.runtime_heartbeats h"
    " WHERE h.detail -> 'pool' ->> 'digest' = p.tree_digest"
    " AND p.app_roles IN (h.detail -> 'pool' ->> 'roles', '')))"
    " > (SELECT count(*) FROM control.platform_jobs j"
    " JOIN control.tenants t ON t.tenant_id = j.tenant_id"
    " WHERE j.status = 'queued' AND j.job_type = 'provision_tenant' AND t.server = s.name)"
)


def upgrade() -> None:
    room = revisions.load("20261204_h32room")
    op.execute(room.WITH_MOVES.replace("{spare_first}", USABLE_SPARE_PREFERENCE))


def downgrade() -> None:
    room = revisions.load("20261204_h32room")
    pool = revisions.load("20261204_h32pool")
    op.execute(room.WITH_MOVES.replace("{spare_first}", pool.SPARE_PREFERENCE))
