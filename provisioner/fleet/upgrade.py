"""Fleet upgrades: queue the tenants behind the tenant template's head (found by
:mod:`provisioner.fleet.versions`), under a rollout (:mod:`provisioner.fleet.rollout`).

A worker then re-runs the migration step alone for each queued tenant, replaying the new
revisions' DDL when :mod:`provisioner.templates.upgrade` can verify it, else through Alembic.
Tenants whose lifecycle state is suspended, archived or deleted are left alone and reported
(deleted ones only when asked: a purged tenant has left the fleet for good).

A tenant on a tenant server has its version read on that server (the fan-out of
:func:`provisioner.fleet.versions.read_versions_by_server`), and is queued like any other (its
job runs on its server). A tenant server that is down is reported per server
(:attr:`UpgradeReport.servers`): its tenants are neither checked nor queued, and a later
``upgrade --all`` finds them.
"""

from __future__ import annotations

from collections import Counter
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import closing
from dataclasses import dataclass, field
from typing import Any

import psycopg

from provisioner import db, queue, servers
from provisioner.control.schema import require_control_at_head
from provisioner.errors import InvalidInput, UnknownTenant, WrongState
from provisioner.fleet import rollout
from provisioner.fleet.versions import (
    UPGRADE_SETTINGS,
    PlacedVersions,
    ServerVersions,
    read_placed_versions,
    read_versions,
    read_versions_by_server,
    schema_versions,
    schemas_by_server,
)
from provisioner.kinds.provision import PROVISION_JOB_TYPE
from provisioner.models import Job, JobStatus, TenantId
from provisioner.settings import Settings, tenant_naming
from provisioner.templates import migrations
from provisioner.tenant.state import INACTIVE, TenantState

# Tenants an upgrade leaves alone, by lifecycle state.
TENANTS_LEFT_ALONE = """
SELECT tenant_id, state FROM control.tenants WHERE state = ANY(%(states)s)
"""


@dataclass(frozen=True)
class TenantUpgrade:
    """A provisioned tenant whose schema is behind the tenant template's head."""

    job: Job
    #: what ``alembic_version`` in its schema records; empty when there is no version table
    versions: frozenset[str]
    #: 'queued' (a worker brings it to head), or 'would queue' (``dry_run``)
    action: str


@dataclass(frozen=True)
class SkippedTenant:
    """A tenant left alone because of its lifecycle state."""

    tenant_id: str
    state: TenantState


@dataclass(frozen=True)
class ServerUpgrade:
    """One server's part of a fleet upgrade: its provisioned tenants read and found behind, or,
    when it was down, why, and how many were left unread (neither checked nor queued)."""

    server: str
    checked: int
    behind: int
    problem: str | None = None
    unread: int = 0

    def view(self) -> dict[str, Any]:
        return {
            "server": self.server,
            "reachable": self.problem is None,
            "problem": self.problem,
            "checked": self.checked,
            "behind": self.behind,
            "unread": self.unread,
        }


@dataclass(frozen=True)
class UpgradeReport:
    heads: frozenset[str]
    checked: int
    behind: list[TenantUpgrade]
    #: tenants whose job has not succeeded: they reach head when it runs (or after a retry)
    unfinished: list[Job]
    #: tenants whose lifecycle state keeps them out of an upgrade
    skipped: list[SkippedTenant]
    #: the rollout recorded for the queued tenants (None with ``dry_run`` or nothing behind)
    rollout_id: int | None = None
    #: each server's part (empty: every tenant on the control database)
    servers: list[ServerUpgrade] = field(default_factory=list)

    @property
    def down(self) -> list[ServerUpgrade]:
        return [s for s in self.servers if s.problem is not None]

    def versions_behind(self) -> dict[str, int]:
        """How many tenants are at each older revision, for a summary line."""
        counts = Counter(migrations.head_label(b.versions) or "(none)" for b in self.behind)
        return dict(sorted(counts.items()))


