"""The caller's connection, whatever wraps it, as the psycopg 3 connection the queue needs.

An application enqueues a tenant inside its own transaction, through whatever it already holds:
a SQLAlchemy ``Session`` or ``Connection`` (on the psycopg 3 driver), a psycopg ``Connection``,
or, for async applications (FastAPI), a psycopg ``AsyncConnection``. This module finds the
driver connection under the wrapper, in the caller's transaction, and refuses anything else
(a psycopg2 connection above all) with one line, BEFORE any statement is sent: nothing is
written in the caller's transaction when it is refused.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, TypeAlias

import psycopg

from provisioner.errors import InvalidInput

# SQLAlchemy (and its ORM) is imported only by applications that use it: its objects are
# recognised by class, so an application on psycopg alone and the CLI start without it.
if TYPE_CHECKING:
    import sqlalchemy as sa
    from sqlalchemy.ext.asyncio import AsyncConnection, AsyncSession
    from sqlalchemy.orm import Session

#: What :func:`provisioner.enqueue` accepts.
SyncConnection: TypeAlias = "Session | sa.Connection | psycopg.Connection[Any]"
#: What :func:`provisioner.enqueue_async` accepts: a psycopg ``AsyncConnection``, or SQLAlchemy's
#: ``AsyncSession`` / ``AsyncConnection`` on the psycopg driver.
AsyncConnectionLike: TypeAlias = "psycopg.AsyncConnection[Any] | AsyncSession | AsyncConnection"

NEEDS_PSYCOPG3 = (
    "needs a psycopg 3 connection: with SQLAlchemy, use a postgresql+psycopg:// URL "
    "(the psycopg2 driver is not supported)"
)


def _is_sqlalchemy(obj: object, module: str, name: str) -> bool:
    """SQLAlchemy's class ``module.name`` (or a subclass), without importing SQLAlchemy to ask."""
    return any(klass.__module__ == module and klass.__name__ == name for klass in type(obj).__mro__)


def _is_session(obj: object) -> bool:
    """A SQLAlchemy ORM ``Session`` (or subclass)."""
    return _is_sqlalchemy(obj, "sqlalchemy.orm.session", "Session")


def _is_sa_connection(obj: object) -> bool:
    """A SQLAlchemy Core ``Connection`` (or subclass)."""
    return _is_sqlalchemy(obj, "sqlalchemy.engine.base", "Connection")


def _describe(obj: object) -> str:
    kind = type(obj)
    return f"{kind.__module__}.{kind.__qualname__}"


def _driver_only(driver: object, wrapper: object) -> psycopg.Connection[Any]:
    if isinstance(driver, psycopg.Connection):
        return driver
    if isinstance(driver, psycopg.AsyncConnection):
        raise InvalidInput("enqueue got an async connection: use enqueue_async (and await it)")
    raise InvalidInput(
        f"enqueue {NEEDS_PSYCOPG3}; got {_describe(driver)} under {_describe(wrapper)}"
    )


def sync_connection(conn: object) -> psycopg.Connection[Any]:
    """The psycopg connection behind ``conn``, in the caller's transaction (a ``Session`` begins
    one if none is open, as ``session.execute`` would)."""
    if isinstance(conn, psycopg.Connection):
        return conn
    if _is_session(conn):
        session: Session = conn  # type: ignore[assignment]
        return _driver_only(session.connection().connection.driver_connection, conn)
    if _is_sa_connection(conn):
        connection: sa.Connection = conn  # type: ignore[assignment]
        if not connection.in_transaction():
            # Begin SQLAlchemy's transaction as its first execute would: the statements go to
            # the driver directly, and conn.commit() must commit them.
            connection.begin()
        return _driver_only(connection.connection.driver_connection, conn)
    if isinstance(conn, psycopg.AsyncConnection):
        raise InvalidInput("enqueue got an async connection: use enqueue_async (and await it)")
    if _is_sqlalchemy(conn, "sqlalchemy.engine.base", "Engine"):
        raise InvalidInput(
            "enqueue needs a connection in a transaction (engine.begin(), a Session), not an Engine"
        )
    raise InvalidInput(f"enqueue {NEEDS_PSYCOPG3}; got {_describe(conn)}")


def _is_sa_async(obj: object, name: str) -> bool:
    """SQLAlchemy's ``AsyncSession`` or ``AsyncConnection`` (by class), without importing
    ``sqlalchemy.ext.asyncio`` for applications that never use it."""
    return any(
        klass.__module__.startswith("sqlalchemy.ext.asyncio") and klass.__name__ == name
        for klass in type(obj).__mro__
    )


async def async_connection(conn: object) -> psycopg.AsyncConnection[Any]:
    """The psycopg ``AsyncConnection`` behind ``conn``, in the caller's transaction (an
    ``AsyncSession`` begins one if none is open, as ``await session.execute`` would)."""
    if isinstance(conn, psycopg.AsyncConnection):
        return conn
    if _is_sa_async(conn, "AsyncSession"):
        session: AsyncSession = conn  # type: ignore[assignment]
        conn = await session.connection()
    if _is_sa_async(conn, "AsyncConnection"):
        connection: AsyncConnection = conn  # type: ignore[assignment]
        if not connection.in_transaction():
            await connection.begin()  # as its first execute would (see sync_connection)
        raw = await connection.get_raw_connection()
        driver = raw.driver_connection
        if isinstance(driver, psycopg.AsyncConnection):
            return driver
        raise InvalidInput(
            f"enqueue_async {NEEDS_PSYCOPG3} (postgresql+psycopg:// with create_async_engine); "
            f"got {_describe(driver)} under {_describe(conn)}"
        )
    if isinstance(conn, psycopg.Connection) or _is_sa_connection(conn) or _is_session(conn):
        raise InvalidInput("enqueue_async got a synchronous connection: use enqueue")
    raise InvalidInput(f"enqueue_async {NEEDS_PSYCOPG3}; got {_describe(conn)}")
