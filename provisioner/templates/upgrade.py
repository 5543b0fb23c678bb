"""The verified fast path of a fleet upgrade: replay the new revisions' DDL in place.

``provisioner upgrade`` re-opens the provisioning job of every tenant behind the head, and a
worker re-runs the migration step on a schema that already holds the tenant's tables and
data. Running Alembic there costs ~13 ms a tenant (loading ``env.py`` and every revision file,
one round trip per statement) for DDL that takes ~1 ms. Here, as for an empty schema
(:mod:`provisioner.templates.replay`), the statements Alembic's offline mode emits for
``FROM:head`` are replayed in ONE round trip under a savepoint, and the result is proven equal
to what Alembic builds. The step record says which path ran and why::

    path=replay from=t004 head=t005
    path=alembic (fallback: <reason>) from=t004 head=t005

The checks, in order:

1. **The offline SQL is DDL alone** (``CREATE``/``ALTER``/``DROP``/``COMMENT``/``GRANT``/
   ``REVOKE``, plus the version table's own row). A data migration runs through Alembic.
2. **The script is current**: captured for this tree digest and this starting revision.
3. **A reference exists**: the catalog fingerprint of a scratch schema that Alembic built at
   the starting revision, that was granted like a tenant, and that Alembic then upgraded to the
   head, in the same database, for the same tree. That online run is recorded
   (:mod:`provisioner.templates.recording`): when what the revisions sent differs from the
   offline SQL, or a revision read the database, the reference says the replay is refused and
   why, and every tenant runs through Alembic. No revision declares anything. It is computed
   once per database, tree state, starting revision and set of application roles (its grants
   are in the fingerprint: :func:`upgrade_reference_key`), under an advisory lock, stored in
   ``control.tenant_upgrade_references`` and the scratch schema rolled back: every process,
   one-off or worker, replays from its first tenant, and no tenant's drift can become the
   reference.
4. **The replay matches**: the upgraded schema's fingerprint equals the reference. A mismatch
   (a tenant that drifted) rolls back to the savepoint and runs Alembic for that tenant alone;
   the next tenant replays again.

A lock timeout is not a reason to fall back: Alembic would wait for the same lock. The error
propagates and the queue retries the tenant later with backoff.

Once a replay has passed these checks, the engine's cache keeps it as the **plan** for the
tree state (:class:`ReplayPlan`): the next tenant of the rollout gets its lock timeout, a guard
that it is at the plan's start, the version table's revoke, the script and the version read in
ONE round trip, then the fingerprint (:meth:`UpgradeCache._planned`). Whatever the plan does
not prove is rolled back to the savepoint and goes through the checks above. Pinned by
``tests/integration/test_fleet_upgrade.py::
test_the_next_tenant_replays_the_workers_plan_in_two_round_trips``.
"""

from __future__ import annotations

import re
import threading
from collections.abc import Callable
from contextlib import AbstractContextManager
from dataclasses import dataclass
from pathlib import Path

from psycopg import sql
from psycopg.rows import dict_row, tuple_row
from psycopg.types.json import Jsonb

from provisioner import naming, roles
from provisioner.db import Transaction, kept_alive, translated
from provisioner.db.plans import keeping_prepared_statements, preparing_again
from provisioner.errors import NotReplayable
from provisioner.roles import AppRoles
from provisioner.templates import migrations, recording
from provisioner.templates.reference import PLACEHOLDER_SCHEMA, reference_key
from provisioner.templates.replay import (
    Outcome,
    TemplateCache,
    database_key,
    replay_verified,
)
from provisioner.tenant import schema as tenant_schema
from provisioner.tenant.fingerprint import Fingerprint, fingerprint

SAVEPOINT = "tenant_upgrade_replay"
SCRATCH_SAVEPOINT = "tenant_upgrade_reference"
#: First key of the advisory lock under which one process computes a reference ('upgr').
REFERENCE_LOCK_CLASS = 0x75706772

