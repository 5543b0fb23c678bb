"""Fleet upgrades: find the tenants behind the tenant template's head and queue them.

"Who is behind" is two kinds of query, whatever the fleet's size: one catalog lookup for the
schemas that have a version table, then their versions read by strings of ``COPY ... TO
STDOUT`` statements, :data:`VERSION_CHUNK` tables each, over :data:`VERSION_SESSIONS` sessions.
Each string runs as one implicit transaction, so 10,000 tenants never hold 10,000 table locks
at once (the lock table would run out). Every answer is read from the schema's own
``alembic_version`` table, never from a cache a hand-run Alembic could leave stale.

A worker then re-runs ``run_tenant_migrations`` alone for each queued tenant, replaying the new
revisions' DDL when :mod:`provisioner.templates.upgrade` can verify it, else through Alembic.
Tenants whose lifecycle state is suspended, archived or deleted are left alone and reported.
"""

from __future__ import annotations

import csv
import io
import selectors
from collections import Counter
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from contextlib import closing
from dataclasses import dataclass
from typing import Any

import psycopg
from psycopg import pq, sql
from psycopg.errors import error_from_result
from psycopg.rows import tuple_row

from provisioner import db, queue
from provisioner.errors import InvalidInput, UnknownTenant, WrongState
from provisioner.fleet import rollout
from provisioner.models import Job, JobStatus, TenantId
from provisioner.settings import Settings
from provisioner.templates import migrations
from provisioner.tenant import row as tenants

#: Version tables per string of ``COPY`` statements (one round trip, one implicit transaction,
#: so as many table locks). ``COPY table TO STDOUT`` is not planned: a ``UNION ALL`` of the same
#: tables also opened each one's index and sized its files for the planner, and planning grew
#: faster than its branches (10,000 real tenants, two sessions, same minute: ``UNION ALL`` in
#: chunks of 100 0.56 s; ``COPY`` in strings of 100 0.40 s, of 500 0.33 s, of 1,000 0.32 s).
VERSION_CHUNK = 500

#: Sessions reading versions at once for a large fleet: each table costs the server a lock and
#: a relation open in a cold session, so two backends nearly halve the time on a 2-core machine
#: (``COPY`` strings of 500 over 10,000 tenants: 0.44 s with one session, 0.33 s with two; the
#: former ``UNION ALL``: 0.56 s with two, 0.81 s with three).
VERSION_SESSIONS = 2

#: A tenant stuck behind a long migration's lock fails the command rather than hang it.
UPGRADE_OPTIONS = {"lock_timeout": "5s"}

# The schemas (of those named) that hold a version table: one catalog lookup by relname. A
# session reading a share of them (``oid % shares = share``) finds its own share.
VERSIONED_SCHEMAS = """
SELECT n.nspname, c.oid, c.relkind = 'p' FROM pg_class c
  JOIN pg_namespace n ON n.oid = c.relnamespace
 WHERE c.relname = 'alembic_version' AND c.relkind IN ('r', 'p') AND n.nspname = ANY(%(schemas)s)
   AND c.oid::int8 %% %(shares)s = %(share)s
"""

# Every tenant schema that holds a version table (a fleet-wide upgrade reads them all while
# it reads the jobs; spares are named pool_*). The pattern's "_" is escaped: a literal one.
VERSIONED_TENANT_SCHEMAS = r"""
SELECT n.nspname, c.oid, c.relkind = 'p' FROM pg_class c
  JOIN pg_namespace n ON n.oid = c.relnamespace
 WHERE c.relname = 'alembic_version' AND c.relkind IN ('r', 'p')
   AND n.nspname LIKE 'tenant\_%%' AND c.oid::int8 %% %(shares)s = %(share)s
"""

# Tenants an upgrade leaves alone, by lifecycle state.
TENANTS_LEFT_ALONE = """
SELECT tenant_id, state FROM control.tenants WHERE state = ANY(%(states)s)
"""


