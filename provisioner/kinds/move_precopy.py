"""A move's copy in two parts, so that the writes' freeze holds the rows alone (issue 29's 2-s
goal).

Restoring a schema's DDL is most of a ``pg_dump | pg_restore`` of a tenant: for a 10,000-row
tenant of the default template, the tables, sequences, keys and indexes take about 80% of the
restore, the rows the rest. None of that DDL changes while the application writes (only the
owner's migrations change it, and the verification compares every catalog object after the
copy), so it is restored before the freeze:

* :func:`precopy` (step ``precopy_schema``, the application still writing):
  ``pg_dump --schema-only`` of the source, kept in memory; restored on the target in one
  transaction, all but the entries that must follow the rows (:data:`AFTER_ROWS`: foreign
  keys, triggers, rules, row security and its policies, ``NOT VALID`` checks, materialized
  views' data), as a full restore orders them; then the application roles' privileges that
  came with it taken away there (committed). The copy is routed nowhere until the switch; a
  write that slipped onto it meanwhile would show in the verification's row counts.
* :func:`copy_rows` (step ``copy_schema``, in the freeze): ``pg_dump --data-only |
  pg_restore --single-transaction`` (the rows and each sequence's value), then the entries
  kept for after the rows, restored from the dump held in memory, in one more transaction.

Only the run that pre-copied may finish the copy so: a run resumed after a crash or a failed
step does not trust a half-made target, drops it and copies the whole schema in the freeze
(:func:`provisioner.kinds.move_copy.copy_schema`).
"""

from __future__ import annotations

import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

from provisioner.kinds import move_copy
from provisioner.local.cluster import find_bin_dir
from provisioner.roles import AppRoles
from provisioner.servers.moves import End
from provisioner.tenant import schema as tenant_schema

#: The archive's entry types a full restore creates after the rows (its post-data section,
#: less the keys and indexes, which the copy of the rows keeps up as it goes). A trigger made
#: before the rows would fire on them; a foreign key would need the tables in its order.
AFTER_ROWS = (
    "FK CONSTRAINT",
    "CHECK CONSTRAINT",
    "TRIGGER",
    "RULE",
    "POLICY",
    "ROW SECURITY",
    "MATERIALIZED VIEW DATA",
)


@dataclass(frozen=True)
class PreCopy:
    """The schema-only dump of the source (a custom-format archive, in memory) and the lines of
    its table of contents restored after the rows; with the time each part took."""

    archive: bytes = field(repr=False)
    after_rows: tuple[str, ...]
    entries: int
    dump_ms: float
    restore_ms: float


@dataclass(frozen=True)
class RowsCopied:
    """The frozen part's milliseconds: the rows' ``pg_dump | pg_restore``, then the entries
    after them (0 when there are none)."""

    rows_ms: float
    after_ms: float


def entry_type(line: str) -> str:
    """An archive listing line's type (``3549; 0 0 SEQUENCE SET schema name owner``): the
    words after the two object ids; "" for a comment or a blank line."""
    if not line.strip() or line.startswith(";") or ";" not in line:
        return ""
    words = line.split(";", 1)[1].split()[2:]
    return " ".join(words)


def after_rows(line: str) -> bool:
    kind = entry_type(line)
    return any(kind.startswith(name + " ") for name in AFTER_ROWS)


def precopy(source: End, target: End, schema: str, roles: AppRoles) -> PreCopy:
    """Restore the schema's DDL on the target but for :data:`AFTER_ROWS`, and take the
    application roles' privileges away there; the dump kept for :func:`copy_rows`."""
    bin_dir = find_bin_dir()
    began = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="provisioner-move-") as folder:
        base = Path(folder)
        archive = move_copy.run(
            move_copy.command(
                bin_dir,
                "pg_dump",
                move_copy.address(source, base / "source"),
                "--format=custom",
                "--schema-only",
                f"--schema={move_copy.pattern(schema)}",
            )
        )
        dumped = time.perf_counter()
        listing = move_copy.run([str(bin_dir / "pg_restore"), "--list"], archive).decode()
        lines = [line for line in listing.splitlines() if entry_type(line)]
        first = [line for line in lines if not after_rows(line)]
        _restore(bin_dir, target, base, archive, first)
    with move_copy.connect(target) as conn, conn.transaction():
        tenant_schema.revoke_app_roles(conn, schema, roles)
    return PreCopy(
        archive,
        tuple(line for line in lines if after_rows(line)),
        len(lines),
        (dumped - began) * 1000,
        (time.perf_counter() - dumped) * 1000,
    )


def copy_rows(source: End, target: End, schema: str, pre: PreCopy) -> RowsCopied:
    """The rows and sequence values (one transaction), then the entries after them (one
    more), onto the pre-copied target."""
    bin_dir = find_bin_dir()
    began = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="provisioner-move-") as folder:
        base = Path(folder)
        dump = move_copy.command(
            bin_dir,
            "pg_dump",
            move_copy.address(source, base / "source"),
            "--format=custom",
            "--data-only",
            f"--schema={move_copy.pattern(schema)}",
        )
        restore = move_copy.command(
            bin_dir,
            "pg_restore",
            move_copy.address(target, base / "target"),
            "--single-transaction",
            "--exit-on-error",
            "--no-owner",
        )
        codes, errors = move_copy.pipe(dump, restore)
        for name, code, err in zip(("pg_dump", "pg_restore"), codes, errors, strict=True):
            move_copy.check(name, code, err)
        copied = time.perf_counter()
        if pre.after_rows:
            _restore(bin_dir, target, base, pre.archive, list(pre.after_rows))
    ended = time.perf_counter()
    return RowsCopied((copied - began) * 1000, (ended - copied) * 1000)


def _restore(bin_dir: Path, target: End, base: Path, archive: bytes, lines: list[str]) -> None:
    """The archive's entries named by ``lines`` (its listing's), in one transaction."""
    chosen = base / f"entries-{time.monotonic_ns()}.list"
    chosen.write_text("\n".join(lines) + "\n")
    passfile = base / f"target-{time.monotonic_ns()}"
    move_copy.run(
        move_copy.command(
            bin_dir,
            "pg_restore",
            move_copy.address(target, passfile),
            "--single-transaction",
            "--exit-on-error",
            "--no-owner",
            f"--use-list={chosen}",
        ),
        archive,
    )