def upgrade(
    settings: Settings,
    tenant_ids: list[str] | None = None,
    *,
    dry_run: bool = False,
    canary: int | None = None,
    max_failures: int | None = None,
    include_deleted: bool = False,
) -> UpgradeReport:
    """Queue every provisioned tenant whose schema is behind the template's head for a worker.

    ``tenant_ids`` None means all tenants. A named tenant that is suspended, archived or
    deleted is refused (:class:`WrongState`); with all tenants, such tenants are skipped and
    reported (deleted ones only with ``include_deleted``). The jobs found behind are recorded
    as a rollout (:mod:`provisioner.fleet.rollout`) and queued in one transaction: all of them
    (or the ``canary`` first ones), or none (and none with ``dry_run``). ``max_failures``
    halts the rollout at that many failed tenants.
    """
    for name, value in (("canary", canary), ("max_failures", max_failures)):
        if value is not None and value < 1:
            raise InvalidInput(f"{name.replace('_', '-')} must be at least 1, got {value}")
    naming = tenant_naming()  # once: each TenantId below is checked against it
    wanted = None if tenant_ids is None else [TenantId(t, naming) for t in tenant_ids]
    heads = migrations.tenant_heads()
    owner = db.connect(settings.owner_url, application_name="upgrade", autocommit=True)
    # A fleet-wide upgrade reads every tenant schema's version, on the control database and on
    # each tenant server, while this thread reads and parses the jobs (the reads wait on the
    # servers, the parsing is Python's): the three overlap. The servers' read starts once this
    # session found the control schema at head and read the placement (none: no read, and no
    # session of its own).
    reader = ThreadPoolExecutor(2)
    early = reader.submit(read_versions, settings.owner_url, None) if wanted is None else None
    early_placed = None
    with reader, closing(owner) as conn, db.translated():
        with db.transaction_with(conn, UPGRADE_SETTINGS):
            require_control_at_head(conn)
            if wanted is None:
                early_placed = _start_placed_read(reader, conn, settings.owner_url)
            jobs = queue.latest_jobs(conn, PROVISION_JOB_TYPE, wanted)
            left_alone = [state.value for state in INACTIVE]
            rows = conn.execute(TENANTS_LEFT_ALONE, {"states": left_alone}).fetchall()
        missing = sorted({t.value for t in wanted or []} - {str(j.tenant_id) for j in jobs})
        if missing:
            raise UnknownTenant(f"unknown tenant(s) {', '.join(missing)}: no provisioning job")
        states = {r["tenant_id"]: TenantState(r["state"]) for r in rows}
        skipped = [
            SkippedTenant(str(j.tenant_id), states[j.tenant_id])
            for j in jobs
            if j.tenant_id in states
        ]
        if wanted is not None and skipped:
            first = skipped[0]
            raise WrongState(
                f"tenant {first.tenant_id} is {first.state}: an upgrade leaves it alone"
            )
        if not include_deleted:
            skipped = [s for s in skipped if s.state is not TenantState.DELETED]
        jobs = [j for j in jobs if j.tenant_id not in states]
        finished = [j for j in jobs if j.status is JobStatus.SUCCEEDED]
        placed = servers.servers_of(conn)
        here = [j for j in finished if j.tenant_id not in placed]
        if early is not None:
            versions = early.result()
        else:
            versions = read_versions(
                settings.owner_url, [TenantId(str(j.tenant_id), naming).schema for j in here]
            )
        versions = {
            s: versions[s] for s in (naming.schema(str(j.tenant_id)) for j in here) if s in versions
        }
        elsewhere = _read_elsewhere(settings.owner_url, finished, placed, early_placed)
        versions.update(elsewhere.found)
        reachable = [j for j in finished if placed.get(str(j.tenant_id)) not in elsewhere.down]
        behind = [
            (job, versions.get(TenantId(str(job.tenant_id), naming).schema, frozenset()))
            for job in reachable
            if versions.get(TenantId(str(job.tenant_id), naming).schema) != heads
        ]
        per_server = _per_server(finished, behind, placed, elsewhere.down)
        rollout_id = None
        if dry_run or not behind:
            action = "would queue" if dry_run else "queued"
            upgrades = [TenantUpgrade(job, v, action) for job, v in behind]
        else:
            with db.transaction_with(conn, UPGRADE_SETTINGS):
                started, queued = rollout.start(
                    conn,
                    migrations.head_label(heads),
                    [(job, migrations.head_label(v) or "(none)") for job, v in behind],
                    canary=canary,
                    max_failures=max_failures,
                )
            rollout_id = started.id
            reopened = {j.id: j for j in queued}
            upgrades = [
                TenantUpgrade(
                    reopened.get(job.id, job), v, "queued" if job.id in reopened else "pending"
                )
                for job, v in behind
            ]
    unfinished = [j for j in jobs if j.status is not JobStatus.SUCCEEDED]
    return UpgradeReport(
        heads, len(reachable), upgrades, unfinished, skipped, rollout_id, per_server
    )


def _start_placed_read(
    reader: ThreadPoolExecutor, conn: psycopg.Connection[Any], owner_url: str
) -> Future[PlacedVersions] | None:
    """The tenant servers' read of every placed tenant's versions, started in ``reader`` with
    the placement read now on ``conn``; None when no tenant lives on a tenant server."""
    placed = servers.servers_of(conn)
    if not placed:
        return None
    return reader.submit(read_placed_versions, servers.directory(conn), owner_url, placed)


