"""Several ``COPY ... TO STDOUT`` statements in one round trip, driving libpq by hand.

psycopg's ``cursor.copy()`` takes one statement per round trip; the fleet's read of who is
behind sends strings of hundreds (:mod:`provisioner.fleet.versions`). This module is the only
place the package drives a session's libpq connection (:mod:`psycopg.pq`) itself.

Invariant: the string runs as one implicit transaction; each statement's output comes back in
order; the first error is raised only once the string has ended (the server skips the rest of
it), so the session is left idle and usable; libpq never blocks (the caller's other sessions'
threads keep running). Pinned by tests/integration/test_fleet_upgrade.py.
"""

from __future__ import annotations

import selectors
from collections.abc import Callable
from typing import Any

import psycopg
from psycopg import pq
from psycopg.errors import error_from_result


def copy_each(conn: psycopg.Connection[Any], statements: list[bytes]) -> list[bytes]:
    """The output of each ``COPY ... TO STDOUT`` of ``statements``, sent as one string; the
    results of other statements (settings for the string's transaction) are skipped."""
    pgconn = conn.pgconn
    encoding = conn.info.encoding
    outputs: list[bytes] = []
    error: psycopg.Error | None = None
    with conn.lock, selectors.DefaultSelector() as selector:
        wait = _waiter(pgconn, selector)
        pgconn.send_query(b"; ".join(statements))
        while pgconn.flush():
            wait(True)
        while True:
            while pgconn.is_busy():
                wait(False)
            result = pgconn.get_result()
            if result is None:
                break
            if result.status == pq.ExecStatus.COPY_OUT:
                outputs.append(_copy_data(pgconn, wait))
            elif result.status == pq.ExecStatus.FATAL_ERROR and error is None:
                error = error_from_result(result, encoding=encoding)
    if error is not None:
        raise error
    return outputs


def _copy_data(pgconn: pq.abc.PGconn, wait: Callable[[bool], None]) -> bytes:
    """Every row of the ``COPY ... TO STDOUT`` under way."""
    data = bytearray()
    while True:
        size, chunk = pgconn.get_copy_data(1)
        if size > 0:
            data += chunk
        elif size == 0:
            wait(False)
        elif size == -1:
            return bytes(data)
        else:
            raise psycopg.OperationalError(pgconn.error_message.decode(errors="replace"))


def _waiter(pgconn: pq.abc.PGconn, selector: selectors.BaseSelector) -> Callable[[bool], None]:
    """``wait(write)``: until the server sent more (or, ``write``, the socket takes more), then
    read in what came."""
    selector.register(pgconn.socket, selectors.EVENT_READ)
    events = {False: selectors.EVENT_READ, True: selectors.EVENT_READ | selectors.EVENT_WRITE}

    mode = [False]

    def wait(write: bool) -> None:
        if mode[0] != write:
            selector.modify(pgconn.socket, events[write])
            mode[0] = write
        selector.select()
        pgconn.consume_input()

    return wait
