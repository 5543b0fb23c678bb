"""``provisioner init``: a project's configuration, tenant tree, seeds and first revision.

Three ways to write the first revision:

- an example (a ``notes`` table), for a project starting from nothing;
- ``--from-schema NAME``: the DDL of a schema that already exists in the user's database, read
  with ``pg_dump --schema-only`` (the server's own description of it; credentials reach pg_dump
  through libpq's environment, never its command line), with the schema's name taken out of
  every qualified name so that the revision builds the same objects in any tenant's schema;
- ``--from-metadata module:attr``: SQLAlchemy metadata rendered by Alembic's autogenerate
  (``render_python_code`` of the tables' create operations; no database needed).

Each revision's downgrade drops what the schema holds but the version table (pytest-alembic's
up/down check passes). Nothing is written when a file would be overwritten or the source
cannot be read: the checks come first.
"""

from __future__ import annotations

import importlib
import re
import shutil
import subprocess
import tempfile
from dataclasses import dataclass
from datetime import date
from pathlib import Path

import sqlalchemy as sa
import sqlparse
from psycopg.conninfo import conninfo_to_dict, make_conninfo

from provisioner.errors import ConfigurationError, InvalidInput
from provisioner.redact import redact
from provisioner.templates import migrations

__all__ = ["FirstRevision", "Scaffold", "example_revision", "from_metadata", "from_schema", "write"]

TREE = "tenant"
REVISION_ID = "0001"
#: The shipped tree's files a project's tree starts from (env.py runs in the tenant's schema).
TREE_FILES = ("alembic.ini", "env.py", "script.py.mako")

CONFIG = """\
# The provisioner's settings for this project (every key: provisioner config, or
# docs/configuration.md). The environment overrides this file; database URLs and credentials
# belong in the environment, never here.
tenant_tree = "{tree}"
seeds = ["{tree}/seeds"]
object_store_provider = "none"
# A tenant's schema name ({{id}}: the tenant id) and the ids allowed: choose before the first
# tenant (docs/configuration.md, "Tenant ids and schema names").
schema_pattern = "tenant_{{id}}"
tenant_id_pattern = "[a-z][a-z0-9_]*"
tenant_id_max_length = 48

# The roles tenant schemas are granted to, each with its privilege set: readwrite (rows read
# and written) or readonly (SELECT only).
[app_roles]
app_rw = "readwrite"
"""

SEED = """\
-- An example seed: runs in the tenant's schema (search_path) when it is provisioned, with the
-- tenant id in current_setting('provisioner.tenant_id'). Keep seeds idempotent.
INSERT INTO notes (title, body)
SELECT 'Welcome', 'This is tenant ' || current_setting('provisioner.tenant_id')
WHERE NOT EXISTS (SELECT 1 FROM notes WHERE title = 'Welcome');
"""
EMPTY_SEED = """\
-- Seeds run in the tenant's schema (search_path) when it is provisioned, with the tenant id in
-- current_setting('provisioner.tenant_id'). Keep them idempotent (ON CONFLICT DO NOTHING).
SELECT 1;
"""

REVISION = '''"""{message}

Revision ID: {rev}
Revises:
Create Date: {today}
"""

{imports}

revision = "{rev}"
down_revision = None
branch_labels = None
depends_on = None


def upgrade() -> None:
{body}


def downgrade() -> None:
    # Everything this schema holds but the version table, whatever created it.
    op.execute(DROP_ALL)


DROP_ALL = """
DO $drop$
DECLARE r record;
BEGIN
  FOR r IN SELECT c.relname, c.relkind FROM pg_class c
            WHERE c.relnamespace = current_schema()::regnamespace
              AND c.relkind IN ('r', 'p', 'v', 'm', 'f') AND c.relname <> 'alembic_version'
              AND NOT c.relispartition LOOP
    EXECUTE format(CASE WHEN r.relkind IN ('v') THEN 'DROP VIEW IF EXISTS %I CASCADE'
                        WHEN r.relkind = 'm' THEN 'DROP MATERIALIZED VIEW IF EXISTS %I CASCADE'
                        WHEN r.relkind = 'f' THEN 'DROP FOREIGN TABLE IF EXISTS %I CASCADE'
                        ELSE 'DROP TABLE IF EXISTS %I CASCADE' END, r.relname);
  END LOOP;
  FOR r IN SELECT c.relname FROM pg_class c
            WHERE c.relnamespace = current_schema()::regnamespace AND c.relkind = 'S' LOOP
    EXECUTE format('DROP SEQUENCE IF EXISTS %I CASCADE', r.relname);
  END LOOP;
  FOR r IN SELECT p.oid::regprocedure::text AS sig FROM pg_proc p
            WHERE p.pronamespace = current_schema()::regnamespace LOOP
    EXECUTE 'DROP ROUTINE IF EXISTS ' || r.sig || ' CASCADE';
  END LOOP;
  FOR r IN SELECT t.typname FROM pg_type t
            WHERE t.typnamespace = current_schema()::regnamespace
              AND t.typtype IN ('e', 'd', 'c', 'r') AND (t.typtype <> 'c' OR EXISTS (
                SELECT 1 FROM pg_class c WHERE c.oid = t.typrelid AND c.relkind = 'c')) LOOP
    EXECUTE format('DROP TYPE IF EXISTS %I CASCADE', r.typname);
  END LOOP;
END
$drop$
"""
'''