# The stored reference of an upgrade from one revision, for one tree state.
SELECT_REFERENCE = """
SELECT fingerprint, replay_refused FROM control.tenant_upgrade_references
 WHERE tree_digest = %(key)s AND start = %(start)s
"""
INSERT_REFERENCE = """
INSERT INTO control.tenant_upgrade_references
       (tree_digest, start, heads, fingerprint, created_by, replay_refused)
VALUES (%(key)s, %(start)s, %(heads)s, %(fingerprint)s, %(created_by)s, %(refused)s)
ON CONFLICT (tree_digest, start) DO NOTHING
"""
LOCK_REFERENCE = "SELECT pg_advisory_xact_lock(%(class)s, hashtext(%(digest)s || %(start)s))"

# The step's lock timeout and whether the schema has a version table, in one round trip (one
# catalog lookup by (name, schema), whatever the number of schemas).
LOCK_TIMEOUT_AND_VERSION_TABLE = """
SELECT set_config('lock_timeout', %(lock_timeout)s, true) AS lock_timeout,
       EXISTS (SELECT FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
                WHERE n.nspname = %(schema)s AND c.relname = 'alembic_version'
                  AND c.relkind IN ('r', 'p')) AS versioned
"""

# A planned replay's first statement, sent ahead of its savepoint: the step's lock timeout, and
# the start the plan was proven from, as a setting the guard reads (no text is composed into
# the guard's body).
PLAN_SETTINGS = (
    "SELECT set_config('lock_timeout', {}, true), set_config('provisioner.upgrade_start', {}, true)"
)
# A planned replay's guard, under the savepoint and the schema's search_path, before the
# script: nothing of it runs on a schema that is not at the plan's start (another revision,
# already at the head, no version table). The error rolls back to the savepoint, and the step
# reads the schema's revisions first, as without a plan.
START_GUARD = """DO $guard$
BEGIN
    IF to_regclass('alembic_version') IS NULL THEN
        RAISE EXCEPTION 'the schema has no version table: not at the planned start';
    END IF;
    IF (SELECT string_agg(version_num, ',' ORDER BY version_num) FROM alembic_version)
       IS DISTINCT FROM current_setting('provisioner.upgrade_start') THEN
        RAISE EXCEPTION 'the schema is not at the planned start';
    END IF;
END
$guard$"""

#: The job payload key a fleet upgrade sets: the head label the job brings the tenant to.
UPGRADE_TO = "upgrade_to"

#: The statements a pure-DDL revision may emit, by their first words.
DDL = re.compile(r"(CREATE|ALTER|DROP|COMMENT|GRANT|REVOKE)\s", re.IGNORECASE)
#: Alembic's own bookkeeping of the version table (schema qualifier already removed).
VERSION_ROW = re.compile(
    r"(UPDATE alembic_version SET|INSERT INTO alembic_version|DELETE FROM alembic_version)\b"
)
#: Lines the replay sets itself or the step's transaction owns.
SESSION_LINES = re.compile(r"(BEGIN|COMMIT|SET LOCAL (search_path|lock_timeout)\b.*);?$", re.I)


@dataclass(frozen=True)
class UpgradeScript:
    """The DDL that brings a schema from ``start`` to ``heads``, schema-less, as one script."""

    digest: str
    start: frozenset[str]
    heads: frozenset[str]
    statements: tuple[str, ...]

    @property
    def script(self) -> str:
        return "\n".join(self.statements)

    @classmethod
    def capture(cls, start: frozenset[str], tree: Path | None = None) -> UpgradeScript:
        """Alembic offline for ``start:head``; refused unless it is DDL alone."""
        if len(start) != 1:
            raise NotReplayable(f"the schema records {len(start)} revisions (a merge point)")
        before = migrations.tenant_tree_state(tree)
        emitted = migrations.tenant_offline_sql(PLACEHOLDER_SCHEMA, tree=tree, start=start)
        if migrations.tenant_tree_state(tree) != before:
            raise NotReplayable("the tree changed while its SQL was captured")
        kept: list[str] = []
        for text in emitted:
            if _only_comments(text) or SESSION_LINES.match(text):
                continue
            text = text.replace(f"{PLACEHOLDER_SCHEMA}.", "")
            if PLACEHOLDER_SCHEMA in text:
                raise NotReplayable(f"a statement names the schema: {text[:80]!r}")
            if not (DDL.match(text) or VERSION_ROW.match(text)):
                raise NotReplayable(f"a statement is not DDL: {text[:80]!r}")
            kept.append(text)
        if not any(VERSION_ROW.match(t) for t in kept):
            raise NotReplayable("the offline SQL does not move the version table")
        return cls(before.digest, start, before.heads, tuple(kept))


