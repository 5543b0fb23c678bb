"""Due dates and watchers: the template's second release (a fleet upgrade adds this file to the
tree; kept out of it until then).

An enum value, a nullable column and its index, a table with a composite foreign key, and the
view replaced with one more column, written as Alembic's docs show.

Revision ID: s002
Revises: s001
Create Date: 2026-12-02
"""

import sqlalchemy as sa
from alembic import op

revision = "s002"
down_revision = "s001"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.execute("ALTER TYPE ticket_status ADD VALUE IF NOT EXISTS 'on_hold' AFTER 'pending'")
    op.add_column("tickets", sa.Column("due_on", sa.Date(), nullable=True))
    op.create_index("tickets_due_on_idx", "tickets", ["due_on"])
    op.execute(
        """
        CREATE TABLE ticket_watchers (
            ticket_id  BIGINT NOT NULL REFERENCES tickets (id) ON DELETE CASCADE,
            team_id    BIGINT NOT NULL,
            account_id BIGINT NOT NULL,
            PRIMARY KEY (ticket_id, team_id, account_id),
            FOREIGN KEY (team_id, account_id) REFERENCES team_members (team_id, account_id)
                ON DELETE CASCADE
        )
        """
    )
    op.execute(
        """
        CREATE OR REPLACE VIEW open_tickets AS
        SELECT t.id, t.subject, t.status, t.priority, a.email AS requester, t.due_on
          FROM tickets t JOIN accounts a ON a.id = t.requester_id
         WHERE t.status IN ('new', 'open', 'pending')
        """
    )


def downgrade() -> None:
    # A view loses a column only by being made again (its grants with it); the enum keeps its
    # value (PostgreSQL cannot drop one).
    op.execute("DROP VIEW open_tickets")
    op.execute(
        """
        CREATE VIEW open_tickets AS
        SELECT t.id, t.subject, t.status, t.priority, a.email AS requester
          FROM tickets t JOIN accounts a ON a.id = t.requester_id
         WHERE t.status IN ('new', 'open', 'pending')
        """
    )
    op.drop_table("ticket_watchers")
    op.drop_index("tickets_due_on_idx", table_name="tickets")
    op.drop_column("tickets", "due_on")