EXAMPLE_BODY = '''    op.execute(
        """
        CREATE TABLE notes (
            id         BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
            title      TEXT NOT NULL,
            body       TEXT NOT NULL DEFAULT '',
            created_at TIMESTAMPTZ NOT NULL DEFAULT now()
        )
        """
    )'''


@dataclass(frozen=True)
class FirstRevision:
    """The first revision's text (a complete module) and what it was made from."""

    source: str
    text: str
    has_notes_table: bool = False


@dataclass(frozen=True)
class Scaffold:
    """What ``init`` wrote, relative to the project's folder."""

    root: Path
    files: tuple[Path, ...]


def _module(message: str, body: str, *, needs_sa: bool = False) -> str:
    imports = (
        "import sqlalchemy as sa\nfrom alembic import op" if needs_sa else "from alembic import op"
    )
    return REVISION.format(
        message=message, rev=REVISION_ID, today=date.today(), imports=imports, body=body
    )


def example_revision() -> FirstRevision:
    return FirstRevision("example", _module("An example table", EXAMPLE_BODY), True)


# -- from an existing schema ---------------------------------------------------------------------

_SKIP = re.compile(
    r"^(SET |SELECT pg_catalog\.set_config|\\|CREATE SCHEMA |ALTER SCHEMA |COMMENT ON SCHEMA )"
)


def _pg_dump() -> str:
    from provisioner.local.cluster import find_bin_dir  # the machine's PostgreSQL binaries

    try:
        return str(find_bin_dir() / "pg_dump")
    except Exception:
        found = shutil.which("pg_dump")
        if found is None:
            raise ConfigurationError(
                "pg_dump is not installed (PostgreSQL's client tools)"
            ) from None
        return found


def _conninfo_and_passfile(url: str, folder: Path) -> str:
    """``url`` as a conninfo string for pg_dump's ``--dbname`` without its password: the
    password goes into a password file only this user can read (a command line is visible to
    every local user)."""
    try:
        params = conninfo_to_dict(url)
    except Exception:
        raise InvalidInput("--database-url cannot be parsed as a PostgreSQL URL") from None
    password = params.pop("password", None)
    if password is not None:
        passfile = folder / "pgpass"
        escaped = str(password).replace("\\", "\\\\").replace(":", "\\:")
        passfile.touch(mode=0o600)
        passfile.write_text(f"*:*:*:*:{escaped}\n")
        params["passfile"] = str(passfile)
    params.setdefault("connect_timeout", "10")
    return make_conninfo("", **params)


def exact_pattern(name: str) -> str:
    """``name`` as a pg_dump pattern that matches that name alone: in double quotes, where
    ``*``, ``?`` and ``.`` are literal and case is kept, a ``"`` written ``""``."""
    return '"' + name.replace('"', '""') + '"'


def dump_schema(url: str, schema: str) -> str:
    """``pg_dump --schema-only`` of ``schema``, without owners, grants or its version table."""
    with tempfile.TemporaryDirectory(prefix="provisioner-init-") as folder:
        args = [
            _pg_dump(),
            "--schema-only",
            "--no-owner",
            "--no-privileges",
            f"--schema={exact_pattern(schema)}",
            f"--exclude-table={exact_pattern(schema)}.{exact_pattern('alembic_version')}",
            f"--dbname={_conninfo_and_passfile(url, Path(folder))}",
        ]
        try:
            done = subprocess.run(args, capture_output=True, text=True, timeout=120, check=False)
        except subprocess.TimeoutExpired:
            raise ConfigurationError("pg_dump did not finish within 120 s") from None
    if done.returncode != 0:
        last = (done.stderr.strip().splitlines() or ["failed"])[-1]
        raise ConfigurationError(f"pg_dump: {redact(last.removeprefix('pg_dump: error: '))}")
    return done.stdout


def schema_statements(dump: str, schema: str) -> list[str]:
    """The dump's statements, without session settings, psql commands, comments or the
    schema's own statement, each name unqualified (the revision runs in the tenant's schema)."""
    lines = [line for line in dump.splitlines() if not _SKIP.match(line)]
    text = "\n".join(line for line in lines if not line.startswith("--"))
    statements = (_unqualified(statement, schema) for statement in sqlparse.split(text))
    return [s.strip() for s in statements if s.strip().rstrip(";").strip()]


