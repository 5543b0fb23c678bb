"""Resumable tenant provisioning for schema-per-tenant PostgreSQL.

The public API is what this module exports (see ``__all__`` and README "Using it from code");
the submodules are the implementation and may change between releases.
"""

from provisioner.api import (
    check,
    deprovision,
    enqueue,
    enqueue_async,
    health,
    locate,
    provision,
    restore,
    status,
    suspend,
    upgrade,
)
from provisioner.control.heartbeats import HealthReport
from provisioner.errors import (
    ConfigurationError,
    InvalidInput,
    KeyConflict,
    ProvisionerError,
    UnknownJob,
    UnknownTenant,
)
from provisioner.fleet.drift import DriftReport
from provisioner.models import Job, JobStatus, TenantId
from provisioner.servers import Location
from provisioner.service import LifecycleResult, ProvisionResult, TenantStatus, UpgradeReport
from provisioner.settings import Settings
from provisioner.version import __version__

__all__ = [
    "ConfigurationError",
    "DriftReport",
    "HealthReport",
    "InvalidInput",
    "Job",
    "JobStatus",
    "KeyConflict",
    "LifecycleResult",
    "Location",
    "ProvisionResult",
    "ProvisionerError",
    "Settings",
    "TenantId",
    "TenantStatus",
    "UnknownJob",
    "UnknownTenant",
    "UpgradeReport",
    "__version__",
    "check",
    "deprovision",
    "enqueue",
    "enqueue_async",
    "health",
    "locate",
    "provision",
    "restore",
    "status",
    "suspend",
    "upgrade",
]
