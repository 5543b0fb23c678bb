"""The tenant template's reference: what Alembic builds for the head, stored once per database.

The fast path of the migration step (:mod:`provisioner.templates.replay`) and the warm pool
(:mod:`provisioner.pool`) replay the tree's DDL instead of running Alembic, and prove the result
against a reference: the catalog fingerprint (:func:`provisioner.tenant.fingerprint.fingerprint`,
schema name abstracted) of a schema that Alembic itself built for the same tree state in the same
database. The reference, and the statements to replay, live in
``control.tenant_template_references``, keyed by the tree's digest (a SHA-256 over every file of
the tree, helper modules a revision imports included, so another head or an edited file is another
key: :func:`provisioner.templates.migrations.tree_digest`) and the fingerprint's format
(:func:`reference_key`: ``<digest>/fingerprint-v2``; a reference another version rendered
differently is never compared with this one).

Computed once per database and tree state, by whichever process needs it first: under a
transaction-level advisory lock on the digest, it reads the row again, and if it is still
missing it captures the tree's offline SQL, has Alembic build a scratch schema under a SAVEPOINT,
takes the fingerprint, rolls the scratch schema back and inserts the row (``ON CONFLICT DO
NOTHING``). Two processes computing at once therefore compute once: the second waits on the lock
and then reads the first one's row. Every later process, worker child or one-off CLI, reads the
row (one round trip) and replays from its first tenant.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psycopg
from psycopg import sql
from psycopg.rows import dict_row
from psycopg.types.json import Jsonb

from provisioner import naming
from provisioner.db import Transaction
from provisioner.errors import TemplateUnusable
from provisioner.templates import migrations
from provisioner.tenant import schema as tenant_schema
from provisioner.tenant.fingerprint import FINGERPRINT_FORMAT, Fingerprint, fingerprint

#: The schema name the template is captured for: one of the tool's scratch names, which no
#: tenant id maps to and env.py accepts (:mod:`provisioner.naming`). It never reaches the
#: database: capture is offline, and the name is stripped from the SQL.
PLACEHOLDER_SCHEMA = f"{naming.SCRATCH_PREFIX}template_capture"

#: First key of the advisory lock that serialises computing a reference ('tplr').
REFERENCE_LOCK_CLASS = 0x74706C72

SCRATCH_SAVEPOINT = "tenant_template_reference"

# -- statements ---------------------------------------------------------------------------------

# The stored reference of one tree state, if any (``key``: see reference_key()).
SELECT_REFERENCE = """
SELECT heads, statements, fingerprint FROM control.tenant_template_references
 WHERE tree_digest = %(key)s
"""

# Store a reference; a row already there (computed meanwhile) wins.
INSERT_REFERENCE = """
INSERT INTO control.tenant_template_references
       (tree_digest, heads, statements, fingerprint, created_by)
VALUES (%(key)s, %(heads)s, %(statements)s, %(fingerprint)s, %(created_by)s)
ON CONFLICT (tree_digest) DO NOTHING
"""

# Serialise the computation of one tree state's reference until the transaction ends.
LOCK_REFERENCE = "SELECT pg_advisory_xact_lock(%(class)s, hashtext(%(digest)s))"


@dataclass(frozen=True)
class Template:
    """The tenant tree's DDL for one tree state, schema-less, as one script."""

    digest: str
    heads: frozenset[str]
    statements: tuple[str, ...]

    @property
    def script(self) -> str:
        return "\n".join(self.statements)

    @property
    def head_label(self) -> str:
        return migrations.head_label(self.heads)

    @classmethod
    def capture(cls, tree: Path | None = None) -> Template:
        """Run Alembic offline for the tree's head and keep what can be replayed anywhere.

        Kept: every statement, in order, with the placeholder schema's qualifier removed from
        the version-table statements (they then resolve through the transaction's
        ``search_path``, which is the new schema alone). Dropped: comments, ``BEGIN``/``COMMIT``
        (the step owns the transaction) and the ``search_path`` line (set by the replay).
        """
        before = migrations.tenant_tree_state(tree)
        emitted = migrations.tenant_offline_sql(PLACEHOLDER_SCHEMA, tree=tree)
        if migrations.tenant_tree_state(tree) != before:
            raise TemplateUnusable("the tree changed while its SQL was captured")
        search_path = f'SET LOCAL search_path TO "{PLACEHOLDER_SCHEMA}";'
        kept: list[str] = []
        for text in emitted:
            if _only_comments(text) or text in ("BEGIN;", "COMMIT;", search_path):
                continue
            text = text.replace(f"{PLACEHOLDER_SCHEMA}.", "")
            if PLACEHOLDER_SCHEMA in text:
                raise TemplateUnusable(
                    f"a statement names the tenant schema outside the version table: {text[:80]!r}"
                )
            kept.append(text)
        if not kept:
            raise TemplateUnusable("the tree emitted no statements")
        return cls(digest=before.digest, heads=before.heads, statements=tuple(kept))