def _unqualified(statement: str, schema: str) -> str:
    """``statement`` with ``schema.`` taken off every name (plain or quoted) and off the
    ``'schema.name'::regclass`` literals pg_dump writes in defaults; other strings and function
    bodies are left as the user wrote them (sqlparse's tokens tell names from literals)."""
    quoted = '"' + schema.replace('"', '""') + '"'
    tokens = [
        token
        for parsed in sqlparse.parse(statement)
        for token in parsed.flatten()  # type: ignore[no-untyped-call]
    ]
    out: list[str] = []
    dot_too = False
    for i, token in enumerate(tokens):
        if dot_too:  # the dot after the schema's name goes with it
            dot_too = False
            continue
        after = tokens[i + 1].value if i + 1 < len(tokens) else ""
        if token.value in (schema, quoted) and after == "." and token.ttype in _NAMES:
            dot_too = True
            continue
        value = token.value
        if token.ttype is sqlparse.tokens.String.Single and _reg_cast(tokens, i):
            value = value.replace(f"'{schema}.", "'", 1).replace(f"'{quoted}.", "'", 1)
        out.append(value)
    return "".join(out)


_NAMES = (sqlparse.tokens.Name, sqlparse.tokens.String.Symbol)


def _reg_cast(tokens: list[sqlparse.sql.Token], i: int) -> bool:
    """Is the literal at ``i`` cast to an object identifier type (``::regclass`` ...)?"""
    rest = [t.value for t in tokens[i + 1 : i + 3]]
    return len(rest) == 2 and rest[0] == "::" and rest[1].lower().startswith("reg")


def from_schema(url: str, schema: str) -> FirstRevision:
    statements = schema_statements(dump_schema(url, schema), schema)
    if not statements:
        raise InvalidInput(f"schema {schema} has nothing to copy (no such schema, or it is empty)")
    body = "\n".join(
        f"    op.execute(\n        {_literal(statement)}\n    )" for statement in statements
    )
    return FirstRevision(f"schema {schema}", _module(f"The schema of {schema}", body))


def _literal(text: str) -> str:
    """A Python string literal of ``text`` (repr: every character escaped as Python needs)."""
    return repr(text)


# -- from SQLAlchemy metadata ------------------------------------------------------------------


def _metadata(spec: str) -> sa.MetaData:
    module_name, _, attr = spec.partition(":")
    if not module_name or not attr:
        raise InvalidInput(f"--from-metadata {spec!r}: expected module:attribute")
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise InvalidInput(f"--from-metadata: cannot import {module_name}: {exc}") from None
    value = getattr(module, attr, None)
    metadata = getattr(value, "metadata", value)  # a declarative Base, or a MetaData
    if not isinstance(metadata, sa.MetaData):
        raise InvalidInput(f"--from-metadata {spec}: not SQLAlchemy MetaData or a declarative base")
    return metadata


def from_metadata(spec: str) -> FirstRevision:
    """The metadata's tables (and their indexes) as Alembic's autogenerate renders them."""
    from alembic.autogenerate import render_python_code
    from alembic.operations import ops

    metadata = _metadata(spec)
    operations: list[ops.MigrateOperation] = []
    for table in metadata.sorted_tables:
        if table.schema is not None:
            raise InvalidInput(
                f"table {table.schema}.{table.name} names a schema: a tenant's tables must not"
            )
        operations.append(ops.CreateTableOp.from_table(table))
        operations.extend(ops.CreateIndexOp.from_index(index) for index in table.indexes)
    if not operations:
        raise InvalidInput(f"--from-metadata {spec}: the metadata has no tables")
    code = render_python_code(ops.UpgradeOps(ops=operations))
    body = _indent(code)
    return FirstRevision(f"metadata {spec}", _module(f"The tables of {spec}", body, needs_sa=True))


def _indent(code: str) -> str:
    lines = [line for line in code.splitlines() if not line.strip().startswith("# ###")]
    lines = [line[4:] if line.startswith("    ") else line for line in lines]
    return "\n".join(f"    {line}" if line.strip() else "" for line in lines).rstrip()


# -- writing -------------------------------------------------------------------------------------


def write(root: Path, first: FirstRevision) -> Scaffold:
    """Write the project's files under ``root``; refuse (writing nothing) if any exists."""
    tree = root / TREE
    planned = {
        root / "provisioner.toml": CONFIG.format(tree=TREE),
        tree / "versions" / f"{REVISION_ID}_initial.py": first.text,
        tree / "seeds" / "001_example.sql": SEED if first.has_notes_table else EMPTY_SEED,
    }
    shipped = migrations.packaged_tenant_tree()
    copies = {tree / name: shipped / name for name in TREE_FILES}
    taken = [p for p in (*planned, *copies) if p.exists()]
    if taken:
        raise InvalidInput(f"{taken[0]} exists already: init writes only new files")
    for path, text in planned.items():
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    for path, source in copies.items():
        shutil.copyfile(source, path)
    return Scaffold(root, tuple(p.relative_to(root) for p in (*planned, *copies)))
