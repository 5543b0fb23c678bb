"""The only importer of Alembic: upgrade the control schema or one tenant schema, check heads,
and capture the tenant tree's offline SQL (what the template fast path replays).

Alembic keeps module-level state (``alembic.context``, ``alembic.op``) and is not thread-safe:
run at most one migration (online or offline) at a time per process. The worker gets
concurrency from processes.
"""

from __future__ import annotations

import ast
import hashlib
import importlib
import os
import sys
from dataclasses import dataclass
from functools import cache
from importlib.resources import files
from pathlib import Path
from typing import TYPE_CHECKING, Any

from psycopg.rows import tuple_row

from provisioner.db import SA_CONNECT_ARGS, engine, statements_of, translated
from provisioner.errors import ConfigurationError
from provisioner.settings import TENANT_TREE_ENV as TENANT_TREE_ENV
from provisioner.settings import tenant_naming, tenant_tree_override
from provisioner.tenant import schema as tenant_schema

# Alembic takes ~0.3 s to import, SQLAlchemy ~0.2 s: they are imported where a tree is read or
# run, so commands that never migrate (status, enqueue, jobs, health) start without them.
if TYPE_CHECKING:
    from collections.abc import Iterator

    import sqlalchemy as sa
    from alembic.config import Config

CONTROL_SCHEMA = "control"


@cache
def _tree(package: str) -> Path:
    # Where an installed package lives does not change while the process runs.
    return Path(str(files(package)))


def _no_sys_path_change(config: Config) -> Config:
    """Drop the ini's ``prepend_sys_path = .`` (kept for the ``alembic`` command line).

    From code it would put the current directory first on ``sys.path``; the worker's spawned
    engine processes inherit that list, so started from a source checkout they would import its
    ``provisioner/`` folder instead of the installed package.
    """
    config.set_main_option("prepend_sys_path", "")
    return config


def control_config(**attributes: Any) -> Config:
    from alembic.config import Config

    config = Config(str(_tree("provisioner.control_migrations") / "alembic.ini"))
    config.set_main_option("script_location", str(_tree("provisioner.control_migrations")))
    config.attributes.update(attributes)
    return _no_sys_path_change(config)


def packaged_tenant_tree() -> Path:
    """The tenant tree shipped with the package (the example; ``provisioner init`` copies its
    ``env.py``, ``alembic.ini`` and ``script.py.mako``)."""
    return _tree("provisioner.tenant_template")


def tenant_tree() -> Path:
    """The folder of the tenant Alembic tree: ``$PROVISIONER_TENANT_TREE``
    (:func:`provisioner.settings.tenant_tree_override`), else the one shipped with the
    package."""
    return tenant_tree_override() or packaged_tenant_tree()


def tenant_config(schema: str, *, tree: Path | None = None, **attributes: Any) -> Config:
    """Alembic config for one tenant schema; ``tree`` points at another copy of the tree. The
    tree's ``env.py`` learns the project's naming rule from ``tenant_naming`` (it refuses a
    schema that is neither a tenant's nor one of the tool's scratch schemas)."""
    from alembic.config import Config

    tree = tree or tenant_tree()
    config = Config(str(tree / "alembic.ini"))
    config.set_main_option("script_location", str(tree))
    config.attributes.update(attributes, tenant_schema=schema)
    config.attributes.setdefault("tenant_naming", tenant_naming())
    return _no_sys_path_change(config)


@cache
def control_heads() -> frozenset[str]:
    """The control tree's heads: its revisions that are no revision's ``down_revision``.

    Read from the revision files' literal assignments, without Alembic: every command checks
    the control schema is at head before it starts, and Alembic (with SQLAlchemy's DDL, Mako
    and Pygments) takes ~0.3 s to import (docs/performance.md "Start-up"). The control tree
    ships with the package and its files assign ``revision`` and ``down_revision`` literally,
    as Alembic's template writes them; a test pins that this is what Alembic's
    ``ScriptDirectory`` says. Tenant trees are the user's: :func:`tenant_heads` asks Alembic.
    """
    revisions: set[str] = set()
    parents: set[str] = set()
    for path in sorted((_tree("provisioner.control_migrations") / "versions").glob("*.py")):
        if path.name.startswith("__init__"):
            continue  # Alembic skips it too
        values = _literal_assignments(path, ("revision", "down_revision"))
        revisions.add(values["revision"])
        down = values.get("down_revision")
        parents.update([down] if isinstance(down, str) else down or ())
    return frozenset(revisions - parents)