def _only_comments(text: str) -> bool:
    return all(not line.strip() or line.lstrip().startswith("--") for line in text.splitlines())


@dataclass(frozen=True)
class Reference:
    """One tree state's replay script and the fingerprint Alembic's own build has."""

    template: Template
    fingerprint: Fingerprint

    @property
    def digest(self) -> str:
        return self.template.digest

    @property
    def heads(self) -> frozenset[str]:
        return self.template.heads


def reference_key(digest: str) -> str:
    """Where a reference of the tree state ``digest`` is stored: the digest and the format of
    the fingerprint it holds (:data:`provisioner.tenant.fingerprint.FINGERPRINT_FORMAT`)."""
    return f"{digest}/{FINGERPRINT_FORMAT}"


def load(tx: Transaction, digest: str) -> Reference | None:
    """The stored reference of the tree state ``digest``; None when none was computed yet."""
    return stored(tx.pg, digest)


def stored(conn: psycopg.Connection[Any], digest: str) -> Reference | None:
    """:func:`load` on a plain session of the control database (a job on a tenant server
    replays control's reference there: :mod:`provisioner.kinds.placed`)."""
    with conn.cursor(row_factory=dict_row) as cur:
        cur.execute(SELECT_REFERENCE, {"key": reference_key(digest)})
        row = cur.fetchone()
    if row is None:
        return None
    template = Template(digest, frozenset(row["heads"]), tuple(row["statements"]))
    found = row["fingerprint"]
    return Reference(template, {name: [tuple(r) for r in rows] for name, rows in found.items()})


def obtain(tx: Transaction, tree: migrations.TreeState, created_by: str) -> tuple[Reference, bool]:
    """The tree state's reference, computed and stored in ``tx`` if nobody did it yet.

    Returns (reference, computed here). Raises :class:`TemplateUnusable` when the tree cannot
    be captured for replay. The caller's transaction holds the advisory lock until it ends.
    """
    found = load(tx, tree.digest)
    if found is not None:
        return found, False
    with tx.pg.cursor() as cur:
        cur.execute(LOCK_REFERENCE, {"class": REFERENCE_LOCK_CLASS, "digest": tree.digest})
    found = load(tx, tree.digest)  # computed by the process that held the lock before us
    if found is not None:
        return found, False
    reference = compute(tx, tree)
    with tx.pg.cursor() as cur:
        cur.execute(
            INSERT_REFERENCE,
            {
                "key": reference_key(reference.digest),
                "heads": sorted(reference.heads),
                "statements": list(reference.template.statements),
                "fingerprint": Jsonb(reference.fingerprint),
                "created_by": created_by,
            },
        )
    return reference, True


def compute(tx: Transaction, tree: migrations.TreeState) -> Reference:
    """Capture the tree's offline SQL and fingerprint what Alembic builds, leaving no trace.

    The scratch schema lives under a savepoint that is rolled back: nothing of it commits.
    """
    template = Template.capture()
    if template.digest != tree.digest:
        raise TemplateUnusable("the tree changed while its reference was computed")
    scratch = naming.scratch_name("reference")
    savepoint = sql.Identifier(SCRATCH_SAVEPOINT)
    with tx.pg.cursor() as cur:
        cur.execute(sql.SQL("SAVEPOINT {}").format(savepoint))
        try:
            tenant_schema.create_schema(tx.pg, scratch)
            migrations.upgrade_tenant(tx.sa, scratch)
            after = migrations.tenant_tree_state()
            if after != tree:
                raise TemplateUnusable("the tree changed while its reference was built")
            # Read as the replay reads a tenant: under the session's search_path, not the
            # scratch schema Alembic left in it (it changes how names are printed).
            cur.execute("SET LOCAL search_path TO DEFAULT")
            found = fingerprint(tx.pg, scratch)
        finally:
            cur.execute(sql.SQL("ROLLBACK TO SAVEPOINT {}").format(savepoint))
            cur.execute(sql.SQL("RELEASE SAVEPOINT {}").format(savepoint))
    return Reference(template, found)
