"""The tenant's row in ``control.tenants`` and its lifecycle state."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

import psycopg
from psycopg.rows import dict_row

from provisioner.models import TenantId

Conn = psycopg.Connection[Any]

# States in which onboarding has begun; activation never moves a tenant backwards.
ONBOARDED_STATES = ("onboarding", "active", "suspended", "archived")

GET_TENANT = "SELECT * FROM control.tenants WHERE tenant_id = %(tenant_id)s"

# pending -> provisioning, when the first step of a tenant's provisioning commits.
MARK_PROVISIONING = """
UPDATE control.tenants SET state = 'provisioning', updated_at = now()
 WHERE tenant_id = %(tenant_id)s AND state = 'pending'
"""

# -> onboarding, stamped once.
ACTIVATE_ONBOARDING = """
UPDATE control.tenants
   SET state = 'onboarding', onboarding_started_at = coalesce(onboarding_started_at, now()),
       updated_at = now()
 WHERE tenant_id = %(tenant_id)s AND state IN ('pending', 'provisioning')
"""


@dataclass(frozen=True)
class Tenant:
    tenant_id: str
    schema_name: str
    state: str
    created_at: datetime
    onboarding_started_at: datetime | None

    @classmethod
    def from_row(cls, row: dict[str, Any]) -> Tenant:
        return cls(
            tenant_id=row["tenant_id"],
            schema_name=row["schema_name"],
            state=row["state"],
            created_at=row["created_at"],
            onboarding_started_at=row["onboarding_started_at"],
        )


def get_tenant(conn: Conn, tenant: TenantId) -> Tenant | None:
    with conn.cursor(row_factory=dict_row) as cur:
        cur.execute(GET_TENANT, {"tenant_id": tenant.value})
        row = cur.fetchone()
    return Tenant.from_row(row) if row else None


def mark_provisioning(conn: Conn, tenant: TenantId) -> None:
    with conn.cursor() as cur:
        cur.execute(MARK_PROVISIONING, {"tenant_id": tenant.value})


def activate_onboarding(conn: Conn, tenant: TenantId) -> None:
    with conn.cursor() as cur:
        cur.execute(ACTIVATE_ONBOARDING, {"tenant_id": tenant.value})


def onboarding_active(conn: Conn, tenant: TenantId) -> bool:
    found = get_tenant(conn, tenant)
    return (
        found is not None
        and found.state in ONBOARDED_STATES
        and found.onboarding_started_at is not None
    )
