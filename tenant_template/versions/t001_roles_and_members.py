"""Role profiles (seeded by key) and the tenant's members.

Revision ID: t001
Revises:
Create Date: 2026-07-22
"""

from alembic import op

revision = "t001"
down_revision = None
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.execute(
        """
        CREATE TABLE role_profiles (
            id          BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
            key         TEXT NOT NULL CONSTRAINT role_profiles_key_key UNIQUE,
            name        TEXT NOT NULL,
            permissions JSONB NOT NULL DEFAULT '[]'::jsonb,
            is_default  BOOLEAN NOT NULL DEFAULT false,
            created_at  TIMESTAMPTZ NOT NULL DEFAULT now()
        )
        """
    )
    op.execute(
        """
        CREATE TABLE members (
            id              BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
            email           TEXT NOT NULL,
            display_name    TEXT,
            role_profile_id BIGINT NOT NULL
                            REFERENCES role_profiles (id) ON DELETE RESTRICT,
            status          TEXT NOT NULL DEFAULT 'invited'
                            CONSTRAINT members_status_check
                            CHECK (status IN ('invited', 'active', 'disabled')),
            created_at      TIMESTAMPTZ NOT NULL DEFAULT now(),
            updated_at      TIMESTAMPTZ NOT NULL DEFAULT now()
        )
        """
    )
    op.execute("CREATE UNIQUE INDEX members_email_key ON members (lower(email))")
    op.execute("CREATE INDEX members_role_profile_idx ON members (role_profile_id)")


def downgrade() -> None:
    op.execute("DROP TABLE members")
    op.execute("DROP TABLE role_profiles")
