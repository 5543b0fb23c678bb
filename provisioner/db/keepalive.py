"""A transaction kept from looking idle while its holder works elsewhere.

The engine's sessions, and its sessions on tenant servers, end a transaction left idle longer
than their ``idle_in_transaction_session_timeout``
(:func:`provisioner.engine.sessions.idle_timeout_ms`, 10-60 s): that is how a frozen or cut off
holder gives its tenant's lock back. A live holder may keep a transaction open while its work
runs somewhere else for longer than that: a move's steps copy and verify the schema through
sessions and processes of their own, with the step's control transaction (its tenant's lock and
its record) waiting for them; a step on a tenant server waits for control to compute an upgrade
reference. Without a word on the waiting transaction, the server ended it and the step failed
at its close (``the connection is lost``), then ran again, as long again.

:func:`kept_alive` sends ``SELECT 1`` on the waiting connection, from a thread, every third of
its timeout while the block runs.

Invariant: the pings come from this process while it runs the block, so a frozen or killed
holder sends none and the timeout still ends its transaction; they stop (the thread joined)
before the block is left; psycopg's connection lock serialises a ping with the holder's own use
of the connection; a ping that fails (the transaction already failed, the connection lost) ends
the pings and leaves the error for the holder's next statement to meet. Pinned by
``tests/integration/test_db.py::test_a_kept_alive_transaction_outlasts_its_idle_timeout_and_only_then``.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import psycopg

# The session's idle-in-transaction timeout, in milliseconds (0: none).
IDLE_TIMEOUT = (
    "SELECT setting::int FROM pg_settings WHERE name = 'idle_in_transaction_session_timeout'"
)
PING = "SELECT 1"
#: Pings per timeout: a late ping (a busy machine, the holder's own statement in the way)
#: still comes well before the timeout.
PINGS_PER_TIMEOUT = 3


@contextmanager
def kept_alive(conn: psycopg.Connection[Any]) -> Iterator[None]:
    """Ping ``conn``'s open transaction while the block runs, so that its idle timeout does not
    end it (see the module). One round trip to read the timeout; nothing more when it is off."""
    row = conn.execute(IDLE_TIMEOUT).fetchone()
    timeout_ms = int(row[0]) if row is not None else 0
    if timeout_ms <= 0:
        yield
        return
    stop = threading.Event()
    pinger = threading.Thread(
        target=_ping_until,
        args=(conn, stop, timeout_ms / 1000 / PINGS_PER_TIMEOUT),
        name="provisioner-keepalive",
        daemon=True,
    )
    pinger.start()
    try:
        yield
    finally:
        stop.set()
        pinger.join()


def _ping_until(conn: psycopg.Connection[Any], stop: threading.Event, every: float) -> None:
    while not stop.wait(every):
        try:
            conn.execute(PING)
        except psycopg.Error:
            return  # the holder's next statement meets the error
