"""The one place driver errors become the package's errors.

Nothing above :mod:`provisioner.db` catches ``psycopg.Error`` or SQLAlchemy's errors: they leave
:func:`translated` as :class:`DatabaseUnavailable` (the server or the connection went away;
retry later), as :class:`LockNotAvailable` (a lock timeout, SQLSTATE 55P03: retried like an
outage) or as :class:`DatabaseError` (the statement itself failed), with any password removed
and on one line. What the SQLSTATE says is read here and nowhere else: callers ask with
``isinstance`` (or :func:`login_refused`, :func:`control_missing`).

Pinned by ``tests/unit/test_translate.py`` (each SQLSTATE to its class, secrets redacted) and
``tests/integration/test_fleet_upgrade.py::
test_a_migration_waiting_for_a_lock_gives_up_and_never_stalls_the_application`` (a lock timeout
fails the step and is retried, never a fallback to Alembic).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import psycopg
import sqlalchemy as sa

from provisioner.errors import (
    ConfigurationError,
    DatabaseError,
    DatabaseUnavailable,
    LockNotAvailable,
    ProvisionerError,
)
from provisioner.redact import redact

__all__ = [
    "DatabaseError",
    "DatabaseUnavailable",
    "LockNotAvailable",
    "control_missing",
    "login_refused",
    "translate",
    "translated",
]

#: SQLSTATE of a lock timeout (``lock_not_available``).
LOCK_NOT_AVAILABLE = "55P03"

# What libpq says when the server answered but refused this login: retrying cannot help.
_LOGIN_REFUSED = (
    "password authentication failed",
    "no password supplied",
    "authentication failed",
    "does not exist",
    "pg_hba.conf",
    "permission denied for database",
)
# What PgBouncer answers to the ``options`` startup parameter (session settings the engine's
# sessions carry): the connection goes through a pooler, and these sessions cannot.
_POOLER_REFUSED_OPTIONS = "unsupported startup parameter: options"
#: What to do about it, appended to PgBouncer's refusal.
POOLER_HINT = (
    "this connection goes through PgBouncer, and this command needs a PostgreSQL session of "
    "its own: connect it directly to PostgreSQL (enqueue, status, jobs, health, check and "
    "migrate work through PgBouncer)"
)
# SQLSTATEs of a control schema that is missing or older than this release.
_CONTROL_MISSING = {"3F000", "42P01", "42703", "42883"}


def _is_connectivity(exc: BaseException) -> bool:
    if isinstance(exc, psycopg.OperationalError):
        return True
    if isinstance(exc, sa.exc.DBAPIError):
        return bool(exc.connection_invalidated) or isinstance(exc.orig, psycopg.OperationalError)
    return isinstance(exc, sa.exc.OperationalError)


def translate(exc: BaseException) -> ProvisionerError:
    """Map a driver error to the package's tree, message redacted and on one line.

    A lock timeout is an ``OperationalError`` to psycopg, so it was always reported as the
    database being unavailable (and retried); :class:`LockNotAvailable` keeps that, and names
    it."""
    orig = exc.orig if isinstance(exc, sa.exc.DBAPIError) and exc.orig is not None else exc
    message = " ".join(redact(str(orig)).split()) or type(orig).__name__
    if _POOLER_REFUSED_OPTIONS in message:
        return ConfigurationError(f"{message}: {POOLER_HINT}")
    if isinstance(orig, psycopg.Error) and orig.sqlstate == LOCK_NOT_AVAILABLE:
        return LockNotAvailable(f"database unavailable: {message}")
    if _is_connectivity(exc):
        return DatabaseUnavailable(f"database unavailable: {message}")
    return DatabaseError(f"database error: {message}")


@contextmanager
def translated() -> Iterator[None]:
    """Run a block, re-raising driver errors as package errors."""
    try:
        yield
    except (psycopg.Error, sa.exc.SQLAlchemyError) as exc:
        raise translate(exc) from exc


def login_refused(exc: BaseException) -> bool:
    """True for a connection the server refused (wrong password, unknown role or database)."""
    cause = exc.__cause__ if isinstance(exc, ProvisionerError) else exc
    if not isinstance(cause, psycopg.OperationalError):
        return False
    text = str(cause).lower()
    return any(marker in text for marker in _LOGIN_REFUSED)


def control_missing(exc: BaseException) -> bool:
    """True when a statement failed because the control schema is missing or not migrated.

    The application role sees an unmigrated schema as ``permission denied for schema control``
    (it has no USAGE yet); the owner sees missing tables or columns.
    """
    cause = exc.__cause__ if isinstance(exc, ProvisionerError) else exc
    if not isinstance(cause, psycopg.Error) or cause.sqlstate is None:
        return False
    if cause.sqlstate == "42501":
        return "schema control" in str(cause)
    return cause.sqlstate in _CONTROL_MISSING
