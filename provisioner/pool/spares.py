"""The warm pool's spares: built ahead of demand, taken by a rename.

With ``PROVISIONER_POOL_SIZE=N`` the worker keeps N spares (:mod:`provisioner.pool.keeper`),
built while it is otherwise idle by the verified replay of
:mod:`provisioner.templates.reference` (the stored reference's statements, then a fingerprint
that must equal the reference's). A spare is ready only once its row in
``control.tenant_pool`` is committed, in the build's last transaction, after every check. The
build before it runs in transactions of :data:`BATCH` statements (:func:`build_spare`): one
transaction of a large template's DDL sends more catalog invalidations than PostgreSQL's shared
queue holds, and every other session of the database (the application's too) then drops all
its caches and reloads them at its next statement (pinned by
``tests/integration/test_pool.py::test_a_spare_is_built_in_batches_and_recorded_in_its_own_last_transaction``).

A spare is invisible to the application and to users until it is taken:

* its name is ``pool_<hex>``, never ``tenant_<id>``, and ``app_rw`` has no USAGE on it: any
  access is refused (``permission denied for schema``). Its tables and sequences already carry
  ``app_rw``'s grants, and the schema its default privileges (:func:`spare_grant_batches`), so
  that a take only grants USAGE (with its rename) and checks the ACLs instead of naming every
  table, whatever the template's size. Without USAGE the role cannot look up anything in the
  schema, so those grants give it nothing until the take; the build checks that it holds
  neither USAGE nor CREATE there;
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
``tests/integration/test_pool_roles.py``). When no spare is ready the step creates an empty
schema as it always did.

Every schema created, renamed or granted on makes PostgreSQL drop all cached plans of every
session of the database, so the take reads the spare's grants before its rename, with plans
prepared after each build (:func:`plan_take`, pinned by
``tests/integration/test_pool.py::test_a_take_binds_the_plans_made_before_it``), and renames
and grants in one statement (one reset, not two).
"""

from __future__ import annotations

import secrets
from collections.abc import Callable
from contextlib import suppress
from dataclasses import dataclass
from typing import Any

import psycopg
from psycopg import sql
from psycopg.rows import dict_row

from provisioner import db, naming, roles
from provisioner.db import DatabaseError, Transaction
from provisioner.db.plans import (
    PlanAhead,
    keeping_prepared_statements,
    prepare_ahead,
    preparing_again,
)
from provisioner.errors import BuildStopped, PermanentError, ProvisionerError, SpareRejected
from provisioner.pool.grants import (
    GRANTS_HELD,
    GrantsHeld,
    check_spare_grants,
    grants_held,
    spare_grant_batches,
    take_grants,
)
from provisioner.pool.server_schemas import (
    RECORD_SERVER_SPARE_SCHEMA,
    NameTaken,
    OnServer,
    create_on_server,
    drop_server_schema,
)
from provisioner.roles import AppRoles
from provisioner.templates import migrations
from provisioner.templates import reference as template_reference
from provisioner.templates.replay import mismatch
from provisioner.tenant import schema as tenant_schema
from provisioner.tenant.fingerprint import fingerprint

#: Spare schemas are ``pool_`` and 16 hex digits: never a tenant's, under any naming rule.
SPARE_PREFIX = naming.SPARE_PREFIX
#: Names a build tries before it gives up (a name is skipped when a schema holds it already).
NAME_ATTEMPTS = 5

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

#: Statements of the template's replay, and relations granted, per transaction of a spare
#: build. PostgreSQL's shared invalidation queue holds 4096 messages, and a table with its
#: indexes sends about a hundred; a session further behind than the queue holds (an idle one
#: cannot catch up during one commit) resets every cache, and pays for it at its next
#: statement: the application's enqueue after a 200-table spare built in one transaction took
#: 2 ms more. Ten statements stay far below, and idle sessions catch up
#: between commits.
BATCH = 10


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


