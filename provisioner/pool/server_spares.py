"""The warm pool on tenant servers: spares built on each active server, taken there.

A spare's schema lives on the server its tenant will live on; its record stays in
``control.tenant_pool`` (control revision ``20261204_h32pool``: the ``server`` column), where
placement reads it: the enqueue's placement prefers, among the active servers with room, one
with a ready spare. The keeper keeps ``PROVISIONER_POOL_SIZE`` spares on each active server, as
on the control database (:func:`provisioner.pool.refill.refill` with ``on``), one builder per
server (the builders' lock is the server's own).

Placement counts only the spares a take would hand out: those at the tree state and role set
a live worker with the pool on reports in its heartbeat (:func:`takes_for`), a beat younger
than that worker's lease and written by the owner side (control revision ``20261206_h35beats``).

A take there spans two databases, so it is done in three commits (:func:`take_on_server`):

1. **claim**, on control: the oldest ready spare of the server is marked ``claimed_by`` the
   tenant (``FOR UPDATE SKIP LOCKED``: two takers never claim one spare). A tenant that
   already holds a claim (a run that died before step 2 committed, resumed) gets it again:
   never a second spare;
2. **rename**, on the server, in the ``create_schema`` step's transaction with its journal row
   and fence (:mod:`provisioner.engine.remote`): the spare becomes ``tenant_<id>``;
3. **forget**, on control, in the step's checkpoint (:func:`finish_take`): the claimed rows go.

With the pool off (``PROVISIONER_POOL_SIZE=0``) a provisioning there does none of the three
(:mod:`provisioner.kinds.placed`): no round trip to control's pool; a claim left by a run with
the pool on is then abandoned once its job is done (below).

A crash before 2 commits leaves the claim, which the resume reuses (pinned by
``tests/crash/test_server_pool_crash.py``, a SIGKILL between 1 and 2); between 2 and 3 the step is
in the server's journal, adopted on resume, whose checkpoint runs 3. The spare is taken once
and its record goes once (pinned by ``tests/crash/test_server_pool_crash.py``). A claim left
by a tenant with no provisioning job queued or running any more is useless: the keeper drops
its spare (by its spare name only: a renamed spare is the tenant's and is never touched).
"""

from __future__ import annotations

from typing import Any

import psycopg
from psycopg.rows import dict_row, tuple_row

from provisioner import db
from provisioner.db import Transaction
from provisioner.models import TenantId
from provisioner.pool.server_schemas import FORGET_SERVER_SPARE, OnServer, drop_server_schema
from provisioner.pool.spares import PoolCounts, Taken, rename_spare, roles_key
from provisioner.roles import AppRoles
from provisioner.servers.directory import TenantServer
from provisioner.templates import migrations

# The active tenant servers, which the keeper keeps spares on.
ACTIVE_SERVERS = "SELECT * FROM control.tenant_servers WHERE status = 'active' ORDER BY name"

# A claim whose tenant has no provisioning run left to finish it.
_ABANDONED = """p.claimed_by IS NOT NULL AND NOT EXISTS (
    SELECT 1 FROM control.platform_jobs j
     WHERE j.tenant_id = p.claimed_by AND j.status IN ('queued', 'running'))"""
_USABLE = "p.tree_digest = %(digest)s AND p.app_roles IN (%(roles)s, '')"

# Names recorded on the server with no ready row: builds under way, or left by a dead build.
UNFINISHED_SERVER_SPARES = """
SELECT s.schema_name FROM control.tenant_pool_schemas s
 WHERE s.server = %(server)s
   AND NOT EXISTS (SELECT 1 FROM control.tenant_pool p WHERE p.schema_name = s.schema_name)
 ORDER BY s.created_at
"""

# The server's spares: ready (unclaimed, at the tree state and role set), stale (unclaimed at
# another, or claimed and abandoned) and unfinished. A claimed spare is being taken: neither.
COUNT_SERVER_SPARES = f"""
SELECT count(*) FILTER (WHERE p.claimed_by IS NULL AND {_USABLE}) AS ready,
       count(*) FILTER (WHERE (p.claimed_by IS NULL AND NOT ({_USABLE})) OR ({_ABANDONED}))
         AS stale,
       (SELECT count(*) FROM ({UNFINISHED_SERVER_SPARES}) u) AS unfinished
  FROM control.tenant_pool p WHERE p.server = %(server)s
"""

# The server's useless spares (see COUNT_SERVER_SPARES), to drop.
STALE_SERVER_SPARES = f"""
SELECT p.schema_name FROM control.tenant_pool p
 WHERE p.server = %(server)s
   AND ((p.claimed_by IS NULL AND NOT ({_USABLE})) OR ({_ABANDONED}))
 ORDER BY p.created_at
"""

# Step 1 of a take: the tenant's own claim on the server if it holds one, else the oldest ready
# spare there, claimed for it.
CLAIM_SERVER_SPARE = f"""
UPDATE control.tenant_pool SET claimed_by = %(tenant)s
 WHERE schema_name = (
       SELECT p.schema_name FROM control.tenant_pool p
        WHERE p.server = %(server)s
          AND (p.claimed_by = %(tenant)s OR (p.claimed_by IS NULL AND {_USABLE}))
        ORDER BY p.claimed_by IS NULL, p.created_at
        LIMIT 1
          FOR UPDATE SKIP LOCKED)
RETURNING schema_name
"""

