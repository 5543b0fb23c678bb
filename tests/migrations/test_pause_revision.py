"""Control revision 20261202_h28rest down and up again on a database with a paused rollout and
a recorded drift check: the downgrade turns the paused rollout into a halted one (its held jobs
stay held, ``upgrade --resume`` releases them) and drops the checks; the upgrade allows
``paused`` again."""

from __future__ import annotations

import psycopg
import pytest
import sqlalchemy as sa
from alembic import command

from provisioner import db, service
from provisioner.settings import Settings
from provisioner.templates import migrations
from tests.conftest import Database

BEFORE = "20261202_h28_rollouts"


def _control_to(database: Database, revision: str) -> None:
    engine = db.engine(database.owner_url, poolclass=sa.pool.NullPool)
    try:
        with engine.begin() as conn:
            command.downgrade(migrations.control_config(connection=conn), revision)
    finally:
        engine.dispose()


def test_a_paused_rollout_is_halted_by_the_downgrade_and_paused_is_allowed_again(
    settings: Settings, database: Database
) -> None:
    with database.owner() as conn:
        conn.execute(
            "INSERT INTO control.rollouts (head, state, paused_at, paused_by) "
            "VALUES ('t005', 'paused', now(), 'ops@host')"
        )
        conn.execute(
            "INSERT INTO control.tenant_checks (tenant_id, outcome, checked_by) "
            "VALUES ('acme', 'clean', 'check')"
        )
    _control_to(database, BEFORE)
    with database.owner() as conn:
        assert conn.execute("SELECT state FROM control.rollouts").fetchall() == [("halted",)]
        assert conn.execute("SELECT to_regclass('control.tenant_checks')").fetchone() == (None,)
        with pytest.raises(psycopg.errors.CheckViolation):
            conn.execute("UPDATE control.rollouts SET state = 'paused'")
    service.migrate(settings)
    with database.owner() as conn:
        conn.execute("UPDATE control.rollouts SET state = 'paused'")
        assert conn.execute("SELECT count(*) FROM control.tenant_checks").fetchone() == (0,)
