"""pytest-alembic's built-in checks on the control tree: one head, upgrade from base to head,
and every revision's downgrade and upgrade again (up/down consistency).

pytest-alembic hands ``env.py`` an Engine in ``config.attributes["connection"]``; the tree's
``env.py`` opens a transaction on it."""

from __future__ import annotations

from collections.abc import Iterator

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
from tests.conftest import Database


@pytest.fixture
def alembic_config() -> Config:
    return migrations.control_config()


@pytest.fixture
def alembic_engine(bare_database: Database) -> Iterator[sa.Engine]:
    engine = db.engine(bare_database.owner_url, poolclass=sa.pool.NullPool)
    yield engine
    engine.dispose()