# A claim given back: the tenant's schema exists on the server already (nothing to rename).
RELEASE_CLAIM = """
UPDATE control.tenant_pool SET claimed_by = NULL
 WHERE schema_name = %(schema)s AND claimed_by = %(tenant)s
"""

# On the server, before the rename: is the claimed spare there, is the tenant's schema.
ON_SERVER = """
SELECT EXISTS (SELECT 1 FROM pg_namespace WHERE nspname = %(spare)s),
       EXISTS (SELECT 1 FROM pg_namespace WHERE nspname = %(tenant)s)
"""

# Step 3: the tenant's claimed spares are its schema now; their records go. Safe to run again.
FINISH_TAKE = """
WITH taken AS (
    DELETE FROM control.tenant_pool WHERE claimed_by = %(tenant)s RETURNING schema_name)
DELETE FROM control.tenant_pool_schemas s USING taken WHERE s.schema_name = taken.schema_name
"""


def active_servers(conn: Any) -> list[TenantServer]:
    with conn.cursor(row_factory=dict_row) as cur:
        cur.execute(ACTIVE_SERVERS)
        return [TenantServer.from_row(row) for row in cur.fetchall()]


def server_counts(conn: Any, server: str, app_roles: AppRoles | None = None) -> PoolCounts:
    """The spares of ``server`` (read on control): ready, stale, unfinished."""
    with conn.cursor(row_factory=dict_row) as cur:
        cur.execute(COUNT_SERVER_SPARES, _params(server, app_roles))
        row = cur.fetchone()
    assert row is not None
    return PoolCounts(
        ready=int(row["ready"]), stale=int(row["stale"]), unfinished=int(row["unfinished"])
    )


def _params(server: str, app_roles: AppRoles | None) -> dict[str, Any]:
    return {"server": server, **takes_for(app_roles)}


def takes_for(app_roles: AppRoles | None, alive_seconds: float | None = None) -> dict[str, Any]:
    """What this worker's takes hand out (the tree state on disk and the role set a spare must
    have been built for, :data:`_USABLE`), for its heartbeat's ``pool`` entry: placement
    (control revision ``20261205_h33spares``) prefers a server for its spares only when they
    match what a live worker with the pool on would take (a stale spare, or any spare while
    no worker runs a pool, makes no server preferred). ``alive_seconds``: how long the beat
    stays believed (the worker's lease, three intervals; revision ``20261206_h35beats``, which
    also believes only a beat written by the owner side)."""
    takes: dict[str, Any] = {
        "digest": migrations.tenant_tree_state().digest,
        "roles": roles_key(app_roles),
    }
    if alive_seconds is not None:
        takes["alive_seconds"] = alive_seconds
    return takes


def drop_unfinished_on(control: db.Session, on: OnServer) -> list[str]:
    """Drop the server's recorded schemas that hold no ready spare (the caller holds the
    server's builders' lock: each was left by a build whose process died); those dropped."""
    with control.transaction() as tx:
        names = [str(r[0]) for r in tx.pg.execute(UNFINISHED_SERVER_SPARES, {"server": on.name})]
    return [name for name in names if drop_server_schema(control, on, name)]


def drop_stale_on(control: db.Session, on: OnServer, app_roles: AppRoles | None) -> list[str]:
    """Drop the server's useless spares (another tree state or role set, or an abandoned
    claim), under its builders' lock; those whose schema was dropped."""
    with control.transaction() as tx:
        params = _params(on.name, app_roles)
        names = [str(r[0]) for r in tx.pg.execute(STALE_SERVER_SPARES, params)]
    dropped = []
    for name in names:
        if drop_server_schema(control, on, name):
            dropped.append(name)
    return dropped


def take_on_server(
    tx: Transaction,
    control: psycopg.Connection[Any],
    server: str,
    tenant: TenantId,
    app_roles: AppRoles,
) -> Taken | None:
    """Steps 1 and 2 of a take (see the module): claim a ready spare of ``server`` on control
    (``control``: an autocommit session, the claim one statement committed by itself: one
    round trip, and none more than before when the server has no spare), then rename it to the
    tenant's schema in ``tx``, the server's step transaction. None when no spare is ready
    there; a claimed spare whose schema is gone is forgotten, and one claimed while the
    tenant's schema already exists is given back."""
    assert control.autocommit, "the claim commits on its own"
    with db.translated(), control.cursor(row_factory=tuple_row) as cur:
        params = {**_params(server, app_roles), "tenant": tenant.value}
        cur.execute(CLAIM_SERVER_SPARE, params)
        claimed = cur.fetchone()
    if claimed is None:
        return None
    spare = str(claimed[0])
    with tx.pg.cursor() as cur:
        cur.execute(ON_SERVER, {"spare": spare, "tenant": tenant.schema})
        there = cur.fetchone()
    assert there is not None
    if bool(there[0]) and not bool(there[1]):
        return rename_spare(tx, spare, tenant.schema, app_roles)
    with db.translated():
        if there[0]:
            control.execute(RELEASE_CLAIM, {"schema": spare, "tenant": tenant.value})
        else:
            control.execute(FORGET_SERVER_SPARE, {"schema": spare})
    return None


def finish_take(conn: Any, tenant: TenantId) -> None:
    """Step 3 (see the module), in the checkpoint's transaction on control."""
    conn.execute(FINISH_TAKE, {"tenant": tenant.value})
