"""The seeds applied to each tenant's schema (``control.tenant_seeds``), and the verdict on an
upgrade's replay (``tenant_upgrade_references.replay_refused``).

One row per schema (by OID) and seed (a SQL file's name or ``module:function``): the content
digest applied, and the tenant it was applied for. Keyed by the schema's OID, so that the seed
step's catalog check is real: a changed seed, or a schema created again, is not seeded, and a
schema renamed into a tenant's name (a spare taken) keeps its record. The owner's alone: the
application role is granted nothing here.

Revision ID: 20261202_lead24
Revises: 20260804_c008
Create Date: 2026-12-02
"""

from alembic import op

revision = "20261202_lead24"
down_revision = "20260804_c008"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.execute(
        """
        CREATE TABLE control.tenant_seeds (
            schema_oid OID NOT NULL,
            seed       TEXT NOT NULL,
            tenant_id  TEXT NOT NULL,
            digest     TEXT NOT NULL,
            applied_at TIMESTAMPTZ NOT NULL DEFAULT now(),
            PRIMARY KEY (schema_oid, seed)
        )
        """
    )
    op.execute("REVOKE ALL ON TABLE control.tenant_seeds FROM PUBLIC")
    # Why an upgrade's offline SQL must not be replayed (NULL: it is what Alembic ran), decided
    # by recording Alembic's run on the scratch schema (provisioner.templates.recording).
    op.execute("ALTER TABLE control.tenant_upgrade_references ADD COLUMN replay_refused TEXT")


def downgrade() -> None:
    op.execute("ALTER TABLE control.tenant_upgrade_references DROP COLUMN replay_refused")
    op.execute("DROP TABLE control.tenant_seeds")
