"""The project's seed data: what the fourth provisioning step puts into a new tenant's schema.

A project declares its seeds (``PROVISIONER_SEEDS``, comma-separated) as entries, each one of:

- a folder: its ``*.sql`` files, applied in file-name order;
- one ``.sql`` file;
- ``package.module:function``: a callable ``function(conn, tenant)`` given the step's psycopg
  connection and the :class:`~provisioner.models.TenantId`.

Without a declaration, the seeds are the tenant tree's ``seeds/`` folder when it has one (the
shipped template's holds its role profiles: the example), and none otherwise: a project with
its own tree and no seeds provisions tenants without any.

Seed SQL runs in the step's transaction with ``search_path`` set to the tenant's schema alone
(as migrations run) and the tenant id readable as ``current_setting('provisioner.tenant_id')``:
nothing is formatted into the text, so nothing can be injected. Seeds must be idempotent
(``ON CONFLICT DO NOTHING``): a step that is re-run applies them again.

What was applied is recorded in ``control.tenant_seeds`` (the owner's alone): each seed's name
and content digest, keyed by the schema's OID, so a schema dropped and created again counts as
unseeded and a schema renamed into the tenant's name keeps its record. The step's catalog check
compares that record with the seeds declared now: a new or changed seed makes the step run
again when the job is resumed or re-run, and its detail says which seed changed. A seed that
fails for good (a syntax error, an undefined table, a constraint) fails the job at once, naming
the file (:func:`provisioner.db.statements_of`).
"""

from __future__ import annotations

import hashlib
import importlib
import inspect
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psycopg
from psycopg import sql
from psycopg.rows import tuple_row

from provisioner.db import statements_of
from provisioner.errors import ConfigurationError, SeedUnusable
from provisioner.models import TenantId

__all__ = [
    "SEEDS_FOLDER",
    "Seed",
    "SeedRun",
    "apply",
    "check_declared",
    "declared",
    "recorded",
    "seeded",
]

Conn = psycopg.Connection[Any]
SeedFunction = Callable[[Conn, TenantId], object]

#: The tenant tree's folder of seeds, used when the project declares none.
SEEDS_FOLDER = "seeds"
#: The setting that carries the tenant id to seed SQL (``current_setting(...)``).
TENANT_ID_SETTING = "provisioner.tenant_id"

# The search_path before, then the tenant's schema alone and the tenant id for this transaction.
ENTER = """
SELECT current_setting('search_path'),
       set_config('search_path', %(path)s, true),
       set_config('provisioner.tenant_id', %(tenant)s, true)
"""
#: Where the seeds applied are recorded: on the control database; a tenant server keeps its own
#: record (:data:`provisioner.servers.journal.SEEDS_TABLE`), by its schemas' OIDs.
CONTROL_SEEDS = sql.Identifier("control", "tenant_seeds")
# What was applied, recorded in one statement that also puts the search_path back.
RECORD = sql.SQL("""
WITH recorded AS (
  INSERT INTO {seeds} (tenant_id, schema_oid, seed, digest)
  SELECT %(tenant)s, n.oid, s.seed, s.digest
    FROM pg_namespace n, unnest(%(seeds)s::text[], %(digests)s::text[]) AS s(seed, digest)
   WHERE n.nspname = %(schema)s
  ON CONFLICT (schema_oid, seed) DO UPDATE
     SET tenant_id = EXCLUDED.tenant_id, digest = EXCLUDED.digest, applied_at = now()
  RETURNING 1
)
SELECT set_config('search_path', %(restore)s, true), (SELECT count(*) FROM recorded)
""")
# The seeds recorded for the schema as it is now, by its OID (a schema made again has another;
# a spare renamed to the tenant's name keeps its own).
RECORDED = sql.SQL("""
SELECT s.seed, s.digest
  FROM {seeds} s
  JOIN pg_namespace n ON n.oid = s.schema_oid
 WHERE n.nspname = %(schema)s
""")


@dataclass(frozen=True)
class Seed:
    """One declared seed: SQL text or a function, named and digested for the record."""

    name: str
    digest: str
    sql: str | None = None
    function: SeedFunction | None = None


@dataclass(frozen=True)
class SeedRun:
    """What the step did: the seeds applied, and those whose content changed since the last
    application recorded for this schema."""

    applied: tuple[Seed, ...]
    changed: tuple[str, ...]

    @property
    def detail(self) -> str:
        if not self.applied:
            return "no seeds declared"
        names = ", ".join(f"{s.name} ({s.digest[:12]})" for s in self.applied)
        note = f"; changed since last applied: {', '.join(self.changed)}" if self.changed else ""
        return f"applied {names}{note}"