def build_spare(
    session: db.Session,
    created_by: str,
    app_roles: AppRoles | None = None,
    *,
    stop: Callable[[], bool] = lambda: False,
    go_on: Callable[[], bool] = lambda: False,
    references: dict[str, template_reference.Reference] | None = None,
    on: OnServer | None = None,
    name: str | None = None,
    next_spare: Callable[[], str | None] = lambda: None,
) -> str:
    """Build one spare at the head and record it; its name. The caller holds the builders'
    lock (:func:`builder_lock`) of the database the spare is built on.

    The reference is read (or computed once, see :mod:`provisioner.templates.reference`) in the
    transaction that creates the schema (``references``: the ones a refill already read, by
    tree digest, kept there); its statements are replayed :data:`BATCH` per transaction; the
    schema's fingerprint must then equal the reference's. With ``app_roles`` the spare gets
    those roles' grants but USAGE, batched the same way, and they are checked
    (:func:`check_spare_grants`) in the last transaction, which records the spare. Batches are
    sent as :func:`_run_batches` says (``go_on``: whether a commit may begin the next batch).
    Raises :class:`SpareRejected` when the replay (or the grants) do not match,
    :class:`TemplateUnusable` when the tree cannot be replayed, :class:`BuildStopped` when
    ``stop()`` says so between two transactions: the schema is then dropped (by the next
    builder, if this process dies).

    ``name``: the name to try first (:func:`spare_name`; else one is drawn). ``next_spare``:
    asked once the spare is checked, just before the commit that records it, for the name of
    the spare this session builds next (None: none, or not now); that commit then begins the
    next spare's first transaction (:func:`first_batch`) in its own round trip, as a batch's
    commit begins the next batch, and the next call, given that ``name``, finds it open (see
    :func:`_record`). Not for a tenant server's spares (``on``), which record on control.

    ``on``: built on a tenant server. ``session`` is then control's: the reference is read and
    the name recorded there first, the schema is built on the server, and the ready row is
    recorded on control after the server's last check. A crash between two of those leaves a
    recorded name with no ready row, which the server's next builder drops there.
    """
    reference = known_reference(session, created_by, {} if references is None else references)
    for attempt in range(NAME_ATTEMPTS):
        drawn = name if attempt == 0 and name is not None else spare_name()
        try:
            _build(session, drawn, reference, created_by, app_roles, stop, go_on, on, next_spare)
        except NameTaken:  # a schema holds the name drawn: draw another
            continue
        return drawn
    raise PermanentError(f"no free spare name in {NAME_ATTEMPTS} tries")


def spare_name() -> str:
    """A new spare's name, drawn at random (:data:`SPARE_PREFIX` and 16 hex digits)."""
    return f"{SPARE_PREFIX}{secrets.token_hex(8)}"


def first_batch(
    name: str, reference: template_reference.Reference, created_by: str
) -> sql.Composed:
    """The first transaction's statement of a spare built on the control database: the name's
    record, the schema's creation and the replay's first batch (a name already taken fails
    it: nothing is left, another is drawn)."""
    return _replay_batches(name, reference, _opening(name, created_by))[0]


def _opening(name: str, created_by: str) -> sql.Composed:
    return sql.SQL(
        "INSERT INTO control.tenant_pool_schemas (schema_name, created_by) VALUES ({}, {});"
        " CREATE SCHEMA {} AUTHORIZATION CURRENT_USER"
    ).format(sql.Literal(name), sql.Literal(created_by), sql.Identifier(name))


def _replay_batches(
    name: str, reference: template_reference.Reference, opening: sql.Composable | None
) -> list[sql.Composed]:
    """The replay's transactions, :data:`BATCH` statements each under the spare's
    ``search_path``; ``opening`` rides the first. The last sets the ``search_path`` back to the
    session's, under which the fingerprint is read (as the reference's was): one round trip
    fewer than a statement of its own."""
    search_path = sql.SQL("SET LOCAL search_path TO {}").format(sql.Identifier(name))
    statements = reference.template.statements
    replay = [
        sql.SQL("{};\n{}").format(search_path, sql.SQL("\n".join(statements[at : at + BATCH])))
        for at in range(0, len(statements), BATCH)
    ] or [sql.Composed([search_path])]
    replay[-1] = sql.SQL("{};\nSET LOCAL search_path TO DEFAULT").format(replay[-1])
    if opening is not None:
        replay[0] = sql.SQL("{};\n{}").format(opening, replay[0])
    return replay


