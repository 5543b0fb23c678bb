"""The verified fast path of the migration step: replay the tenant template's DDL.

Running the ``tenant_template`` revisions through Alembic costs several times the SQL they
issue (Alembic loads ``env.py`` and every revision file, then sends each statement on its own).
The fast path replays instead the statements Alembic's offline mode emits for the head, in ONE
round trip, inside the step's transaction, then proves the result is what Alembic would have
built. It is used only when every check below holds; otherwise the step runs Alembic, and the
step record says which path ran and why::

    path=template head=t004
    path=current (already at head) head=t004
    path=alembic (fallback: <reason>) head=t004

The checks, in order:

1. **The schema is empty.** A schema already at the head (one taken from the warm pool, a
   resume) needs nothing; one that holds objects at another revision (a resume after the tree
   moved on, a repair) is upgraded in place by Alembic.
2. **A reference exists for the tree as it is on disk.** The reference
   (:mod:`provisioner.templates.reference`) is stored in the control schema once per database
   and tree state (a digest of every file of the tree, helper modules included, so another
   head or an edited file is another reference). A process reads it once; when there is none
   yet, the step computes it first (Alembic builds a scratch schema that is rolled back) and
   stores it, so even the very first tenant of a database is built by the verified replay.
3. **The replay matches.** After the replay (under a SAVEPOINT), the new schema's fingerprint
   must equal the reference's. A mismatch or an SQL error rolls back to the savepoint, Alembic
   runs instead, and the fast path stays off for that tree state in this cache.

The cache belongs to one :class:`provisioner.engine.Engine` (a worker child's or a one-off
run's) and reaches the step through its context; it memoises the references it read. Alembic
keeps module-level state: the cache runs it only inside a step, under the same
one-migration-at-a-time rule as the step itself.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import psycopg
from psycopg import sql

from provisioner.db import DatabaseError, Transaction, translated
from provisioner.db.plans import keeping_prepared_statements
from provisioner.errors import TemplateUnusable
from provisioner.templates import migrations
from provisioner.templates import reference as template_reference
from provisioner.templates.reference import Reference, Template
from provisioner.tenant import schema as tenant_schema
from provisioner.tenant.fingerprint import Fingerprint, fingerprint

__all__ = ["Outcome", "Reference", "Template", "TemplateCache", "TemplateUnusable"]

SAVEPOINT = "tenant_template_replay"


@dataclass(frozen=True)
class Outcome:
    """Which path built the schema, and why Alembic ran when it did."""

    path: str  # 'template', 'current' or 'alembic'
    heads: frozenset[str]
    reason: str | None = None

    @property
    def detail(self) -> str:
        """The step record: ``path=template head=t004`` or ``path=alembic (fallback: ...) ...``."""
        if self.path == "current":
            via = "current (already at head)"
        else:
            via = self.path if self.reason is None else f"{self.path} (fallback: {self.reason})"
        return f"path={via} head={migrations.head_label(self.heads)}"


def database_key(tx: Transaction) -> tuple[str, ...]:
    """Which database (and role) a reference belongs to."""
    return connection_key(tx.pg)


def connection_key(conn: psycopg.Connection[Any]) -> tuple[str, ...]:
    """:func:`database_key` of a session."""
    info = conn.info
    return (str(info.host), str(info.port), str(info.dbname), str(info.user))


def describe_difference(expected: Fingerprint, got: Fingerprint) -> str:
    """The fingerprint sections that differ, with one example row each."""
    parts = []
    for section in sorted(set(expected) | set(got)):
        want, have = expected.get(section, []), got.get(section, [])
        if want == have:
            continue
        extra = [row for row in have if row not in want]
        missing = [row for row in want if row not in have]
        example = f"missing {missing[0]}" if missing else f"unexpected {extra[0]}" if extra else ""
        example = example if len(example) <= 160 else example[:157] + "..."
        parts.append(f"{section} differ ({example})" if example else f"{section} differ")
    return "; ".join(parts) or "no difference"


def mismatch(expected: Fingerprint, got: Fingerprint) -> str | None:
    """None when a built schema's fingerprint is the expected one, else why not (a replay's
    and a spare build's verdict)."""
    if got == expected:
        return None
    return f"fingerprint mismatch: {describe_difference(expected, got)}"


def replay(tx: Transaction, schema: str, reference: Reference) -> str | None:
    """Replay the reference's statements into the empty ``schema`` under a savepoint; None if
    the result matches the reference, else the reason it was rolled back."""
    return replay_verified(tx, schema, reference.template.script, reference.fingerprint)


