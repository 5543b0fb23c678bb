"""The one place driver errors become the package's errors.

Nothing above :mod:`provisioner.db` catches ``psycopg.Error`` or SQLAlchemy's errors: they leave
:func:`translated` as :class:`DatabaseUnavailable` (the server is unavailable; retry later), as
:class:`ConnectionLost` (a kind of it: the session itself went away or could not be opened, no
fault of the statement: a job cut this way is retried at once), as :class:`LockNotAvailable`
(a lock timeout, SQLSTATE 55P03: retried like an outage) or as :class:`DatabaseError` (the
statement itself failed), with any password removed and on one line. What the SQLSTATE says
is read here and nowhere else: callers ask with ``isinstance`` (or :func:`login_refused`,
:func:`control_missing`).

Pinned by ``tests/unit/test_translate.py`` (each SQLSTATE to its class, secrets redacted) and
``tests/integration/test_fleet_upgrade.py::
test_a_migration_waiting_for_a_lock_gives_up_and_never_stalls_the_application`` (a lock timeout
fails the step and is retried, never a fallback to Alembic).
"""

from __future__ import annotations

import re
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager

import psycopg

from provisioner.errors import (
    ConfigurationError,
    ConnectionLost,
    DatabaseError,
    DatabaseUnavailable,
    LeaseLost,
    LockNotAvailable,
    NoServerRoom,
    ProvisionerError,
    StatementRejected,
)
from provisioner.redact import redact

__all__ = [
    "ConnectionLost",
    "DatabaseError",
    "DatabaseUnavailable",
    "LockNotAvailable",
    "control_missing",
    "login_refused",
    "options_refused",
    "placement_refused",
    "rejected_for_good",
    "statements_of",
    "translate",
    "translated",
]

#: SQLSTATE of a lock timeout (``lock_not_available``).
LOCK_NOT_AVAILABLE = "55P03"
#: SQLSTATE the placement trigger raises when no tenant server takes a new tenant (control
#: revision ``20261202_h29servers``).
NO_SERVER_ROOM = "PV001"
#: SQLSTATE a tenant server's fence raises when a step's journal row comes from a run that was
#: taken over (``provisioner_server.fenced_out``, tool schema version 2 on the server).
FENCED_OUT = "PV002"

# What libpq says when the server answered but refused this login: retrying cannot help.
_LOGIN_REFUSED = (
    "password authentication failed",
    "no password supplied",
    "authentication failed",
    "does not exist",
    "pg_hba.conf",
    "permission denied for database",
)
# What libpq (or psycopg, reading the address) says of a connection option it refuses before
# it tries any server: a parameter it does not know, a value it does not know
# (``sslmode=bogus``, ``target_session_attrs``...), a port out of range, an integer option that
# is not one, ports that do not match the hosts. Such an address can never work: a
# ConfigurationError (exit 2), not the database being unavailable (retried, exit 1).
_OPTION_REFUSED = re.compile(
    r"invalid port number|invalid integer value \S+ for connection option|invalid \w+ value: "
    r"|invalid SSL protocol version range|invalid require_auth method"
    r"|invalid URI query parameter|invalid connection option"
    r"|could not match \d+ (?:port numbers|host names)"
)
# SQLSTATE classes of a statement that fails the same way however often it runs: data
# exceptions (22), integrity constraint violations (23), syntax errors or access rule
# violations (42: undefined tables, columns, functions; duplicate objects). Connectivity (08),
# serialization failures and deadlocks (40), lock timeouts (55P03) and the rest stay transient.
_DETERMINISTIC_CLASSES = frozenset({"22", "23", "42"})
# What PgBouncer answers to the ``options`` startup parameter (session settings the engine's
# sessions carry): the connection goes through a pooler, and these sessions cannot.
_POOLER_REFUSED_OPTIONS = "unsupported startup parameter: options"
#: What to do about it, appended to PgBouncer's refusal.
POOLER_HINT = (
    "this connection goes through PgBouncer, and this command needs a PostgreSQL session of "
    "its own: connect it directly to PostgreSQL (enqueue, status, jobs, health, check, "
    "migrate and upgrade work through PgBouncer)"
)
# SQLSTATEs of a session the server ended with no fault of its statement (class 08 aside):
# admin_shutdown (a fast stop, a demoted primary), crash_shutdown (another backend crashed),
# cannot_connect_now (the server is starting or stopping).
_SESSION_ENDED = frozenset({"57P01", "57P02", "57P03"})
# SQLSTATEs of a control schema that is missing or older than this release.
_CONTROL_MISSING = {"3F000", "42P01", "42703", "42883"}


def _sqlalchemy(exc: BaseException | None, name: str) -> bool:
    """Whether ``exc`` is SQLAlchemy's exception ``name`` (``sqlalchemy.exc.<name>``).

    Asked through ``sys.modules``: an exception can be one of SQLAlchemy's only once something
    (Alembic, a caller's connection) has imported it, and importing it here would put ~0.2 s on
    every command that only reads and writes rows (docs/performance.md "Start-up")."""
    errors = sys.modules.get("sqlalchemy.exc")
    return errors is not None and isinstance(exc, getattr(errors, name))