def known_reference(
    session: db.Session, created_by: str, references: dict[str, template_reference.Reference]
) -> template_reference.Reference:
    """The reference of the tree state on disk: from ``references`` (by tree digest), else read
    (or computed once, with Alembic: never in two threads at once) on ``session``, which must
    be the control database's, and kept there."""
    tree = migrations.tenant_tree_state()
    reference = references.get(tree.digest)
    if reference is None:
        with session.transaction() as tx:
            reference, _ = template_reference.obtain(tx, tree, created_by)
        references[tree.digest] = reference
    return reference


def _build(
    session: db.Session,
    name: str,
    reference: template_reference.Reference,
    created_by: str,
    app_roles: AppRoles | None,
    stop: Callable[[], bool],
    go_on: Callable[[], bool],
    on: OnServer | None,
    next_spare: Callable[[], str | None] = lambda: None,
) -> None:
    """:func:`build_spare` under the name ``name``; :class:`NameTaken` when a schema holds it.

    Per spare, beyond the build's own batches, on the control database: the name's record and
    the schema's creation ride the first replay batch (:func:`first_batch`), which the previous
    spare's record may have begun already; the fingerprint and the list of relations to grant
    are read in the last replay batch's transaction, before its commit (which begins the first
    grant batch); the last grant batch's commit begins the record's transaction with the
    spare's row, and that transaction checks the grants before its commit makes the row (and
    so the spare) ready (:func:`_record`). Two round trips of bookkeeping per spare (the check
    and the record's commit, which begins the next spare), where there were five, and four
    transactions and a dozen round trips before that."""
    target = session if on is None else on.session
    opening: sql.Composable | None = None
    if on is None:
        opening = _opening(name, created_by)
    else:
        with session.transaction() as tx, tx.pg.cursor() as cur:
            cur.execute(
                RECORD_SERVER_SPARE_SCHEMA,
                {"schema": name, "created_by": created_by, "server": on.name},
            )
            if cur.fetchone() is None:
                raise NameTaken(name)
    record = _added(name, reference, created_by, app_roles, on)
    try:
        if on is not None:
            create_on_server(on, name)
        replay = _replay_batches(name, reference, opening)

        def verified(tx: Transaction) -> list[sql.Composed]:
            # Before any grant: the reference has none. Read under the session's search_path,
            # as the reference was (the last batch set it back: the batch's own names the
            # spare, and the catalog's definitions then leave the spare's names unqualified).
            problem = mismatch(reference.fingerprint, fingerprint(tx.pg, name, prepare=True))
            if problem is not None:
                raise SpareRejected(problem)
            if app_roles is None:
                return []
            # The spare's relations are the reference's, now that their shapes are equal: no
            # catalog read of its own (one round trip and ~4 ms of a ~60 ms spare).
            return spare_grant_batches(name, app_roles, relations_granted(reference), BATCH)

        try:
            _run_batches(target, replay, stop, go_on, at_end=verified, then=None if on else record)
        except DatabaseError as exc:
            if opening is not None and isinstance(
                exc.__cause__, (psycopg.errors.DuplicateSchema, psycopg.errors.UniqueViolation)
            ):
                raise NameTaken(name) from exc
            raise SpareRejected(f"replay failed: {exc}") from exc
        if on is None:
            _record(session, name, reference, created_by, app_roles, record, next_spare)
            return
        if app_roles is not None:
            with target.transaction() as tx:
                check_spare_grants(tx.pg, name, app_roles)
        with session.transaction(record):
            pass
    except BaseException as exc:
        _drop_schema_quietly(session, name, on, ours=not isinstance(exc, NameTaken))
        raise


def _added(
    name: str,
    reference: template_reference.Reference,
    created_by: str,
    app_roles: AppRoles | None,
    on: OnServer | None,
) -> sql.Composed:
    """The spare's ready row (:data:`ADD_SPARE`), its values as literals: the first statement
    of the record's transaction, which the last batch's commit begins."""
    return sql.SQL(ADD_SPARE).format(
        schema=sql.Literal(name),
        digest=sql.Literal(reference.digest),
        heads=sql.Literal(sorted(reference.heads)),
        created_by=sql.Literal(created_by),
        roles=sql.Literal(roles_key(app_roles)),
        server=sql.Literal(None if on is None else on.name),
    )


