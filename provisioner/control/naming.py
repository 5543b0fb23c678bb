"""The tenant naming the control database records (``control.tenant_naming``, control revision
20261202_h24names): what ``provisioner migrate`` writes, and what a worker checks at start.

The record serves two ends. The database holds the application role to it: the role registers
a tenant only with the schema name the recorded pattern gives its id (policy
``app_registers_tenants``). And every process of one control database names schemas the same
way: a worker configured with another rule refuses to start, and a change of rule under
tenants it would no longer name (or whose ids it would refuse) is refused by ``migrate``,
naming one such tenant; nothing is written then.
"""

from __future__ import annotations

from typing import Any

import psycopg
from psycopg.rows import tuple_row

from provisioner.errors import ConfigurationError
from provisioner.naming import TenantNaming

# The recorded naming (no row: the default, tenant_{id}).
RECORDED = """
SELECT schema_pattern, tenant_id_pattern, tenant_id_max_length FROM control.tenant_naming
"""

# Record the project's naming (one row).
RECORD = """
INSERT INTO control.tenant_naming (schema_pattern, tenant_id_pattern, tenant_id_max_length)
VALUES (%(schema_pattern)s, %(tenant_id_pattern)s, %(tenant_id_max_length)s)
ON CONFLICT (only_row) DO UPDATE
   SET schema_pattern = EXCLUDED.schema_pattern, tenant_id_pattern = EXCLUDED.tenant_id_pattern,
       tenant_id_max_length = EXCLUDED.tenant_id_max_length, recorded_at = now()
"""

# Every tenant that still has (or will have) a schema, with the schema name it was given; the
# table is locked against new registrations while a new rule is checked and recorded.
LIVE_TENANTS = """
SELECT tenant_id, schema_name FROM control.tenants WHERE state <> 'deleted' ORDER BY tenant_id
"""
LOCK_TENANTS = "LOCK TABLE control.tenants IN SHARE ROW EXCLUSIVE MODE"


def recorded(conn: psycopg.Connection[Any]) -> TenantNaming:
    """The naming the control database records (the default when none was)."""
    with conn.cursor(row_factory=tuple_row) as cur:
        row = cur.execute(RECORDED).fetchone()
    return TenantNaming(row[0], row[1], int(row[2])) if row else TenantNaming()


def record(conn: psycopg.Connection[Any], naming: TenantNaming) -> bool:
    """Record ``naming`` in the caller's transaction (True: it changed). Refused, with nothing
    written, when a tenant that is not deleted has an id the rule refuses or a schema the
    pattern does not give it."""
    with conn.cursor(row_factory=tuple_row) as cur:
        row = cur.execute(RECORDED).fetchone()
        if row and TenantNaming(row[0], row[1], int(row[2])) == naming:
            return False
        cur.execute(LOCK_TENANTS)
        for tenant_id, schema_name in cur.execute(LIVE_TENANTS):
            if naming.problem(tenant_id) is not None or naming.schema(tenant_id) != schema_name:
                raise ConfigurationError(
                    f"tenant {str(tenant_id)[:48]} lives in schema {str(schema_name)[:63]}, "
                    f"which schema pattern {naming.schema_pattern!r} and the tenant-id rule do "
                    "not give it: the naming cannot change under existing tenants (nothing "
                    "was recorded)"
                )
        cur.execute(RECORD, naming.describe())
    return True


def send_read(conn: psycopg.Connection[Any]) -> psycopg.Cursor[Any]:
    """The recorded naming's statement sent (for a pipeline); :func:`finish_check` reads it."""
    cur = conn.cursor(row_factory=tuple_row)
    cur.execute(RECORDED)
    return cur


def finish_check(cur: psycopg.Cursor[Any], naming: TenantNaming) -> None:
    """:func:`check` on the row :func:`send_read` asked for."""
    with cur:
        row = cur.fetchone()
    _refuse_other(TenantNaming(row[0], row[1], int(row[2])) if row else TenantNaming(), naming)


def check(conn: psycopg.Connection[Any], naming: TenantNaming) -> None:
    """Refuse a process whose naming differs from the one the control database records."""
    _refuse_other(recorded(conn), naming)


def _refuse_other(found: TenantNaming, naming: TenantNaming) -> None:
    if found != naming:
        raise ConfigurationError(
            f"the control database names tenant schemas {found.schema_pattern!r} (ids "
            f"{found.id_pattern!r}, at most {found.max_length}); this configuration says "
            f"{naming.schema_pattern!r} (ids {naming.id_pattern!r}, at most "
            f"{naming.max_length}): use the project's settings, or run `provisioner migrate` "
            "with the new ones"
        )
