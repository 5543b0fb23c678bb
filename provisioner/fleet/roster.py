"""The list of tenants (``provisioner tenants list``): each tenant's lifecycle state, the
revision its schema records, whether it is behind the template's head, its provisioning job's
status and, when asked, whether it has drifted.

Purged (deleted) tenants have left the fleet: they are listed only when asked for
(``include_deleted``, or a state filter naming ``deleted``). Who is behind costs one read of
the version tables (:mod:`provisioner.fleet.versions`). Drift is read from each tenant's last
stored check (``control.tenant_checks``, :mod:`provisioner.tenant.checks`): one indexed read,
whatever the fleet's size, so a tenant never checked is listed as such rather than guessed
clean. A fresh check (:func:`provisioner.fleet.drift.check`: the head built once in a
rolled-back transaction, then one catalog query per tenant) runs only when asked for
(``check_now``); it records its results, which the listing then reads.

A tenant on a tenant server has its version read there (the fan-out of
:func:`provisioner.fleet.versions.read_versions_by_server`); when that server is down, the
tenant is listed with its revision unknown and the reason (``server_down``), not dropped.
"""

from __future__ import annotations

from contextlib import closing
from dataclasses import dataclass, replace
from datetime import datetime

from provisioner import db, queue
from provisioner.control.schema import require_control_at_head
from provisioner.fleet import drift
from provisioner.fleet.versions import read_versions_by_server
from provisioner.kinds.provision import PROVISION_JOB_TYPE
from provisioner.models import JobStatus, TenantId
from provisioner.settings import Settings, tenant_naming
from provisioner.templates import migrations
from provisioner.tenant import checks
from provisioner.tenant import row as tenants
from provisioner.tenant.state import TenantState


@dataclass(frozen=True)
class TenantEntry:
    tenant_id: str
    state: TenantState
    #: the revision the schema records ("" when it has none: not provisioned, or purged)
    revision: str
    #: the schema records another revision than the template's head
    behind: bool
    #: the provisioning job's status (None: no provisioning job)
    job_status: JobStatus | None
    updated_at: datetime | None
    #: drifted from the head's shape at its last check (None: not read, or never checked)
    drifted: bool | None = None
    #: the tenant server it lives on (None: the control database)
    server: str | None = None
    #: its last stored drift check (None: not read, or never checked)
    last_check: checks.CheckRecord | None = None
    #: why its tenant server could not be read (None: read; its revision is then unknown)
    server_down: str | None = None


def list_tenants(
    settings: Settings,
    *,
    states: list[TenantState] | None = None,
    behind: bool = False,
    drifted: bool = False,
    check_now: bool = False,
    include_deleted: bool = False,
) -> list[TenantEntry]:
    """The tenants (in ``states``, else all), by tenant id; only those behind the head with
    ``behind``. With ``drifted``: those whose last stored check found drift, and those never
    checked (``drifted`` None); with ``check_now`` as well, the tenants at the head are checked
    first and only those found drifted are listed. Deleted tenants only with
    ``include_deleted`` or when ``states`` names deleted."""
    wanted = list(states or [])
    if not wanted:
        wanted = [s for s in TenantState if include_deleted or s is not TenantState.DELETED]
    heads = migrations.tenant_heads()
    owner = db.connect(settings.owner_url, application_name="tenants-list", autocommit=True)
    with closing(owner) as conn, db.translated():
        require_control_at_head(conn)
        found = tenants.select_tenants(conn, None, wanted)
        naming = tenant_naming()  # once: each TenantId below is checked against it
        ids = [TenantId(t.tenant_id, naming) for t in found]
        jobs = {str(j.tenant_id): j for j in queue.latest_jobs(conn, PROVISION_JOB_TYPE, ids)}
    by_server: dict[str | None, list[str]] = {}
    for tenant in found:
        by_server.setdefault(tenant.server, []).append(naming.schema(tenant.tenant_id))
    read = read_versions_by_server(settings.owner_url, by_server)
    entries = []
    for tenant in found:
        recorded = read.found.get(naming.schema(tenant.tenant_id))  # checked above
        job = jobs.get(tenant.tenant_id)
        entries.append(
            TenantEntry(
                tenant.tenant_id,
                tenant.state,
                migrations.head_label(recorded) if recorded else "",
                recorded is not None and recorded != heads,
                job.status if job is not None else None,
                tenant.updated_at,
                server=tenant.server,
                server_down=read.down.get(tenant.server or ""),
            )
        )
    if behind:
        entries = [e for e in entries if e.behind]
    if drifted and check_now:
        return _checked_now(settings, entries)
    if drifted:
        return _with_stored_drift(settings, entries)
    return entries


def _with_stored_drift(settings: Settings, entries: list[TenantEntry]) -> list[TenantEntry]:
    """The entries whose last stored check found drift, and those never checked."""
    owner = db.connect(settings.owner_url, application_name="tenants-list", autocommit=True)
    with closing(owner) as conn, db.translated():
        stored = checks.last_of(conn, [e.tenant_id for e in entries])
    listed = []
    for entry in entries:
        found = stored.get(entry.tenant_id)
        if found is None:
            listed.append(entry)
        elif found.outcome == "drifted":
            listed.append(replace(entry, drifted=True, last_check=found))
    return listed


def _checked_now(settings: Settings, entries: list[TenantEntry]) -> list[TenantEntry]:
    """The entries found drifted by a check of those at the head (the others cannot be),
    the check recorded as ``provisioner check`` records it."""
    checkable = [
        e.tenant_id
        for e in entries
        if e.revision and not e.behind and e.job_status is JobStatus.SUCCEEDED
    ]
    if not checkable:
        return []
    drift.check(settings, checkable, checked_by="tenants list --check-now")
    found = _with_stored_drift(settings, [e for e in entries if e.tenant_id in checkable])
    return [e for e in found if e.drifted]
