"""Control revision 20261206_h35beats up and down from the revision before it: the upgrade's
placement believes a pool's heartbeat only while it is fresh and written by the owner side;
the downgrade gives back 20261205_h33spares's function word for word. Its behaviour is tested
in tests/integration/test_server_pool.py."""

from __future__ import annotations

from alembic.script import ScriptDirectory

from provisioner.templates import migrations
from tests.conftest import Database
from tests.migrations.test_place_spares_revision import _migrate, _preference

REVISION = "20261206_h35beats"


def test_the_downgrade_restores_the_placement_before_it(bare_database: Database) -> None:
    script = ScriptDirectory.from_config(migrations.control_config())
    before = script.get_revision(REVISION).down_revision
    assert before == "20261205_h33spares"
    any_beat = _migrate(bare_database, "upgrade", before)
    assert "heartbeat_at" not in any_beat and "written_by" not in any_beat
    live = _migrate(bare_database, "upgrade", REVISION)
    assert "h.heartbeat_at > now() - make_interval(" in live and "h.written_by" in live
    assert live.replace(_preference(live), "") == any_beat.replace(_preference(any_beat), "")
    assert _migrate(bare_database, "downgrade", before) == any_beat
    assert _migrate(bare_database, "upgrade", REVISION) == live
