"""Control revision 20261204_h32room up and down from the revision before it: the upgrade's
placement counts the moves under way (``control.tenant_moves``) and finds them by an index of
its own; the downgrade gives back the function word for word as it was, and drops the index.
Its behaviour with moves under way is tested in tests/integration/test_place_room.py."""

from __future__ import annotations

import sqlalchemy as sa
from alembic import command
from alembic.script import ScriptDirectory

from provisioner import db
from provisioner.templates import migrations
from tests.conftest import Database

REVISION = "20261204_h32room"

DEFINITION = "SELECT pg_get_functiondef('control.place_tenant()'::regprocedure)"
INDEX = "SELECT to_regclass('control.tenant_moves_coming_idx') IS NOT NULL"


def _migrate(database: Database, step: str, revision: str) -> tuple[str, bool]:
    """Run ``step`` (upgrade or downgrade) to ``revision``; the placement function's definition
    and whether the index exists, after it."""
    engine = db.engine(database.owner_url, poolclass=sa.pool.NullPool)
    try:
        with engine.begin() as conn:
            getattr(command, step)(migrations.control_config(connection=conn), revision)
        with engine.connect() as conn:
            definition = conn.execute(sa.text(DEFINITION)).scalar_one()
            indexed = conn.execute(sa.text(INDEX)).scalar_one()
    finally:
        engine.dispose()
    return str(definition), bool(indexed)


def test_the_downgrade_restores_the_placement_before_it(bare_database: Database) -> None:
    script = ScriptDirectory.from_config(migrations.control_config())
    before = script.get_revision(REVISION).down_revision
    assert isinstance(before, str)
    placed_only, indexed = _migrate(bare_database, "upgrade", before)
    assert "tenant_moves" not in placed_only and not indexed
    with_moves, indexed = _migrate(bare_database, "upgrade", REVISION)
    assert "control.tenant_moves m" in with_moves and "phase = 'moving'" in with_moves
    assert indexed
    assert _migrate(bare_database, "downgrade", before) == (placed_only, False)
    assert _migrate(bare_database, "upgrade", REVISION) == (with_moves, True)