@dataclass(frozen=True, order=True)
class VersionTable:
    """A schema's ``alembic_version`` table, found in the catalog."""

    schema: str
    oid: int
    #: a partitioned table (``COPY`` reads it through a query, as it cannot name it)
    partitioned: bool = False

    def copy_statement(self, conn: psycopg.Connection[Any]) -> bytes:
        """``COPY ... TO STDOUT`` of its versions, one CSV line each."""
        table = sql.Identifier(self.schema, "alembic_version").as_bytes(conn)
        source = b"(SELECT version_num FROM " + table + b")" if self.partitioned else table
        if not self.partitioned:
            source += b" (version_num)"
        return b"COPY " + source + b" TO STDOUT (FORMAT csv)"


@dataclass(frozen=True)
class TenantUpgrade:
    """A provisioned tenant whose schema is behind the tenant template's head."""

    job: Job
    #: what ``alembic_version`` in its schema records; empty when there is no version table
    versions: frozenset[str]
    #: 'queued' (a worker brings it to head), or 'would queue' (``dry_run``)
    action: str


@dataclass(frozen=True)
class SkippedTenant:
    """A tenant left alone because of its lifecycle state."""

    tenant_id: str
    state: str


@dataclass(frozen=True)
class UpgradeReport:
    heads: frozenset[str]
    checked: int
    behind: list[TenantUpgrade]
    #: tenants whose job has not succeeded: they reach head when it runs (or after a retry)
    unfinished: list[Job]
    #: tenants whose lifecycle state keeps them out of an upgrade
    skipped: list[SkippedTenant]
    #: the rollout recorded for the queued tenants (None with ``dry_run`` or nothing behind)
    rollout_id: int | None = None

    def versions_behind(self) -> dict[str, int]:
        """How many tenants are at each older revision, for a summary line."""
        counts = Counter(migrations.head_label(b.versions) or "(none)" for b in self.behind)
        return dict(sorted(counts.items()))


def schema_versions(
    conn: psycopg.Connection[Any], schemas: list[str]
) -> dict[str, frozenset[str] | None]:
    """Each schema's recorded revisions (None: no version table, or no schema).

    ``conn`` is in autocommit: every chunk is a transaction of its own.
    """
    found = _read_chunks(conn, _versioned(conn, schemas))
    return {s: found.get(s) for s in schemas}


def _versioned(
    conn: psycopg.Connection[Any], schemas: list[str] | None, share: int = 0, shares: int = 1
) -> list[VersionTable]:
    """Of ``schemas`` (None: every tenant schema), those that hold a version table, by name;
    of those, the ``share``-th of ``shares`` (by oid)."""
    params = {"schemas": schemas, "share": share, "shares": shares}
    with conn.cursor(row_factory=tuple_row) as cur:
        cur.execute(VERSIONED_TENANT_SCHEMAS if schemas is None else VERSIONED_SCHEMAS, params)
        return sorted(VersionTable(row[0], int(row[1]), bool(row[2])) for row in cur.fetchall())


def _read_chunks(
    conn: psycopg.Connection[Any], tables: list[VersionTable]
) -> dict[str, frozenset[str]]:
    found: dict[str, frozenset[str]] = {}
    for start in range(0, len(tables), VERSION_CHUNK):
        found.update(_copy_versions(conn, tables[start : start + VERSION_CHUNK]))
    return found


def _copy_versions(
    conn: psycopg.Connection[Any], tables: list[VersionTable]
) -> dict[str, frozenset[str]]:
    """The versions of ``tables``: one string of ``COPY`` statements (joined from escaped
    identifiers as bytes), its results read in order, one per table.

    psycopg's ``cursor.copy()`` takes one statement per round trip, so this drives the
    session's libpq connection (:mod:`psycopg.pq`) itself, without blocking in libpq (the
    other sessions' threads keep running). The first error is raised once the string has
    ended (the server skips the rest of it), leaving the session idle."""
    pgconn = conn.pgconn
    encoding = conn.info.encoding
    pending = iter(tables)
    found: dict[str, frozenset[str]] = {}
    error: psycopg.Error | None = None
    with conn.lock, selectors.DefaultSelector() as selector:
        wait = _waiter(pgconn, selector)
        pgconn.send_query(b"; ".join(table.copy_statement(conn) for table in tables))
        while pgconn.flush():
            wait(True)
        while True:
            while pgconn.is_busy():
                wait(False)
            result = pgconn.get_result()
            if result is None:
                break
            if result.status == pq.ExecStatus.COPY_OUT:
                data = _copy_data(pgconn, wait)
                lines = csv.reader(io.StringIO(data.decode(encoding)))
                found[next(pending).schema] = frozenset(line[0] for line in lines if line)
            elif result.status == pq.ExecStatus.FATAL_ERROR and error is None:
                error = error_from_result(result, encoding=encoding)
    if error is not None:
        raise error
    return found