def _dbapi_orig(exc: BaseException | None) -> BaseException | None:
    """The driver's exception a SQLAlchemy ``DBAPIError`` wraps (None for any other)."""
    return getattr(exc, "orig", None) if _sqlalchemy(exc, "DBAPIError") else None


def _is_connectivity(exc: BaseException) -> bool:
    if isinstance(exc, psycopg.OperationalError):
        return True
    if _sqlalchemy(exc, "DBAPIError"):
        invalidated = bool(getattr(exc, "connection_invalidated", False))
        return invalidated or isinstance(_dbapi_orig(exc), psycopg.OperationalError)
    return _sqlalchemy(exc, "OperationalError")


def _session_lost(exc: BaseException, orig: BaseException) -> bool:
    """The session went away or never opened, whatever the statement: libpq's own errors (no
    SQLSTATE: the connection refused, closed or broken), connection exceptions (class 08), or
    the server ending every session (:data:`_SESSION_ENDED`). A statement or idle timeout, a
    cancel or a lock timeout has a SQLSTATE of its own and is not one."""
    if _sqlalchemy(exc, "DBAPIError") and getattr(exc, "connection_invalidated", False):
        return True
    if not isinstance(orig, psycopg.OperationalError):
        return False
    state = orig.sqlstate
    return state is None or state.startswith("08") or state in _SESSION_ENDED


def translate(exc: BaseException) -> ProvisionerError:
    """Map a driver error to the package's tree, message redacted and on one line.

    A lock timeout is an ``OperationalError`` to psycopg, so it was always reported as the
    database being unavailable (and retried); :class:`LockNotAvailable` keeps that, and names
    it."""
    orig = _dbapi_orig(exc) or exc
    message = " ".join(redact(str(orig)).split()) or type(orig).__name__
    if _POOLER_REFUSED_OPTIONS in message:
        return ConfigurationError(f"{message}: {POOLER_HINT}")
    refused = _OPTION_REFUSED.search(message)
    if refused is not None and isinstance(orig, psycopg.Error) and orig.sqlstate is None:
        return ConfigurationError(f"the database address cannot work: {message[refused.start() :]}")
    if isinstance(orig, psycopg.Error) and orig.sqlstate == LOCK_NOT_AVAILABLE:
        return LockNotAvailable(f"database unavailable: {message}")
    if isinstance(orig, psycopg.Error) and orig.sqlstate == NO_SERVER_ROOM:
        return NoServerRoom(redact(orig.diag.message_primary or message))
    if isinstance(orig, psycopg.Error) and orig.sqlstate == FENCED_OUT:
        return LeaseLost(redact(orig.diag.message_primary or message))
    if _session_lost(exc, orig):
        return ConnectionLost(f"database unavailable: {message}")
    if _is_connectivity(exc):
        return DatabaseUnavailable(f"database unavailable: {message}")
    return DatabaseError(f"database error: {message}")


@contextmanager
def translated() -> Iterator[None]:
    """Run a block, re-raising driver errors as package errors."""
    try:
        yield
    except Exception as exc:
        if not (isinstance(exc, psycopg.Error) or _sqlalchemy(exc, "SQLAlchemyError")):
            raise
        raise translate(exc) from exc


def options_refused(exc: BaseException) -> bool:
    """True for a connection a pooler in transaction mode refused for its libpq ``options``
    startup parameter (PgBouncer's ``unsupported startup parameter: options``)."""
    cause = exc.__cause__ if isinstance(exc, ProvisionerError) else exc
    return isinstance(cause, psycopg.OperationalError) and _POOLER_REFUSED_OPTIONS in str(cause)


@contextmanager
def placement_refused() -> Iterator[None]:
    """Run an enqueue, raising :class:`NoServerRoom` when placement refused the new tenant
    (SQLSTATE ``PV001``); every other driver error is left as it is, for the caller's own
    handling (an application's enqueue sees psycopg's errors, as it always did)."""
    try:
        yield
    except psycopg.Error as exc:
        if exc.sqlstate == NO_SERVER_ROOM:
            raise translate(exc) from exc
        raise


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


def _sqlstate(exc: BaseException) -> str | None:
    cause = exc.__cause__ if isinstance(exc, ProvisionerError) else exc
    cause = _dbapi_orig(cause) or cause
    return cause.sqlstate if isinstance(cause, psycopg.Error) else None


def rejected_for_good(exc: BaseException) -> bool:
    """True for a statement error no retry can fix (SQLSTATE class 22, 23 or 42)."""
    state = _sqlstate(exc)
    return state is not None and state[:2] in _DETERMINISTIC_CLASSES


@contextmanager
def statements_of(source: str | Callable[[], str]) -> Iterator[None]:
    """Run the statements of a migration or a seed, named ``source`` (``revision t005``, ``seed
    002_plans.sql``, or a function that names it once the failure is known): a failure no retry
    can fix becomes :class:`StatementRejected`, which fails the job at once, with the source and
    the server's message; any other failure is left as it is (a lock timeout or a lost
    connection is retried)."""
    try:
        with translated():
            yield
    except DatabaseError as exc:
        if not rejected_for_good(exc):
            raise
        message = str(exc).removeprefix("database error: ")
        where = source if isinstance(source, str) else source()
        raise StatementRejected(f"{where}: {message}") from exc.__cause__
