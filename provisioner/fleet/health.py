"""``health`` across servers: the worker's readiness from its heartbeat (read as the
application role, :mod:`provisioner.control.heartbeats`), each tenant server's status and load,
and, where the owner's URL is set, whether the owner reaches each server now.

The servers are reached through the fan-out (:mod:`provisioner.servers.fanout`: one session per
server, a few at once); a server that is down is listed with why, and does not make the worker
not ready: the worker's readiness is about the worker (a restarted worker would not bring the
server back), the server's about the server.
"""

from __future__ import annotations

from contextlib import closing
from dataclasses import replace
from typing import Any

import psycopg

from provisioner import db, kinds, servers
from provisioner.control import heartbeats
from provisioner.control.schema import app_connection
from provisioner.errors import ProvisionerError
from provisioner.settings import Settings

# Enough to know the owner is in: the session's own role.
SELECT_ROLE = "SELECT current_user"


def health(settings: Settings) -> heartbeats.HealthReport:
    """Readiness, the servers' loads and, with the owner's URL, each server reached or not."""
    required = {settings.worker_component: frozenset(kinds.worker_job_types(settings))}
    application_kinds = kinds.for_settings(settings).application_kinds
    with app_connection(settings) as conn:
        report = heartbeats.readiness(conn, required, settings.heartbeat_seconds, application_kinds)
        report = replace(report, servers=tuple(servers.loads(conn)))
    if not report.servers or not settings.migrations_database_url:
        return report  # the references are the owner's to read
    return replace(report, reached=reach_servers(settings))


def reach_servers(settings: Settings) -> dict[str, str | None]:
    """Each server not retired: None when the owner reached it, else why not (one line).
    Empty (not tried) when the owner cannot read the directory: readiness is still reported."""
    try:
        owner = db.connect(settings.owner_url, application_name="health", autocommit=True)
        with closing(owner) as conn, db.translated():
            found = servers.directory(conn)
    except ProvisionerError:
        return {}
    plan = [t for t in servers.targets(found, settings.owner_url) if t.name != servers.CONTROL]

    def who(conn: psycopg.Connection[Any], target: servers.Target) -> bool:
        return conn.execute(SELECT_ROLE).fetchone() is not None

    reached = servers.fan_out(plan, who, application_name="health")
    return {name: outcome.problem for name, outcome in reached.items()}
