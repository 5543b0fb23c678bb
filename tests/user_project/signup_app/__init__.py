"""A tiny application built on provisioner, as a user would write it: sign a customer up (the
business write and the provisioning job in one transaction), then work inside its schema."""

from __future__ import annotations

from typing import Any

import psycopg
import sqlalchemy as sa
from sqlalchemy.orm import Session

import provisioner


def sign_up(session: Session, tenant_id: str, display_name: str) -> provisioner.Job:
    """Register the tenant under its name and queue its provisioning; the caller commits both or
    neither. (The application role may register a tenant, never change one: the owner's.)"""
    session.execute(
        sa.text(
            "INSERT INTO control.tenants (tenant_id, schema_name, display_name) "
            "VALUES (:id, :schema, :name) ON CONFLICT (tenant_id) DO NOTHING"
        ),
        {"id": tenant_id, "schema": f"tenant_{tenant_id}", "name": display_name},
    )
    return provisioner.enqueue(session, tenant_id)


async def sign_up_async(conn: psycopg.AsyncConnection[Any], tenant_id: str) -> provisioner.Job:
    """The same from an async request handler (FastAPI and friends)."""
    return await provisioner.enqueue_async(conn, tenant_id)


def add_dataset(conn: psycopg.Connection[Any], name: str) -> int:
    """A row in the tenant's own ``datasets`` table (``conn``'s search_path is the tenant)."""
    row = conn.execute("INSERT INTO datasets (name) VALUES (%s) RETURNING id", (name,)).fetchone()
    assert row is not None
    return int(row[0])


def dataset_names(conn: psycopg.Connection[Any]) -> list[str]:
    return [row[0] for row in conn.execute("SELECT name FROM datasets ORDER BY name")]