def _copy_data(pgconn: pq.abc.PGconn, wait: Callable[[bool], None]) -> bytes:
    """Every row of the ``COPY ... TO STDOUT`` under way."""
    data = bytearray()
    while True:
        size, chunk = pgconn.get_copy_data(1)
        if size > 0:
            data += chunk
        elif size == 0:
            wait(False)
        elif size == -1:
            return bytes(data)
        else:
            raise psycopg.OperationalError(pgconn.error_message.decode(errors="replace"))


def _waiter(pgconn: pq.abc.PGconn, selector: selectors.BaseSelector) -> Callable[[bool], None]:
    """``wait(write)``: until the server sent more (or, ``write``, the socket takes more), then
    read in what came."""
    selector.register(pgconn.socket, selectors.EVENT_READ)
    events = {False: selectors.EVENT_READ, True: selectors.EVENT_READ | selectors.EVENT_WRITE}

    mode = [False]

    def wait(write: bool) -> None:
        if mode[0] != write:
            selector.modify(pgconn.socket, events[write])
            mode[0] = write
        selector.select()
        pgconn.consume_input()

    return wait


def read_versions(url: str, schemas: list[str] | None) -> dict[str, frozenset[str]]:
    """The recorded revisions of each of ``schemas`` (None: every tenant schema) that has a
    version table (the others are absent).

    A fleet-wide read (or one of more than :data:`VERSION_CHUNK` schemas) runs over
    :data:`VERSION_SESSIONS` sessions at once, each finding and reading its own share: the
    sessions connect, look up and read side by side, with nothing serial before them."""
    shares = 1 if schemas is not None and len(schemas) <= VERSION_CHUNK else VERSION_SESSIONS

    def part(share: int) -> dict[str, frozenset[str]]:
        conn = db.connect(url, application_name="upgrade", autocommit=True, options=UPGRADE_OPTIONS)
        with closing(conn), db.translated():
            return _read_chunks(conn, _versioned(conn, schemas, share, shares))

    if shares == 1:
        return part(0)
    found: dict[str, frozenset[str]] = {}
    with ThreadPoolExecutor(shares) as pool:
        for result in pool.map(part, range(shares)):
            found.update(result)
    return found


