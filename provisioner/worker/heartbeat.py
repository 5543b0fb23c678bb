"""How the worker shows it is alive: the heartbeat thread, and the one-line outage log.

The heartbeat runs on its own thread and its own connection, so no step, claim or slow query of
the worker's main loop can starve it. Each beat upserts the component's row in
``control.runtime_heartbeats`` and, in the same transaction, renews ``locked_at`` of every job
the worker's engine processes hold.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from contextlib import suppress
from dataclasses import dataclass, field
from typing import Any

import psycopg

from provisioner import db, queue
from provisioner.control import heartbeats
from provisioner.db import DatabaseError
from provisioner.errors import DatabaseUnavailable, ProvisionerError
from provisioner.logs import event
from provisioner.settings import Settings

DB_ERRORS = (DatabaseUnavailable, DatabaseError)


@dataclass
class Outage:
    """Logs one line when the database goes away and one when it is back, from any thread."""

    log: logging.Logger
    since: float | None = None
    lock: threading.Lock = field(default_factory=threading.Lock)

    def failed(self, exc: ProvisionerError, where: str, retry_in: float) -> None:
        with self.lock:
            if self.since is not None:
                return
            self.since = time.monotonic()
        fields = {"error": str(exc), "where": where, "retry_in": retry_in}
        event(self.log, "database_unavailable", logging.WARNING, **fields)

    def recovered(self) -> None:
        with self.lock:
            if self.since is None:
                return
            down, self.since = time.monotonic() - self.since, None
        event(self.log, "database_reconnected", down_seconds=round(down, 3))


class Heartbeat(threading.Thread):
    """Beats and renews the leases of ``snapshot()``'s holders on its own connection."""

    def __init__(
        self,
        settings: Settings,
        instance_id: str,
        snapshot: Callable[[], tuple[dict[str, Any], list[str]]],
        outage: Outage,
    ) -> None:
        super().__init__(name="heartbeat", daemon=True)
        self.settings = settings
        self.instance_id = instance_id
        self.snapshot = snapshot
        self.outage = outage
        self.halt = threading.Event()
        self.holder_beat = queue.HolderBeat(
            settings.worker_component, instance_id, settings.holder_lease_seconds
        )
        self._conn: psycopg.Connection[Any] | None = None

    def run(self) -> None:
        """Beat every interval until halted; the first beat is the caller's (:meth:`beat`,
        before any job is claimed), so every holder beats before it holds a lease."""
        while not self.halt.wait(self.settings.heartbeat_seconds):
            self.beat()
        self.close()

    def beat(self, *, last: bool = False) -> None:
        """Upsert the component's row, beat for every lease holder and renew their jobs, in
        one transaction. The ``last`` beat (a clean stop) forgets the holders that hold nothing
        any more; one left holding an unsettled job is recovered once its lease runs out."""
        detail, holders = self.snapshot()
        try:
            if self._conn is None:
                name = f"{self.instance_id}:heartbeat"
                # The owner's URL: only the owner's beat counts for an owner job type (c005);
                # only the owner may write control.lease_holders.
                self._conn = db.connect(self.settings.owner_url, application_name=name)
            with db.translated():
                component = self.settings.worker_component
                heartbeats.beat(self._conn, component, self.instance_id, detail)
                if last:
                    queue.forget_holders(self._conn, self.instance_id)
                elif holders:
                    queue.beat_holders(self._conn, self.holder_beat, holders)
                self._conn.commit()
        except DB_ERRORS as exc:
            self.close()
            self.outage.failed(exc, "heartbeat", self.settings.heartbeat_seconds)
        else:
            self.outage.recovered()

    def close(self) -> None:
        if self._conn is not None:
            with suppress(Exception):
                self._conn.close()
            self._conn = None
