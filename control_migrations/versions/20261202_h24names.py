"""The tenant naming the control database records, and the application role's registration
held to it.

``control.tenant_naming`` (one row, the owner's; the application role reads it) holds the
project's schema pattern and tenant-id rule as ``provisioner migrate`` last recorded them
(:mod:`provisioner.control.naming`). The application role registers a tenant (``control.tenants``,
policy ``app_registers_tenants``) only with the schema name that pattern gives its id: it can
never point a tenant at another schema. With no row, the pattern is ``tenant_{id}``, as before.

Revision ID: 20261202_h24names
Revises: 20261202_h28_rollouts
Create Date: 2026-12-02
"""

from alembic import op

from provisioner.control_migrations.privileges import for_app_role, grant_to_app_role

revision = "20261202_h24names"
down_revision = "20261202_h29servers"
branch_labels = None
depends_on = None

#: The schema name a tenant's id gives under the recorded pattern (``tenant_{id}`` without one).
NAMED_SCHEMA = (
    "coalesce((SELECT replace(n.schema_pattern, '{id}', tenant_id) "
    "FROM control.tenant_naming n), 'tenant_' || tenant_id)"
)


def upgrade() -> None:
    op.execute(
        """
        CREATE TABLE control.tenant_naming (
            only_row             BOOLEAN PRIMARY KEY DEFAULT true CHECK (only_row),
            schema_pattern       TEXT NOT NULL CHECK (schema_pattern LIKE '%{id}%'),
            tenant_id_pattern    TEXT NOT NULL,
            tenant_id_max_length INTEGER NOT NULL CHECK (tenant_id_max_length BETWEEN 1 AND 63),
            recorded_at          TIMESTAMPTZ NOT NULL DEFAULT now()
        )
        """
    )
    op.execute("REVOKE ALL ON TABLE control.tenant_naming FROM PUBLIC")
    grant_to_app_role("SELECT", "TABLE control.tenant_naming")
    _registration(f"schema_name = {NAMED_SCHEMA} AND state = 'pending'")


def downgrade() -> None:
    _registration("schema_name = 'tenant_' || tenant_id AND state = 'pending'")
    op.execute("DROP TABLE control.tenant_naming")


def _registration(check: str) -> None:
    """The application role's INSERT policy on control.tenants, replaced."""
    for_app_role("DROP POLICY IF EXISTS app_registers_tenants ON control.tenants")
    for_app_role(
        f"""
        CREATE POLICY app_registers_tenants ON control.tenants FOR INSERT TO {{role}}
        WITH CHECK ({check})
        """
    )
