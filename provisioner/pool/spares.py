"""The warm pool's spares: what a spare is, its statements, and its take by a rename.

With ``PROVISIONER_POOL_SIZE=N`` the worker keeps N spares (:mod:`provisioner.pool.keeper`),
built while it is otherwise idle (:mod:`provisioner.pool.build`: the verified replay of
:mod:`provisioner.templates.reference`, in batches). A spare is ready only once its row in
``control.tenant_pool`` is committed, in the build's last transaction, after every check. This
module holds the statements on the pool's control tables for the control database's spares (the
build's record among them; a tenant server's are :mod:`provisioner.pool.server_spares`'), the
take, the counts and the drop.

A spare is invisible to the application and to users until it is taken:

* its name is ``pool_<hex>``, never ``tenant_<id>``, and ``app_rw`` has no USAGE on it: any
  access is refused (``permission denied for schema``). Its tables and sequences already carry
  ``app_rw``'s grants, and the schema its default privileges
  (:func:`provisioner.pool.grants.spare_grant_batches`), so that a take only grants USAGE (with
  its rename) and checks the ACLs instead of naming every table, whatever the template's size.
  Without USAGE the role cannot look up anything in the schema, so those grants give it nothing
  until the take; the build checks that it holds neither USAGE nor CREATE there;
* it has no job and no tenant row, so ``jobs list``, ``status`` and ``upgrade --all`` never see
  it; only the worker's heartbeat (and so ``health --json``) reports the pool.

The ``create_schema`` step takes one (:func:`take`): in the step's transaction it deletes the
oldest spare row built for the tree state on disk (``FOR UPDATE SKIP LOCKED``: two takers never
get one spare), reads the spare's grants, and renames the schema to ``tenant_<id>`` and grants
USAGE on it in one statement; the job's later steps then join that transaction (the
provisioning kind's ``SpareMemo``, ``RunMemo.one_transaction``), each with its own record, and
the grant step checks what the take found. A crash or a failed step before the commit leaves
the spare (row and schema); after it, the tenant (pinned by ``tests/crash/test_pool_crash.py``).
A spare built for another tree state (the template's head changed, or its files) or another
set of application roles (its row records them, :func:`roles_key`: a role added, removed or
given another privilege set) is never handed out: the keeper drops it, says why
(``pool_spare_dropped``), and builds a new one. The tenant naming is not recorded: nothing in a
spare depends on it (the replay is schema-less, the take renames the spare to the schema the
configured naming gives and re-points any pinned ``search_path``; pinned by
``tests/integration/test_role_set_changes.py::
test_a_spare_built_under_one_naming_is_taken_under_another``). When no spare is ready the step
creates an empty schema as it always did.

Every schema created, renamed or granted on makes PostgreSQL drop all cached plans of every
session of the database, so the take reads the spare's grants before its rename, with plans
prepared after each build (:func:`plan_take`, pinned by
``tests/integration/test_pool.py::test_a_take_binds_the_plans_made_before_it``), and renames
and grants in one statement (one reset, not two).
"""

from __future__ import annotations

import secrets
from dataclasses import dataclass
from typing import Any

from psycopg import sql
from psycopg.rows import dict_row

from provisioner import naming, roles
from provisioner.db import Transaction
from provisioner.db.plans import PlanAhead, keeping_prepared_statements, prepare_ahead
from provisioner.errors import PermanentError
from provisioner.pool.grants import GRANTS_HELD, GrantsHeld, grants_held, take_grants
from provisioner.roles import AppRoles
from provisioner.templates import migrations
from provisioner.tenant import schema as tenant_schema

#: Spare schemas are ``pool_`` and 16 hex digits: never a tenant's, under any naming rule.
SPARE_PREFIX = naming.SPARE_PREFIX

# -- statements ---------------------------------------------------------------------------------