def _literal_assignments(path: Path, names: tuple[str, ...]) -> dict[str, Any]:
    """The module-level ``name = <literal>`` (or ``name: type = <literal>``) of a Python file."""
    found: dict[str, Any] = {}
    for node in ast.parse(path.read_text(encoding="utf-8"), str(path)).body:
        if isinstance(node, ast.Assign) and len(node.targets) == 1:
            target, value = node.targets[0], node.value
        elif isinstance(node, ast.AnnAssign) and node.value is not None:
            target, value = node.target, node.value
        else:
            continue
        if isinstance(target, ast.Name) and target.id in names:
            found[target.id] = ast.literal_eval(value)
    return found


def head_label(revisions: frozenset[str]) -> str:
    """Revisions as one label, e.g. ``t004`` (or ``a,b`` for a tree with two heads)."""
    return ",".join(sorted(revisions))


@dataclass(frozen=True)
class TreeState:
    """What a tenant tree holds right now: a digest of its files and its heads."""

    digest: str
    heads: frozenset[str]

    @property
    def head_label(self) -> str:
        return head_label(self.heads)


#: Folders and files of a tree that are no part of what it builds: Python's byte-code caches
#: (rewritten by every import) and hidden files (an editor's swap file, a VCS folder).
_NOT_TREE_FILES = ("__pycache__",)
#: Bumped when what the digest covers changes: a digest of another format names another state
#: (spares and references of the earlier format are rebuilt once, never taken for this one).
#: v2: every file of the tree (helper modules a revision imports, ``alembic.ini``, data files a
#: revision reads); v1 covered ``env.py`` and ``versions/*.py`` alone.
DIGEST_FORMAT = b"tree-digest-v2"


def _tree_files(tree: Path) -> list[str]:
    """Every file of the tree, in a stable order: what the digest covers. A revision can take
    its DDL from any of them (a helper module it imports, a ``.sql`` file it reads), so a
    change to any of them is another tree state. Listed with ``os.scandir`` (pathlib's glob
    costs several times more, and this runs at every job)."""
    found: list[str] = []
    pending = [str(tree)]
    while pending:
        folder = pending.pop()
        with os.scandir(folder) as entries:
            for entry in entries:
                if entry.name.startswith(".") or entry.name in _NOT_TREE_FILES:
                    continue
                if entry.is_dir():
                    pending.append(entry.path)
                elif entry.is_file() and not entry.name.endswith((".pyc", ".pyo")):
                    found.append(entry.path)
    return sorted(found)


def tree_digest(tree: Path | None = None) -> str:
    """SHA-256 over every file of the tree (relative names and bytes, :func:`_tree_files`).

    Computed again whenever a file's size, mtime or inode changed, or a file came or went (one
    ``stat`` per file, so callers ask at every use rather than trust a memo): a tree replaced
    under a running process shows up at once.
    """
    tree = tree or tenant_tree()
    return _digest(tree, _signature(tree))


def _signature(tree: Path) -> tuple[tuple[str, int, int, int], ...]:
    """Relative name, size, mtime and inode of each file :func:`_tree_files` lists (each path
    starts with the tree's own: the name is cut from it, ``os.path.relpath`` costing more than
    the ``stat``, and this runs at least once per job)."""
    cut = len(os.path.join(str(tree), ""))
    return tuple(
        (path[cut:], st.st_size, st.st_mtime_ns, st.st_ino)
        for path, st in ((path, os.stat(path)) for path in _tree_files(tree))
    )


@cache
def _digest(tree: Path, signature: tuple[tuple[str, int, int, int], ...]) -> str:
    digest = hashlib.sha256(DIGEST_FORMAT + b"\0")
    for name in _tree_files(tree):
        path = Path(name)
        digest.update(path.relative_to(tree).as_posix().encode() + b"\0")
        digest.update(path.read_bytes() + b"\0")
    return digest.hexdigest()


