"""Resumable tenant provisioning for schema-per-tenant PostgreSQL.

The public API is what this module exports (see ``__all__`` and README "Using it from code");
the submodules are the implementation and may change between releases.
"""

from provisioner.api import enqueue, enqueue_async, provision, status, upgrade
from provisioner.errors import (
    ConfigurationError,
    InvalidInput,
    KeyConflict,
    ProvisionerError,
    UnknownJob,
    UnknownTenant,
)
from provisioner.models import Job, JobStatus, TenantId
from provisioner.service import ProvisionResult, TenantStatus, UpgradeReport
from provisioner.settings import Settings
from provisioner.version import __version__

__all__ = [
    "ConfigurationError",
    "InvalidInput",
    "Job",
    "JobStatus",
    "KeyConflict",
    "ProvisionResult",
    "ProvisionerError",
    "Settings",
    "TenantId",
    "TenantStatus",
    "UnknownJob",
    "UnknownTenant",
    "UpgradeReport",
    "__version__",
    "enqueue",
    "enqueue_async",
    "provision",
    "status",
    "upgrade",
]
