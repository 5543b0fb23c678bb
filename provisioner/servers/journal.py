"""The tool's own small schema on each tenant server: the journal of finished steps and the
fence, and the seeds' record there.

A job of a tenant placed on a tenant server commits each step twice: on the tenant's server
(the step's DDL, its journal row and the fence check, in ONE transaction), then in ``control``
(the job's checkpoint). A crash between the two leaves the step in this journal and not in the
checkpoint: the resume adopts it (after the catalog confirms its effect), so no step's effect is
repeated or lost (:mod:`provisioner.engine.remote`).

The fence: one row per tenant carrying the token of the run that last wrote there. A run's
token is a transaction id of ``control``, taken by a write fenced by the job's lease
(:func:`provisioner.queue.fence_token`), so a run that took the job over always holds a larger
token than the run it took it from (the invariant: :mod:`provisioner.queue.fence`). A run
raises the fence to its token when it begins (before it adopts anything), in the transaction
that reads this journal (both sent with its BEGIN, :func:`fence_opening`) and, when there is
nothing to adopt, goes on to run its first step; every step transaction here raises it again
with its journal row, in one statement sent with its COMMIT (:func:`end_step`), refused when
the fence holds a larger one (SQLSTATE PV002: nothing commits): a holder whose lease was
taken over (a frozen process that wakes up) cannot write on the tenant's server once its
successor has begun.

The schema is versioned (:data:`VERSION`) and applied by ``provisioner migrate`` to every server
not retired (:func:`migrate`); the worker refuses to start while an active server is behind.
It is not an Alembic tree: it is three tables the tool alone reads, created in one
transaction per version, with no downgrade.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any
from uuid import UUID

import psycopg
from psycopg import sql
from psycopg.rows import tuple_row

from provisioner.db import Transaction
from provisioner.errors import LeaseLost
from provisioner.models import TenantId

#: The tool's schema on a tenant server (never a tenant's: no tenant naming makes it).
SCHEMA = "provisioner_server"
#: The key of the transaction-level advisory lock two migrations of one server take in turn.
MIGRATE_LOCK_KEY = 0x70726F76  # "prov"

# Version 1: the journal, the fence, the seeds' record (as control.tenant_seeds, by the schema's
# OID on this server). The owner creates them: the application role gets nothing here.
_V1 = """
CREATE SCHEMA IF NOT EXISTS provisioner_server;
CREATE TABLE provisioner_server.schema_version (
  version integer PRIMARY KEY,
  applied_at timestamptz NOT NULL DEFAULT now()
);
CREATE TABLE provisioner_server.fences (
  tenant_id text PRIMARY KEY,
  token bigint NOT NULL,
  job_id uuid NOT NULL,
  updated_at timestamptz NOT NULL DEFAULT now()
);
CREATE TABLE provisioner_server.step_journal (
  tenant_id text NOT NULL,
  job_id uuid NOT NULL,
  step text NOT NULL,
  token bigint NOT NULL,
  detail text,
  finished_at timestamptz NOT NULL DEFAULT clock_timestamp(),
  PRIMARY KEY (tenant_id, job_id, step)
);
CREATE TABLE provisioner_server.tenant_seeds (
  tenant_id text NOT NULL,
  schema_oid oid NOT NULL,
  seed text NOT NULL,
  digest text NOT NULL,
  applied_at timestamptz NOT NULL DEFAULT now(),
  PRIMARY KEY (schema_oid, seed)
);
"""

# Version 2: each journal row says which run of its job wrote it. A re-opened job (a fleet
# upgrade's) keeps its id, and the rows of its earlier run are not this run's to adopt: without
# the run, every such job checked those steps' effects on the catalog first (two round trips
# and a wasted check per tenant of a rollout). Rows written before it say NULL: any run's, and
# checked as before. And the refusal of a journal row by the fence is an error of its own
# (SQLSTATE PV002), so that the row can ride on its transaction's COMMIT (RECORD_STEP).
_V2 = """
ALTER TABLE provisioner_server.step_journal ADD COLUMN run integer;
CREATE FUNCTION provisioner_server.fenced_out(refusal text) RETURNS bigint
LANGUAGE plpgsql VOLATILE SET search_path = pg_catalog AS $fenced$
BEGIN
    RAISE EXCEPTION USING ERRCODE = 'PV002', MESSAGE = refusal;