@cache
def _forget_tree_modules(tree: Path, digest: str) -> None:
    """Once per tree state: forget the modules this process imported from the tree's files
    (helper modules its revisions import), so that the next revision that imports one reads
    the file as it is now. Alembic loads the revision files afresh each time, but Python keeps
    a module a revision imported (``sys.modules``) for the life of the process: a worker would
    otherwise build the new state's reference with the old helper."""
    roots = tuple(
        {os.path.join(os.path.abspath(tree), ""), os.path.join(os.path.realpath(tree), "")}
    )
    for name, module in list(sys.modules.items()):
        path = getattr(module, "__file__", None)
        if isinstance(path, str) and os.path.abspath(path).startswith(roots):
            del sys.modules[name]
    importlib.invalidate_caches()


@cache
def _heads_of(tree: Path, digest: str) -> frozenset[str]:
    # Keyed by digest: the heads are read again only when the files changed.
    from alembic.script import ScriptDirectory

    return frozenset(ScriptDirectory.from_config(tenant_config("tenant_x", tree=tree)).get_heads())


def tenant_tree_state(tree: Path | None = None) -> TreeState:
    """The tree's digest and heads as its files are now (the configured tree by default).

    A tree that cannot be read (a folder that is missing or is not an Alembic tree, a revision
    that does not load) is a :class:`ConfigurationError`, in one line naming the folder: every
    command and step that reads the tree meets it the same way, never as a traceback."""
    tree = tree or tenant_tree()
    try:
        digest = tree_digest(tree)
        _forget_tree_modules(tree, digest)
        heads = _heads_of(tree, digest)
    except ConfigurationError:
        raise  # a setting the tree's config reads (the tenant naming) says so itself
    except Exception as exc:  # a revision file raises whatever its Python does
        reason = " ".join(str(exc).split())[:300] or type(exc).__name__
        raise ConfigurationError(
            f"{_tree_label(tree)} is not a readable tenant Alembic tree "
            f"(env.py, alembic.ini, versions/): {reason}"
        ) from None
    return TreeState(digest=digest, heads=heads)


def _tree_label(tree: Path) -> str:
    """How an error names ``tree``: by its setting when it is the configured one."""
    shown = str(tree)[:200]
    return (
        f"{TENANT_TREE_ENV}={shown}" if tree == tenant_tree_override() else f"tenant tree {shown}"
    )


def check_tenant_tree() -> None:
    """Refuse, in one line, a tenant tree that cannot be read (``PROVISIONER_TENANT_TREE``
    naming a folder that is missing or is not an Alembic tree, or a revision that does not
    load) or that has no revision: a worker that started with it would fail every job after
    its retries, and a command would build a schema it cannot migrate. The worker checks it
    at start, and every command that reads the tree before it creates or queues anything."""
    tree = tenant_tree()
    state = tenant_tree_state(tree)
    if not state.heads:
        raise ConfigurationError(
            f"{_tree_label(tree)} has no revisions: a tenant Alembic tree holds env.py, "
            "alembic.ini and versions/ with at least one revision"
        )


def tenant_heads() -> frozenset[str]:
    """The tenant tree's heads as the files on disk say now."""
    return tenant_tree_state().heads


def upgrade_control(owner_url: str, app_role: str = "app_rw") -> tuple[str | None, str | None]:
    """Bring the control schema to head; returns (revision before, revision after)."""
    import sqlalchemy as sa
    from alembic import command

    owner = engine(owner_url, poolclass=sa.pool.NullPool, connect_args=SA_CONNECT_ARGS)
    try:
        with translated():
            before = control_revision_sa(owner)
            with owner.begin() as connection:
                command.upgrade(control_config(connection=connection, app_role=app_role), "head")
            return before, control_revision_sa(owner)
    finally:
        owner.dispose()


def control_revision_sa(engine: sa.Engine) -> str | None:
    from alembic.runtime.migration import MigrationContext

    with engine.connect() as connection:
        context = MigrationContext.configure(
            connection, opts={"version_table_schema": CONTROL_SCHEMA}
        )
        return context.get_current_revision()


