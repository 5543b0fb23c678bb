"""The one driver-error translation: each SQLSTATE to its class, on one line, redacted."""

from __future__ import annotations

import psycopg
import pytest

from provisioner import db
from provisioner.errors import (
    ConnectionLost,
    DatabaseUnavailable,
    LockNotAvailable,
    ProvisionerError,
    StatementRejected,
    TransientError,
)


def test_a_lock_timeout_is_lock_not_available_and_transient() -> None:
    error = db.translate(psycopg.errors.LockNotAvailable("canceling statement due to lock timeout"))
    assert isinstance(error, LockNotAvailable)
    assert isinstance(error, DatabaseUnavailable) and isinstance(error, TransientError)
    assert str(error) == "database unavailable: canceling statement due to lock timeout"


def test_a_lost_connection_is_unavailable_and_a_failed_statement_an_error() -> None:
    lost = db.translate(psycopg.OperationalError("server closed\n the connection"))
    assert type(lost) is ConnectionLost and isinstance(lost, DatabaseUnavailable)
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


@pytest.mark.parametrize(
    ("error", "for_good"),
    [
        (psycopg.errors.UndefinedTable("relation does not exist"), True),
        (psycopg.errors.SyntaxError("syntax error"), True),
        (psycopg.errors.InvalidTextRepresentation("invalid input syntax"), True),
        (psycopg.errors.NotNullViolation("null value"), True),
        (psycopg.errors.LockNotAvailable("lock timeout"), False),
        (psycopg.errors.SerializationFailure("could not serialize"), False),
        (psycopg.errors.DeadlockDetected("deadlock detected"), False),
        (psycopg.OperationalError("server closed the connection"), False),
    ],
)
def test_only_errors_no_retry_can_fix_are_rejected_for_good(
    error: psycopg.Error, for_good: bool
) -> None:
    """Classes 22, 23 and 42 fail a migration or seed at once; lock timeouts, serialization
    failures, deadlocks and lost connections stay transient."""
    assert db.rejected_for_good(error) is for_good
    with pytest.raises(ProvisionerError) as caught, db.statements_of("seed 001.sql"):
        raise error
    assert isinstance(caught.value, StatementRejected) is for_good
    if for_good:
        assert str(caught.value).startswith("seed 001.sql: ")


@pytest.mark.parametrize(
    "error",
    [
        psycopg.OperationalError("connection failed: Connection refused"),  # libpq: no SQLSTATE
        psycopg.errors.AdminShutdown("terminating connection due to administrator command"),
        psycopg.errors.CrashShutdown("terminating connection because of crash of another"),
        psycopg.errors.CannotConnectNow("the database system is starting up"),
        psycopg.errors.ConnectionFailure("connection failure"),
    ],
)
def test_a_session_that_went_away_is_connection_lost(error: psycopg.Error) -> None:
    assert type(db.translate(error)) is ConnectionLost


@pytest.mark.parametrize(
    "error",
    [
        psycopg.errors.QueryCanceled("canceling statement due to statement timeout"),
        psycopg.errors.IdleInTransactionSessionTimeout("terminating connection due to idle"),
        psycopg.errors.LockNotAvailable("canceling statement due to lock timeout"),
    ],
)
def test_a_timeout_of_the_session_itself_is_not_connection_lost(error: psycopg.Error) -> None:
    """Each of these is the statement's or the session's own doing: retried with backoff."""
    assert not isinstance(db.translate(error), ConnectionLost)