# Take the oldest spare of this tree state and role set (or built without grants) whose schema
# exists, unless the tenant's schema already does (a resume): its rows go (the ready row and the
# record of the schema, which is about to become the tenant's), the caller renames the schema
# in the same transaction.
TAKE_SPARE = """
WITH taken AS (
    DELETE FROM control.tenant_pool
     WHERE schema_name = (
           SELECT p.schema_name FROM control.tenant_pool p
            WHERE p.server IS NULL
              AND p.tree_digest = %(digest)s AND p.app_roles IN (%(roles)s, '')
              AND EXISTS (SELECT 1 FROM pg_namespace n WHERE n.nspname = p.schema_name)
              AND NOT EXISTS (SELECT 1 FROM pg_namespace n WHERE n.nspname = %(tenant)s)
            ORDER BY p.created_at
            LIMIT 1
              FOR UPDATE SKIP LOCKED)
    RETURNING schema_name)
DELETE FROM control.tenant_pool_schemas s USING taken WHERE s.schema_name = taken.schema_name
RETURNING s.schema_name
"""

# Forget a schema the pool recorded, and say whether the schema is there and still owned by
# the connected role (only then does the caller drop it).
FORGET_SPARE_SCHEMA = """
DELETE FROM control.tenant_pool_schemas s WHERE s.schema_name = %(schema)s
RETURNING EXISTS (SELECT 1 FROM pg_namespace n
                   WHERE n.nspname = s.schema_name
                     AND n.nspowner = (SELECT oid FROM pg_roles WHERE rolname = current_user))
          AS ours
"""

# Record a spare built (and verified) in the same transaction, with the roles it was granted for
# (composed with literals: the last batch's commit begins its transaction with it).
ADD_SPARE = """
INSERT INTO control.tenant_pool (schema_name, tree_digest, heads, created_by, app_roles, server)
VALUES ({schema}, {digest}, {heads}, {created_by}, {roles}, {server})
"""

# (Spares on tenant servers, ``server`` not NULL, are :mod:`provisioner.pool.server_spares`'.)

# Schemas the pool recorded that hold no ready spare: being built, or left by a build whose
# process died (dropped by the next builder, under the builders' lock).
UNFINISHED_SPARES = """
SELECT s.schema_name FROM control.tenant_pool_schemas s
 WHERE s.server IS NULL
   AND NOT EXISTS (SELECT 1 FROM control.tenant_pool p WHERE p.schema_name = s.schema_name)
 ORDER BY s.created_at
"""

# Schemas named like spares that are not the pool's: never recorded by a builder, or no longer
# owned by the connected role. Reported, never dropped. The names 'pool_' <= n < 'pool`' (the
# character after '_') are those starting with 'pool_', as a range of pg_namespace's name
# index: the keeper looks every half second, in a catalog that holds a schema per tenant.
FOREIGN_SCHEMAS = """
SELECT n.nspname AS schema_name, pg_get_userbyid(n.nspowner) AS owner FROM pg_namespace n
 WHERE n.nspname >= 'pool_' AND n.nspname < 'pool`'
   AND (n.nspowner <> (SELECT oid FROM pg_roles WHERE rolname = current_user)
        OR NOT EXISTS (SELECT 1 FROM control.tenant_pool_schemas s
                        WHERE s.schema_name = n.nspname))
 ORDER BY n.nspname
"""

# Spares ready for this tree state and role set, the useless ones (built for another tree state
# or role set, or whose schema is gone: dropped by hand), and the unfinished ones.
COUNT_SPARES = f"""
SELECT count(*) FILTER (WHERE usable) AS ready, count(*) FILTER (WHERE NOT usable) AS stale,
       (SELECT count(*) FROM ({UNFINISHED_SPARES}) u) AS unfinished,
       ARRAY(SELECT f.schema_name FROM ({FOREIGN_SCHEMAS}) f) AS foreign_schemas
  FROM (SELECT tree_digest = %(digest)s AND app_roles IN (%(roles)s, '')
               AND EXISTS (SELECT 1 FROM pg_namespace n WHERE n.nspname = p.schema_name) AS usable
          FROM control.tenant_pool p WHERE p.server IS NULL) s
"""

