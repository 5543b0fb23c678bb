"""The fleet at a glance, read on the caller's connection: the queue's figures, the tenants by
lifecycle state, the warm pool, the newest rollout's tenants by phase, every component's
heartbeat age, the tenants by their last drift check (recorded by ``check``: never computed
here). What the worker's Prometheus metrics and the console's first page show; a
handful of statements, none of them per tenant or per kind.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import psycopg

from provisioner import pool
from provisioner.control import heartbeats
from provisioner.fleet import rollout
from provisioner.queue import stats
from provisioner.roles import AppRoles
from provisioner.tenant import checks

# Tenants by lifecycle state.
TENANTS_BY_STATE = "SELECT state, count(*) AS n FROM control.tenants GROUP BY state ORDER BY state"

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
    )
