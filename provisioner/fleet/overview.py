"""The fleet at a glance, read on the caller's connection: the queue's figures, the tenants by
lifecycle state, the warm pool, the newest rollout's tenants by phase, every component's
heartbeat age, the tenants by their last drift check (recorded by ``check``: never computed
here), and where the tenants are (the control database and each tenant server). What the
worker's Prometheus metrics and the console's first page show; a handful of statements, none
of them per tenant, per kind or per server.

The console's servers page reads more of the directory (:func:`server_rows`: the references
and each server's jobs), which the metrics do not need.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import psycopg
from psycopg.rows import dict_row

from provisioner import pool, servers
from provisioner.control import heartbeats
from provisioner.fleet import rollout
from provisioner.models import JobStatus
from provisioner.queue import stats
from provisioner.roles import AppRoles
from provisioner.servers.directory import Placement, placement
from provisioner.tenant import checks

# Tenants by lifecycle state.
TENANTS_BY_STATE = "SELECT state, count(*) AS n FROM control.tenants GROUP BY state ORDER BY state"

# The jobs of the tenants of each server (NULL: the control database) in these statuses: one
# scan of the queue joined to the tenant rows (jobs of no tenant are left out).
JOBS_BY_SERVER = """
SELECT t.server, j.status, count(*) AS n
  FROM control.platform_jobs AS j JOIN control.tenants AS t ON t.tenant_id = j.tenant_id
 WHERE j.status = ANY(%(statuses)s)
 GROUP BY t.server, j.status
"""

#: The status the servers page gives the control database (it has no row in the directory).
DEFAULT_STATUS = "default"

Conn = psycopg.Connection[dict[str, Any]]


@dataclass(frozen=True)
class Overview:
    queue: list[stats.QueueFigure]
    tenants: dict[str, int]
    pool: pool.PoolCounts
    #: the newest rollout (None: there never was one) and its tenants by phase
    rollout: rollout.Rollout | None
    rollout_phases: dict[str, int]
    #: heartbeat age in seconds, by component
    heartbeats: dict[str, float]
    #: the tenants by their last drift check's outcome, and when the newest check ran
    drift: checks.DriftFigures
    #: the tenants (not purged) on the control database, and each tenant server's load
    servers: Placement


@dataclass(frozen=True)
class ServerJobs:
    """The jobs of one server's tenants that an operator watches, by status."""

    queued: int = 0
    running: int = 0
    failed: int = 0


@dataclass(frozen=True)
class ServerRow:
    """One line of the console's servers page: the control database (status
    :data:`DEFAULT_STATUS`, no reference shown: its URL may hold a password) or a tenant
    server."""

    name: str
    status: str
    #: tenants placed there and not purged
    tenants: int
    #: at most this many tenants (None: no limit)
    capacity: int | None
    #: its share of new tenants (None: the control database, which placement never picks
    #: while a server is active)
    weight: int | None
    #: the directory's reference (holds no secret by design); None for the control database
    conninfo: str | None
    jobs: ServerJobs

    @property
    def percent_full(self) -> int | None:
        """How full it is, in percent of its capacity (None: no limit)."""
        if self.capacity is None:
            return None
        return round(100 * self.tenants / self.capacity) if self.capacity else 100


def tenants_by_state(conn: Conn) -> dict[str, int]:
    return {row["state"]: int(row["n"]) for row in conn.execute(TENANTS_BY_STATE).fetchall()}


def read(conn: Conn, app_roles: AppRoles | None = None) -> Overview:
    """Everything at once, in one transaction's snapshot when the caller opened one; the pool's
    spares counted ready for ``app_roles`` (the configured ones)."""
    latest = rollout.latest(conn)
    phases = stats.rollout_phases(conn, [latest.id]).get(latest.id, {}) if latest else {}
    return Overview(
        queue=stats.figures(conn),
        tenants=tenants_by_state(conn),
        pool=pool.counts(conn, app_roles),
        rollout=latest,
        rollout_phases=phases,
        heartbeats=heartbeats.ages(conn),
        drift=checks.figures(conn),
        servers=placement(conn),
    )


def jobs_by_server(conn: Conn) -> dict[str, ServerJobs]:
    """The queued, running and failed jobs of each server's tenants, by server name
    (:data:`provisioner.servers.CONTROL` for the control database); a server with none is
    absent."""
    watched = [JobStatus.QUEUED, JobStatus.RUNNING, JobStatus.FAILED]
    counts: dict[str, dict[str, int]] = {}
    with conn.cursor(row_factory=dict_row) as cur:
        cur.execute(JOBS_BY_SERVER, {"statuses": [s.value for s in watched]})
        for row in cur.fetchall():
            name = row["server"] or servers.CONTROL
            counts.setdefault(name, {})[row["status"]] = int(row["n"])
    return {name: ServerJobs(**by_status) for name, by_status in counts.items()}


def server_rows(conn: Conn) -> list[ServerRow]:
    """The control database first, then each tenant server by name, with its reference and its
    tenants' jobs: what the console's servers page shows. Needs the owner (the application role
    reads no reference); two statements, in the caller's snapshot when it opened one."""
    found = servers.directory(conn)
    jobs = jobs_by_server(conn)
    control = ServerRow(
        name=servers.CONTROL,
        status=DEFAULT_STATUS,
        tenants=found.on_control,
        capacity=None,
        weight=None,
        conninfo=None,
        jobs=jobs.get(servers.CONTROL, ServerJobs()),
    )
    return [control] + [
        ServerRow(
            name=server.name,
            status=server.status.value,
            tenants=server.placed,
            capacity=server.capacity,
            weight=server.weight,
            conninfo=server.conninfo,
            jobs=jobs.get(server.name, ServerJobs()),
        )
        for server in found.servers
    ]