# One useless spare, to drop (with its schema, if any) in the same transaction; what it was
# built for, to say why.
CLAIM_STALE_SPARE = """
DELETE FROM control.tenant_pool
 WHERE schema_name = (
       SELECT p.schema_name FROM control.tenant_pool p
        WHERE p.server IS NULL
          AND (p.tree_digest <> %(digest)s OR p.app_roles NOT IN (%(roles)s, '')
               OR NOT EXISTS (SELECT 1 FROM pg_namespace n WHERE n.nspname = p.schema_name))
        ORDER BY p.created_at LIMIT 1 FOR UPDATE SKIP LOCKED)
RETURNING schema_name, tree_digest = %(digest)s AS same_tree, app_roles
"""


#: What a take reads, for the idle sessions' warm-up after a build (with the queue's own).
WARM_TOUCHES: tuple[str, ...] = ("SELECT 1 FROM control.tenant_pool WHERE schema_name IS NULL",)

#: A take's statements before its rename, planned ahead on the steps' idle session after a
#: spare build (:func:`plan_take`): parameters that match nothing.
TAKE_PLANS: tuple[PlanAhead, ...] = (
    (TAKE_SPARE, {"digest": "", "roles": "", "tenant": ""}),
    *((query, {"schema": "", "role": ""}) for query in GRANTS_HELD.values()),
)


@dataclass(frozen=True)
class PoolCounts:
    #: spares at the tree state on disk, for the configured roles: what provisioning can take
    ready: int
    #: spares at another tree state or role set: never handed out, rebuilt by the keeper
    stale: int
    #: schemas the pool recorded with no ready row: being built, or left by a build that died
    #: (dropped by the next builder)
    unfinished: int = 0
    #: schemas named ``pool_*`` that the pool did not record or does not own: reported, left
    #: alone, never handed out
    foreign: tuple[str, ...] = ()


# -- operations ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class Taken:
    """A spare renamed to a tenant's schema by :func:`take`."""

    spare: str
    #: each application role's grants in the spare (in the roles' order), read before the
    #: rename: every schema change makes each session of the database plan its statements
    #: again (PostgreSQL resets all cached plans when ``pg_namespace`` changes), so the check
    #: costs a planning of its catalog query after the rename (about 1 ms), and nothing before
    grants: tuple[GrantsHeld, ...]

    @property
    def all_but_usage(self) -> bool:
        """Every role's grants were in place but USAGE (:attr:`GrantsHeld.all_but_usage`)."""
        return all(held.all_but_usage for held in self.grants)

    @property
    def detail(self) -> str:
        return f"taken from the warm pool: {self.spare}"


def take(tx: Transaction, tenant_schema_name: str, app_roles: AppRoles) -> Taken | None:
    """Rename a ready spare to the tenant's schema in ``tx`` and grant each of ``app_roles``
    USAGE on it and its set's privileges on its sequences (the job's later steps join this
    transaction: nothing is visible before they all commit); None when no spare is ready (or
    the tenant's schema already exists)."""
    digest = migrations.tenant_tree_state().digest
    with tx.pg.cursor() as cur:
        cur.execute(
            TAKE_SPARE,
            {"digest": digest, "roles": roles_key(app_roles), "tenant": tenant_schema_name},
        )
        row = cur.fetchone()
    if row is None:
        return None
    return rename_spare(tx, str(row[0]), tenant_schema_name, app_roles)


