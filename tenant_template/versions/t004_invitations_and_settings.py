"""Member invitations, tenant settings and API keys.

Revision ID: t004
Revises: t003
Create Date: 2026-07-25
"""

from alembic import op

revision = "t004"
down_revision = "t003"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.execute(
        """
        CREATE TABLE invitations (
            id              BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
            email           TEXT NOT NULL,
            role_profile_id BIGINT NOT NULL REFERENCES role_profiles (id) ON DELETE CASCADE,
            invited_by      BIGINT REFERENCES members (id) ON DELETE SET NULL,
            token_hash      TEXT NOT NULL CONSTRAINT invitations_token_hash_key UNIQUE,
            expires_at      TIMESTAMPTZ NOT NULL,
            accepted_at     TIMESTAMPTZ,
            created_at      TIMESTAMPTZ NOT NULL DEFAULT now()
        )
        """
    )
    op.execute("CREATE INDEX invitations_email_idx ON invitations (lower(email))")
    op.execute(
        """
        CREATE TABLE tenant_settings (
            key        TEXT PRIMARY KEY,
            value      JSONB NOT NULL,
            updated_at TIMESTAMPTZ NOT NULL DEFAULT now()
        )
        """
    )
    op.execute(
        """
        CREATE TABLE api_keys (
            id         BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
            member_id  BIGINT NOT NULL REFERENCES members (id) ON DELETE CASCADE,
            label      TEXT NOT NULL,
            key_hash   TEXT NOT NULL CONSTRAINT api_keys_key_hash_key UNIQUE,
            created_at TIMESTAMPTZ NOT NULL DEFAULT now(),
            revoked_at TIMESTAMPTZ
        )
        """
    )
    op.execute("CREATE INDEX api_keys_member_idx ON api_keys (member_id)")


def downgrade() -> None:
    op.execute("DROP TABLE api_keys")
    op.execute("DROP TABLE tenant_settings")
    op.execute("DROP TABLE invitations")
