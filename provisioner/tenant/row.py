"""The tenant's row in ``control.tenants`` and the guarded UPDATEs that move its lifecycle
state (authoritative; the states and the transitions' table are :mod:`provisioner.tenant.state`).

Each transition is one guarded UPDATE named as its :data:`~.state.TRANSITIONS` entry: it moves
the tenant only from the states it allows, and a tenant already in the target state is left
alone (a re-run step is a no-op).
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

import psycopg
from psycopg.rows import dict_row

from provisioner.errors import WrongState
from provisioner.models import TenantId
from provisioner.tenant.state import ONBOARDED, TenantState

Conn = psycopg.Connection[Any]

GET_TENANT = "SELECT * FROM control.tenants WHERE tenant_id = %(tenant_id)s"

# The state of each named tenant (every tenant when the names are NULL).
TENANT_STATES = """
SELECT tenant_id, state FROM control.tenants
 WHERE %(tenants)s::text[] IS NULL OR tenant_id = ANY(%(tenants)s)
"""

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


# onboarding/active -> suspended, remembering where it was.
SUSPEND = """
UPDATE control.tenants SET previous_state = state, state = 'suspended', updated_at = now()
 WHERE tenant_id = %(tenant_id)s AND state IN ('onboarding', 'active')
RETURNING state
"""

# onboarding/active/suspended -> archived; a suspended tenant keeps its earlier state.
ARCHIVE = """
UPDATE control.tenants
   SET previous_state = CASE WHEN state = 'suspended' THEN previous_state ELSE state END,
       state = 'archived', updated_at = now()
 WHERE tenant_id = %(tenant_id)s AND state IN ('onboarding', 'active', 'suspended')
RETURNING state
"""

# suspended/archived -> the state before suspension.
RESTORE = """
UPDATE control.tenants
   SET state = coalesce(previous_state, 'onboarding'), previous_state = NULL, updated_at = now()
 WHERE tenant_id = %(tenant_id)s AND state IN ('suspended', 'archived')
RETURNING state
"""

# any state but deleted -> deleted (purge); the row stays as the audit record.
DELETE = """
UPDATE control.tenants SET state = 'deleted', deleted_at = now(), updated_at = now()
 WHERE tenant_id = %(tenant_id)s AND state <> 'deleted'
RETURNING state
"""

# deleted -> pending: provision --reuse-deleted starts the tenant again from scratch.
REUSE_DELETED = """
UPDATE control.tenants
   SET state = 'pending', previous_state = NULL, onboarding_started_at = NULL,
       activated_at = NULL, updated_at = now(), schema_name = %(schema)s
 WHERE tenant_id = %(tenant_id)s AND state = 'deleted'
RETURNING state
"""


@dataclass(frozen=True)
class Tenant:
    tenant_id: str
    schema_name: str
    state: TenantState
    created_at: datetime
    onboarding_started_at: datetime | None
    #: the state before suspension or archival, which restore returns to
    previous_state: TenantState | None = None
    deleted_at: datetime | None = None
    updated_at: datetime | None = None
    #: the tenant server it lives on (None: the control database)
    server: str | None = None

    @classmethod
    def from_row(cls, row: dict[str, Any]) -> Tenant:
        return cls(
            tenant_id=row["tenant_id"],
            schema_name=row["schema_name"],
            state=TenantState(row["state"]),
            created_at=row["created_at"],
            onboarding_started_at=row["onboarding_started_at"],
            previous_state=_state_or_none(row.get("previous_state")),
            deleted_at=row.get("deleted_at"),
            updated_at=row.get("updated_at"),
            server=row.get("server"),
        )


def _state_or_none(value: str | None) -> TenantState | None:
    return None if value is None else TenantState(value)


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
        found is not None and found.state in ONBOARDED and found.onboarding_started_at is not None
    )


def transition(
    conn: Conn, tenant: TenantId, statement: str, target: tuple[TenantState, ...]
) -> TenantState:
    """Run one guarded transition; the new state. A tenant already in ``target`` stays there;
    any other state refuses with :class:`WrongState` (the step fails for good)."""
    with conn.cursor() as cur:
        cur.execute(statement, {"tenant_id": tenant.value})
        moved = cur.fetchone()
    if moved is not None:
        return TenantState(moved[0])
    found = get_tenant(conn, tenant)
    if found is None:
        raise WrongState(f"tenant {tenant} has no control row")
    if found.state in target:
        return found.state
    raise WrongState(f"tenant {tenant} is {found.state}: this transition does not apply")


def reuse_deleted(conn: Conn, tenant: TenantId) -> bool:
    """deleted -> pending; False when the tenant was not deleted."""
    with conn.cursor() as cur:
        # the schema it gets now (the naming may have changed since it was purged)
        cur.execute(REUSE_DELETED, {"tenant_id": tenant.value, "schema": tenant.schema})
        return cur.fetchone() is not None


def states_of(conn: Conn, tenants: list[TenantId] | None = None) -> dict[str, TenantState]:
    """Each named tenant's state (every tenant's for None), by tenant id; ids without a row are
    absent."""
    names = None if tenants is None else [t.value for t in tenants]
    with conn.cursor(row_factory=dict_row) as cur:
        cur.execute(TENANT_STATES, {"tenants": names})
        return {str(r["tenant_id"]): TenantState(r["state"]) for r in cur.fetchall()}


def state_of(conn: Conn, tenant: TenantId) -> TenantState | None:
    found = get_tenant(conn, tenant)
    return found.state if found else None


# Tenants for the fleet's lists and batches: the named ones and those in the named states.
SELECT_TENANTS = """
SELECT * FROM control.tenants
 WHERE tenant_id = ANY(%(tenants)s) OR state = ANY(%(states)s)
 ORDER BY tenant_id
"""


def select_tenants(
    conn: Conn, tenants: list[str] | None = None, states: list[TenantState] | None = None
) -> list[Tenant]:
    """The tenants named in ``tenants`` and those in one of ``states``, by tenant id."""
    params = {"tenants": tenants or [], "states": [s.value for s in states or []]}
    with conn.cursor(row_factory=dict_row) as cur:
        cur.execute(SELECT_TENANTS, params)
        return [Tenant.from_row(row) for row in cur.fetchall()]