def _set_lock_timeout_and_read_versions(
    tx: Transaction, schema: str, lock_timeout_ms: int, *, versioned: bool = False
) -> frozenset[str] | None:
    """Set the step's ``lock_timeout``; the revisions the schema records, None when it has no
    version table (what :func:`provisioner.templates.migrations.tenant_versions` says), in two round
    trips, one when there is no version table. With ``versioned`` (a spare this run took: the
    pool built it with its version table) both in one simple query, one round trip; a table
    that is gone after all fails the step, and its retry looks as above."""
    with tx.pg.cursor(row_factory=tuple_row) as cur:
        if versioned:
            cur.execute(
                sql.SQL("SELECT set_config('lock_timeout', {}, true); {}").format(
                    sql.Literal(f"{lock_timeout_ms}ms"), tenant_schema.versions_query(schema)
                ),
                prepare=False,  # one text per schema
            )
            cur.nextset()  # past the set_config's row, to the versions
            return frozenset(str(version[0]) for version in cur.fetchall())
        cur.execute(
            LOCK_TIMEOUT_AND_VERSION_TABLE,
            {"lock_timeout": f"{lock_timeout_ms}ms", "schema": schema},
        )
        row = cur.fetchone()
        if row is None or not row[1]:
            return None
        cur.execute(
            tenant_schema.versions_query(schema),
            prepare=False,  # one text per schema
        )
        return frozenset(str(version[0]) for version in cur.fetchall())


def _only_comments(text: str) -> bool:
    return all(not line.strip() or line.lstrip().startswith("--") for line in text.splitlines())


@dataclass(frozen=True)
class UpgradeOutcome:
    path: str  # 'replay' or 'alembic'
    start: frozenset[str]
    heads: frozenset[str]
    reason: str | None = None

    @property
    def detail(self) -> str:
        via = self.path if self.reason is None else f"{self.path} (fallback: {self.reason})"
        return (
            f"path={via} from={migrations.head_label(self.start)} "
            f"head={migrations.head_label(self.heads)}"
        )


ReferenceKey = tuple[str, frozenset[str], tuple[str, ...]]


@dataclass(frozen=True)
class ReferenceSource:
    """Where the reference of a replay on a tenant server is read, or computed and stored:
    control's (its :func:`provisioner.templates.replay.database_key`, and a transaction of its
    own there). The fingerprint does not depend on the database: the replay on the server is
    proven against it as on control."""

    key: tuple[str, ...]
    transaction: Callable[[], AbstractContextManager[Transaction]]


@dataclass(frozen=True)
class ReplayPlan:
    """A replay this cache proved on a tenant (its script and the reference it matched), tried
    first, in one round trip, on the next schema of the same tree state and database."""

    script: UpgradeScript
    reference: Fingerprint


@dataclass(frozen=True)
class UpgradeReference:
    """What Alembic built from a start to the head, and why the replay is refused (None: the
    offline SQL is what Alembic ran)."""

    fingerprint: Fingerprint
    refused: str | None = None


def upgrade_reference_key(digest: str, app_roles: AppRoles) -> str:
    """Where the reference of an upgrade of the tree state ``digest`` is stored: the template
    reference's key and the role set the scratch schema was granted for
    (:func:`provisioner.roles.identity`). The grants are part of the fingerprint: a reference of
    another role set would refuse every replay as a mismatch, so a change of roles computes a
    new one instead."""
    return f"{reference_key(digest)}/roles={roles.identity(app_roles)}"