def upgrade_tenant(
    connection: sa.Connection,
    schema: str,
    target: str = "head",
    *,
    start: frozenset[str] = frozenset(),
) -> None:
    """Run the tenant template to ``target`` (the head by default) inside ``schema``, in the
    caller's transaction, from ``start`` (the schema's revisions; empty: a new schema).

    A revision that fails for good (a syntax error, an undefined object, a constraint: see
    :func:`provisioner.db.statements_of`) is named in the error: the first revision after
    ``start`` that Alembic did not report applied (``on_version_apply``, which the tree's
    ``env.py`` hands to ``context.configure``)."""
    from alembic import command

    applied: list[str] = []

    def note(*, step: Any, **_: Any) -> None:
        applied.append(str(step.up_revision_id))

    config = tenant_config(schema, connection=connection, on_version_apply=note)
    with statements_of(lambda: _failing_revision(start, applied)):
        command.upgrade(config, target)


def _failing_revision(start: frozenset[str], applied: list[str]) -> str:
    """The revision an upgrade from ``start`` failed in, after ``applied`` went through."""
    done = set(start) | set(applied)
    pending = [rev.revision for rev in tenant_revisions_after(start) if rev.revision not in done]
    return f"revision {pending[0]}" if pending else "tenant migration"


class _StatementRecorder:
    """An output buffer for Alembic's offline mode that keeps each statement apart.

    Offline mode writes every statement (or comment) with one ``write`` call, so the
    boundaries come from Alembic itself rather than from splitting text on semicolons.
    """

    def __init__(self) -> None:
        self.statements: list[str] = []

    def write(self, text: str) -> int:
        self.statements.append(text)
        return len(text)

    def flush(self) -> None:
        return None


def tenant_offline_sql(
    schema: str, *, tree: Path | None = None, start: frozenset[str] | None = None
) -> list[str]:
    """The statements ``upgrade [START:]head --sql`` emits for ``schema`` (never connects), in
    order, each as Alembic wrote it (comments and ``BEGIN``/``COMMIT`` included). ``start`` is
    the revision a schema is at (one head only: Alembic's offline range takes one)."""
    from alembic import command

    recorder = _StatementRecorder()
    config = tenant_config(schema, tree=tree)
    config.output_buffer = recorder  # type: ignore[assignment]
    target = "head" if not start else f"{head_label(start)}:head"
    command.upgrade(config, target, sql=True)
    return [text.strip() for text in recorder.statements if text.strip()]


@dataclass(frozen=True)
class Revision:
    """One tenant revision, as far as an upgrade replay cares."""

    revision: str


def tenant_revisions_after(start: frozenset[str], tree: Path | None = None) -> list[Revision]:
    """The revisions an upgrade from ``start`` to the tree's head runs, oldest first."""
    from alembic.script import ScriptDirectory

    scripts = ScriptDirectory.from_config(tenant_config("tenant_x", tree=tree or tenant_tree()))
    found = list(scripts.iterate_revisions("heads", tuple(start)))
    return [Revision(s.revision) for s in reversed(found) if s.revision not in start]


def _versions(pg_conn: Any, schema: str) -> frozenset[str] | None:
    """Revisions recorded in ``<schema>.alembic_version``; None if the table is missing."""
    with pg_conn.cursor(row_factory=tuple_row) as cur:
        # One catalog lookup by (name, schema), whatever the number of schemas.
        cur.execute(
            "SELECT c.relkind FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace "
            "WHERE n.nspname = %s AND c.relname = 'alembic_version' AND c.relkind IN ('r', 'p')",
            (schema,),
        )
        if cur.fetchone() is None:
            return None
        cur.execute(tenant_schema.versions_query(schema))
        return frozenset(row[0] for row in cur)


def read_control_versions(pg_conn: Any) -> Iterator[str]:
    """The control schema's recorded revisions, read with one statement that fails (undefined
    table or schema) when it was never migrated; in a pipeline the rows come with the next
    fetch's round trip. :func:`control_at_head` asks the catalog first instead, and never fails.
    """
    cur = pg_conn.cursor(row_factory=tuple_row)
    cur.execute(tenant_schema.versions_query(CONTROL_SCHEMA))
    return (str(row[0]) for row in cur)


def control_at_head(pg_conn: Any) -> bool:
    return _versions(pg_conn, CONTROL_SCHEMA) == control_heads()


def tenant_at_head(pg_conn: Any, schema: str) -> bool:
    return _versions(pg_conn, schema) == tenant_heads()


def tenant_versions(pg_conn: Any, schema: str) -> frozenset[str] | None:
    """The revisions a tenant schema records; None when it has no version table (or no schema)."""
    return _versions(pg_conn, schema)
