"""A help desk's workspace: the second template's whole first schema.

Deliberately unlike the shipped example: enum types and a domain, a column of an extension's
type (citext, installed once per database in ``public``), composite primary and foreign keys,
a generated column, a range-partitioned table with a default partition, a view, trigger
functions (one pinned to the schema with ``SET search_path FROM CURRENT``, as PostgreSQL's docs
advise for functions that must not depend on their caller's path), row-level security
policies, and 30-odd tables.

Revision ID: s001
Revises:
Create Date: 2026-12-02
"""

from alembic import op

revision = "s001"
down_revision = None
branch_labels = None
depends_on = None

STATEMENTS = [
    # One copy per database, shared by every tenant; never dropped by a tenant's downgrade.
    "CREATE EXTENSION IF NOT EXISTS citext SCHEMA public",
    "CREATE TYPE ticket_status AS ENUM ('new', 'open', 'pending', 'solved', 'closed')",
    "CREATE TYPE priority AS ENUM ('low', 'normal', 'high', 'urgent')",
    "CREATE TYPE member_role AS ENUM ('owner', 'admin', 'agent', 'viewer')",
    "CREATE DOMAIN money_cents AS BIGINT CHECK (VALUE >= 0)",
    """
    CREATE TABLE accounts (
        id           BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
        email        public.citext NOT NULL UNIQUE,
        display_name TEXT NOT NULL,
        role         member_role NOT NULL DEFAULT 'agent',
        created_at   TIMESTAMPTZ NOT NULL DEFAULT now(),
        updated_at   TIMESTAMPTZ NOT NULL DEFAULT now()
    )
    """,
    """
    CREATE TABLE teams (
        id   BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
        name public.citext NOT NULL UNIQUE
    )
    """,
    """
    CREATE TABLE team_members (
        team_id    BIGINT NOT NULL REFERENCES teams (id) ON DELETE CASCADE,
        account_id BIGINT NOT NULL REFERENCES accounts (id) ON DELETE CASCADE,
        role       member_role NOT NULL DEFAULT 'agent',
        PRIMARY KEY (team_id, account_id)
    )
    """,
    """
    CREATE TABLE projects (
        team_id    BIGINT NOT NULL REFERENCES teams (id) ON DELETE CASCADE,
        project_no INT NOT NULL CHECK (project_no > 0),
        name       TEXT NOT NULL,
        PRIMARY KEY (team_id, project_no)
    )
    """,
    """
    CREATE TABLE tickets (
        id                  BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
        team_id             BIGINT NOT NULL,
        project_no          INT NOT NULL,
        status              ticket_status NOT NULL DEFAULT 'new',
        priority            priority NOT NULL DEFAULT 'normal',
        subject             TEXT NOT NULL,
        requester_id        BIGINT NOT NULL REFERENCES accounts (id),
        assignee_team_id    BIGINT,
        assignee_account_id BIGINT,
        created_at          TIMESTAMPTZ NOT NULL DEFAULT now(),
        updated_at          TIMESTAMPTZ NOT NULL DEFAULT now(),
        FOREIGN KEY (team_id, project_no) REFERENCES projects (team_id, project_no),
        FOREIGN KEY (assignee_team_id, assignee_account_id)
            REFERENCES team_members (team_id, account_id) ON DELETE SET NULL
    )
    """,
    "CREATE INDEX tickets_open_idx ON tickets (team_id, priority) WHERE status <> 'closed'",
    """
    CREATE TABLE ticket_comments (
        id         BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
        ticket_id  BIGINT NOT NULL REFERENCES tickets (id) ON DELETE CASCADE,
        author_id  BIGINT NOT NULL REFERENCES accounts (id),
        body       TEXT NOT NULL,
        internal   BOOLEAN NOT NULL DEFAULT false,
        created_at TIMESTAMPTZ NOT NULL DEFAULT now()
    )
    """,
    """
    CREATE TABLE labels (
        id    BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
        name  public.citext NOT NULL UNIQUE,
        color TEXT NOT NULL DEFAULT '#888888' CHECK (color ~ '^#[0-9a-f]{6}$')
    )
    """,
    """
    CREATE TABLE ticket_labels (
        ticket_id BIGINT NOT NULL REFERENCES tickets (id) ON DELETE CASCADE,
        label_id  BIGINT NOT NULL REFERENCES labels (id) ON DELETE CASCADE,
        PRIMARY KEY (ticket_id, label_id)
    )
    """,
    """
    CREATE TABLE attachments (
        id           BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
        ticket_id    BIGINT NOT NULL REFERENCES tickets (id) ON DELETE CASCADE,
        file_name    TEXT NOT NULL,
        byte_size    BIGINT NOT NULL CHECK (byte_size >= 0),
        content_type TEXT NOT NULL DEFAULT 'application/octet-stream'
    )
    """,
    """
    CREATE TABLE sla_policies (
        id                     BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
        priority               priority NOT NULL UNIQUE,
        first_response_minutes INT NOT NULL,
        resolve_minutes        INT NOT NULL
    )
    """,
    """
    CREATE TABLE ticket_sla (
        ticket_id     BIGINT PRIMARY KEY REFERENCES tickets (id) ON DELETE CASCADE,
        sla_policy_id BIGINT NOT NULL REFERENCES sla_policies (id),
        due_at        TIMESTAMPTZ NOT NULL
    )
    """,
    """
    CREATE TABLE customers (
        id    BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
        name  TEXT NOT NULL,
        email public.citext UNIQUE
    )
    """,
    """
    CREATE TABLE customer_contacts (
        customer_id BIGINT NOT NULL REFERENCES customers (id) ON DELETE CASCADE,
        contact_no  INT NOT NULL,
        email       public.citext NOT NULL,
        PRIMARY KEY (customer_id, contact_no)
    )
    """,
    """
    CREATE TABLE products (
        id    BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
        sku   public.citext NOT NULL UNIQUE,
        name  TEXT NOT NULL,
        price money_cents NOT NULL
    )
    """,
    """
    CREATE TABLE orders (
        id          BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
        customer_id BIGINT NOT NULL REFERENCES customers (id),
        placed_at   TIMESTAMPTZ NOT NULL DEFAULT now()
    )
    """,
    """
    CREATE TABLE order_lines (
        order_id    BIGINT NOT NULL REFERENCES orders (id) ON DELETE CASCADE,
        line_no     INT NOT NULL,
        product_id  BIGINT NOT NULL REFERENCES products (id),
        quantity    INT NOT NULL CHECK (quantity > 0),
        unit_cents  money_cents NOT NULL,
        total_cents BIGINT GENERATED ALWAYS AS (quantity * unit_cents) STORED,
        PRIMARY KEY (order_id, line_no)
    )
    """,
    """
    CREATE TABLE invoices (
        id           BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
        order_id     BIGINT NOT NULL UNIQUE REFERENCES orders (id),
        issued_at    TIMESTAMPTZ NOT NULL DEFAULT now(),
        amount_cents money_cents NOT NULL
    )
    """,
    """
    CREATE TABLE payments (
        id           BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
        invoice_id   BIGINT NOT NULL REFERENCES invoices (id),
        amount_cents money_cents NOT NULL,
        paid_at      TIMESTAMPTZ NOT NULL DEFAULT now()
    )
    """,
    """
    CREATE TABLE knowledge_articles (
        id        BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
        title     TEXT NOT NULL,
        body      TEXT NOT NULL DEFAULT '',
        published BOOLEAN NOT NULL DEFAULT false
    )
    """,
    """
    CREATE TABLE article_tags (
        article_id BIGINT NOT NULL REFERENCES knowledge_articles (id) ON DELETE CASCADE,
        tag        public.citext NOT NULL,
        PRIMARY KEY (article_id, tag)
    )
    """,
    """
    CREATE TABLE macros (
        id   BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
        name TEXT NOT NULL UNIQUE,
        body TEXT NOT NULL
    )
    """,
    """
    CREATE TABLE saved_views (
        id       BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
        owner_id BIGINT NOT NULL REFERENCES accounts (id) ON DELETE CASCADE,
        name     TEXT NOT NULL,
        filter   JSONB NOT NULL DEFAULT '{}'::jsonb,
        UNIQUE (owner_id, name)
    )
    """,
    """
    CREATE TABLE notifications (
        id         BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
        account_id BIGINT NOT NULL REFERENCES accounts (id) ON DELETE CASCADE,
        kind       TEXT NOT NULL,
        read_at    TIMESTAMPTZ
    )
    """,
    """
    CREATE TABLE webhooks (
        id  BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
        url TEXT NOT NULL CHECK (url LIKE 'https://%')
    )
    """,
    """
    CREATE TABLE webhook_deliveries (
        id           BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
        webhook_id   BIGINT NOT NULL REFERENCES webhooks (id) ON DELETE CASCADE,
        status_code  INT,
        delivered_at TIMESTAMPTZ
    )
    """,
    """
    CREATE TABLE audit_log (
        id         BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
        table_name TEXT NOT NULL,
        row_id     BIGINT NOT NULL,
        action     TEXT NOT NULL,
        at         TIMESTAMPTZ NOT NULL DEFAULT now()
    )
    """,
    """
    CREATE TABLE events (
        id          UUID NOT NULL DEFAULT gen_random_uuid(),
        occurred_at TIMESTAMPTZ NOT NULL,
        kind        TEXT NOT NULL,
        payload     JSONB NOT NULL DEFAULT '{}'::jsonb,
        PRIMARY KEY (id, occurred_at)
    ) PARTITION BY RANGE (occurred_at)
    """,
    """
    CREATE TABLE events_2026h1 PARTITION OF events
        FOR VALUES FROM ('2026-01-01 00:00+00') TO ('2026-07-01 00:00+00')
    """,
    """
    CREATE TABLE events_2026h2 PARTITION OF events
        FOR VALUES FROM ('2026-07-01 00:00+00') TO ('2027-01-01 00:00+00')
    """,
    "CREATE TABLE events_default PARTITION OF events DEFAULT",
    "CREATE INDEX events_kind_idx ON events (kind, occurred_at)",
    """
    CREATE TABLE settings (
        key   TEXT PRIMARY KEY,
        value JSONB NOT NULL
    )
    """,
    """
    CREATE TABLE business_hours (
        weekday SMALLINT PRIMARY KEY CHECK (weekday BETWEEN 1 AND 7),
        opens   TIME NOT NULL,
        closes  TIME NOT NULL,
        CHECK (opens < closes)
    )
    """,
    """
    CREATE TABLE holidays (
        day  DATE PRIMARY KEY,
        name TEXT NOT NULL
    )
    """,
    # -- a view the application reads ---------------------------------------------------------
    """
    CREATE VIEW open_tickets AS
    SELECT t.id, t.subject, t.status, t.priority, a.email AS requester
      FROM tickets t JOIN accounts a ON a.id = t.requester_id
     WHERE t.status IN ('new', 'open', 'pending')
    """,
    # -- functions and triggers -----------------------------------------------------------------
    """
    CREATE FUNCTION touch_updated_at() RETURNS trigger LANGUAGE plpgsql AS $$
    BEGIN
        NEW.updated_at := now();
        RETURN NEW;
    END
    $$
    """,
    """
    CREATE TRIGGER accounts_touch BEFORE UPDATE ON accounts
        FOR EACH ROW EXECUTE FUNCTION touch_updated_at()
    """,
    """
    CREATE TRIGGER tickets_touch BEFORE UPDATE ON tickets
        FOR EACH ROW EXECUTE FUNCTION touch_updated_at()
    """,
    # Pinned to this schema whatever the caller's search_path (the application's may not name
    # it): the name of the schema it was created in is stored with the function.
    """
    CREATE FUNCTION audit_ticket_change() RETURNS trigger LANGUAGE plpgsql
    SET search_path FROM CURRENT AS $$
    BEGIN
        INSERT INTO audit_log (table_name, row_id, action) VALUES (TG_TABLE_NAME, NEW.id, TG_OP);
        RETURN NEW;
    END
    $$
    """,
    """
    CREATE TRIGGER tickets_audit AFTER INSERT OR UPDATE ON tickets
        FOR EACH ROW EXECUTE FUNCTION audit_ticket_change()
    """,
    """
    CREATE FUNCTION ticket_age(t tickets) RETURNS interval LANGUAGE sql STABLE
    AS 'SELECT now() - t.created_at'
    """,
    # -- row-level security ---------------------------------------------------------------------
    # Internal comments only for a session that says it is an agent; the table's owner (the
    # provisioner, seeding) is not subject to the policies.
    "ALTER TABLE ticket_comments ENABLE ROW LEVEL SECURITY",
    """
    CREATE POLICY comments_visible ON ticket_comments FOR SELECT
        USING (NOT internal OR current_setting('app.agent', true) = 'on')
    """,
    "CREATE POLICY comments_insert ON ticket_comments FOR INSERT WITH CHECK (true)",
    "ALTER TABLE notifications ENABLE ROW LEVEL SECURITY",
    """
    CREATE POLICY notifications_own ON notifications
        USING (account_id = nullif(current_setting('app.account_id', true), '')::bigint)
    """,
]


def upgrade() -> None:
    for statement in STATEMENTS:
        op.execute(statement)


def downgrade() -> None:
    # Everything this revision made but the shared extension, dependants first.
    op.execute(
        "DROP VIEW open_tickets; DROP FUNCTION ticket_age(tickets); "
        "DROP TABLE events, holidays, business_hours, settings, "
        "audit_log, webhook_deliveries, webhooks, notifications, saved_views, macros, "
        "article_tags, knowledge_articles, payments, invoices, order_lines, orders, products, "
        "customer_contacts, customers, ticket_sla, sla_policies, attachments, ticket_labels, "
        "labels, ticket_comments, tickets, projects, team_members, teams, accounts; "
        "DROP FUNCTION touch_updated_at(), audit_ticket_change(); "
        "DROP DOMAIN money_cents; DROP TYPE member_role, priority, ticket_status"
    )
