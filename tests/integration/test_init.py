"""``provisioner init`` (issue 24, item 4): on an empty folder, from an existing schema, from
SQLAlchemy metadata; each project provisions a tenant in one more command, run from the
project's folder as a user would. A refused init writes nothing."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

from provisioner.settings import Settings
from tests.conftest import Database, run_cli

# An application's schema as a team that already runs schema-per-tenant has it.
LEGACY = """
CREATE SCHEMA legacy_app;
SET search_path TO legacy_app;
CREATE TYPE plan_tier AS ENUM ('free', 'pro');
CREATE TABLE accounts (
    id BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    email TEXT NOT NULL UNIQUE CHECK (position('@' in email) > 1),
    tier plan_tier NOT NULL DEFAULT 'free',
    email_domain TEXT GENERATED ALWAYS AS (split_part(email, '@', 2)) STORED
);
CREATE TABLE invoices (
    id BIGSERIAL PRIMARY KEY,
    account_id BIGINT NOT NULL REFERENCES accounts (id) ON DELETE CASCADE,
    cents INT NOT NULL,
    note TEXT
);
CREATE INDEX invoices_account_idx ON invoices (account_id);
CREATE VIEW big_invoices AS SELECT * FROM invoices WHERE cents > 100000;
CREATE FUNCTION touch_note() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN NEW.note := coalesce(NEW.note, 'legacy_app.note; default'); RETURN NEW; END $$;
CREATE TRIGGER invoices_note BEFORE INSERT ON invoices FOR EACH ROW EXECUTE FUNCTION touch_note();
"""

MODELS = """
import sqlalchemy as sa
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column


class Base(DeclarativeBase):
    pass


class Project(Base):
    __tablename__ = "projects"
    id: Mapped[int] = mapped_column(primary_key=True)
    name: Mapped[str] = mapped_column(sa.String(200), index=True)


class Task(Base):
    __tablename__ = "tasks"
    id: Mapped[int] = mapped_column(primary_key=True)
    project_id: Mapped[int] = mapped_column(sa.ForeignKey("projects.id"))
    done: Mapped[bool] = mapped_column(default=False)
"""


def cli(
    settings: Settings, cwd: Path, *args: str, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    """The CLI run in ``cwd``, the project's file saying the object store (none)."""
    return run_cli(settings, *args, env={"OBJECT_STORE_PROVIDER": "", **(env or {})}, cwd=cwd)


def tables(database: Database, schema: str) -> list[tuple[str, str, str]]:
    with database.owner() as conn:
        return conn.execute(
            "SELECT table_name, column_name, data_type FROM information_schema.columns "
            "WHERE table_schema = %s AND table_name <> 'alembic_version' ORDER BY 1, 2",
            (schema,),
        ).fetchall()


def test_init_on_an_empty_folder_then_provision(
    tmp_path: Path, settings: Settings, database: Database
) -> None:
    project = tmp_path / "signup"
    done = cli(settings, tmp_path, "init", str(project))
    assert done.returncode == 0, done.stderr
    assert (project / "provisioner.toml").is_file()
    assert (project / "tenant" / "env.py").is_file()
    assert (project / "tenant" / "seeds" / "001_example.sql").is_file()

    result = cli(settings, project, "provision", "acme")
    assert result.returncode == 0, result.stderr
    with database.owner() as conn:
        assert conn.execute("SELECT title, body FROM tenant_acme.notes").fetchall() == [
            ("Welcome", "This is tenant acme")
        ]

    again = cli(settings, tmp_path, "init", str(project))
    assert again.returncode == 2
    assert again.stderr.strip().splitlines() == [
        f"error: {project / 'provisioner.toml'} exists already: init writes only new files"
    ]