def _load_reference(
    tx: Transaction, digest: str, start: str, app_roles: AppRoles
) -> UpgradeReference | None:
    with tx.pg.cursor(row_factory=dict_row) as cur:
        key = upgrade_reference_key(digest, app_roles)
        cur.execute(SELECT_REFERENCE, {"key": key, "start": start})
        row = cur.fetchone()
    if row is None:
        return None
    found = {name: [tuple(r) for r in rows] for name, rows in row["fingerprint"].items()}
    return UpgradeReference(found, row["replay_refused"])


def obtain_reference(
    tx: Transaction,
    start: frozenset[str],
    tree: migrations.TreeState,
    app_roles: AppRoles,
    created_by: str,
    script: UpgradeScript,
) -> UpgradeReference:
    """The stored reference of an upgrade from ``start``, computed and stored in ``tx`` when
    nobody did it yet (the caller's transaction holds the advisory lock until it ends)."""
    label = migrations.head_label(start)
    found = _load_reference(tx, tree.digest, label, app_roles)
    if found is not None:
        return found
    with tx.pg.cursor() as cur:
        cur.execute(
            LOCK_REFERENCE, {"class": REFERENCE_LOCK_CLASS, "digest": tree.digest, "start": label}
        )
    found = _load_reference(
        tx, tree.digest, label, app_roles
    )  # computed by the lock's previous holder
    if found is not None:
        return found
    reference = _compute_reference(tx, label, tree, app_roles, script)
    with tx.pg.cursor() as cur:
        cur.execute(
            INSERT_REFERENCE,
            {
                "key": upgrade_reference_key(tree.digest, app_roles),
                "start": label,
                "heads": sorted(tree.heads),
                "fingerprint": Jsonb(reference.fingerprint),
                "created_by": created_by,
                "refused": reference.refused,
            },
        )
    return reference


def _compute_reference(
    tx: Transaction,
    start: str,
    tree: migrations.TreeState,
    app_roles: AppRoles,
    script: UpgradeScript,
) -> UpgradeReference:
    """Alembic builds a scratch schema at ``start``, it is granted like a tenant, Alembic
    upgrades it to the head (recorded: :mod:`provisioner.templates.recording`), and its
    fingerprint is taken; the savepoint rolls all of it back. The session keeps its prepared
    statements through it (:func:`keeping_prepared_statements`: Alembic's ``ALTER``s and the
    rollback would have psycopg forget them all, and a worker's next five jobs plan the
    queue's statements and the fingerprint again); only the scratch schema changes, which no
    prepared statement names."""
    scratch = naming.scratch_name("upgrade")
    savepoint = sql.Identifier(SCRATCH_SAVEPOINT)
    with tx.pg.cursor() as cur, keeping_prepared_statements(tx.pg):
        cur.execute(sql.SQL("SAVEPOINT {}").format(savepoint))
        try:
            tenant_schema.create_schema(tx.pg, scratch)
            migrations.upgrade_tenant(tx.sa, scratch, start)
            tenant_schema.grant_app_roles(tx.pg, scratch, app_roles)
            with recording.recorded(tx.sa) as run:
                migrations.upgrade_tenant(tx.sa, scratch, start=frozenset([start]))
            refused = run.refusal(script.statements, scratch)
            if migrations.tenant_tree_state() != tree:
                raise NotReplayable("the tree changed while the upgrade reference was built")
            # Read as the replay reads a tenant: under the session's search_path, not the
            # scratch schema Alembic left in it (it changes how names are printed).
            cur.execute("SET LOCAL search_path TO DEFAULT")
            with preparing_again(tx.pg):  # the fingerprint's plan, made ahead, is bound
                return UpgradeReference(fingerprint(tx.pg, scratch), refused)
        finally:
            cur.execute(sql.SQL("ROLLBACK TO SAVEPOINT {}").format(savepoint))
            cur.execute(sql.SQL("RELEASE SAVEPOINT {}").format(savepoint))


