"""The work of a move's steps on the two servers: freeze the application's writes, copy the
schema with ``pg_dump | pg_restore``, and compare the two copies.

* **Freeze** (:func:`freeze`): every application role's privileges on the schema revoked and
  committed, so a stale route fails loudly (``permission denied``); then, in a second
  transaction, each table locked ``IN SHARE MODE`` and released: that waits for every write
  begun before the revoke to commit or roll back, so the copy that follows holds every write
  the application was told succeeded. Bounded by the lock timeout (a long application
  transaction makes the step wait its turn and retry, without spending an attempt).
* **Copy** (:func:`copy_schema`): ``pg_dump --schema --format=custom`` on the source piped into
  ``pg_restore --single-transaction --exit-on-error --no-owner`` on the target, both as the
  owner, binaries of the machine (the first, in :mod:`provisioner.local.cluster`'s order,
  whose ``pg_dump`` is at least the source's major version: :func:`bin_dir_for`). Single
  transaction: a restore killed or failed half-way leaves nothing on the target. The owner
  URL's password reaches a child in a password file of its own held in memory
  (:class:`Passwords`: nothing on disk, even after a SIGKILL), a server's from libpq's own
  sources; never on a command line nor in the environment; what they print is redacted
  before it is shown. Each child is killed with its parent (Linux: the parent-death signal),
  so a worker killed mid-copy leaves no restore running on its own.
* **Compare** (:func:`snapshot`, :func:`differences`): the catalog inventory
  (:mod:`provisioner.tenant.catalog`: every object, owner and privilege), the rows of each
  table and each sequence's value, on both ends.
"""

from __future__ import annotations

import ctypes
import os
import signal
import subprocess
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psycopg
from psycopg import sql
from psycopg.conninfo import conninfo_to_dict, make_conninfo
from psycopg.rows import tuple_row

from provisioner import db
from provisioner.db.conninfo import KEEPALIVES
from provisioner.errors import PermanentError
from provisioner.local.cluster import find_client_dir
from provisioner.redact import redact
from provisioner.roles import AppRoles
from provisioner.servers.moves import End
from provisioner.tenant import catalog
from provisioner.tenant import schema as tenant_schema

Conn = psycopg.Connection[Any]

#: Linux's prctl option: the signal a child gets when its parent dies.
_PR_SET_PDEATHSIG = 1

# The schema's tables (partitioned ones and their partitions alike) and sequences, by name.
TABLES_AND_SEQUENCES = """
SELECT c.relname, c.relkind FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
 WHERE n.nspname = %(schema)s AND c.relkind IN ('r', 'p', 'S')
 ORDER BY c.relname
"""


@dataclass(frozen=True)
class Snapshot:
    """What a copy must equal: the catalog inventory, rows per table, each sequence's
    ``(last_value, is_called)``."""

    inventory: catalog.Inventory
    rows: dict[str, int]
    sequences: dict[str, tuple[int, bool]]


@dataclass(frozen=True)
class Frozen:
    """What the freeze did: the tables waited on, the revoke's and the wait's milliseconds."""

    tables: int
    revoke_ms: float
    wait_ms: float


def freeze(conn: Conn, schema: str, roles: AppRoles, *, lock_timeout_ms: int) -> Frozen:
    """Revoke the application roles' privileges on the schema (committed), then wait for the
    writes begun before it. ``conn`` is an owner session on the source, autocommit off."""
    began = time.perf_counter()
    with conn.transaction():
        tenant_schema.revoke_app_roles(conn, schema, roles)
    revoked = time.perf_counter()
    tables, _ = _relations(conn, schema)
    if tables:
        names = sql.SQL(", ").join(sql.Identifier(schema, t) for t in tables)
        timeout = sql.Literal(f"{max(1, lock_timeout_ms)}ms")
        with conn.transaction(), conn.cursor() as cur:
            cur.execute(
                sql.SQL(
                    "SELECT set_config('lock_timeout', {}, true); LOCK TABLE {} IN SHARE MODE"
                ).format(timeout, names)
            )
    return Frozen(len(tables), (revoked - began) * 1000, (time.perf_counter() - revoked) * 1000)


def frozen(conn: Conn, schema: str, roles: AppRoles) -> bool:
    """No application role can use the schema (or there is no schema to use)."""
    return tenant_schema.app_roles_cut_off(conn, schema, roles)