def _record(
    session: db.Session,
    name: str,
    reference: template_reference.Reference,
    created_by: str,
    app_roles: AppRoles | None,
    record: sql.Composed,
    next_spare: Callable[[], str | None],
) -> None:
    """The control spare's last transaction: its row (``record``, begun by the last batch's
    commit, or sent now), the grants' check, then the commit that makes it ready, which begins
    the next spare's first transaction when ``next_spare()`` names one (asked after the check:
    a spare rejected here begins nothing). A check that fails rolls the row back with it."""
    with (
        keeping_prepared_statements(session.driver),
        session.transaction(record) as tx,
        preparing_again(tx.pg),  # the grants check stays prepared (planned once per session)
    ):
        if app_roles is not None:
            check_spare_grants(tx.pg, name, app_roles)
        following = next_spare()
        if following is not None:
            tx.begin_next_with(first_batch(following, reference, created_by))


def relations_granted(reference: template_reference.Reference) -> list[str]:
    """The tables, views and materialized views a replay of ``reference`` builds, by name (the
    relations the grant step names), read from its fingerprint."""
    return sorted(
        str(row[0])
        for row in reference.fingerprint["relations"]
        if str(row[1]) in tenant_schema.TABLE_KINDS
    )


def _run_batches(
    session: db.Session,
    batches: list[sql.Composed],
    stop: Callable[[], bool],
    go_on: Callable[[], bool],
    at_end: Callable[[Transaction], list[sql.Composed]] | None = None,
    then: sql.Composable | None = None,
) -> None:
    """Each batch its own transaction, one simple query. While ``go_on()`` says so (the
    keeper: the worker is idle), a batch's commit begins the next batch's transaction with its
    statements in the same round trip (``COMMIT; BEGIN; <next batch>``,
    :meth:`provisioner.db.Session.transaction`'s ``then``): one round trip per batch, where
    a ``BEGIN``, the batch and a ``COMMIT`` were three. When it does not, the commit goes
    alone and ``stop()`` runs before the next batch (it pauses while the worker has a job:
    nothing of the build runs meanwhile). The first batch is begun by the session's last commit
    when that commit was given it (the previous spare's record: :func:`_record`), and
    ``stop()`` is then not asked before it, as for any chained batch. A chained batch that
    fails after its predecessor's commit is begun again by the next transaction, which meets
    the error. ``at_end`` runs in the last batch's transaction, before its commit, and returns
    batches to run after it (the commit begins the first); the last commit begins ``then``
    (the spare's record: bookkeeping, not the build's progress). psycopg keeps the session's
    prepared statements (:func:`keeping_prepared_statements`)."""
    pending = list(batches)
    chained = bool(pending) and session.driver.chained == pending[0]
    with keeping_prepared_statements(session.driver):
        at = 0
        while at < len(pending):
            if not chained:
                _between_batches(stop)
            with session.transaction(pending[at]) as tx:
                if at + 1 == len(pending) and at_end is not None:
                    with preparing_again(tx.pg):  # the checks' catalog queries stay prepared
                        pending.extend(at_end(tx))
                    at_end = None
                if at + 1 == len(pending):
                    tx.begin_next_with(then)
                else:
                    chained = go_on()
                    tx.begin_next_with(pending[at + 1] if chained else None)
            at += 1


def _between_batches(stop: Callable[[], bool]) -> None:
    if stop():
        raise BuildStopped("the spare build was stopped")


def _drop_schema_quietly(
    session: db.Session, schema: str, on: OnServer | None, *, ours: bool = True
) -> None:
    """Drop a spare schema a build did not finish; when that fails too (the server is gone),
    the next builder drops it."""
    with suppress(ProvisionerError):
        if on is None:
            with session.transaction() as tx:
                drop_schema(tx, schema)
        else:
            drop_server_schema(session, on, schema, ours=ours)


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
