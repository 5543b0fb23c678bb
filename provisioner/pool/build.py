"""A spare's build: the verified replay of the stored reference in batches, its grants, and
the record that makes it ready.

A spare is built at the head by the verified replay of :mod:`provisioner.templates.reference`
(the stored reference's statements, then a fingerprint that must equal the reference's). A
spare is ready only once its row in ``control.tenant_pool`` is committed, in the build's last
transaction, after every check. The build before it runs in transactions of :data:`BATCH`
statements (:func:`build_spare`): one transaction of a large template's DDL sends more catalog
invalidations than PostgreSQL's shared queue holds, and every other session of the database
(the application's too) then drops all its caches and reloads them at its next statement
(pinned by
``tests/integration/test_pool.py::test_a_spare_is_built_in_batches_and_recorded_in_its_own_last_transaction``).

The refill that calls it, under the builders' lock, is :mod:`provisioner.pool.refill`; what a
spare is, its statements (the record's :data:`~provisioner.pool.spares.ADD_SPARE` among them),
its take and its drop are :mod:`provisioner.pool.spares`'.
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import suppress

import psycopg
from psycopg import sql

from provisioner import db
from provisioner.db import DatabaseError, Transaction
from provisioner.db.plans import keeping_prepared_statements, preparing_again
from provisioner.errors import BuildStopped, PermanentError, ProvisionerError, SpareRejected
from provisioner.pool.grants import check_spare_grants, spare_grant_batches
from provisioner.pool.server_schemas import (
    RECORD_SERVER_SPARE_SCHEMA,
    NameTaken,
    OnServer,
    create_on_server,
    drop_server_schema,
)
from provisioner.pool.spares import ADD_SPARE, drop_schema, roles_key, spare_name
from provisioner.roles import AppRoles
from provisioner.templates import migrations
from provisioner.templates import reference as template_reference
from provisioner.templates.replay import mismatch
from provisioner.tenant import schema as tenant_schema
from provisioner.tenant.fingerprint import fingerprint

#: Names a build tries before it gives up (a name is skipped when a schema holds it already).
NAME_ATTEMPTS = 5

#: Statements of the template's replay, and relations granted, per transaction of a spare
#: build. PostgreSQL's shared invalidation queue holds 4096 messages, and a table with its
#: indexes sends about a hundred; a session further behind than the queue holds (an idle one
#: cannot catch up during one commit) resets every cache, and pays for it at its next
#: statement: the application's enqueue after a 200-table spare built in one transaction took
#: 2 ms more. Ten statements stay far below, and idle sessions catch up
#: between commits.
BATCH = 10


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
