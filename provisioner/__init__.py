"""Resumable tenant provisioning for schema-per-tenant PostgreSQL.

The public API is what this module exports (see ``__all__`` and README "Using it from code");
the submodules are the implementation and may change between releases.

The functions and the result types are imported on first use (PEP 562 ``__getattr__``), not by
``import provisioner``: every submodule, ``provisioner.cli`` included, starts by importing this
package, and the API pulls in the engine, the fleet and PostgreSQL's driver, which the command
line's ``--help`` never needs (docs/performance.md "Start-up"). A type checker and
``from provisioner import ...`` see the same names either way.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from provisioner.errors import (
    ConfigurationError,
    InvalidInput,
    KeyConflict,
    ProvisionerError,
    UnknownJob,
    UnknownTenant,
)
from provisioner.models import Job, JobStatus, TenantId
from provisioner.settings import Settings
from provisioner.version import __version__

if TYPE_CHECKING:
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
    from provisioner.fleet.drift import DriftReport
    from provisioner.servers import Location
    from provisioner.service import LifecycleResult, ProvisionResult, TenantStatus, UpgradeReport

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

#: Where each export imported on first use lives (the list under ``TYPE_CHECKING`` above).
_LAZY = {
    **dict.fromkeys(
        (
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
        ),
        "provisioner.api",
    ),
    "HealthReport": "provisioner.control.heartbeats",
    "DriftReport": "provisioner.fleet.drift",
    "Location": "provisioner.servers",
    **dict.fromkeys(
        ("LifecycleResult", "ProvisionResult", "TenantStatus", "UpgradeReport"),
        "provisioner.service",
    ),
}


def __getattr__(name: str) -> Any:
    """Import a lazy export from its module the first time it is asked for, then keep it here."""
    home = _LAZY.get(name)
    if home is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(home), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})
