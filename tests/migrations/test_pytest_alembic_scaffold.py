"""pytest-alembic's built-in checks on the trees ``provisioner init`` writes (issue 24, item
4): the example, one from an existing schema, one from SQLAlchemy metadata; each has one head,
upgrades from base to head and goes up and down again revision by revision, inside one tenant
schema as the engine runs it."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest
import sqlalchemy as sa
from alembic.config import Config
from pytest_alembic.tests import (  # noqa: F401 (collected here)
    test_single_head_revision,
    test_up_down_consistency,
    test_upgrade,
)

from provisioner import db
from provisioner.templates import migrations, scaffold
from provisioner.tenant import schema as tenant_schema
from tests.conftest import Database
from tests.integration.test_init import LEGACY, MODELS

SCHEMA = "tenant_pytest_alembic"


@pytest.fixture(params=["example", "schema", "metadata"])
def alembic_config(
    request: pytest.FixtureRequest,
    tmp_path: Path,
    database: Database,
    monkeypatch: pytest.MonkeyPatch,
) -> Config:
    if request.param == "schema":
        with database.owner() as conn:
            conn.execute(LEGACY)
        first = scaffold.from_schema(database.owner_url, "legacy_app")
    elif request.param == "metadata":
        (tmp_path / "app_models_scaffold.py").write_text(MODELS)
        monkeypatch.syspath_prepend(str(tmp_path))
        first = scaffold.from_metadata("app_models_scaffold:Base")
    else:
        first = scaffold.example_revision()
    project = scaffold.write(tmp_path / "project", first)
    return migrations.tenant_config(SCHEMA, tree=project.root / scaffold.TREE)


@pytest.fixture
def alembic_engine(database: Database) -> Iterator[sa.Engine]:
    with psycopg.connect(database.owner_url) as conn:
        tenant_schema.create_schema(conn, SCHEMA)
    engine = db.engine(database.owner_url, poolclass=sa.pool.NullPool)
    yield engine
    engine.dispose()
