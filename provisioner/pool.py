"""The warm pool: spare tenant schemas built ahead of demand, taken by a rename.

With ``PROVISIONER_POOL_SIZE=N`` the worker keeps N spares, built while it is otherwise idle by
the verified replay of :mod:`provisioner.template_reference` (the stored reference's statements,
then a fingerprint that must equal the reference's), each in ONE transaction together with its
row in ``control.tenant_pool``: a crash leaves a verified spare or nothing.

A spare is invisible to the application and to users until it is taken:

* its name is ``pool_<hex>``, never ``tenant_<id>``, and nothing is granted on it (``app_rw``
  has no USAGE: any access is refused);
* it has no job and no tenant row, so ``jobs list``, ``status`` and ``upgrade --all`` never see
  it; only the worker's heartbeat (and so ``health --json``) reports the pool.

The ``create_schema`` step takes one (:func:`take`): in the step's transaction it deletes the
oldest spare row built for the tree state on disk (``FOR UPDATE SKIP LOCKED``: two takers never
get one spare) and renames the schema to ``tenant_<id>``; the step's own record commits with it.
A crash before that commit leaves the spare (row and schema); after it, the tenant. A spare built
for another tree state (the template's head changed, or its files) is never handed out: the
keeper drops it and builds a new one. When no spare is ready the step creates an empty schema as
it always did.
"""

from __future__ import annotations

import logging
import secrets
import threading
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any

from psycopg import sql
from psycopg.rows import dict_row

from provisioner import db, migrations, template_reference
from provisioner.db import DatabaseError, Transaction
from provisioner.errors import DatabaseUnavailable, PermanentError, ProvisionerError
from provisioner.logs import event
from provisioner.template_reference import TemplateUnusable
from provisioner.template_replay import replay

#: Spare schemas are ``pool_`` and 16 hex digits: never a valid ``tenant_<id>``.
SPARE_PREFIX = "pool_"

# -- statements ---------------------------------------------------------------------------------

# Take the oldest spare of this tree state whose schema exists, unless the tenant's schema
# already does (a resume): the row goes, the caller renames the schema in the same transaction.
TAKE_SPARE = """
DELETE FROM control.tenant_pool
 WHERE schema_name = (
       SELECT p.schema_name FROM control.tenant_pool p
        WHERE p.tree_digest = %(digest)s
          AND EXISTS (SELECT 1 FROM pg_namespace n WHERE n.nspname = p.schema_name)
          AND NOT EXISTS (SELECT 1 FROM pg_namespace n WHERE n.nspname = %(tenant)s)
        ORDER BY p.created_at
        LIMIT 1
          FOR UPDATE SKIP LOCKED)
RETURNING schema_name
"""

# Record a spare built (and verified) in the same transaction.
ADD_SPARE = """
INSERT INTO control.tenant_pool (schema_name, tree_digest, heads, created_by)
VALUES (%(schema)s, %(digest)s, %(heads)s, %(created_by)s)
"""

# Spares ready for this tree state, and the useless ones: built for another tree state, or
# whose schema is gone (dropped by hand).
COUNT_SPARES = """
SELECT count(*) FILTER (WHERE usable) AS ready, count(*) FILTER (WHERE NOT usable) AS stale
  FROM (SELECT tree_digest = %(digest)s
               AND EXISTS (SELECT 1 FROM pg_namespace n WHERE n.nspname = p.schema_name) AS usable
          FROM control.tenant_pool p) s
"""

# One useless spare, to drop (with its schema, if any) in the same transaction.
CLAIM_STALE_SPARE = """
DELETE FROM control.tenant_pool
 WHERE schema_name = (
       SELECT p.schema_name FROM control.tenant_pool p
        WHERE p.tree_digest <> %(digest)s
           OR NOT EXISTS (SELECT 1 FROM pg_namespace n WHERE n.nspname = p.schema_name)
        ORDER BY p.created_at LIMIT 1 FOR UPDATE SKIP LOCKED)
RETURNING schema_name
"""

# One builder at a time per database (worker replicas share the pool): try, never wait.
TRY_BUILD_LOCK = "SELECT pg_try_advisory_xact_lock(%(class)s, 0) AS locked"

#: First key of the pool builders' advisory lock ('pool').
POOL_LOCK_CLASS = 0x706F6F6C


class SpareRejected(Exception):
    """A freshly built spare did not match the reference (it was rolled back)."""


@dataclass(frozen=True)
class PoolCounts:
    #: spares at the tree state on disk: what provisioning can take
    ready: int
    #: spares at another tree state: never handed out, rebuilt by the keeper
    stale: int


# -- operations ---------------------------------------------------------------------------------


def take(tx: Transaction, tenant_schema_name: str) -> str | None:
    """Rename a ready spare to the tenant's schema in ``tx``; the step detail, or None when no
    spare is ready (or the tenant's schema already exists)."""
    digest = migrations.tenant_tree_state().digest
    with tx.pg.cursor() as cur:
        cur.execute(TAKE_SPARE, {"digest": digest, "tenant": tenant_schema_name})
        row = cur.fetchone()
        if row is None:
            return None
        spare = str(row[0])
        # The rename and the catalog's view of the result in one round trip (simple query).
        cur.execute(
            sql.SQL(
                "ALTER SCHEMA {} RENAME TO {}; "
                "SELECT (SELECT pg_get_userbyid(nspowner) FROM pg_namespace WHERE nspname = {}), "
                "current_user"
            ).format(
                sql.Identifier(spare),
                sql.Identifier(tenant_schema_name),
                sql.Literal(tenant_schema_name),
            )
        )
        cur.nextset()  # past the ALTER's empty result, to the SELECT's row
        checked = cur.fetchone()
    assert checked is not None
    owner, me = checked[0], checked[1]
    if owner != me:  # as create_schema checks: the catalog must show the schema as ours
        raise PermanentError(
            f"spare {spare} is owned by role {owner}, not {me}; drop it from control.tenant_pool"
        )
    return f"taken from the warm pool: {spare}"


