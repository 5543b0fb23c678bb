"""Control revision 20261208_h38keylog: ``control.tenant_location`` (the application's lookup in
SQL) leaves ``sslkeylogfile`` out of a reference stored before the library refused it, reading
the reference as libpq does; the directory's CHECK refuses the key, and a URL that
percent-encodes a parameter's name, in a new or changed reference (a row stored before still
counts its tenants); the downgrade gives the lookup back word for word."""

from __future__ import annotations

import psycopg
import pytest
from alembic.script import ScriptDirectory
from psycopg.conninfo import conninfo_to_dict

import provisioner
from provisioner import servers
from provisioner.templates import migrations
from tests.conftest import Database
from tests.migrations.test_place_spares_revision import _migrate as migrate_and_read

REVISION = "20261208_h38keylog"

LOOKUP = "SELECT pg_get_functiondef('control.tenant_location(text)'::regprocedure)"

# Stored references, each with what libpq reads in it; the lookup must give the same less
# sslkeylogfile. Quoted values, escapes, a key inside another value, a value libpq takes from
# the next word, URLs with the key first, last, alone and percent-encoded in its name.
STORED = (
    "host=db port=5432 dbname=app",
    "host=db sslkeylogfile=/tmp/k dbname=app",
    "host=db sslkeylogfile = '/tmp/my keys' dbname=app",
    "host=db sslkeylogfile='/tmp/it\\'s' dbname='a b'",
    "host=db sslkeylogfile=/tmp/a\\ b dbname=app",
    "host=db application_name='x sslkeylogfile=y' dbname=app",
    "host=db sslkeylogfile= dbname=app",
    "  host=db   sslkeylogfile=''   dbname=app  ",
    "postgresql://db:5432/app?sslmode=require&sslkeylogfile=/tmp/k",
    "postgresql://db/app?sslkeylogfile=/tmp/k",
    "postgresql://db/app?sslkeylogfile=/tmp/k&sslmode=require",
    "postgresql://db/app?ssl%6Beylogfile=/tmp/k&sslmode=require",
    "postgres://db/app%20x?application_name=a%20b",
    "service=shard1",
)


def _migrate(database: Database, step: str, revision: str) -> str:
    """Run ``step`` to ``revision``; the lookup's definition after it."""
    return migrate_and_read(database, step, revision, read=LOOKUP)


def _without_key(reference: str) -> dict[str, str]:
    return {k: v for k, v in conninfo_to_dict(reference).items() if k != "sslkeylogfile"}


def test_the_lookup_leaves_the_key_out_of_a_row_stored_before_and_the_downgrade_restores_it(
    bare_database: Database,
) -> None:
    script = ScriptDirectory.from_config(migrations.control_config())
    before = script.get_revision(REVISION).down_revision
    assert before == "20261207_h37guard"
    as_stored = _migrate(bare_database, "upgrade", before)
    keylog = "host=db port=5432 dbname=app sslkeylogfile=/tmp/hunter2.keys"
    with psycopg.connect(bare_database.owner_url, autocommit=True) as conn:
        # written by hand before this revision: its CHECK did not exist yet
        conn.execute(
            "INSERT INTO control.tenant_servers (name, conninfo) VALUES ('leaky', %s)", (keylog,)
        )
    routed = _migrate(bare_database, "upgrade", REVISION)
    assert "routable_reference" in routed and "routable_reference" not in as_stored
    with psycopg.connect(bare_database.app_url) as conn:
        provisioner.enqueue(conn, "acme", server="leaky")
        conn.commit()
        found = conn.execute("SELECT * FROM control.tenant_location('acme')").fetchone()
        located = provisioner.locate("acme", conn=conn)
    assert found == ("leaky", "host=db port=5432 dbname=app")
    assert (located.server, located.conninfo) == found
    with psycopg.connect(bare_database.owner_url, autocommit=True) as conn:
        # the row counts its tenants (an update of another column), its reference is kept
        assert conn.execute(
            "SELECT placed, conninfo FROM control.tenant_servers WHERE name = 'leaky'"
        ).fetchone() == (1, keylog)
        with pytest.raises(psycopg.errors.CheckViolation):
            conn.execute(
                "UPDATE control.tenant_servers SET conninfo = conninfo || ' sslmode=require'"
            )
        conn.execute("UPDATE control.tenant_servers SET conninfo = 'host=db dbname=app'")

    assert _migrate(bare_database, "downgrade", before) == as_stored
    with psycopg.connect(bare_database.owner_url) as conn:
        gone = conn.execute(
            "SELECT to_regprocedure('control.routable_reference(text)'),"
            " to_regprocedure('control.refuse_keylog_reference()'),"
            " (SELECT count(*) FROM pg_trigger WHERE tgname = 'tenant_servers_no_keylog')"
        ).fetchone()
    assert gone == (None, None, 0)
    assert _migrate(bare_database, "upgrade", REVISION) == routed


