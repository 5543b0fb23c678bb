"""The fleet: every tenant at once. Who is behind the template's head (:mod:`.versions`), the
upgrade that queues them (:mod:`.upgrade`) under a rollout with a canary and brakes
(:mod:`.rollout`), the drift check (:mod:`.drift`), and ``health`` across the tenant servers
(:mod:`.health`). Each reads tenants on their own server through the fan-out
(:mod:`provisioner.servers.fanout`).
"""

from provisioner.fleet.upgrade import (
    SkippedTenant,
    TenantUpgrade,
    UpgradeReport,
    abort,
    pause,
    progress,
    resume,
    tenants_per_head,
    upgrade,
    wait_for_canary,
)
from provisioner.fleet.versions import (
    UPGRADE_SETTINGS,
    VersionTable,
    read_versions,
    schema_versions,
    versioned,
)

__all__ = [
    "UPGRADE_SETTINGS",
    "SkippedTenant",
    "TenantUpgrade",
    "UpgradeReport",
    "VersionTable",
    "abort",
    "pause",
    "progress",
    "read_versions",
    "resume",
    "schema_versions",
    "tenants_per_head",
    "upgrade",
    "versioned",
    "wait_for_canary",
]