def _digest(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _sql_seed(path: Path) -> Seed:
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise SeedUnusable(f"seed {path.name} cannot be read: {exc.strerror}") from None
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        raise SeedUnusable(f"seed {path.name} is not UTF-8 text") from None
    return Seed(path.name, _digest(data), sql=text)


def _function_seed(entry: str) -> Seed:
    module_name, _, attr = entry.partition(":")
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise SeedUnusable(f"seed {entry}: cannot import {module_name}: {exc}") from None
    function = getattr(module, attr, None)
    if not callable(function):
        raise SeedUnusable(f"seed {entry}: {module_name} has no function {attr!r}")
    try:
        source = inspect.getsource(module).encode()
    except (OSError, TypeError):
        source = entry.encode()
    return Seed(entry, _digest(source), function=function)


def _is_function(entry: str) -> bool:
    module, sep, attr = entry.partition(":")
    return (
        bool(sep)
        and "/" not in entry
        and all(part.isidentifier() for part in (*module.split("."), attr))
    )


def _entry_seeds(entry: str, base: Path) -> list[Seed]:
    if _is_function(entry):
        return [_function_seed(entry)]
    path = Path(entry) if Path(entry).is_absolute() else base / entry
    if path.is_dir():
        return [_sql_seed(p) for p in sorted(path.glob("*.sql"))]
    if path.is_file() and path.suffix == ".sql":
        return [_sql_seed(path)]
    raise SeedUnusable(f"seed {entry}: no such folder or .sql file")


def declared(entries: Sequence[str], tree: Path, base: Path | None = None) -> tuple[Seed, ...]:
    """The seeds of ``entries`` (paths relative to ``base``, the working directory by default),
    in order; none declared: the tree's ``seeds/`` folder if it has one."""
    if not entries:
        folder = tree / SEEDS_FOLDER
        return tuple(_sql_seed(p) for p in sorted(folder.glob("*.sql"))) if folder.is_dir() else ()
    seeds = [seed for entry in entries for seed in _entry_seeds(entry, base or Path.cwd())]
    names = [seed.name for seed in seeds]
    twice = sorted({name for name in names if names.count(name) > 1})
    if twice:
        raise SeedUnusable(f"seeds declared twice (names must be unique): {', '.join(twice)}")
    return tuple(seeds)


def check_declared(entries: Sequence[str], tree: Path) -> None:
    """Refuse declared seeds that cannot be used (a missing folder or file, a function that does
    not import, a file that is not UTF-8 text, a name declared twice) as a
    :class:`ConfigurationError`, one line: called before anything is built (``provision``, the
    worker's start), so that a bad setting is not met at the fourth step, after the schema was
    created, migrated and granted."""
    try:
        declared(entries, tree)
    except SeedUnusable as exc:
        raise ConfigurationError(
            f"{exc} (PROVISIONER_SEEDS, or seeds in the project file)"
        ) from None


def recorded(
    conn: Conn, tenant: TenantId, record: sql.Identifier = CONTROL_SEEDS
) -> dict[str, str]:
    """The seeds recorded as applied to the tenant's schema as it is now: name -> digest."""
    with conn.cursor(row_factory=tuple_row) as cur:
        cur.execute(RECORDED.format(seeds=record), {"schema": tenant.schema})
        return {str(name): str(digest) for name, digest in cur.fetchall()}


def seeded(
    conn: Conn, tenant: TenantId, seeds: Sequence[Seed], record: sql.Identifier = CONTROL_SEEDS
) -> bool:
    """The step's catalog check: every declared seed is recorded with its current digest."""
    if not seeds:
        return True
    have = recorded(conn, tenant, record)
    return all(have.get(seed.name) == seed.digest for seed in seeds)


def apply(
    conn: Conn, tenant: TenantId, seeds: Sequence[Seed], record: sql.Identifier = CONTROL_SEEDS
) -> SeedRun:
    """Apply ``seeds`` in the caller's transaction, in order, and record them in ``record``."""
    if not seeds:
        return SeedRun((), ())
    before = recorded(conn, tenant, record)
    changed = tuple(s.name for s in seeds if s.name in before and before[s.name] != s.digest)
    with conn.cursor(row_factory=tuple_row) as cur:
        path = sql.Identifier(tenant.schema).as_string(conn)
        cur.execute(ENTER, {"path": path, "tenant": tenant.value})
        row = cur.fetchone()
        restore = str(row[0]) if row else ""
        for seed in seeds:
            with statements_of(f"seed {seed.name}"):
                if seed.sql is not None:
                    # No parameters: the file's text goes as it is (several statements, any %).
                    cur.execute(seed.sql.encode(), prepare=False)
                elif seed.function is not None:
                    seed.function(conn, tenant)
        cur.execute(
            RECORD.format(seeds=record),
            {
                "tenant": tenant.value,
                "schema": tenant.schema,
                "seeds": [s.name for s in seeds],
                "digests": [s.digest for s in seeds],
                "restore": restore,
            },
        )
    return SeedRun(tuple(seeds), changed)
