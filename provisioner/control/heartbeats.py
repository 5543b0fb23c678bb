"""Worker heartbeats in ``control.runtime_heartbeats`` and the readiness verdict built on them."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

import psycopg
from psycopg.rows import dict_row, tuple_row
from psycopg.types.json import Jsonb

from provisioner import queue
from provisioner.control.replication import Replication, replication
from provisioner.servers import ServerLoad

Conn = psycopg.Connection[Any]

# One row per component: the newest instance's beat wins.
UPSERT = """
INSERT INTO control.runtime_heartbeats (component, instance_id, heartbeat_at, detail)
VALUES (%(component)s, %(instance_id)s, now(), %(detail)s)
ON CONFLICT (component) DO UPDATE
   SET instance_id = excluded.instance_id, heartbeat_at = excluded.heartbeat_at,
       detail = excluded.detail
"""

# Every component's row with its age in seconds, measured by the database clock, and whether
# the role that wrote it (stamped by a trigger, control c005) is the control tables' owner (or
# a role that has the owner's privileges): app_rw cannot pass a beat of its own for the owner's.
READ_ALL = """
SELECT h.component, h.instance_id, h.heartbeat_at, h.detail, h.written_by,
       extract(epoch FROM now() - h.heartbeat_at)::float AS age_seconds,
       EXISTS (SELECT 1 FROM pg_roles r, pg_class c
                WHERE c.oid = 'control.runtime_heartbeats'::regclass AND r.rolname = h.written_by
                  AND pg_has_role(r.oid, c.relowner, 'USAGE')) AS by_owner
  FROM control.runtime_heartbeats h ORDER BY h.component
"""

#: A worker whose queue work keeps failing for this many heartbeat intervals is not ready.
STALLED_INTERVALS = 3


# Whether the connection's role is a superuser (the worker refuses an owner URL that is).
CONNECTED_AS_SUPERUSER = "SELECT rolsuper FROM pg_roles WHERE rolname = current_user"


def connected_as_superuser(conn: Conn) -> bool:
    with conn.cursor(row_factory=tuple_row) as cur:
        cur.execute(CONNECTED_AS_SUPERUSER)
        row = cur.fetchone()
    return bool(row and row[0])


def queue_error(failure: tuple[float, str] | None) -> dict[str, Any] | None:
    """The heartbeat's ``queue_error`` field: for how long and why claiming keeps failing."""
    if failure is None:
        return None
    since, error = failure
    return {"seconds": round(time.monotonic() - since, 1), "error": error[:500]}


def beat(conn: Conn, component: str, instance_id: str, detail: dict[str, Any]) -> None:
    with conn.cursor() as cur:
        cur.execute(
            UPSERT, {"component": component, "instance_id": instance_id, "detail": Jsonb(detail)}
        )


@dataclass(frozen=True)
class ComponentHealth:
    component: str
    ready: bool
    reason: str
    instance_id: str | None = None
    age_seconds: float | None = None
    detail: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class HealthReport:
    ready: bool
    components: list[ComponentHealth]
    #: the database's replication, as the worker's writes see it (None: not looked at)
    database: Replication | None = None
    #: the tenant servers of the directory (none: every tenant is on the control database)
    servers: tuple[ServerLoad, ...] = ()
    #: each server's reach by the owner: None reached, else why not (empty: not tried)
    reached: dict[str, str | None] = field(default_factory=dict)

    def reach_of(self, server: str) -> dict[str, Any]:
        """``reachable`` and ``problem`` of a server, when the owner tried it."""
        if server not in self.reached:
            return {}
        return {"reachable": self.reached[server] is None, "problem": self.reached[server]}

    def view(self) -> dict[str, Any]:
        located = (
            {"servers": [s.view() | self.reach_of(s.name) for s in self.servers]}
            if self.servers
            else {}
        )
        return located | {
            "ready": self.ready,
            "database": None if self.database is None else self.database.view(),
            "components": [
                {
                    "component": c.component,
                    "ready": c.ready,
                    "reason": c.reason,
                    "instance_id": c.instance_id,
                    "age_seconds": None if c.age_seconds is None else round(c.age_seconds, 3),
                    "detail": c.detail,
                }
                for c in self.components
            ],
        }


def readiness(
    conn: Conn,
    required: dict[str, frozenset[str]],
    heartbeat_seconds: float,
    application_kinds: frozenset[str],
) -> HealthReport:
    """Ready when each required component beat within three intervals, advertising its types,
    and none of its lease holders stopped beating while it holds running jobs of the owner's
    kinds (a replica that died with jobs in hand: not ready until recovery queued them again,
    which the stale threshold no longer delays). A product row the application role marked
    running under a holder's name is not counted (:data:`provisioner.queue.ORPHANED_JOBS`).

    A beat that advertises a kind not in ``application_kinds`` (an owner's kind) is trusted only
    when the owner role wrote it."""
    with conn.cursor(row_factory=dict_row) as cur:
        cur.execute(READ_ALL)
        rows: dict[str, dict[str, Any]] = {row["component"]: row for row in cur.fetchall()}
    orphans = queue.orphaned_jobs(conn)
    limit = STALLED_INTERVALS * heartbeat_seconds
    verdicts = []
    for component, job_types in sorted(required.items()):
        row = rows.get(component)
        waiting = [o for o in orphans if o.component == component]
        if row is None:
            verdicts.append(ComponentHealth(component, False, "no heartbeat recorded"))
            continue
        detail = dict(row["detail"] or {})
        advertised = set(detail.get("job_types") or [])
        age = float(row["age_seconds"])
        stalled = detail.get("queue_error") or {}
        if waiting:
            # The component's row may be a live replica's: a dead one's jobs still wait.
            reason, ready = _orphaned(waiting), False
        elif detail.get("state") == "stopped":
            reason, ready = "stopped cleanly", False
        elif job_types - application_kinds and not row["by_owner"]:
            # An owner job type (provision_tenant) is only trusted from the owner's own beat.
            who = row["written_by"] or "an unknown role"
            reason, ready = f"heartbeat written by {who}, not by the owner role", False
        elif float(stalled.get("seconds") or 0) > limit:
            reason = f"cannot claim jobs for {stalled['seconds']:.0f}s: {stalled.get('error')}"
            ready = False
        elif age > limit:
            reason, ready = f"heartbeat {age:.1f}s old (limit {limit:.0f}s)", False
        elif not job_types <= advertised:
            missing = ", ".join(sorted(job_types - advertised))
            reason, ready = f"does not advertise {missing}", False
        elif detail.get("storage", {}).get("ready") is False:
            reason, ready = f"object store not ready: {detail['storage'].get('error')}", False
        else:
            reason, ready = "ok", True
        verdicts.append(ComponentHealth(component, ready, reason, row["instance_id"], age, detail))
    return HealthReport(all(v.ready for v in verdicts), verdicts, replication(conn))


def ages(conn: Conn) -> dict[str, float]:
    """Each component's heartbeat age in seconds, by the database clock (for the metrics)."""
    with conn.cursor(row_factory=dict_row) as cur:
        cur.execute(READ_ALL)
        return {row["component"]: float(row["age_seconds"]) for row in cur.fetchall()}


def _orphaned(waiting: list[queue.OrphanedJobs]) -> str:
    first = waiting[0]
    jobs = sum(o.jobs for o in waiting)
    holders = f" (and {len(waiting) - 1} more)" if len(waiting) > 1 else ""
    return (
        f"{jobs} running job(s) held by {first.holder}{holders}, which stopped beating "
        f"{first.silent_seconds:.0f}s ago (lease {first.lease_seconds:g}s): waiting for recovery"
    )
