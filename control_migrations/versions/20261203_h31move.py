"""Moves of a tenant between servers: ``control.tenant_moves``, one row per tenant moved.

A move (``provisioner move TENANT --to SERVER``, issue 29) copies a tenant's schema from the
server it lives on to another one with ``pg_dump | pg_restore`` as a job of kind
``move_tenant``. Its row says what the tool owns while it runs and after: the copy on the
target (``moving``: the target's copy is the move's, dropped again by ``move --abort``), the
old copy on the source (``switched``: the directory names the target; the source's schema is
the move's to drop with ``move --finish``), and when the directory switched (the grace period
counts from it). ``source`` and ``target`` are server names; NULL is the control database, as
in ``control.tenants.server``. One row per tenant (its primary key): a new move of a tenant
starts only once the last one is ``finished`` or ``aborted``, so two moves of one tenant never
run at once, and its job history keeps the earlier moves. The application role has no
privilege here.

Revision ID: 20261203_h31move
Revises: 20261203_h31pool
Create Date: 2026-12-03
"""

from alembic import op

from provisioner.control_migrations.privileges import revoke_from_app_role

revision = "20261203_h31move"
down_revision = "20261203_h31pool"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.execute(
        """
        CREATE TABLE control.tenant_moves (
            tenant_id   TEXT PRIMARY KEY REFERENCES control.tenants (tenant_id),
            source      TEXT REFERENCES control.tenant_servers (name),
            target      TEXT REFERENCES control.tenant_servers (name),
            phase       TEXT NOT NULL DEFAULT 'moving'
                        CHECK (phase IN ('moving', 'switched', 'finished', 'aborted')),
            job_id      UUID,
            started_at  TIMESTAMPTZ NOT NULL DEFAULT now(),
            switched_at TIMESTAMPTZ,
            ended_at    TIMESTAMPTZ,
            CHECK (source IS DISTINCT FROM target)
        )
        """
    )
    revoke_from_app_role("ALL", "TABLE control.tenant_moves")


def downgrade() -> None:
    op.execute(
        """
        -- squawk-ignore ban-drop-table
        DROP TABLE control.tenant_moves
        """
    )
