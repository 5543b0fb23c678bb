"""Append-only audit trail of who did what in the tenant.

Revision ID: t003
Revises: t002
Create Date: 2026-07-24
"""

from alembic import op

revision = "t003"
down_revision = "t002"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.execute(
        """
        CREATE TABLE audit_events (
            id              BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
            occurred_at     TIMESTAMPTZ NOT NULL DEFAULT now(),
            actor_member_id BIGINT REFERENCES members (id) ON DELETE SET NULL,
            action          TEXT NOT NULL,
            target_type     TEXT,
            target_id       TEXT,
            detail          JSONB NOT NULL DEFAULT '{}'::jsonb
        )
        """
    )
    op.execute("CREATE INDEX audit_events_occurred_idx ON audit_events (occurred_at)")
    op.execute("CREATE INDEX audit_events_actor_idx ON audit_events (actor_member_id)")


def downgrade() -> None:
    op.execute("DROP TABLE audit_events")