def replay_verified(
    tx: Transaction,
    schema: str,
    script: str,
    expected: Fingerprint,
    *,
    savepoint: str = SAVEPOINT,
    before: sql.Composable | None = None,
    setup: sql.Composable | None = None,
) -> str | None:
    """Run ``script`` in ``schema`` under a savepoint and prove the result: None when the
    schema's fingerprint equals ``expected``, else the reason it was rolled back. Only a
    :class:`DatabaseError` becomes a reason: a transient error (an outage, a lock timeout for
    an upgrade: :class:`LockNotAvailable`) propagates and fails the step, to be retried. The
    template replay and the upgrade replay both verify this way.

    Two round trips: (1) the savepoint, the ``search_path`` (the schema alone, as Alembic's
    env.py sets it), the statements, the ``search_path`` back to the session default (the
    fingerprint is read under it, see :data:`provisioner.tenant.fingerprint.FINGERPRINT`) and the
    version table's rows, as one simple query; (2) the fingerprint's prepared catalog query.
    A replay that matches leaves its savepoint open: the caller's commit releases it with the
    rest (a ``RELEASE`` would be a third round trip, at every tenant of a fleet upgrade), and a
    later savepoint of the same name (another replay in the transaction) nests inside it. A
    replay that does not match is rolled back to it, and the savepoint released.

    ``before`` (statements sent ahead of the savepoint, kept when it is rolled back) and
    ``setup`` (under the savepoint and the schema's ``search_path``, ahead of the script) ride
    in the first round trip: a fleet upgrade's planned replay sets its lock timeout, checks
    the schema's start and revokes the version table's writes there
    (:meth:`provisioner.templates.upgrade.UpgradeCache.migrate`).
    """
    name = sql.Identifier(savepoint)
    text = (
        (sql.SQL("{};\n").format(before).as_string(tx.pg) if before is not None else "")
        + sql.SQL("SAVEPOINT {}; SET LOCAL search_path TO {};\n")
        .format(name, sql.Identifier(schema))
        .as_string(tx.pg)
        + (sql.SQL("{};\n").format(setup).as_string(tx.pg) if setup is not None else "")
        + script
        + sql.SQL("\nSET LOCAL search_path TO DEFAULT; {}")
        .format(tenant_schema.versions_query(schema))
        .as_string(tx.pg)
    )
    with tx.pg.cursor() as cur:
        try:
            with translated():
                with keeping_prepared_statements(tx.pg):
                    cur.execute(text.encode())
                while cur.nextset():  # the last result: the version table's rows
                    pass
                versions = [str(row[0]) for row in cur.fetchall()]
                got = fingerprint(tx.pg, schema, versions=versions)
        except DatabaseError as exc:
            cur.execute(sql.SQL("ROLLBACK TO SAVEPOINT {}").format(name))
            problem: str | None = f"replay failed: {exc}"
        else:
            problem = mismatch(expected, got)
            if problem is None:
                return None  # the savepoint is released by the caller's commit
            cur.execute(sql.SQL("ROLLBACK TO SAVEPOINT {}").format(name))
        cur.execute(sql.SQL("RELEASE SAVEPOINT {}").format(name))
    return problem


@dataclass
class TemplateCache:
    """An engine's memo of the stored references, and where the fast path is off."""

    #: who computes a missing reference (the engine's lease holder id)
    holder: str = "provisioner"
    #: (tree digest, database key) -> the reference read from (or stored in) that database
    references: dict[tuple[str, tuple[str, ...]], Reference] = field(default_factory=dict)
    #: tree digest -> why the fast path is off for that tree state in this cache
    disabled: dict[str, str] = field(default_factory=dict)

    def reference(self, tx: Transaction, tree: migrations.TreeState) -> Reference:
        """The tree state's reference: memoised, else read, else computed and stored in ``tx``.
        Raises :class:`TemplateUnusable`."""
        key = (tree.digest, database_key(tx))
        found = self.references.get(key)
        if found is None:
            found, _ = template_reference.obtain(tx, tree, self.holder)
            self.references[key] = found
        return found

    def remembered(self, conn: psycopg.Connection[Any], digest: str) -> Reference | None:
        """The reference of tree state ``digest`` for ``conn``'s database, if memoised."""
        return self.references.get((digest, connection_key(conn)))

    # -- the step -------------------------------------------------------------------------------

    def migrate(
        self, tx: Transaction, schema: str, tree: migrations.TreeState | None = None
    ) -> Outcome:
        """Bring ``schema`` to the tree's head in the step's transaction, by the fast path when
        it is verified, else by Alembic. Returns which path ran and why. ``tree``: the tree's
        state as the step read it already (:meth:`UpgradeCache.migrate`), else read here."""
        tree = tree or migrations.tenant_tree_state()
        objects = tenant_schema.object_count(tx.pg, schema)
        if objects is None:
            return self._alembic(tx, schema, f"schema {schema} does not exist")
        if objects:
            if migrations.tenant_versions(tx.pg, schema) == tree.heads:
                return Outcome("current", tree.heads)
            return self._alembic(tx, schema, f"schema holds {objects} objects: upgraded in place")
        if tree.digest in self.disabled:
            return self._alembic(tx, schema, f"fast path off: {self.disabled[tree.digest]}")
        try:
            reference = self.reference(tx, tree)
        except TemplateUnusable as exc:
            self.disabled[tree.digest] = f"template capture failed: {exc}"
            return self._alembic(tx, schema, self.disabled[tree.digest])
        problem = replay(tx, schema, reference)
        if problem is None:
            return Outcome("template", reference.heads)
        self.disabled[tree.digest] = f"{problem} (on {schema})"
        return self._alembic(tx, schema, problem)

    def _alembic(self, tx: Transaction, schema: str, reason: str) -> Outcome:
        migrations.upgrade_tenant(tx.sa, schema)
        return Outcome("alembic", migrations.tenant_heads(), reason)
