"""Drift detection: does each tenant's catalog still match what the template head builds?

The expected shape is built, never kept: a scratch schema is created, migrated by Alembic to the
head and granted to the application role exactly as provisioning does, fingerprinted
(:func:`provisioner.tenant.schema.fingerprint`, schema name abstracted), and the transaction is
rolled back. Nothing is written. Each tenant's fingerprint (one catalog query and its version
read, in a transaction of its own) is then compared with it, section by section, and every
difference is named: an extra object (a hand-made index), a missing one (a dropped column), an
altered one (another definition, other grants), and the application role's missing privileges.

A tenant whose schema records another revision than the head is reported as behind, not as
drifted: ``provisioner upgrade`` is the cure for that.
"""

from __future__ import annotations

import enum
from contextlib import closing
from dataclasses import dataclass
from typing import Any

import sqlalchemy as sa

from provisioner import db, queue
from provisioner.errors import UnknownTenant
from provisioner.kinds.provision import PROVISION_JOB_TYPE
from provisioner.models import JobStatus, TenantId
from provisioner.settings import Settings
from provisioner.templates import migrations
from provisioner.templates.reference import Fingerprint
from provisioner.tenant import schema as tenant_schema

#: The scratch schema the expected shape is built in (rolled back; never committed).
SCRATCH_SCHEMA = "tenant_zz_drift_expected"

#: How many leading fields name an object in each fingerprint section (the rest describe it).
KEY_FIELDS = {
    "relations": 1,
    "columns": 2,
    "indexes": 1,
    "constraints": 2,
    "schema": 0,
    "default_privileges": 2,
    "alembic_version": 1,
}


class DriftKind(enum.StrEnum):
    EXTRA = "extra"
    MISSING = "missing"
    ALTERED = "altered"
    MISSING_GRANT = "missing grant"


class TenantCheck(enum.StrEnum):
    CLEAN = "clean"
    DRIFTED = "drifted"
    BEHIND = "behind"
    #: no schema, or its provisioning job has not succeeded
    NOT_PROVISIONED = "not provisioned"


@dataclass(frozen=True)
class Drift:
    kind: DriftKind
    section: str
    name: str
    detail: str


@dataclass(frozen=True)
class TenantDrift:
    tenant_id: str
    state: TenantCheck
    drifts: tuple[Drift, ...] = ()
    versions: frozenset[str] = frozenset()


@dataclass(frozen=True)
class DriftReport:
    heads: frozenset[str]
    tenants: list[TenantDrift]

    @property
    def drifted(self) -> list[TenantDrift]:
        return [t for t in self.tenants if t.state is TenantCheck.DRIFTED]


def expected_fingerprint(settings: Settings) -> Fingerprint:
    """The fingerprint of a schema freshly built at head, in a transaction rolled back."""
    engine = db.engine(settings.owner_url, poolclass=sa.pool.NullPool)
    try:
        with db.translated(), engine.connect() as connection:
            transaction = connection.begin()
            try:
                pg = connection.connection.driver_connection
                tenant_schema.create_schema(pg, SCRATCH_SCHEMA)  # type: ignore[arg-type]
                migrations.upgrade_tenant(connection, SCRATCH_SCHEMA)
                tenant_schema.grant_app_role(pg, SCRATCH_SCHEMA, settings.app_role)  # type: ignore[arg-type]
                # Alembic left search_path on the scratch schema, which changes how the catalog
                # prints names (pg_get_constraintdef): read it as the tenants are read.
                connection.execute(sa.text("SET LOCAL search_path TO DEFAULT"))
                return tenant_schema.fingerprint(pg, SCRATCH_SCHEMA)  # type: ignore[arg-type]
            finally:
                transaction.rollback()
    finally:
        engine.dispose()


def compare(expected: Fingerprint, got: Fingerprint) -> list[Drift]:
    """Every object that differs, by section: extra, missing, or altered (same name)."""
    drifts: list[Drift] = []
    for section in sorted(set(expected) | set(got)):
        want, have = expected.get(section, []), got.get(section, [])
        if want == have:
            continue
        width = KEY_FIELDS.get(section, 1)
        want_by = {_key(row, width): row for row in want}
        have_by = {_key(row, width): row for row in have}
        for key in sorted(set(want_by) | set(have_by)):
            before, after = want_by.get(key), have_by.get(key)
            if before == after:
                continue
            if before is None:
                drifts.append(Drift(DriftKind.EXTRA, section, key, _show(after)))
            elif after is None:
                drifts.append(Drift(DriftKind.MISSING, section, key, _show(before)))
            else:
                drifts.append(
                    Drift(DriftKind.ALTERED, section, key, f"{_show(before)} -> {_show(after)}")
                )
    return drifts


def _key(row: tuple[Any, ...], width: int) -> str:
    return ".".join(str(v) for v in row[:width]) or "(schema)"


def _show(row: tuple[Any, ...] | None) -> str:
    text = ", ".join(str(v) for v in row or ())
    return text if len(text) <= 200 else text[:197] + "..."


def check(settings: Settings, tenant_ids: list[str] | None = None) -> DriftReport:
    """Compare each provisioned tenant (all, or the named ones) with the head's shape."""
    wanted = None if tenant_ids is None else [TenantId(t) for t in tenant_ids]
    heads = migrations.tenant_heads()
    expected = expected_fingerprint(settings)
    owner = db.connect(settings.owner_url, application_name="check", autocommit=True)
    results: list[TenantDrift] = []
    with closing(owner) as conn, db.translated():
        jobs = queue.latest_jobs(conn, PROVISION_JOB_TYPE, wanted)
        missing = sorted({t.value for t in wanted or []} - {str(j.tenant_id) for j in jobs})
        if missing:
            raise UnknownTenant(f"unknown tenant(s) {', '.join(missing)}: no provisioning job")
        for job in jobs:
            tenant = TenantId(str(job.tenant_id))
            if job.status is not JobStatus.SUCCEEDED:
                results.append(TenantDrift(tenant.value, TenantCheck.NOT_PROVISIONED))
                continue
            versions = migrations.tenant_versions(conn, tenant.schema)
            if versions is None:
                results.append(TenantDrift(tenant.value, TenantCheck.NOT_PROVISIONED))
                continue
            if versions != heads:
                results.append(TenantDrift(tenant.value, TenantCheck.BEHIND, versions=versions))
                continue
            drifts = compare(expected, tenant_schema.fingerprint(conn, tenant.schema))
            drifts += [
                Drift(DriftKind.MISSING_GRANT, "grants", grant, settings.app_role)
                for grant in tenant_schema.missing_app_grants(
                    conn, tenant.schema, settings.app_role
                )
            ]
            state = TenantCheck.DRIFTED if drifts else TenantCheck.CLEAN
            results.append(TenantDrift(tenant.value, state, tuple(drifts), versions))
    return DriftReport(heads, results)
