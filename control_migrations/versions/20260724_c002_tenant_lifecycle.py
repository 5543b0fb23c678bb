"""Tenant lifecycle states: pending -> provisioning -> onboarding -> active (or suspended).

Revision ID: 20260724_c002
Revises: 20260722_c001
Create Date: 2026-07-24
"""

from alembic import op

revision = "20260724_c002"
down_revision = "20260722_c001"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.execute(
        """
        ALTER TABLE control.tenants
            ADD COLUMN state TEXT NOT NULL DEFAULT 'pending'
                CONSTRAINT tenants_state_check
                CHECK (state IN ('pending', 'provisioning', 'onboarding', 'active',
                                 'suspended', 'archived')),
            ADD COLUMN onboarding_started_at TIMESTAMPTZ,
            ADD COLUMN activated_at TIMESTAMPTZ
        """
    )


def downgrade() -> None:
    op.execute(
        """
        ALTER TABLE control.tenants
            DROP COLUMN activated_at,
            DROP COLUMN onboarding_started_at,
            DROP COLUMN state
        """
    )