def test_the_lookup_reads_a_reference_as_libpq_does(database: Database) -> None:
    with psycopg.connect(database.owner_url) as conn:
        for reference in STORED:
            row = conn.execute("SELECT control.routable_reference(%s)", (reference,)).fetchone()
            assert row is not None
            routed = str(row[0])
            assert conninfo_to_dict(routed) == _without_key(reference), reference
            if "sslkeylogfile" not in reference and "%6B" not in reference:
                assert routed == reference  # nothing to leave out: the text as stored
        assert conn.execute("SELECT control.routable_reference(NULL)").fetchone() == (None,)


@pytest.mark.parametrize(
    "reference",
    [
        "host=db sslkeylogfile=/tmp/k",
        "postgresql://db/app?SSLKEYLOGFILE=/tmp/k",
        "postgresql://db/app?sslmode=require&ssl%6Beylogfile=/tmp/k",
        "postgresql://db/app?ssl%6Dode=require",
    ],
)
def test_the_directory_refuses_the_key_or_an_encoded_name_in_a_new_row(
    database: Database, reference: str
) -> None:
    with database.owner() as conn:
        with pytest.raises(psycopg.errors.CheckViolation), conn.transaction():
            conn.execute(
                "INSERT INTO control.tenant_servers (name, conninfo) VALUES ('s', %s)",
                (reference,),
            )
        with pytest.raises(provisioner.InvalidInput):
            servers.connection_reference(reference)
        conn.execute(
            "INSERT INTO control.tenant_servers (name, conninfo) "
            "VALUES ('s', 'postgresql://db:5432/app%20x?sslmode=require')"
        )


def test_a_server_stored_before_the_reference_rules_still_takes_tenants(
    bare_database: Database,
) -> None:
    """Revision 20261207_h37guard's NOT VALID CHECK refused each update of a row stored before
    it that breaks its rule (an ``sslpassword``), and placement counts a server's tenants on
    its row: every tenant placed there failed. The rule is now the trigger's, on a changed
    reference only."""
    _migrate(bare_database, "upgrade", "20261206_h35beats")
    with psycopg.connect(bare_database.owner_url, autocommit=True) as conn:
        conn.execute(
            "INSERT INTO control.tenant_servers (name, conninfo) "
            "VALUES ('old', 'host=db dbname=app sslpassword=s3cret')"
        )
    _migrate(bare_database, "upgrade", "20261207_h37guard")
    with psycopg.connect(bare_database.app_url) as conn:
        with pytest.raises(psycopg.errors.CheckViolation, match="plain_reference"):
            provisioner.enqueue(conn, "early", server="old")
        conn.rollback()
    _migrate(bare_database, "upgrade", REVISION)
    with psycopg.connect(bare_database.app_url) as conn:
        provisioner.enqueue(conn, "acme", server="old")
        conn.commit()
    with psycopg.connect(bare_database.owner_url, autocommit=True) as conn:
        assert conn.execute(
            "SELECT placed FROM control.tenant_servers WHERE name = 'old'"
        ).fetchone() == (1,)
        for reference in ("host=db sslpassword=x", "host=db dbname='a\nb'", "host=db\tx=y"):
            with pytest.raises(psycopg.errors.CheckViolation, match="secret or a control"):
                conn.execute(
                    "INSERT INTO control.tenant_servers (name, conninfo) VALUES ('new', %s)",
                    (reference,),
                )
        with pytest.raises(psycopg.errors.CheckViolation, match="secret or a control"):
            conn.execute("UPDATE control.tenant_servers SET conninfo = conninfo || ' port=5'")
