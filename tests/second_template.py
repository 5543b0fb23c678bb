"""The second template's project (``tests/second_template``), copied where a test may change
it, and the ways to run the tool on it as its team would: the CLI and workers started in the
project's folder (so they find its ``provisioner.toml``), its Python seeds importable.

Shared by ``tests/integration/test_second_template.py`` and ``tests/crash``.
"""

from __future__ import annotations

import shutil
import subprocess
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import psycopg

from provisioner.local import cluster as local_pg
from provisioner.settings import Settings
from provisioner.testing import BOOTSTRAP_LOCK_KEY
from tests.conftest import ROOT, Database, Server, create_database, drop_database, run_cli

PROJECT = ROOT / "tests" / "second_template"
#: The revision a fleet upgrade adds to the tree (kept outside the tree until then).
UPGRADE = PROJECT / "upgrade" / "s002_due_dates.py"
HEAD = "s001"


#: The project's second application role (readonly), beside the bootstrap's app_rw.
READONLY_ROLE = "app_ro"


def add_readonly_role(server: Server, database: Database) -> str:
    """Create the project's readonly role in the cluster (if missing) and let it connect to
    ``database``, as an operator's bootstrap would; its URL there."""
    with psycopg.connect(server.admin_url, autocommit=True) as lock:
        # Roles are the cluster's: one process at a time creates them (as the bootstrap does).
        lock.execute("SELECT pg_advisory_lock(%s)", (BOOTSTRAP_LOCK_KEY,))
        with psycopg.connect(database.admin_url, autocommit=True) as conn:
            local_pg.add_app_roles(conn, (READONLY_ROLE,))
    return server.url(READONLY_ROLE, database.name)


@contextmanager
def own_database(server: Server, prefix: str) -> Iterator[Database]:
    """A database of its own for a module, with the project's readonly role; dropped after."""
    name = f"{prefix}_{uuid.uuid4().hex[:12]}"
    database = create_database(server, name)
    add_readonly_role(server, database)
    try:
        yield database
    finally:
        drop_database(server, name)


def copy_project(target: Path) -> Path:
    """A copy of the project the test may change (a revision added), without byte-code."""
    shutil.copytree(PROJECT, target, ignore=shutil.ignore_patterns("__pycache__", ".pytest_cache"))
    return target


def project_env(project: Path) -> dict[str, str]:
    """What the suite's settings would override in the project's file: the object store (the
    file says none) and the import path (the project's seed module, and this checkout)."""
    return {"OBJECT_STORE_PROVIDER": "", "PYTHONPATH": f"{project}:{ROOT}"}


def cli(settings: Settings, project: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """``provisioner ARGS`` run in the project's folder."""
    return run_cli(settings, *args, env=project_env(project), cwd=project)


def record_naming(settings: Settings, project: Path) -> None:
    """``provisioner migrate`` in the project's folder: its naming (``helpdesk_{id}``) recorded
    in the control database, as a team does before its first tenant."""
    result = cli(settings, project, "migrate")
    assert result.returncode == 0, result.stdout + result.stderr


def provision(settings: Settings, project: Path, tenant: str) -> None:
    result = cli(settings, project, "provision", tenant)
    assert result.returncode == 0, result.stdout + result.stderr


def add_upgrade(project: Path) -> None:
    """The second revision, into the project's tree (a release of the template)."""
    shutil.copy(UPGRADE, project / "tenant" / "versions" / UPGRADE.name)


def tables(database: Database, schema: str) -> list[str]:
    with database.owner() as conn:
        rows = conn.execute(
            "SELECT c.relname FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace "
            "WHERE n.nspname = %s AND c.relkind IN ('r', 'p') ORDER BY 1",
            (schema,),
        ).fetchall()
    return [row[0] for row in rows]
