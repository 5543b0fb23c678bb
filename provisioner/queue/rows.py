"""Shared by the queue's modules: the connection type, row fetching, the bounded error text, and
the queue's limits and names (its NOTIFY channel, its advisory lock class).
"""

from __future__ import annotations

from typing import Any

import psycopg
from psycopg.rows import dict_row

from provisioner.redact import redact

NOTIFY_CHANNEL = "provisioner_jobs"


ERROR_DETAIL_LIMIT = 4000


BACKOFF_CAP_SECONDS = 300


#: The longest wait between two tries of a job that gave up waiting for a lock: an
#: application's transaction holds it, and each try queues the application's queries on that
#: table for up to the lock timeout, so at most once a minute.
LOCK_WAIT_CAP_SECONDS = 60


RECOVERED_DETAIL = "Recovered after worker lease expired."


HOLDER_SILENT_DETAIL = "Recovered: its worker stopped beating (the lease of its heartbeat ran out)."


#: First key of the advisory lock a claim takes on the job's tenant for its transaction ('jobs')
#: when its role may not lock the tenant's control.tenant_locks row (a product worker's claim
#: as app_rw; the owner's claims lock the row: see control.try_lock_tenant).
TENANT_JOB_LOCK_CLASS = 0x6A6F6273


UNPROCESSABLE_DETAIL = (
    "failed unprocessed: a time of this job was not finite (or its steps not a list), so no "
    "worker could claim or recover it; queue it again"
)


#: The most attempts a job may be given (a constraint of control c005 says the same).
MAX_ATTEMPTS_LIMIT = 100


Conn = psycopg.Connection[Any]


def fetch_one(
    conn: Conn, statement: str, params: dict[str, Any], *, prepare: bool | None = None
) -> dict[str, Any] | None:
    """The first row (None: none); ``prepare=False`` never prepares it on the server (the
    caller's connection may go through PgBouncer in transaction mode)."""
    with conn.cursor(row_factory=dict_row) as cur:
        cur.execute(statement, params, prepare=prepare)
        return cur.fetchone()


def fetch_all(conn: Conn, statement: str, params: dict[str, Any]) -> list[dict[str, Any]]:
    with conn.cursor(row_factory=dict_row) as cur:
        cur.execute(statement, params)
        return cur.fetchall()


def bounded_error(text: str) -> str:
    """Secrets redacted, then cut to the column's budget."""
    text = redact(text).strip() or "unknown error"
    if len(text) <= ERROR_DETAIL_LIMIT:
        return text
    return text[: ERROR_DETAIL_LIMIT - 15] + " ...[truncated]"
