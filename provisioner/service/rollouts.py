"""Fleet upgrades as rollouts: queue the tenants behind the template's head, pause, resume,
abort, and read their progress (the work is :mod:`provisioner.fleet`'s)."""

from __future__ import annotations

from provisioner import fleet
from provisioner.fleet import rollout
from provisioner.settings import Settings
from provisioner.templates import migrations

TenantUpgrade = fleet.TenantUpgrade
UpgradeReport = fleet.UpgradeReport


def upgrade(
    settings: Settings,
    tenant_ids: list[str] | None = None,
    *,
    dry_run: bool = False,
    canary: int | None = None,
    max_failures: int | None = None,
    include_deleted: bool = False,
) -> UpgradeReport:
    """Queue the provisioned tenants behind the tenant template's head as a rollout (see
    :mod:`fleet` and :mod:`rollout`); purged tenants are reported only with
    ``include_deleted``."""
    migrations.check_tenant_tree()
    return fleet.upgrade(
        settings,
        tenant_ids,
        dry_run=dry_run,
        canary=canary,
        max_failures=max_failures,
        include_deleted=include_deleted,
    )


def upgrade_resume(
    settings: Settings, *, rollout_id: int | None = None, started_by: str = "upgrade"
) -> rollout.Resumed:
    return fleet.resume(settings, rollout_id=rollout_id, started_by=started_by)


def rollout_pause(settings: Settings, rollout_id: int, *, paused_by: str) -> rollout.Paused:
    """Pause a running rollout (:func:`provisioner.fleet.rollout.pause`)."""
    return fleet.pause(settings, rollout_id, paused_by=paused_by)


def upgrade_abort(settings: Settings, *, ended_by: str = "upgrade --abort") -> rollout.Aborted:
    return fleet.abort(settings, ended_by=ended_by)


def upgrade_progress(settings: Settings) -> rollout.Progress:
    return fleet.progress(settings)


def tenants_per_head(settings: Settings) -> dict[str, int]:
    return fleet.tenants_per_head(settings)


def wait_for_canary(settings: Settings, rollout_id: int) -> dict[str, int]:
    return fleet.wait_for_canary(settings, rollout_id)
