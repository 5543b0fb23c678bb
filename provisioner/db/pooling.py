"""Whether an address leads to a pooler in transaction mode (PgBouncer ``pool_mode=transaction``).

Through such a pooler a client's session is not a server session: each transaction may run on
another server connection, so what the worker keeps across transactions (``LISTEN``, the
pool's session-level advisory lock, prepared statements, session settings) is lost or lands
on another client's connection. The worker refuses to start there; the application's
``enqueue``, one transaction on the caller's connection, works through it.

The pooler cannot be asked (``SHOW pool_mode`` is its admin console's, not a client's), so the
probe asks the server which backend answers. With a direct connection, or session pooling, a
client's backend is its own for the whole session: its pid never changes and no other client
ever sees it. Through transaction pooling the backend goes back to the pool after every
transaction: a second client's transaction takes an idle backend (the one just released, with
PgBouncer's default LIFO), or the first client's next transaction lands on another one (with
``server_round_robin``). Either sign alone is proof; a few rounds make one of them show.
"""

from __future__ import annotations

from contextlib import closing
from typing import Any

import psycopg

from provisioner.db.sessions import connect
from provisioner.db.translate import translated

#: Rounds of the probe; one shows transaction pooling with PgBouncer's defaults.
ROUNDS = 3

BACKEND_PID = "SELECT pg_backend_pid() AS pid"


def transaction_pooled(address: str, *, application_name: str = "provisioner-probe") -> bool:
    """True when two transactions of one client ran on different backends, or a second
    client's transaction ran on the first client's backend (see the module)."""
    first = connect(address, application_name=application_name, autocommit=True)
    with closing(first), translated():
        mine = _pid(first)
        for _ in range(ROUNDS):
            second = connect(address, application_name=application_name)
            with closing(second):
                if _pid(second) == mine:  # its transaction is still open: the backend is shared
                    return True
                if _pid(first) != mine:
                    return True
                second.rollback()
    return False


def _pid(conn: psycopg.Connection[dict[str, Any]]) -> int:
    row = conn.execute(BACKEND_PID).fetchone()
    assert row is not None
    return int(row["pid"])
