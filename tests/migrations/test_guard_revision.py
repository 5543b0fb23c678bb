"""Control revision 20261207_h37guard up and down from the revision before it: the upgrade's
placement decides a heartbeat's belief in a CASE and the registration policy holds the id to
the recorded rule; the downgrade gives back both definitions word for word. Their behaviour is
tested in tests/integration/test_server_pool.py and tests/integration/test_schema_pattern.py."""

from __future__ import annotations

import psycopg
import pytest
import sqlalchemy as sa
from alembic.script import ScriptDirectory

from provisioner import db
from provisioner.templates import migrations
from tests.conftest import Database
from tests.migrations.test_place_spares_revision import _migrate, _preference

REVISION = "20261207_h37guard"

POLICY = (
    "SELECT pg_get_expr(p.polwithcheck, p.polrelid) FROM pg_policy p "
    "WHERE p.polname = 'app_registers_tenants'"
)


def _policy(database: Database) -> str | None:
    engine = db.engine(database.owner_url, poolclass=sa.pool.NullPool)
    try:
        with engine.connect() as conn:
            found = conn.execute(sa.text(POLICY)).scalar_one_or_none()
            return None if found is None else str(found)
    finally:
        engine.dispose()


def test_the_downgrade_restores_the_placement_and_the_policy_before_it(
    bare_database: Database,
) -> None:
    script = ScriptDirectory.from_config(migrations.control_config())
    before = script.get_revision(REVISION).down_revision
    assert before == "20261206_h35beats"
    trusting = _migrate(bare_database, "upgrade", before)
    open_policy = _policy(bare_database)
    guarded = _migrate(bare_database, "upgrade", REVISION)
    guarded_policy = _policy(bare_database)
    assert "jsonb_typeof" in guarded and "jsonb_typeof" not in trusting
    assert guarded.replace(_preference(guarded), "") == trusting.replace(_preference(trusting), "")
    assert open_policy is not None and guarded_policy is not None
    assert "tenant_id_pattern" in guarded_policy and "tenant_id_pattern" not in open_policy
    assert _migrate(bare_database, "downgrade", before) == trusting
    assert _policy(bare_database) == open_policy
    assert _migrate(bare_database, "upgrade", REVISION) == guarded
    assert _policy(bare_database) == guarded_policy


def test_the_directory_refuses_a_secret_or_a_control_character_in_a_reference(
    database: Database,
) -> None:
    """The revision's CHECK on control.tenant_servers, for the owner's direct writes: a secret
    under another key than ``password`` and a control character, typed or percent-encoded."""
    refused = (
        "host=db sslpassword=s3cret",
        "postgresql://db/app?sslpassword=s3cret",
        "host=db oauth_client_secret=s3cret",
        "host=db dbname='a\nb = host=elsewhere'",
        "postgresql://db/a%0Ab",
        "host=db\tdbname=x\x7f",
    )
    with database.owner() as conn:
        for reference in refused:
            with pytest.raises(psycopg.errors.CheckViolation), conn.transaction():
                conn.execute(
                    "INSERT INTO control.tenant_servers (name, conninfo) VALUES ('s', %s)",
                    (reference,),
                )
        conn.execute(
            "INSERT INTO control.tenant_servers (name, conninfo) "
            "VALUES ('s', 'postgresql://db:5432/app%20x?sslmode=require')"
        )
