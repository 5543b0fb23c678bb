"""The verified fast path of ``run_tenant_migrations``: replay the tenant template's DDL.

Running the ``tenant_template`` revisions through Alembic costs several times the SQL they
issue (Alembic loads ``env.py`` and every revision file, then sends each statement on its own).
The fast path replays instead the statements Alembic's offline mode emits for the head, in ONE
round trip, inside the step's transaction, then proves the result is what Alembic would have
built. It is used only when every check below holds; otherwise the step runs Alembic, and the
step record says which path ran and why::

    path=template head=t004
    path=alembic (fallback: <reason>) head=t004

The checks, in order:

1. **The schema is empty.** A schema that already holds objects (a resume after the tree moved
   on, a repair) is upgraded in place by Alembic.
2. **The template is current.** A template is captured for one state of the tree: a SHA-256 over
   ``env.py`` and the revision files, and the heads. It is compared with the files on disk at
   every use; a stale template (another head, or the same head with edited files) is dropped.
3. **A reference exists.** The reference is the catalog fingerprint
   (:func:`provisioner.tenant_schema.fingerprint`, schema name abstracted) of a schema that
   Alembic itself built for the same tree state in the same database. The first empty schema a
   process provisions for a database runs Alembic and its fingerprint becomes the reference, so
   a one-off ``provisioner provision`` costs what it always did and never builds anything extra.
4. **The replay matches.** After the replay (under a SAVEPOINT), the new schema's fingerprint
   must equal the reference. A mismatch or an SQL error rolls back to the savepoint, Alembic
   runs instead, and the fast path stays off for that tree state in this process.

The cache lives for the process (like a memo of the tree's heads): a worker child captures the
template once and replays it for every later tenant. It is keyed and verified, so a stale entry
costs one fallback, never a wrong schema. Alembic's offline mode uses module-level state like its
online mode: the capture runs in the step, under the same one-migration-at-a-time rule.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from psycopg import sql

from provisioner import migrations, tenant_schema
from provisioner.db import DatabaseError, Transaction, translated

#: The schema name the template is captured for; it must match env.py's ``tenant_<id>`` rule.
#: It never reaches the database: capture is offline, and the name is stripped from the SQL.
PLACEHOLDER_SCHEMA = "tenant_zz_template_capture"

SAVEPOINT = "tenant_template_replay"

Fingerprint = dict[str, list[tuple[Any, ...]]]


class TemplateUnusable(Exception):
    """The tree's offline SQL cannot be replayed into another schema (internal to this module)."""


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
class Outcome:
    """Which path built the schema, and why Alembic ran when it did."""

    path: str  # 'template' or 'alembic'
    heads: frozenset[str]
    reason: str | None = None

    @property
    def detail(self) -> str:
        """The step record: ``path=template head=t004`` or ``path=alembic (fallback: ...) ...``."""
        via = self.path if self.reason is None else f"{self.path} (fallback: {self.reason})"
        return f"path={via} head={migrations.head_label(self.heads)}"


def database_key(tx: Transaction) -> tuple[str, ...]:
    """Which database (and role) a reference fingerprint belongs to."""
    info = tx.pg.info
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


