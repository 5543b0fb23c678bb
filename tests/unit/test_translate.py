"""The one driver-error translation: each SQLSTATE to its class, on one line, redacted."""

from __future__ import annotations

import psycopg
import pytest

from provisioner import db
from provisioner.errors import DatabaseUnavailable, LockNotAvailable, TransientError


def test_a_lock_timeout_is_lock_not_available_and_transient() -> None:
    error = db.translate(psycopg.errors.LockNotAvailable("canceling statement due to lock timeout"))
    assert isinstance(error, LockNotAvailable)
    assert isinstance(error, DatabaseUnavailable) and isinstance(error, TransientError)
    assert str(error) == "database unavailable: canceling statement due to lock timeout"


def test_a_lost_connection_is_unavailable_and_a_failed_statement_an_error() -> None:
    lost = db.translate(psycopg.OperationalError("server closed\n the connection"))
    assert type(lost) is DatabaseUnavailable
    assert str(lost) == "database unavailable: server closed the connection"
    failed = db.translate(psycopg.errors.UndefinedTable('relation "x" does not exist'))
    assert type(failed) is db.DatabaseError
    assert str(failed) == 'database error: relation "x" does not exist'


def test_translated_hides_passwords_and_chains_the_cause() -> None:
    cause = psycopg.OperationalError("could not connect to postgresql://owner:s3cr3t@db/x")
    with pytest.raises(DatabaseUnavailable) as raised, db.translated():
        raise cause
    assert "s3cr3t" not in str(raised.value)
    assert raised.value.__cause__ is cause