def upgrade(
    settings: Settings,
    tenant_ids: list[str] | None = None,
    *,
    dry_run: bool = False,
    canary: int | None = None,
    max_failures: int | None = None,
) -> UpgradeReport:
    """Queue every provisioned tenant whose schema is behind the template's head for a worker.

    ``tenant_ids`` None means all tenants. A named tenant that is suspended, archived or
    deleted is refused (:class:`WrongState`); with all tenants, such tenants are skipped and
    reported. The jobs found behind are recorded as a rollout (:mod:`provisioner.fleet.rollout`) and
    queued in one transaction: all of them (or the ``canary`` first ones), or none (and none
    with ``dry_run``). ``max_failures`` halts the rollout at that many failed tenants.
    """
    for name, value in (("canary", canary), ("max_failures", max_failures)):
        if value is not None and value < 1:
            raise InvalidInput(f"{name.replace('_', '-')} must be at least 1, got {value}")
    wanted = None if tenant_ids is None else [TenantId(t) for t in tenant_ids]
    heads = migrations.tenant_heads()
    owner = db.connect(
        settings.owner_url, application_name="upgrade", autocommit=True, options=UPGRADE_OPTIONS
    )
    # A fleet-wide upgrade reads every tenant schema's version while this thread reads and
    # parses the jobs (the reads wait on the server, the parsing is Python's): the two overlap.
    reader = ThreadPoolExecutor(1)
    early = reader.submit(read_versions, settings.owner_url, None) if wanted is None else None
    with reader, closing(owner) as conn, db.translated():
        _require_control_at_head(conn)
        jobs = queue.provision_jobs(conn, wanted)
        missing = sorted({t.value for t in wanted or []} - {str(j.tenant_id) for j in jobs})
        if missing:
            raise UnknownTenant(f"unknown tenant(s) {', '.join(missing)}: no provisioning job")
        rows = conn.execute(
            TENANTS_LEFT_ALONE, {"states": list(tenants.INACTIVE_STATES)}
        ).fetchall()
        states: dict[str, str] = {r["tenant_id"]: r["state"] for r in rows}
        skipped = [
            SkippedTenant(str(j.tenant_id), states[j.tenant_id])
            for j in jobs
            if j.tenant_id in states
        ]
        if wanted is not None and skipped:
            first = skipped[0]
            raise WrongState(
                f"tenant {first.tenant_id} is {first.state}: an upgrade leaves it alone"
            )
        jobs = [j for j in jobs if j.tenant_id not in states]
        finished = [j for j in jobs if j.status is JobStatus.SUCCEEDED]
        if early is not None:
            versions = early.result()
        else:
            versions = read_versions(
                settings.owner_url, [TenantId(str(j.tenant_id)).schema for j in finished]
            )
        behind = [
            (job, versions.get(TenantId(str(job.tenant_id)).schema, frozenset()))
            for job in finished
            if versions.get(TenantId(str(job.tenant_id)).schema) != heads
        ]
        rollout_id = None
        if dry_run or not behind:
            action = "would queue" if dry_run else "queued"
            upgrades = [TenantUpgrade(job, v, action) for job, v in behind]
        else:
            with conn.transaction():
                started, queued = rollout.start(
                    conn,
                    migrations.head_label(heads),
                    [job for job, _ in behind],
                    canary=canary,
                    max_failures=max_failures,
                )
            rollout_id = started.id
            reopened = {j.id: j for j in queued}
            upgrades = [
                TenantUpgrade(
                    reopened.get(job.id, job), v, "queued" if job.id in reopened else "pending"
                )
                for job, v in behind
            ]
    unfinished = [j for j in jobs if j.status is not JobStatus.SUCCEEDED]
    return UpgradeReport(heads, len(finished), upgrades, unfinished, skipped, rollout_id)


def _require_control_at_head(conn: psycopg.Connection[Any]) -> None:
    from provisioner.service import require_control_at_head  # the facade owns the rule

    require_control_at_head(conn)


def _owner(settings: Settings, name: str) -> psycopg.Connection[dict[str, Any]]:
    return db.connect(settings.owner_url, application_name=name, autocommit=True)


def resume(settings: Settings) -> rollout.Resumed:
    """Continue the active rollout (the rest after a canary, or the jobs a halt held)."""
    with closing(_owner(settings, "upgrade")) as conn, db.translated(), conn.transaction():
        return rollout.resume(conn)


def abort(settings: Settings) -> rollout.Aborted:
    """Drop what the active rollout has not started."""
    with closing(_owner(settings, "upgrade")) as conn, db.translated(), conn.transaction():
        return rollout.abort(conn)


def progress(settings: Settings) -> rollout.Progress:
    """The latest rollout's numbers, for ``upgrade --watch`` (read-only)."""
    with closing(_owner(settings, "upgrade-watch")) as conn, db.translated():
        return rollout.progress(conn)


def wait_for_canary(settings: Settings, rollout_id: int) -> dict[str, int]:
    """Block until the canary of ``rollout_id`` has finished; its jobs by status."""
    with closing(_owner(settings, "upgrade")) as conn, db.translated():
        return rollout.wait_for_canary(conn, rollout.get(conn, rollout_id))


def tenants_per_head(settings: Settings) -> dict[str, int]:
    """How many provisioned tenants record each revision (the watch's first line)."""
    with closing(_owner(settings, "upgrade-watch")) as conn, db.translated():
        jobs = [j for j in queue.provision_jobs(conn) if j.status is not JobStatus.RUNNING]
        found = schema_versions(conn, sorted({TenantId(str(j.tenant_id)).schema for j in jobs}))
    counts = Counter(migrations.head_label(v) if v else "(none)" for v in found.values())
    return dict(sorted(counts.items()))
