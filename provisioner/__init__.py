"""Resumable tenant provisioning for schema-per-tenant PostgreSQL.

The public API is what this module exports (see ``__all__`` and README "Using it from code");
the submodules are the implementation and may change between releases.
"""

from importlib.metadata import PackageNotFoundError, version

DISTRIBUTION = "pg-tenant-provisioner"

try:
    __version__ = version(DISTRIBUTION)
except PackageNotFoundError:  # running from a source tree that was never installed
    __version__ = "0.0.0"

# After __version__: the modules below import it (the CLI shows it).
from provisioner.api import enqueue, enqueue_async, provision, status, upgrade  # noqa: E402
from provisioner.errors import (  # noqa: E402
    ConfigurationError,
    InvalidInput,
    KeyConflict,
    ProvisionerError,
    UnknownJob,
    UnknownTenant,
)
from provisioner.models import Job, JobStatus, TenantId  # noqa: E402
from provisioner.service import ProvisionResult, TenantStatus, UpgradeReport  # noqa: E402
from provisioner.settings import Settings  # noqa: E402

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