def _read_elsewhere(
    owner_url: str,
    finished: list[Job],
    placed: dict[str, str],
    early: Future[PlacedVersions] | None = None,
) -> ServerVersions:
    """The versions of the tenants on tenant servers, each read on its server (a server down
    is named, its tenants absent): from the read begun with the call (``early``) for the
    tenants it found where ``placed`` says they are, read now for the others."""
    tenants = [str(job.tenant_id) for job in finished]
    read_early, tenants = (
        early.result().of(placed, tenants)
        if early is not None
        else (ServerVersions({}, {}), tenants)
    )
    by_server: dict[str | None, list[str]] = {
        server: listed for server, listed in schemas_by_server(placed, tenants).items()
    }
    if not by_server:
        return read_early
    return read_early.merged(read_versions_by_server(owner_url, by_server))


def _per_server(
    finished: list[Job],
    behind: list[tuple[Job, frozenset[str]]],
    placed: dict[str, str],
    down: dict[str, str],
) -> list[ServerUpgrade]:
    """Each server's provisioned tenants read, found behind, or left unread (server down);
    the control database first. Empty when every tenant is on the control database."""
    if not placed:
        return []
    on = Counter(placed.get(str(j.tenant_id), servers.CONTROL) for j in finished)
    late = Counter(placed.get(str(j.tenant_id), servers.CONTROL) for j, _ in behind)
    names = sorted(on, key=lambda n: (n != servers.CONTROL, n))
    return [
        ServerUpgrade(n, 0, 0, down[n], on[n]) if n in down else ServerUpgrade(n, on[n], late[n])
        for n in names
    ]


def _owner(settings: Settings, name: str) -> psycopg.Connection[dict[str, Any]]:
    return db.connect(settings.owner_url, application_name=name, autocommit=True)


def resume(
    settings: Settings, *, rollout_id: int | None = None, started_by: str = "upgrade"
) -> rollout.Resumed:
    """Continue the rollout that waits (``rollout_id``, or the newest): the rest after a
    canary, or the jobs a pause or a halt held; the runs it starts record ``started_by``."""
    with closing(_owner(settings, "upgrade")) as conn, db.translated(), conn.transaction():
        return rollout.resume(conn, rollout_id=rollout_id, started_by=started_by)


def pause(settings: Settings, rollout_id: int, *, paused_by: str) -> rollout.Paused:
    """Pause a running rollout: nothing of it starts until resume; what runs finishes."""
    with closing(_owner(settings, "upgrade")) as conn, db.translated(), conn.transaction():
        return rollout.pause(conn, rollout_id, paused_by=paused_by)


def abort(settings: Settings, *, ended_by: str = "upgrade --abort") -> rollout.Aborted:
    """Drop what the active rollout has not started; the dropped runs record ``ended_by``."""
    with closing(_owner(settings, "upgrade")) as conn, db.translated(), conn.transaction():
        return rollout.abort(conn, ended_by=ended_by)


def progress(settings: Settings) -> rollout.Progress:
    """The latest rollout's numbers, for ``upgrade --watch`` (read-only)."""
    with closing(_owner(settings, "upgrade-watch")) as conn, db.translated():
        return rollout.progress(conn)


def wait_for_canary(settings: Settings, rollout_id: int) -> dict[str, int]:
    """Block until the canary of ``rollout_id`` has finished; its jobs by status."""
    with closing(_owner(settings, "upgrade")) as conn, db.translated():
        return rollout.wait_for_canary(conn, rollout.get(conn, rollout_id))


def tenants_per_head(settings: Settings) -> dict[str, int]:
    """How many provisioned tenants record each revision (the watch's first line); purged
    tenants, which have no schema any more, are not counted."""
    with closing(_owner(settings, "upgrade-watch")) as conn, db.translated():
        deleted = {
            r["tenant_id"]
            for r in conn.execute(TENANTS_LEFT_ALONE, {"states": [TenantState.DELETED.value]})
        }
        jobs = [
            j
            for j in queue.latest_jobs(conn, PROVISION_JOB_TYPE)
            if j.status is not JobStatus.RUNNING and j.tenant_id not in deleted
        ]
        naming = tenant_naming()
        found = schema_versions(
            conn, sorted({TenantId(str(j.tenant_id), naming).schema for j in jobs})
        )
    counts = Counter(migrations.head_label(v) if v else "(none)" for v in found.values())
    return dict(sorted(counts.items()))
