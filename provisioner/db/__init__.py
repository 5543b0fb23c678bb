"""The database adapter: the owner role's sessions, the one driver-error translation, the
plan-cache tricks, and the caller's connection checks.

* :mod:`provisioner.db.conninfo`: every address form libpq accepts, handed to libpq as given
  (and to SQLAlchemy through a creator): :func:`engine`, :func:`libpq_address`;
* :mod:`provisioner.db.sessions`: :class:`Database`, :class:`Session`, :class:`Transaction`,
  plain connections, and the chained commit;
* :mod:`provisioner.db.pooling`: whether an address leads to a pooler in transaction mode
  (the worker refuses one);
* :mod:`provisioner.db.translate`: :func:`translated`, the only place ``psycopg.Error`` and
  SQLAlchemy's errors are caught and turned into the package's;
* :mod:`provisioner.db.plans`: generic plans, plans made ahead, prepared statements kept;
* :mod:`provisioner.db.pipelines`: pipeline mode, left cleanly when a statement in it fails;
* :mod:`provisioner.db.caller`: the application's own connection, refused before anything is
  sent when it cannot work;
* :mod:`provisioner.db.keepalive`: a transaction kept from its idle timeout while its holder
  works elsewhere (:func:`kept_alive`).

Callers use the names below (``db.Database``, ``db.translated``...), which stay here whatever
module they live in.
"""

from __future__ import annotations

from provisioner.db.conninfo import engine, is_url, libpq_address, with_role
from provisioner.db.keepalive import kept_alive
from provisioner.db.pipelines import async_pipeline, pipeline
from provisioner.db.pooling import transaction_pooled
from provisioner.db.sessions import (
    BEGIN,
    CONNECT_TIMEOUT_SECONDS,
    FRESH_SECONDS,
    SA_CONNECT_ARGS,
    ChainingConnection,
    Database,
    Session,
    Transaction,
    connect,
    is_alive,
    local_settings,
    transaction_with,
)
from provisioner.db.translate import (
    DatabaseError,
    DatabaseUnavailable,
    LockNotAvailable,
    control_missing,
    login_refused,
    options_refused,
    placement_refused,
    rejected_for_good,
    statements_of,
    translate,
    translated,
)

__all__ = [
    "BEGIN",
    "CONNECT_TIMEOUT_SECONDS",
    "FRESH_SECONDS",
    "SA_CONNECT_ARGS",
    "ChainingConnection",
    "Database",
    "DatabaseError",
    "DatabaseUnavailable",
    "LockNotAvailable",
    "Session",
    "Transaction",
    "async_pipeline",
    "connect",
    "control_missing",
    "engine",
    "is_alive",
    "is_url",
    "kept_alive",
    "libpq_address",
    "local_settings",
    "login_refused",
    "options_refused",
    "pipeline",
    "placement_refused",
    "rejected_for_good",
    "statements_of",
    "transaction_pooled",
    "transaction_with",
    "translate",
    "translated",
    "with_role",
]