END
$fenced$;
REVOKE ALL ON FUNCTION provisioner_server.fenced_out(text) FROM PUBLIC;
"""

#: Each version's statements, in order; a server at version N runs those after N.
MIGRATIONS: tuple[tuple[int, str], ...] = ((1, _V1), (2, _V2))
#: The version this build needs on every active tenant server.
VERSION = MIGRATIONS[-1][0]

#: The seeds' record on a tenant server (as control.tenant_seeds on the control database).
SEEDS_TABLE = sql.Identifier(SCHEMA, "tenant_seeds")

# Whether the schema was ever applied, then its version (a query naming a missing table fails
# when it is parsed, whatever its CASE).
APPLIED = "SELECT to_regclass('provisioner_server.schema_version') IS NOT NULL"
READ_VERSION = "SELECT coalesce(max(version), 0) FROM provisioner_server.schema_version"
RECORD_VERSION = "INSERT INTO provisioner_server.schema_version (version) VALUES (%(version)s)"

# The tenant's fence raised to the run's token: no row when a larger token holds it (a run that
# took the job over, or a later job of the tenant); the row locked until the transaction ends.
# Both statements below raise it this way; a ``str.format`` template (its names filled with
# literals by :func:`fence_opening` and :func:`end_step`).
RAISE_FENCE = """INSERT INTO provisioner_server.fences AS f (tenant_id, token, job_id)
VALUES ({tenant}, {token}, {job})
ON CONFLICT (tenant_id) DO UPDATE
   SET token = EXCLUDED.token, job_id = EXCLUDED.job_id, updated_at = now()
 WHERE f.token <= EXCLUDED.token
RETURNING token"""

# Every transaction of a step on a tenant server commits waiting for the disk, whatever the
# server's default (``synchronous_commit = off`` is a throughput setting some deployments
# choose): control's checkpoint follows that commit, so a server crash must not undo a step it
# recorded, nor a fence a successor raised
# (``tests/crash/test_server_commit_durable.py``). Set in the transaction's first statement
# (the fence's raise) and in its last (the journal row's), which every such transaction has.
DURABLE_COMMIT = "set_config('synchronous_commit', 'on', true)"

# The first statements of the transaction that raises the fence, sent with its BEGIN (one
# simple query, one round trip; values as literals): the lock timeout (a frozen holder whose
# first step's transaction still holds the fence row fails the run as contended, rather than
# hanging it); the tenant's fence raised to this run's token (:data:`RAISE_FENCE`: its row lock
# makes one step of a tenant at a time run on its server); then the steps of the job's
# run the journal shows done (a row of no known run: any run's). The read is a statement of its
# own: its snapshot is taken once the raise has its row lock, so it sees a step that an older
# holder of the run committed while the raise waited for that lock.
FENCE_OPENING = f"""SELECT set_config('lock_timeout', {{lock_timeout}}, true), {DURABLE_COMMIT};
{RAISE_FENCE};
SELECT step FROM provisioner_server.step_journal
 WHERE tenant_id = {{tenant}} AND job_id = {{job}} AND (run IS NULL OR run = {{run}})"""

# A finished step, sent with the COMMIT of the step's own transaction (one round trip:
# :meth:`provisioner.db.Transaction.end_with`), and the fence raised to its token in the same
# statement. When a larger token holds the fence (the run was taken over), the fence yields no
# row and ``fenced_out`` raises (SQLSTATE PV002): the COMMIT never runs, and the transaction,
# the step's DDL with it, is rolled back. A step that runs again (its effect vanished from the
# catalog) overwrites its row. Values as literals: a simple query carries no parameters.
RECORD_STEP = f"""SELECT {DURABLE_COMMIT};
WITH fence AS ({RAISE_FENCE})
INSERT INTO provisioner_server.step_journal (tenant_id, job_id, step, token, detail, run)
VALUES ({{tenant}}, {{job}}, {{step}},
        coalesce((SELECT token FROM fence), provisioner_server.fenced_out({{refusal}})),
        {{detail}}, {{run}})
ON CONFLICT (tenant_id, job_id, step) DO UPDATE
   SET token = EXCLUDED.token, detail = EXCLUDED.detail, run = EXCLUDED.run,
       finished_at = clock_timestamp()
