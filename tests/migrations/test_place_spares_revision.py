"""Control revision 20261205_h33spares up and down from the revision before it: the upgrade's
placement counts only the spares a take would hand out (their tree state and role set read
from the workers' heartbeats); the downgrade gives back 20261204_h32room's function word for
word. Its behaviour is tested in tests/integration/test_server_pool.py."""

from __future__ import annotations

import sqlalchemy as sa
from alembic import command
from alembic.script import ScriptDirectory

from provisioner import db
from provisioner.templates import migrations
from tests.conftest import Database

REVISION = "20261205_h33spares"

DEFINITION = "SELECT pg_get_functiondef('control.place_tenant()'::regprocedure)"


def _migrate(database: Database, step: str, revision: str, read: str = DEFINITION) -> str:
    """Run ``step`` (upgrade or downgrade) to ``revision``; what ``read`` reads after it (by
    default the placement function's definition)."""
    engine = db.engine(database.owner_url, poolclass=sa.pool.NullPool)
    try:
        with engine.begin() as conn:
            getattr(command, step)(migrations.control_config(connection=conn), revision)
        with engine.connect() as conn:
            return str(conn.execute(sa.text(read)).scalar_one())
    finally:
        engine.dispose()


def test_the_downgrade_restores_the_placement_before_it(bare_database: Database) -> None:
    script = ScriptDirectory.from_config(migrations.control_config())
    before = script.get_revision(REVISION).down_revision
    assert before == "20261204_h32room"
    any_spare = _migrate(bare_database, "upgrade", before)
    assert "runtime_heartbeats" not in any_spare and "control.tenant_moves m" in any_spare
    usable = _migrate(bare_database, "upgrade", REVISION)
    assert "control.runtime_heartbeats h" in usable and "p.tree_digest" in usable
    assert "control.tenant_moves m" in usable  # the rest of h32room's definition is kept
    assert usable.replace(_preference(usable), "") == any_spare.replace(_preference(any_spare), "")
    assert _migrate(bare_database, "downgrade", before) == any_spare
    assert _migrate(bare_database, "upgrade", REVISION) == usable


def _preference(definition: str) -> str:
    """The spare preference in a definition: the ORDER BY's text before its first DESC."""
    start = definition.index("ORDER BY ") + len("ORDER BY ")
    return definition[start : definition.index(" DESC,", start)]