def rename_spare(
    tx: Transaction, spare: str, tenant_schema_name: str, app_roles: AppRoles
) -> Taken:
    """The take's work on the spare's own database once the spare is the caller's (its row
    deleted in ``tx``, or claimed on control for a tenant server): read its grants, then
    rename it to the tenant's schema and grant USAGE in one round trip (see :func:`take`)."""
    with tx.pg.cursor() as cur:
        found = [grants_held(tx.pg, spare, role) for role in app_roles]
        grants = tuple(held for held in found if held is not None)
        assert len(grants) == len(app_roles)  # the take found the schema, and holds its row
        # The rename, the application role's grants that a spare lacks (USAGE; the sequences,
        # named under the tenant's schema) and the catalog's view of the result in one round
        # trip (simple query). Each change of the schema's catalog row makes every session plan
        # its statements again: made together, they cost one such reset, not two. The rename
        # touches only this schema, which no prepared statement of the session names: the
        # queue's statements stay prepared (see keeping_prepared_statements).
        changes = [
            sql.SQL("ALTER SCHEMA {} RENAME TO {}").format(
                sql.Identifier(spare), sql.Identifier(tenant_schema_name)
            ),
            *take_grants(tenant_schema_name, app_roles, grants[0].sequences),
            *(
                [tenant_schema.repin_search_path(spare, tenant_schema_name)]
                if grants[0].pinned_functions
                else []
            ),
        ]
        with keeping_prepared_statements(tx.pg):
            cur.execute(
                sql.SQL("; ").join(
                    [
                        *changes,
                        sql.SQL(
                            "SELECT (SELECT pg_get_userbyid(nspowner) FROM pg_namespace"
                            " WHERE nspname = {}), current_user"
                        ).format(sql.Literal(tenant_schema_name)),
                    ]
                )
            )
        for _ in changes:  # past each change's empty result, to the SELECT's row
            cur.nextset()
        checked = cur.fetchone()
    assert checked is not None
    owner, me = checked[0], checked[1]
    if owner != me:  # as create_schema checks: the catalog must show the schema as ours
        raise PermanentError(
            f"spare {spare} is owned by role {owner}, not {me}; drop it from control.tenant_pool"
        )
    return Taken(spare, grants)


def plan_take(conn: Any) -> None:
    """Run the take's statements that come before its rename (:data:`TAKE_PLANS`), prepared,
    with values that match nothing (they take and change nothing), on a session that keeps
    generic plans (the engine's steps session): the next take binds their plans as they are.
    Every schema change resets each session's plans (a build's too), so this runs after each
    build; the rename resets them again, so what comes after it is planned at the take."""
    prepare_ahead(conn, TAKE_PLANS)


def roles_key(app_roles: AppRoles | None) -> str:
    """What a spare's row records of the application roles it was granted for
    (:func:`provisioner.roles.identity`), ``''`` when built without grants: such a spare suits
    any role set (the grant step grants it in full at the take); one built for another set is
    never handed out (its grants are the old set's: a removed role's, a readonly role's
    readwrite ones) and the keeper drops it."""
    return "" if app_roles is None else roles.identity(app_roles)


def counts(conn: Any, app_roles: AppRoles | None = None) -> PoolCounts:
    """How many spares are ready for the tree on disk and ``app_roles`` (the roles a take
    grants; None: spares without grants only), and how many are stale."""
    with conn.cursor(row_factory=dict_row) as cur:
        cur.execute(
            COUNT_SPARES,
            {"digest": migrations.tenant_tree_state().digest, "roles": roles_key(app_roles)},
        )
        row = cur.fetchone()
    assert row is not None
    return PoolCounts(
        ready=int(row["ready"]),
        stale=int(row["stale"]),
        unfinished=int(row["unfinished"]),
        foreign=tuple(row["foreign_schemas"]),
    )


def foreign_schemas(conn: Any) -> list[tuple[str, str]]:
    """(name, owner) of each ``pool_*`` schema the pool did not record or does not own."""
    with conn.cursor() as cur:
        cur.execute(FOREIGN_SCHEMAS)
        return [(str(name), str(owner)) for name, owner in cur.fetchall()]


def spare_name() -> str:
    """A new spare's name, drawn at random (:data:`SPARE_PREFIX` and 16 hex digits)."""
    return f"{SPARE_PREFIX}{secrets.token_hex(8)}"


def drop_schema(tx: Transaction, schema: str) -> bool:
    """Forget a schema the pool recorded and drop it (``DROP SCHEMA ... CASCADE``) if it is
    still there and owned by the connected role; True when dropped. A schema the pool never
    recorded is never dropped, whatever its name; one whose owner changed is forgotten and left
    (then reported as not the pool's)."""
    with tx.pg.cursor() as cur:
        cur.execute(FORGET_SPARE_SCHEMA, {"schema": schema})
        row = cur.fetchone()
        if row is None or not row[0]:
            return False
        cur.execute(sql.SQL("DROP SCHEMA {} CASCADE").format(sql.Identifier(schema)))
    return True
