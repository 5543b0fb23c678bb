"""The second template's Python seed (``second_seeds:seed_workspace``): the workspace's owner,
its first team and project, and a welcome ticket, named after the tenant.

Idempotent, as every seed must be: a re-run finds the rows and adds nothing. The ticket's
insert fires the template's triggers (its audit row comes from ``audit_ticket_change``).
"""

from __future__ import annotations

from typing import Any

import psycopg

from provisioner.models import TenantId


def seed_workspace(conn: psycopg.Connection[Any], tenant: TenantId) -> None:
    email = f"owner@{tenant.value}.example"
    conn.execute(
        "INSERT INTO accounts (email, display_name, role) VALUES (%s, 'Owner', 'owner') "
        "ON CONFLICT (email) DO NOTHING",
        (email,),
    )
    conn.execute("INSERT INTO teams (name) VALUES ('Support') ON CONFLICT (name) DO NOTHING")
    conn.execute(
        "INSERT INTO team_members (team_id, account_id, role) "
        "SELECT t.id, a.id, 'owner' FROM teams t, accounts a "
        "WHERE t.name = 'Support' AND a.email = %s ON CONFLICT DO NOTHING",
        (email,),
    )
    conn.execute(
        "INSERT INTO projects (team_id, project_no, name) "
        "SELECT id, 1, 'Inbox' FROM teams WHERE name = 'Support' ON CONFLICT DO NOTHING"
    )
    conn.execute(
        "INSERT INTO tickets (team_id, project_no, subject, requester_id) "
        "SELECT t.id, 1, 'Welcome to your help desk', a.id FROM teams t, accounts a "
        "WHERE t.name = 'Support' AND a.email = %s "
        "AND NOT EXISTS (SELECT 1 FROM tickets WHERE subject = 'Welcome to your help desk')",
        (email,),
    )
