"""Datasets and their records.

Revision ID: t002
Revises: t001
Create Date: 2026-07-23
"""

from alembic import op

revision = "t002"
down_revision = "t001"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.execute(
        """
        CREATE TABLE datasets (
            id          BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
            name        TEXT NOT NULL CONSTRAINT datasets_name_key UNIQUE,
            description TEXT,
            created_by  BIGINT REFERENCES members (id) ON DELETE SET NULL,
            created_at  TIMESTAMPTZ NOT NULL DEFAULT now(),
            archived_at TIMESTAMPTZ
        )
        """
    )
    op.execute("CREATE INDEX datasets_created_by_idx ON datasets (created_by)")
    op.execute(
        """
        CREATE TABLE dataset_records (
            id           BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
            dataset_id   BIGINT NOT NULL REFERENCES datasets (id) ON DELETE CASCADE,
            external_key TEXT NOT NULL,
            payload      JSONB NOT NULL DEFAULT '{}'::jsonb,
            recorded_at  TIMESTAMPTZ NOT NULL DEFAULT now(),
            CONSTRAINT dataset_records_dataset_key UNIQUE (dataset_id, external_key)
        )
        """
    )
    op.execute(
        "CREATE INDEX dataset_records_recorded_idx ON dataset_records (dataset_id, recorded_at)"
    )


def downgrade() -> None:
    op.execute("DROP TABLE dataset_records")
    op.execute("DROP TABLE datasets")
