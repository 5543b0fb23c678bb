"""The library facade: what the CLI, the worker and tests call. It never prints or exits.

Settings come in resolved by :func:`resolve` (embedded PostgreSQL when no URL is set); each
function opens what it needs, does one thing, and returns plain values. Callers use the names
here (``service.provision``); each lives in the module of its concern:

* :mod:`~provisioner.service.bootstrap`: the settings resolved, the control schema migrated,
  the tenant naming recorded;
* :mod:`~provisioner.service.lifecycle`: one tenant's provisioning and lifecycle changes (and
  one lifecycle kind for many), with the refusals made before anything runs;
* :mod:`~provisioner.service.rollouts`: fleet upgrades as rollouts;
* :mod:`~provisioner.service.repairs`: the drift check and repair;
* :mod:`~provisioner.service.jobs`: the operator's levers on the queue and its history;
* :mod:`~provisioner.service.reads`: a tenant's status, the list of tenants, readiness,
  health and the console's reads;
* :mod:`~provisioner.service.directory`: the directory of tenant servers.
"""

from __future__ import annotations

from provisioner.local import cluster as local_pg
from provisioner.local import state as embedded
from provisioner.models import TenantId
from provisioner.service.bootstrap import migrate, record_naming, resolve
from provisioner.service.directory import (
    add_server,
    check_servers,
    list_servers,
    locate,
    set_server_status,
)
from provisioner.service.jobs import (
    HistoryPruned,
    cancel_job,
    list_jobs,
    parse_job_id,
    prune_history,
    retry_failed,
    retry_job,
)
from provisioner.service.lifecycle import (
    INACTIVE_HINTS,
    LifecycleResult,
    ProvisionResult,
    TenantOutcome,
    change_lifecycle,
    change_lifecycle_many,
    enqueue,
    no_announcement,
    parse_tenant_ids,
    provision,
    refuse_inactive,
)
from provisioner.service.reads import (
    TenantEntry,
    TenantStatus,
    check_storage,
    health,
    list_tenants,
    overview,
    rollout_history,
    server_rows,
    status,
    status_on,
)
from provisioner.service.repairs import RepairReport, RepairResult, check, repair
from provisioner.service.rollouts import (
    TenantUpgrade,
    UpgradeReport,
    rollout_pause,
    tenants_per_head,
    upgrade,
    upgrade_abort,
    upgrade_progress,
    upgrade_resume,
    wait_for_canary,
)
from provisioner.tenant.checks import CheckRecord

__all__ = [
    "INACTIVE_HINTS",
    "CheckRecord",
    "HistoryPruned",
    "LifecycleResult",
    "ProvisionResult",
    "RepairReport",
    "RepairResult",
    "TenantEntry",
    "TenantId",
    "TenantOutcome",
    "TenantStatus",
    "TenantUpgrade",
    "UpgradeReport",
    "add_server",
    "cancel_job",
    "change_lifecycle",
    "change_lifecycle_many",
    "check",
    "check_servers",
    "check_storage",
    "embedded",
    "enqueue",
    "health",
    "list_jobs",
    "list_servers",
    "list_tenants",
    "local_pg",
    "locate",
    "migrate",
    "no_announcement",
    "overview",
    "parse_job_id",
    "parse_tenant_ids",
    "provision",
    "prune_history",
    "record_naming",
    "refuse_inactive",
    "repair",
    "resolve",
    "retry_failed",
    "retry_job",
    "rollout_history",
    "rollout_pause",
    "server_rows",
    "set_server_status",
    "status",
    "status_on",
    "tenants_per_head",
    "upgrade",
    "upgrade_abort",
    "upgrade_progress",
    "upgrade_resume",
    "wait_for_canary",
]
