"""pytest-alembic's built-in checks on the tenant_template tree, inside one tenant schema: one
head, upgrade from base to head, and up/down consistency revision by revision.

The schema travels in ``config.attributes["tenant_schema"]`` as it does for the engine, and
pytest-alembic hands ``env.py`` an Engine in ``config.attributes["connection"]``."""

from __future__ import annotations

from collections.abc import Iterator

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
from provisioner.templates import migrations
from provisioner.tenant import schema as tenant_schema
from tests.conftest import Database

SCHEMA = "tenant_pytest_alembic"


@pytest.fixture
def alembic_config() -> Config:
    return migrations.tenant_config(SCHEMA)


@pytest.fixture
def alembic_engine(database: Database) -> Iterator[sa.Engine]:
    with psycopg.connect(database.owner_url) as conn:
        tenant_schema.create_schema(conn, SCHEMA)
    engine = db.engine(database.owner_url, poolclass=sa.pool.NullPool)
    yield engine
    engine.dispose()