class TemplateCache:
    """The process's template and reference fingerprints, and where the fast path is off."""

    def __init__(self) -> None:
        self.template: Template | None = None
        #: (tree digest, database key) -> fingerprint of a schema Alembic built there.
        self.references: dict[tuple[str, tuple[str, ...]], Fingerprint] = {}
        #: tree digest -> why the fast path is off for that tree state in this process.
        self.disabled: dict[str, str] = {}
        self._lock = threading.Lock()

    def clear(self) -> None:
        with self._lock:
            self.template = None
            self.references.clear()
            self.disabled.clear()

    def use(self, template: Template) -> None:
        """Put a captured template in place (tools and tests that capture elsewhere)."""
        with self._lock:
            self.template = template

    # -- the step -------------------------------------------------------------------------------

    def migrate(self, tx: Transaction, schema: str) -> Outcome:
        """Bring ``schema`` to the tree's head in the step's transaction, by the fast path when
        it is verified, else by Alembic. Returns which path ran and why."""
        with self._lock:
            tree = migrations.tenant_tree_state()
            objects = tenant_schema.object_count(tx.pg, schema)
            if objects is None:
                return self._alembic(tx, schema, tree, f"schema {schema} does not exist")
            if objects:
                return self._alembic(
                    tx, schema, tree, f"schema holds {objects} objects: upgraded in place"
                )
            template = self.template
            if template is not None and template.digest != tree.digest:
                self.template = None
                return self._alembic(tx, schema, tree, _stale(template, tree), learn=True)
            key = (tree.digest, database_key(tx))
            reference = self.references.get(key)
            if reference is None:
                return self._alembic(
                    tx,
                    schema,
                    tree,
                    "no reference schema yet for this tree and database: this one becomes it",
                    learn=True,
                )
            if tree.digest in self.disabled:
                return self._alembic(
                    tx, schema, tree, f"fast path off: {self.disabled[tree.digest]}"
                )
            if template is None:
                try:
                    template = Template.capture()
                except TemplateUnusable as exc:
                    self.disabled[tree.digest] = f"template capture failed: {exc}"
                    return self._alembic(tx, schema, tree, self.disabled[tree.digest])
                if template.digest != tree.digest:
                    return self._alembic(tx, schema, tree, _stale(template, tree))
                self.template = template
            problem = self._replay(tx, schema, template, reference)
            if problem is None:
                return Outcome("template", tree.heads)
            self.disabled[tree.digest] = f"{problem} (on {schema})"
            return self._alembic(tx, schema, tree, problem)

    def _replay(
        self, tx: Transaction, schema: str, template: Template, reference: Fingerprint
    ) -> str | None:
        """Replay under a savepoint; None if the result matches the reference, else the
        reason it was rolled back."""
        # One round trip: the savepoint, the schema as the only search_path entry for the rest
        # of the step's transaction (as Alembic's env.py sets it), and the template's DDL.
        script = (
            sql.SQL("SAVEPOINT {}; SET LOCAL search_path TO {};\n")
            .format(sql.Identifier(SAVEPOINT), sql.Identifier(schema))
            .as_string(tx.pg)
            + template.script
        )
        with tx.pg.cursor() as cur:
            try:
                with translated():
                    cur.execute(script.encode())
                    got = tenant_schema.fingerprint(tx.pg, schema)
            except DatabaseError as exc:
                problem = f"replay failed: {exc}"
            else:
                if got == reference:
                    cur.execute(sql.SQL("RELEASE SAVEPOINT {}").format(sql.Identifier(SAVEPOINT)))
                    return None
                problem = f"fingerprint mismatch: {describe_difference(reference, got)}"
            cur.execute(sql.SQL("ROLLBACK TO SAVEPOINT {}").format(sql.Identifier(SAVEPOINT)))
            cur.execute(sql.SQL("RELEASE SAVEPOINT {}").format(sql.Identifier(SAVEPOINT)))
        return problem

    def _alembic(
        self,
        tx: Transaction,
        schema: str,
        tree: migrations.TreeState,
        reason: str,
        *,
        learn: bool = False,
    ) -> Outcome:
        """Run the revisions; with ``learn``, keep the result as the reference fingerprint."""
        migrations.upgrade_tenant(tx.sa, schema)
        after = migrations.tenant_tree_state()
        if learn and after == tree:
            self.references[(tree.digest, database_key(tx))] = tenant_schema.fingerprint(
                tx.pg, schema
            )
        return Outcome("alembic", after.heads, reason)


def _stale(template: Template, tree: migrations.TreeState) -> str:
    if template.heads != tree.heads:
        return (
            f"cached template is stale: captured for head {template.head_label}, "
            f"the tree is at head {tree.head_label}"
        )
    return (
        f"cached template is stale: the tree's files changed at head {tree.head_label} "
        f"(digest {template.digest[:12]} -> {tree.digest[:12]})"
    )


#: This process's cache (see the module docstring for why it is per process).
PROCESS_CACHE = TemplateCache()
