"""The warm pool's record of the schemas it created: ``control.tenant_pool_schemas``.

The pool keeper used to treat any schema named ``pool_*`` without a ``tenant_pool`` row as a
build of its own that died, and dropped it (``DROP SCHEMA ... CASCADE``), whoever had made it.
Now a builder records the name in ``tenant_pool_schemas`` in the transaction that creates the
schema, before it creates it: a ``pool_*`` schema is the pool's only when it is recorded here,
and the keeper drops nothing else (it reports the others). A ready spare (a ``tenant_pool`` row)
is always a recorded one (the foreign key).

Existing ready spares are recorded by this revision; a ``pool_*`` schema without a
``tenant_pool`` row (an unfinished build of an earlier release, or anything else) is not: the
keeper reports it and leaves it to the operator.

Revision ID: 20261202_h27_tenantside
Revises: 20261202_h28_console
Create Date: 2026-12-02
"""

from alembic import op

revision = "20261202_h27_tenantside"
down_revision = "20261202_h28_console"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.execute(
        """
        CREATE TABLE control.tenant_pool_schemas (
            schema_name TEXT PRIMARY KEY
                        CONSTRAINT tenant_pool_schemas_name_check
                        CHECK (schema_name ~ '^pool_[0-9a-f]+$'),
            created_by  TEXT NOT NULL,
            created_at  TIMESTAMPTZ NOT NULL DEFAULT now()
        )
        """
    )
    op.execute(
        """
        INSERT INTO control.tenant_pool_schemas (schema_name, created_by, created_at)
        SELECT schema_name, created_by, created_at FROM control.tenant_pool
        """
    )
    op.execute(
        """
        ALTER TABLE control.tenant_pool
          ADD CONSTRAINT tenant_pool_recorded_fkey FOREIGN KEY (schema_name)
              REFERENCES control.tenant_pool_schemas (schema_name) ON DELETE CASCADE NOT VALID
        """
    )
    # NOT VALID: every existing row was recorded just above, in this transaction, and the key
    # holds for every later write; no validating scan under the lock.


def downgrade() -> None:
    # The earlier release drops a pool_* schema without a tenant_pool row as an unfinished
    # build: the recorded unfinished builds are exactly those, so nothing else is lost.
    op.execute("ALTER TABLE control.tenant_pool DROP CONSTRAINT tenant_pool_recorded_fkey")
    op.execute("DROP TABLE control.tenant_pool_schemas")
