"""Database addresses: every form libpq accepts, handed to libpq as the user wrote it.

A production database is seldom one plain URL. The settings, the commands, the worker and its
children, both Alembic ``env.py`` files and the pytest plugin accept what libpq accepts:

* ``postgresql://`` URLs, with one host or a host list (``h1:5432,h2:5432``) and any libpq
  parameter (``?target_session_attrs=read-write``, ``?service=NAME``, ``?sslmode=...``);
* libpq ``key=value`` strings (``host=h1,h2 port=5432,5433 dbname=app user=owner``);
* a service file entry (``service=NAME`` or ``?service=NAME``, from ``PGSERVICEFILE``);
* no password at all in the address: ``PGPASSWORD``, ``~/.pgpass`` / ``PGPASSFILE``.

Why one module: SQLAlchemy's URL holds a single port, and re-parsing an address (to add a
driver name, or to pick it apart) breaks on a host list and on key=value strings, and once
printed part of a password in its error. So nothing parses an address here: psycopg gets the
original string (:func:`libpq_address`), and SQLAlchemy gets a *creator* that calls psycopg
with it (:func:`engine`), with a bare ``postgresql+psycopg://`` URL naming only the dialect.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import psycopg
from psycopg.conninfo import conninfo_to_dict, make_conninfo

# SQLAlchemy (~0.2 s to import) is for Alembic and the callers' connections; commands that
# only read and write rows start without it (docs/performance.md "Start-up").
if TYPE_CHECKING:
    import sqlalchemy as sa

#: The URL SQLAlchemy and Alembic see: the dialect and driver only, never an address.
DIALECT_URL = "postgresql+psycopg://"

_DRIVER_PREFIXES = ("postgresql+psycopg://", "postgresql+psycopg2://", "postgres://")
_URL_PREFIXES = ("postgresql://", "postgres://", "postgresql+psycopg://", "postgresql+psycopg2://")


def libpq_address(address: str) -> str:
    """The string libpq accepts: a SQLAlchemy driver suffix dropped, anything else untouched."""
    for prefix in _DRIVER_PREFIXES:
        if address.startswith(prefix):
            return "postgresql://" + address[len(prefix) :]
    return address


#: libpq's TCP keepalives and user timeout on every connection the package opens. A server that
#: goes silent in the middle of a statement (its host lost, the network cut) is given up after
#: about 25 s of unanswered probes (10 s idle, then 3 probes 5 s apart), or 30 s of sent data
#: never acknowledged; without them a connection waited for the kernel's default, about 2 h
#: 11 min, and a worker child with it, its lease renewed all along by its parent's heartbeat.
#: A live server's kernel answers the probes, whatever a statement's length. (A server process
#: frozen on a live host is not caught: its kernel still answers.) An address that sets one of
#: them keeps its own (:func:`keepalive_args`).
KEEPALIVES: dict[str, int] = {
    "keepalives": 1,
    "keepalives_idle": 10,
    "keepalives_interval": 5,
    "keepalives_count": 3,
    "tcp_user_timeout": 30_000,
}


def keepalive_args(address: str) -> dict[str, Any]:
    """:data:`KEEPALIVES`, less those ``address`` sets itself."""
    try:
        given = conninfo_to_dict(libpq_address(address))
    except psycopg.ProgrammingError:  # libpq refuses the address at connect, and says why
        given = {}
    return {key: value for key, value in KEEPALIVES.items() if key not in given}


def is_url(address: str) -> bool:
    """True for a ``postgresql://`` URL (any driver suffix), False for a key=value string."""
    return address.lower().startswith(_URL_PREFIXES)


def engine(
    address: str,
    *,
    connection_class: type[psycopg.Connection[Any]] = psycopg.Connection,
    connect_args: dict[str, Any] | None = None,
    **engine_args: Any,
) -> sa.Engine:
    """A SQLAlchemy engine (psycopg 3) whose connections libpq opens from ``address`` itself.

    ``connect_args`` go to :meth:`psycopg.Connection.connect` with the address (SQLAlchemy
    ignores its own ``connect_args`` when a creator is given), after :func:`keepalive_args`;
    ``engine_args`` to :func:`sqlalchemy.create_engine`."""
    import sqlalchemy as sa

    conninfo = libpq_address(address)
    kwargs = {**keepalive_args(conninfo), **(connect_args or {})}
    creator: Callable[[], psycopg.Connection[Any]] = lambda: connection_class.connect(  # noqa: E731
        conninfo, **kwargs
    )
    return sa.create_engine(DIALECT_URL, creator=creator, **engine_args)


def with_role(address: str, user: str, database: str) -> str:
    """``address`` for another role and database: the same hosts, ports and parameters, its
    password left out (the role's comes from libpq's own sources: PGPASSWORD, a password
    file, the service file). A URL stays a URL; anything else becomes a key=value string."""
    if is_url(address):
        return _url_with_role(libpq_address(address), user, database)
    params = {k: v for k, v in conninfo_to_dict(address).items() if k != "password"}
    params.update(user=user, dbname=database)
    return make_conninfo("", **params)


def _url_with_role(url: str, user: str, database: str) -> str:
    scheme, _, rest = url.partition("://")
    cut = min((i for i in (rest.find("/"), rest.find("?")) if i >= 0), default=len(rest))
    authority, tail = rest[:cut], rest[cut:]
    hosts = authority.rpartition("@")[2]
    query = tail.partition("?")[2]
    kept = [p for p in query.split("&") if p and p.split("=")[0] not in _ROLE_PARAMS]
    return f"{scheme}://{user}@{hosts}/{database}" + ("?" + "&".join(kept) if kept else "")


#: URL query parameters that name a role or a database, replaced by :func:`with_role`.
_ROLE_PARAMS = frozenset({"user", "password", "dbname"})
