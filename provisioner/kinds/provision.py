"""The six provisioning steps, in order, each safe to run again on its own.

A step has ``run`` (do the work inside the engine's transaction) and ``effect_present`` (read
the catalog: is the work still there?). The engine skips a recorded step only when its effect is
present; a step whose effect vanished (a dropped schema, revoked grants) runs again.
"""

from __future__ import annotations

from provisioner import pool
from provisioner.db import Transaction
from provisioner.kinds import Step, StepContext
from provisioner.models import STEPS
from provisioner.templates import migrations
from provisioner.tenant import row as tenants
from provisioner.tenant import schema as tenant_schema

__all__ = ["PROVISION_STEPS", "Step", "StepContext"]


def _create_schema(tx: Transaction, ctx: StepContext) -> str | None:
    # A spare from the warm pool when one is ready at the head (renamed in this transaction).
    taken = pool.take(tx, ctx.tenant.schema, ctx.app_role)
    if taken is None:
        tenant_schema.create_schema(tx.pg, ctx.tenant.schema)
    tenants.mark_provisioning(tx.pg, ctx.tenant)
    ctx.memo.spare_taken = taken is not None
    ctx.memo.spare_grants_in_place = taken is not None and taken.grants.all_but_usage
    # A taken spare's other steps are a few statements each: they join the take's transaction,
    # so that a sign-up's tenant appears whole or not at all (a crash leaves the spare), with
    # one commit where there were six.
    ctx.memo.one_transaction = ctx.memo.spare_taken
    return None if taken is None else taken.detail


def _run_tenant_migrations(tx: Transaction, ctx: StepContext) -> str | None:
    # A verified replay when it applies (the template for a new schema, the new revisions' DDL
    # for one behind the head), else Alembic; the detail says which ran and why.
    return ctx.upgrades.migrate(
        tx,
        ctx.tenant.schema,
        lock_timeout_ms=ctx.lock_timeout_ms,
        templates=ctx.templates,
        app_role=ctx.app_role,
        versioned=ctx.memo.spare_taken is True,
    )


#: The grant step's detail when a taken spare's grants were in place (the take granted USAGE).
TAKEN_GRANTS = "grants already in place (warm pool): USAGE granted with the take, every ACL checked"
#: ... when a schema's grants were in place but USAGE, read in this step (a job resumed after
#: its create_schema step): USAGE granted here.
GRANTS_IN_PLACE = "grants already in place: USAGE granted, every ACL checked"


def _grant_app_rw(tx: Transaction, ctx: StepContext) -> str | None:
    # A taken spare already carries every grant but USAGE, which the take granted: check it,
    # whatever the number of tables (the take read every other ACL before its rename). A
    # schema with its other grants in place (a job resumed after its take) gets USAGE and a
    # check of every ACL in one round trip. Otherwise (a new schema, a restore after a revoke,
    # a spare built without grants) name every table and check, as always. A schema this run
    # created has no grant yet: the one-query check is not tried.
    if ctx.memo.spare_grants_in_place and pool.usage_held(tx.pg, ctx.tenant.schema, ctx.app_role):
        return TAKEN_GRANTS
    fresh = ctx.memo.spare_taken is False
    if not fresh and pool.grant_usage_if_in_place(tx.pg, ctx.tenant.schema, ctx.app_role):
        return GRANTS_IN_PLACE
    tenant_schema.grant_app_role(tx.pg, ctx.tenant.schema, ctx.app_role)
    return None


def _seed_role_profiles(tx: Transaction, ctx: StepContext) -> str | None:
    tenant_schema.seed_role_profiles(tx.pg, ctx.tenant.schema)
    return None


def _verify_object_storage(tx: Transaction, ctx: StepContext) -> str | None:
    ctx.store.check()
    return ctx.store.describe()


def _activate_onboarding(tx: Transaction, ctx: StepContext) -> str | None:
    tenants.activate_onboarding(tx.pg, ctx.tenant)
    return None


def _always(tx: Transaction, ctx: StepContext) -> bool:
    return True


PROVISION_STEPS: tuple[Step, ...] = (
    Step(
        "create_schema",
        _create_schema,
        lambda tx, ctx: tenant_schema.schema_ready(tx.pg, ctx.tenant.schema),
    ),
    Step(
        "run_tenant_migrations",
        _run_tenant_migrations,
        lambda tx, ctx: migrations.tenant_at_head(tx.pg, ctx.tenant.schema),
    ),
    Step(
        "grant_app_rw",
        _grant_app_rw,
        lambda tx, ctx: (
            not tenant_schema.missing_app_grants(tx.pg, ctx.tenant.schema, ctx.app_role)
        ),
    ),
    Step(
        "seed_role_profiles",
        _seed_role_profiles,
        lambda tx, ctx: tenant_schema.role_profiles_seeded(tx.pg, ctx.tenant.schema),
    ),
    Step("verify_object_storage", _verify_object_storage, _always, uses_database=False),
    Step(
        "activate_onboarding",
        _activate_onboarding,
        lambda tx, ctx: tenants.onboarding_active(tx.pg, ctx.tenant),
    ),
)

assert tuple(step.name for step in PROVISION_STEPS) == STEPS, "steps out of sync with STEPS"