class UpgradeCache:
    """An engine's upgrade scripts and reference fingerprints, keyed by tree and start (owned
    by the engine and passed in the step context, like the template cache)."""

    def __init__(self) -> None:
        self.scripts: dict[tuple[str, frozenset[str]], UpgradeScript | str] = {}
        self.references: dict[ReferenceKey, UpgradeReference] = {}
        #: (reference key, database key) -> the last replay proven there (see :meth:`migrate`)
        self.plans: dict[tuple[str, tuple[str, ...]], ReplayPlan] = {}
        self._lock = threading.Lock()

    def clear(self) -> None:
        with self._lock:
            self.scripts.clear()
            self.references.clear()
            self.plans.clear()

    def migrate(
        self,
        tx: Transaction,
        schema: str,
        *,
        lock_timeout_ms: int,
        templates: TemplateCache,
        app_roles: AppRoles,
        versioned: bool = False,
        existing: bool = False,
    ) -> str:
        """Bring ``schema`` to head in the step's transaction; the step record's detail.

        A new schema (no version table) and one already at head go to the provisioning fast
        path (``templates``, the engine's); a schema behind the head is upgraded here.
        ``versioned``: the schema is known to have a version table (a spare this run took).

        ``existing``: the schema was there before this run (a fleet upgrade's job), so it is
        likely at the start of the last replay this cache proved for the tree: that plan is
        tried first, in ONE round trip (:meth:`_planned`). Without a plan, or when the schema
        is not at its start, the revisions are read first and the replay's script and
        reference looked up for them, three round trips more.
        """
        if existing:
            planned = self._planned(tx, schema, lock_timeout_ms, app_roles)
            if planned is not None:
                return planned.detail
        with translated():
            versions = _set_lock_timeout_and_read_versions(
                tx, schema, lock_timeout_ms, versioned=versioned
            )
        tree = migrations.tenant_tree_state()
        if versions == tree.heads:
            # What the template cache would say after reading the versions again (a taken
            # spare, a re-run): three round trips fewer.
            return Outcome("current", tree.heads).detail
        if not versions:
            return templates.migrate(tx, schema, tree).detail  # the state read above, once
        with translated():
            # Tenants granted by an earlier release let the application role write the version
            # table: from this upgrade on it cannot (and the replay's reference has it so).
            tenant_schema.revoke_version_writes(tx.pg, schema, app_roles)
        with self._lock:
            return self._upgrade(tx, schema, versions, tree, app_roles, templates.holder).detail

    def upgrade_placed(
        self,
        tx: Transaction,
        schema: str,
        *,
        lock_timeout_ms: int,
        app_roles: AppRoles,
        holder: str,
        source: ReferenceSource,
    ) -> str | None:
        """A schema on a tenant server to the head in the step's transaction there, as
        :meth:`migrate` does with ``existing`` on control (the last plan proven on this server
        first, else the verified replay, else Alembic), with the reference read from control
        (``source``; computed and stored there once when missing). Its detail; None when the
        schema records no revision (a new schema: the caller's template path)."""
        planned = self._planned(tx, schema, lock_timeout_ms, app_roles)
        if planned is not None:
            return planned.detail
        with translated():
            versions = _set_lock_timeout_and_read_versions(tx, schema, lock_timeout_ms)
        tree = migrations.tenant_tree_state()
        if not versions:
            return None
        if versions == tree.heads:
            return Outcome("current", tree.heads).detail
        with translated():
            tenant_schema.revoke_version_writes(tx.pg, schema, app_roles)
        with self._lock:
            return self._upgrade(tx, schema, versions, tree, app_roles, holder, source).detail

    def _upgrade(
        self,
        tx: Transaction,
        schema: str,
        start: frozenset[str],
        tree: migrations.TreeState,
        app_roles: AppRoles,
        holder: str,
        source: ReferenceSource | None = None,
    ) -> UpgradeOutcome:
        script = self.scripts.get((tree.digest, start))
        if script is None:
            try:
                script = UpgradeScript.capture(start)
            except NotReplayable as exc:
                script = str(exc)
            except Exception as exc:  # e.g. a revision the tree does not know: Alembic says it
                script = f"cannot capture the upgrade's SQL: {type(exc).__name__}: {exc}"
            self.scripts[(tree.digest, start)] = script
        if isinstance(script, str):
            return self._alembic(tx, schema, start, reason=script)
        if script.digest != tree.digest:
            del self.scripts[(tree.digest, start)]
            return self._alembic(tx, schema, start, reason="the tree changed since the capture")
        home = database_key(tx) if source is None else source.key
        key = (upgrade_reference_key(tree.digest, app_roles), start, home)
        reference = self.references.get(key)
        if reference is None:
            try:
                if source is None:
                    reference = obtain_reference(tx, start, tree, app_roles, holder, script)
                else:  # the server's transaction waits meanwhile: kept alive
                    with kept_alive(tx.pg), source.transaction() as at_home:
                        reference = obtain_reference(
                            at_home, start, tree, app_roles, holder, script
                        )
            except NotReplayable as exc:
                return self._alembic(tx, schema, start, reason=str(exc))
            self.references[key] = reference
        if reference.refused is not None:
            return self._alembic(tx, schema, start, reason=reference.refused)
        problem = self._replay(tx, schema, script, reference.fingerprint)
        if problem is None:
            # kept for the database the replay ran in (a tenant server's own plan)
            self.plans[(key[0], database_key(tx))] = ReplayPlan(script, reference.fingerprint)
            return UpgradeOutcome("replay", start, tree.heads)
        return self._alembic(tx, schema, start, reason=problem)

    def _planned(
        self, tx: Transaction, schema: str, lock_timeout_ms: int, app_roles: AppRoles
    ) -> UpgradeOutcome | None:
        """The last proven replay of this tree state, tried on ``schema`` in one round trip:
        the lock timeout, then under the savepoint the start's guard (:data:`START_GUARD`), the
        version table's revoke, the script and the version read; then the fingerprint,
        compared with the plan's reference as any replay's is. None when there is no plan or
        it did not hold (rolled back to the savepoint: the caller goes the read-first way,
        which says why in the step record if the replay is refused there too). A lock timeout
        propagates, as from any replay."""
        tree = migrations.tenant_tree_state()
        plan = self.plans.get((upgrade_reference_key(tree.digest, app_roles), database_key(tx)))
        if plan is None:
            return None
        before = sql.SQL(PLAN_SETTINGS).format(
            sql.Literal(f"{lock_timeout_ms}ms"),
            sql.Literal(migrations.head_label(plan.script.start)),
        )
        setup = sql.SQL("; ").join(
            [
                sql.SQL(START_GUARD),
                *(tenant_schema.version_writes_revoke(schema, role.name) for role in app_roles),
            ]
        )
        problem = replay_verified(
            tx,
            schema,
            plan.script.script,
            plan.reference,
            savepoint=SAVEPOINT,
            before=before,
            setup=setup,
        )
        if problem is not None:
            return None
        return UpgradeOutcome("replay", plan.script.start, plan.script.heads)

    def _replay(
        self, tx: Transaction, schema: str, script: UpgradeScript, reference: Fingerprint
    ) -> str | None:
        """Replay under a savepoint; None when the result matches the reference, else why it
        was rolled back. A lock timeout (:class:`LockNotAvailable`, a transient error and no
        :class:`DatabaseError`) is raised, not turned into a fallback."""
        return replay_verified(tx, schema, script.script, reference, savepoint=SAVEPOINT)

    def _alembic(
        self, tx: Transaction, schema: str, start: frozenset[str], *, reason: str
    ) -> UpgradeOutcome:
        """Run the revisions in place through Alembic, saying why the replay did not."""
        migrations.upgrade_tenant(tx.sa, schema, start=start)
        return UpgradeOutcome("alembic", start, migrations.tenant_heads(), reason)
