"""A tenant's connection through PgBouncer in transaction mode: its ``search_path`` set in each
transaction, where libpq's ``options`` would set it for the session.

``Tenant.connect()`` gives unqualified names the tenant's schema with ``-c search_path=...`` in
the ``options`` startup parameter, which holds for the whole session, autocommit included. A
pooler in transaction mode refuses that parameter (``unsupported startup parameter: options``),
and a session ``SET`` through it would land on a server connection other clients share next,
while this client's next transaction runs on another one. So there the setting goes with every
transaction instead: right after each ``BEGIN`` psycopg sends (the implicit one before a
statement, or ``conn.transaction()``'s), ``SET LOCAL search_path``, which ends with the
transaction; the pooler keeps both on the transaction's server connection.

What this cannot give through such a pooler: a statement run in autocommit mode outside a
``transaction()`` block has no transaction to carry the setting (qualify its names there).
Pinned by ``tests/integration/test_pgbouncer.py::
test_a_tenant_connection_through_pgbouncer_keeps_its_search_path``.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import psycopg
from psycopg import sql
from psycopg.abc import PQGen
from psycopg.pq import TransactionStatus

IDLE = TransactionStatus.IDLE


class SearchPathConnection(psycopg.Connection[Any]):
    """psycopg's connection, whose every transaction sets ``search_path`` first."""

    #: ``SET LOCAL search_path TO <schema>`` (set by :func:`connect`)
    begin_with: bytes = b""

    def _start_query(self) -> PQGen[None]:
        # psycopg's implicit BEGIN before a statement outside autocommit: the setting follows.
        beginning = not self.autocommit and self.info.transaction_status is IDLE
        yield from super()._start_query()
        if beginning:
            yield from self._exec_command(self.begin_with)

    @contextmanager
    def transaction(
        self, savepoint_name: str | None = None, force_rollback: bool = False
    ) -> Iterator[psycopg.Transaction]:
        """psycopg's ``transaction()``; one that begins a transaction sets the path first."""
        beginning = self.info.transaction_status is IDLE
        with super().transaction(savepoint_name, force_rollback) as tx:
            if beginning:
                self.execute(self.begin_with, prepare=False)
            yield tx


def connect(url: str, schema: str, **kwargs: Any) -> SearchPathConnection:
    """A connection to ``url`` whose transactions see ``schema`` alone on their search path.
    Its statements are not prepared on the server unless asked (``prepare_threshold``): a
    statement prepared in one transaction is missing from the server connection of the next."""
    kwargs.setdefault("prepare_threshold", None)
    conn = SearchPathConnection.connect(url, **kwargs)
    statement = sql.SQL("SET LOCAL search_path TO {}").format(sql.Identifier(schema))
    conn.begin_with = statement.as_bytes(conn)
    return conn