def copy_schema(source: End, target: End, schema: str) -> None:
    """``pg_dump | pg_restore`` of one schema, in one transaction on the target; raises
    :class:`PermanentError` with the children's redacted message when either fails."""
    bin_dir = bin_dir_for(source)
    with Passwords() as passwords:
        dump = command(
            bin_dir,
            "pg_dump",
            passwords.address(source),
            "--format=custom",
            f"--schema={pattern(schema)}",
        )
        restore = command(
            bin_dir,
            "pg_restore",
            passwords.address(target),
            "--single-transaction",
            "--exit-on-error",
            "--no-owner",
        )
        codes, errors = pipe(dump, restore, passwords.fds)
    for name, code, err in zip(("pg_dump", "pg_restore"), codes, errors, strict=True):
        check(name, code, err)


def bin_dir_for(source: End) -> Path:
    """The binaries whose ``pg_dump`` can dump ``source`` (its server's major version or
    later: :func:`provisioner.local.cluster.find_client_dir`)."""
    with connect(source) as conn:
        version = conn.info.server_version
    return find_client_dir(version // 10000)


def check(name: str, code: int, err: bytes) -> None:
    """:class:`PermanentError` with the child's redacted message unless it exited 0."""
    if code != 0:
        lines = [line for line in err.decode(errors="replace").splitlines() if line.strip()]
        message = redact(" ".join(lines[:3]))[:500] or f"exit status {code}"
        raise PermanentError(f"{name} failed: {message}")


def pipe(
    dump: list[str], restore: list[str], fds: tuple[int, ...] = ()
) -> tuple[tuple[int, int], tuple[bytes, bytes]]:
    """Run ``dump | restore`` (``fds``: the password files they inherit); their exit codes and
    what each wrote on stderr."""
    with subprocess.Popen(
        dump,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        preexec_fn=_die_with_parent,
        pass_fds=fds,
    ) as dumper:
        assert dumper.stdout is not None
        with subprocess.Popen(
            restore,
            stdin=dumper.stdout,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            preexec_fn=_die_with_parent,
            pass_fds=fds,
        ) as restorer:
            dumper.stdout.close()  # the restore holds the pipe's reading end alone
            _, restore_err = restorer.communicate()
        dump_err = dumper.stderr.read() if dumper.stderr is not None else b""
        dumper.wait()
    return (dumper.returncode, restorer.returncode), (dump_err, restore_err)


def run(args: list[str], given: bytes = b"", fds: tuple[int, ...] = ()) -> bytes:
    """Run one child (dying with this process), ``given`` on its standard input, ``fds`` (its
    password files) inherited; what it wrote on its standard output, or
    :class:`PermanentError` (:func:`check`)."""
    done = subprocess.run(
        args,
        input=given,
        capture_output=True,
        preexec_fn=_die_with_parent,
        pass_fds=fds,
        check=False,
    )
    check(Path(args[0]).name, done.returncode, done.stderr)
    return done.stdout


class Passwords:
    """The password files of a copy's children, each an anonymous file in memory
    (``memfd_create``, mode 0600) that the child inherits and libpq reads as ``/dev/fd/N``:
    never on disk, so nothing is left behind even when this process is SIGKILLed mid-copy,
    and never on a command line nor in an environment. Closed on leaving the block."""

    def __init__(self) -> None:
        self._fds: list[int] = []

    def __enter__(self) -> Passwords:
        return self

    def __exit__(self, *exc: object) -> None:
        for fd in self._fds:
            os.close(fd)
        self._fds.clear()

    @property
    def fds(self) -> tuple[int, ...]:
        """The descriptors a child must inherit (``pass_fds``)."""
        return tuple(self._fds)

    def address(self, end: End) -> str:
        """The end's address for a child: with its password (the owner URL's) in a password
        file of its own, libpq's own sources otherwise; and the bounds of every connection of
        the package (:data:`provisioner.db.CONNECT_TIMEOUT_SECONDS`, the TCP keepalives:
        :data:`provisioner.db.conninfo.KEEPALIVES`), where the address sets none."""
        given = conninfo_to_dict(db.libpq_address(end.address))
        wanted = {"connect_timeout": db.CONNECT_TIMEOUT_SECONDS, **KEEPALIVES}
        bounds = {key: value for key, value in wanted.items() if key not in given}
        if end.password is None:
            return make_conninfo(db.libpq_address(end.address), **bounds)
        escaped = end.password.replace("\\", "\\\\").replace(":", "\\:")
        fd = _anonymous_file()
        self._fds.append(fd)
        os.fchmod(fd, 0o600)
        os.write(fd, f"*:*:*:*:{escaped}\n".encode())
        os.lseek(fd, 0, os.SEEK_SET)
        return make_conninfo(db.libpq_address(end.address), passfile=f"/dev/fd/{fd}", **bounds)


def _anonymous_file() -> int:
    """A file with no name: in memory on Linux (``memfd_create``); elsewhere a temporary file
    unlinked at once. Either is gone with its last descriptor, whatever kills the process."""
    if hasattr(os, "memfd_create"):
        return os.memfd_create("provisioner-pgpass", os.MFD_CLOEXEC)
    with tempfile.TemporaryFile() as held:  # unlinked on creation (POSIX)
        return os.dup(held.fileno())


def snapshot(conn: Conn, schema: str) -> Snapshot | None:
    """The schema's :class:`Snapshot`, read in one repeatable-read transaction; None when
    there is no such schema."""
    with conn.transaction():
        conn.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ READ ONLY")
        inventory = catalog.read(conn, schema)
        if inventory is None:
            return None
        tables, sequences = _relations(conn, schema)
        parts = [
            sql.SQL("SELECT 't', {}, count(*), NULL::boolean FROM {}").format(
                sql.Literal(t), sql.Identifier(schema, t)
            )
            for t in tables
        ] + [
            sql.SQL("SELECT 's', {}, last_value, is_called FROM {}").format(
                sql.Literal(s), sql.Identifier(schema, s)
            )
            for s in sequences
        ]
        found: list[tuple[Any, ...]] = []
        if parts:
            with conn.cursor(row_factory=tuple_row) as cur:
                cur.execute(sql.SQL(" UNION ALL ").join(parts))
                found = cur.fetchall()
    rows = {str(name): int(n) for kind, name, n, _ in found if kind == "t"}
    values = {str(name): (int(n), bool(called)) for kind, name, n, called in found if kind == "s"}
    return Snapshot(inventory, rows, values)


def differences(source: Snapshot, target: Snapshot) -> list[str]:
    """How the target's copy differs from the source's, one line each (empty: equal)."""
    lines = [
        f"{d.change} {d.kind} {d.name}" for d in catalog.compare(source.inventory, target.inventory)
    ]
    for table in sorted(set(source.rows) | set(target.rows)):
        if source.rows.get(table) != target.rows.get(table):
            lines.append(
                f"table {table}: {source.rows.get(table)} rows, {target.rows.get(table)} copied"
            )
    for seq in sorted(set(source.sequences) | set(target.sequences)):
        if source.sequences.get(seq) != target.sequences.get(seq):
            lines.append(
                f"sequence {seq}: {source.sequences.get(seq)} on the source, "
                f"{target.sequences.get(seq)} copied"
            )
    return lines


def schema_exists(conn: Conn, schema: str) -> bool:
    """The schema is there (in a transaction of its own, ended here)."""
    with conn.transaction():
        return tenant_schema.object_count(conn, schema) is not None


def drop(conn: Conn, schema: str, *, lock_timeout_ms: int) -> None:
    """``DROP SCHEMA ... CASCADE`` of a copy the move owns, committed, bounded by the lock
    timeout."""
    with conn.transaction():
        tenant_schema.drop_schema(conn, schema, lock_timeout_ms=lock_timeout_ms)


def _relations(conn: Conn, schema: str) -> tuple[list[str], list[str]]:
    with conn.cursor(row_factory=tuple_row) as cur:
        cur.execute(TABLES_AND_SEQUENCES, {"schema": schema})
        rows = cur.fetchall()
    return [n for n, kind in rows if kind in ("r", "p")], [n for n, kind in rows if kind == "S"]


def pattern(schema: str) -> str:
    """The schema as a ``pg_dump`` pattern that matches its name alone (double-quoted: no
    wildcard, no case folding)."""
    return '"' + schema.replace('"', '""') + '"'


def command(bin_dir: Path, program: str, address: str, *flags: str) -> list[str]:
    """The child's arguments: the address holds no password (:func:`address`)."""
    return [str(bin_dir / program), f"--dbname={address}", "--no-password", *flags]


def _die_with_parent() -> None:
    """In the child, before exec: die when the process that started it dies (Linux only;
    elsewhere nothing)."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
    except (OSError, AttributeError):
        pass


def connect(end: End) -> Conn:
    """An owner session on ``end`` with every failure translated (:mod:`provisioner.db`)."""
    with db.translated():
        return end.connect()
