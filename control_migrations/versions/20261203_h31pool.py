"""The application roles a warm spare was granted for: ``control.tenant_pool.app_roles``.

A spare carries its roles' grants (all but USAGE) from its build. When the project's role set
changes (a role added, removed, or given another privilege set), a spare built for the old set
would be handed out with the old grants: a removed role's table grants and default privileges
left in the tenant, a readonly role still holding a readwrite grant. The column records the set
(:func:`provisioner.roles.identity`; ``''`` for a spare built without grants, which the grant
step grants in full at the take): a take only hands out a spare of the configured set (or one
without grants), and the keeper drops the others and builds new ones. Spares recorded before
this revision say ``not recorded``: never handed out, rebuilt.

Revision ID: 20261203_h31pool
Revises: 20261202_hgaps
Create Date: 2026-12-03
"""

from alembic import op

revision = "20261203_h31pool"
down_revision = "20261202_hgaps"
branch_labels = None
depends_on = None


def upgrade() -> None:
    # A constant default: no table rewrite (PostgreSQL 11+), and every existing row reads as
    # unrecorded.
    op.execute(
        "ALTER TABLE control.tenant_pool ADD COLUMN app_roles TEXT NOT NULL DEFAULT 'not recorded'"
    )


def downgrade() -> None:
    op.execute("ALTER TABLE control.tenant_pool DROP COLUMN app_roles")
