"""The tenant template's verified reference, shared by every process, and the warm pool.

``tenant_template_references``: one row per state of the tenant tree (a digest of its files),
holding what Alembic builds for the head (the catalog fingerprint) and the statements the fast
path replays. Computed once per database and tree state, under an advisory lock.

``tenant_pool``: spare schemas already built at a tree state and verified, named ``pool_<hex>``
(never ``tenant_<id>``), granted to nobody. Provisioning takes one by renaming it.

Revision ID: 20260803_c007
Revises: 20260728_c004
Create Date: 2026-08-03
"""

from alembic import op

revision = "20260803_c007"
down_revision = "20260802_c006"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.execute(
        """
        CREATE TABLE control.tenant_template_references (
            tree_digest TEXT PRIMARY KEY,
            heads       TEXT[] NOT NULL,
            statements  TEXT[] NOT NULL,
            fingerprint JSONB NOT NULL,
            created_by  TEXT NOT NULL,
            created_at  TIMESTAMPTZ NOT NULL DEFAULT now()
        )
        """
    )
    op.execute(
        """
        CREATE TABLE control.tenant_pool (
            schema_name TEXT PRIMARY KEY
                        CONSTRAINT tenant_pool_name_check CHECK (schema_name ~ '^pool_[0-9a-f]+$'),
            tree_digest TEXT NOT NULL,
            heads       TEXT[] NOT NULL,
            created_by  TEXT NOT NULL,
            created_at  TIMESTAMPTZ NOT NULL DEFAULT now()
        )
        """
    )
    op.execute(
        "CREATE INDEX tenant_pool_digest_idx ON control.tenant_pool (tree_digest, created_at)"
    )


def downgrade() -> None:
    # Spares are nobody's tenants: without their table they would be orphans.
    op.execute(
        """
        DO $drop$
        DECLARE spare text;
        BEGIN
          FOR spare IN SELECT schema_name FROM control.tenant_pool LOOP
            EXECUTE format('DROP SCHEMA IF EXISTS %I CASCADE', spare);
          END LOOP;
        END
        $drop$
        """
    )
    op.execute("DROP TABLE control.tenant_pool")
    op.execute("DROP TABLE control.tenant_template_references")