def counts(conn: Any) -> PoolCounts:
    """How many spares are ready for the tree on disk, and how many are stale."""
    with conn.cursor(row_factory=dict_row) as cur:
        cur.execute(COUNT_SPARES, {"digest": migrations.tenant_tree_state().digest})
        row = cur.fetchone()
    assert row is not None
    return PoolCounts(ready=int(row["ready"]), stale=int(row["stale"]))


def build_spare(tx: Transaction, created_by: str) -> str:
    """Build one spare at the head in ``tx`` and record it; its name. The reference is read
    (or computed once, see :mod:`provisioner.template_reference`) first. Raises
    :class:`SpareRejected` when the replay does not match, :class:`TemplateUnusable` when the
    tree cannot be replayed; the caller's transaction then rolls back."""
    tree = migrations.tenant_tree_state()
    reference, _ = template_reference.obtain(tx, tree, created_by)
    name = f"{SPARE_PREFIX}{secrets.token_hex(8)}"
    with tx.pg.cursor() as cur:
        cur.execute(
            sql.SQL("CREATE SCHEMA {} AUTHORIZATION CURRENT_USER").format(sql.Identifier(name))
        )
    problem = replay(tx, name, reference)
    if problem is not None:
        raise SpareRejected(problem)
    with tx.pg.cursor() as cur:
        cur.execute(
            ADD_SPARE,
            {
                "schema": name,
                "digest": reference.digest,
                "heads": sorted(reference.heads),
                "created_by": created_by,
            },
        )
    return name


def build_spare_if_short(tx: Transaction, size: int, created_by: str) -> str | None:
    """Build one spare unless another builder is at work or the pool already holds ``size``
    ready spares (counted again under the lock); its name, or None."""
    with tx.pg.cursor(row_factory=dict_row) as cur:
        cur.execute(TRY_BUILD_LOCK, {"class": POOL_LOCK_CLASS})
        row = cur.fetchone()
    if not (row and row["locked"]) or counts(tx.pg).ready >= size:
        return None
    return build_spare(tx, created_by)


def drop_stale_spare(tx: Transaction) -> str | None:
    """Drop one useless spare (row and schema, if any); its name, or None."""
    with tx.pg.cursor() as cur:
        cur.execute(CLAIM_STALE_SPARE, {"digest": migrations.tenant_tree_state().digest})
        row = cur.fetchone()
        if row is None:
            return None
        cur.execute(sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(sql.Identifier(str(row[0]))))
    return str(row[0])


# -- the keeper ---------------------------------------------------------------------------------


class PoolKeeper(threading.Thread):
    """The worker's pool thread: keeps ``size`` spares ready while the worker is idle.

    One spare per transaction, then it asks again whether the worker is idle, so a job that
    arrives waits for no build. It runs Alembic only to compute a missing reference, and it is
    the only thread of the worker's parent process that does.
    """

    #: How often a full (or busy) pool is looked at again.
    CHECK_SECONDS = 0.5

    def __init__(
        self,
        owner_url: str,
        size: int,
        holder: str,
        is_idle: Callable[[], bool],
        log: logging.Logger,
    ) -> None:
        super().__init__(name="pool-keeper", daemon=True)
        self.size = size
        self.holder = holder
        self.is_idle = is_idle
        self.log = log
        self.halt = threading.Event()
        self.wake = threading.Event()
        self._db = db.Database(owner_url, application_name=holder)
        self._status: dict[str, Any] = {"size": size, "ready": None, "stale": None}
        self._problem: str | None = None

    def status(self) -> dict[str, Any]:
        """The heartbeat's ``pool`` entry."""
        return dict(self._status)

    def run(self) -> None:
        try:
            while not self.halt.is_set():
                busy = self._tend()
                if not busy:
                    self.wake.wait(self.CHECK_SECONDS)
                    self.wake.clear()
        finally:
            self._db.close()

    def _tend(self) -> bool:
        """One unit of work; True when there may be more to do at once."""
        try:
            with self._db.transaction() as tx:
                found = counts(tx.pg)
            self._status.update(asdict(found), size=self.size, error=self._problem)
            if not self.is_idle() or self._problem is not None:
                return False
            if found.stale:
                with self._db.transaction() as tx:
                    dropped = drop_stale_spare(tx)
                if dropped:
                    event(self.log, "pool_spare_dropped", schema=dropped, reason="stale head")
                return dropped is not None
            if found.ready >= self.size:
                return False
            with self._db.transaction() as tx:
                name = build_spare_if_short(tx, self.size, self.holder)
            if name is None:
                return False
            event(self.log, "pool_spare_built", schema=name, ready=found.ready + 1)
            return True
        except (SpareRejected, TemplateUnusable) as exc:
            # The replay cannot be trusted for this tree: stop building (provisioning goes on).
            self._problem = f"spares not built: {exc}"
            event(self.log, "pool_disabled", logging.ERROR, error=self._problem)
            return False
        except (DatabaseUnavailable, DatabaseError) as exc:
            self._status["error"] = str(exc)
            self.halt.wait(2.0)  # the worker logs outages; try again later
            return False
        except ProvisionerError as exc:  # e.g. a spare's owner is wrong: say so, go on later
            self._status["error"] = str(exc)
            event(self.log, "pool_error", logging.WARNING, error=str(exc))
            self.halt.wait(2.0)
            return False

    def stop(self) -> None:
        self.halt.set()
        self.wake.set()
        self.join(10)