def test_init_from_an_existing_schema_then_provision(
    tmp_path: Path, settings: Settings, database: Database
) -> None:
    with database.owner() as conn:
        conn.execute(LEGACY)
    project = tmp_path / "adopt"
    done = cli(
        settings,
        tmp_path,
        "init",
        str(project),
        "--from-schema",
        "legacy_app",
        "--database-url",
        database.owner_url,
    )
    assert done.returncode == 0, done.stderr
    revision = (project / "tenant" / "versions" / "0001_initial.py").read_text()
    assert "legacy_app." not in revision.replace("legacy_app.note; default", "")

    result = cli(settings, project, "provision", "acme")
    assert result.returncode == 0, result.stderr
    assert tables(database, "tenant_acme") == tables(database, "legacy_app")
    with database.owner() as conn:
        conn.execute(
            "INSERT INTO tenant_acme.accounts (email) VALUES ('a@example.com');"
            "INSERT INTO tenant_acme.invoices (account_id, cents) VALUES (1, 200000)"
        )
        row = conn.execute("SELECT note, cents FROM tenant_acme.big_invoices").fetchone()
        assert row == ("legacy_app.note; default", 200000)  # the trigger, the view
        domain = conn.execute("SELECT email_domain, tier FROM tenant_acme.accounts").fetchone()
        assert domain == ("example.com", "free")


def test_init_from_a_missing_schema_writes_nothing(
    tmp_path: Path, settings: Settings, database: Database
) -> None:
    project = tmp_path / "nothing"
    done = cli(
        settings,
        tmp_path,
        "init",
        str(project),
        "--from-schema",
        "no_such_schema",
        "--database-url",
        database.owner_url,
    )
    assert done.returncode == 2
    assert len(done.stderr.strip().splitlines()) == 1
    assert not project.exists()


# Schemas whose names pg_dump reads as patterns unless quoted: a wildcard, mixed case, a dot
# (database.schema to pg_dump), a double quote.
ODD_SCHEMAS = ["pat_one", "pat_two", "MixedCase", "dot.ted", 'q"x']


def test_init_from_schema_takes_the_name_exactly_not_as_a_pattern(
    tmp_path: Path, settings: Settings, database: Database
) -> None:
    with database.owner() as conn:
        for i, schema in enumerate(ODD_SCHEMAS):
            quoted = '"' + schema.replace('"', '""') + '"'
            conn.execute(f"CREATE SCHEMA {quoted}; CREATE TABLE {quoted}.table_{i} (id int)")
            conn.execute(f"CREATE TABLE {quoted}.alembic_version (version_num text)")

    def init(name: str, folder: str) -> subprocess.CompletedProcess[str]:
        args = ("init", str(tmp_path / folder), "--from-schema", name)
        return cli(settings, tmp_path, *args, "--database-url", database.owner_url)

    for pattern in ("pat_*", "pat_?ne", "PAT_ONE"):  # no schema has that very name
        refused = init(pattern, "wild")
        assert refused.returncode == 2, (pattern, refused.stdout, refused.stderr)
        assert len(refused.stderr.strip().splitlines()) == 1, refused.stderr
        assert not (tmp_path / "wild").exists()
    for i, schema in enumerate(ODD_SCHEMAS[2:], start=2):
        folder = f"odd_{i}"
        done = init(schema, folder)
        assert done.returncode == 0, (schema, done.stderr)
        revision = (tmp_path / folder / "tenant" / "versions" / "0001_initial.py").read_text()
        tables_made = sorted(set(re.findall(r"CREATE TABLE (\w+)", revision)))
        assert tables_made == [f"table_{i}"], (schema, revision)  # not its alembic_version


def test_init_from_sqlalchemy_metadata_then_provision(
    tmp_path: Path, settings: Settings, database: Database
) -> None:
    (tmp_path / "mods").mkdir()
    (tmp_path / "mods" / "app_models.py").write_text(MODELS)
    project = tmp_path / "orm"
    env = {"PYTHONPATH": f"{tmp_path / 'mods'}:{Path(__file__).resolve().parents[2]}"}
    done = cli(
        settings, tmp_path, "init", str(project), "--from-metadata", "app_models:Base", env=env
    )
    assert done.returncode == 0, done.stderr
    result = cli(settings, project, "provision", "acme", env=env)
    assert result.returncode == 0, result.stderr
    assert [t[:2] for t in tables(database, "tenant_acme")] == [
        ("projects", "id"),
        ("projects", "name"),
        ("tasks", "done"),
        ("tasks", "id"),
        ("tasks", "project_id"),
    ]
    with database.owner() as conn:
        indexes = conn.execute(
            "SELECT indexname FROM pg_indexes WHERE schemaname = 'tenant_acme' ORDER BY 1"
        ).fetchall()
    assert ("ix_projects_name",) in indexes