"""


@dataclass(frozen=True)
class Migrated:
    """One server's schema version before and after :func:`migrate`."""

    before: int | None
    after: int


def version(conn: psycopg.Connection[Any]) -> int | None:
    """The server's version of the tool's schema (None: never applied)."""
    with conn.cursor(row_factory=tuple_row) as cur:
        applied = cur.execute(APPLIED).fetchone()
        if applied is None or not applied[0]:
            return None
        row = cur.execute(READ_VERSION).fetchone()
    return int(row[0]) if row else 0


def behind(conn: psycopg.Connection[Any]) -> str | None:
    """Why the server's tool schema cannot serve this build (None: it can): what ``servers
    check``, a worker's start, an engine's first use of a server and ``move --to`` refuse."""
    have = version(conn)
    if have is None or have < VERSION:
        return (
            f"its tool schema is at version {have or 0}, this build needs {VERSION}: "
            "run `provisioner migrate`"
        )
    return None


def migrate(conn: psycopg.Connection[Any]) -> Migrated:
    """Apply the versions the server lacks, in one transaction (the caller's connection, not in
    a transaction), under a lock so that two migrations of one server run in turn."""
    with conn.transaction(), conn.cursor(row_factory=tuple_row) as cur:
        cur.execute("SELECT pg_advisory_xact_lock(%s)", (MIGRATE_LOCK_KEY,))
        before = version(conn)
        for number, statements in MIGRATIONS:
            if before is not None and number <= before:
                continue
            cur.execute(statements.encode(), prepare=False)
            cur.execute(RECORD_VERSION, {"version": number})
        row = cur.execute(READ_VERSION).fetchone()
    return Migrated(before, int(row[0]) if row else VERSION)


def _fenced_out(tenant: TenantId, job: UUID, token: int) -> str:
    return (
        f"job {job}: tenant {tenant}'s fence on its server holds a later run than this one "
        f"(token {token}): the job was taken over"
    )


@dataclass(frozen=True)
class FencedRun:
    """Which run of which job writes or reads the journal, under which fencing token."""

    tenant: TenantId
    job: UUID
    run: int
    token: int

    def params(self) -> dict[str, Any]:
        return {"tenant": self.tenant.value, "job": self.job, "run": self.run, "token": self.token}


def end_step(tx: Transaction, writer: FencedRun, step: str, detail: str | None) -> None:
    """Have the step's transaction on the tenant's server end with its journal row and the
    fence raised to the run's token, sent with its COMMIT (:data:`RECORD_STEP`). Its commit
    raises :class:`LeaseLost` when a larger token holds the fence (nothing of the transaction
    is then committed, the step's work with it)."""
    values = {name: sql.Literal(value) for name, value in writer.params().items()}
    refusal = _fenced_out(writer.tenant, writer.job, writer.token)
    tx.end_with(
        sql.SQL(RECORD_STEP).format(
            **values,
            step=sql.Literal(step),
            detail=sql.Literal(detail),
            refusal=sql.Literal(refusal),
        )
    )


def fence_opening(reader: FencedRun, lock_timeout_ms: int) -> sql.Composable:
    """:data:`FENCE_OPENING` for this run: the ``first`` statement of the transaction that
    raises the fence (:meth:`provisioner.db.Session.transaction`); :func:`fenced_steps` reads
    what it found."""
    values = {name: sql.Literal(value) for name, value in reader.params().items()}
    return sql.SQL(FENCE_OPENING).format(**values, lock_timeout=sql.Literal(f"{lock_timeout_ms}ms"))


def fenced_steps(tx: Transaction, reader: FencedRun) -> frozenset[str]:
    """The steps of the job's run the journal shows done, from the results of the
    transaction's :func:`fence_opening`; :class:`LeaseLost` when a larger token holds the
    fence (the transaction is then to be rolled back)."""
    results = tx.first_results
    assert results is not None, "the transaction was begun with its fence_opening"
    results.nextset()  # past the BEGIN, to the lock timeout's row
    results.nextset()  # to the fence's
    if results.fetchone() is None:
        raise LeaseLost(_fenced_out(reader.tenant, reader.job, reader.token))
    results.nextset()  # to the journal's rows
    return frozenset(str(row[0]) for row in results.fetchall())
