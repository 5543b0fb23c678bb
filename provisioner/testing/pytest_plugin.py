"""The pytest plugin (entry point ``pytest11``): real, freshly provisioned tenants for tests.

Fixtures (see README, "Testing your application"):

``provisioner_server`` (session)
    A PostgreSQL server: the one named by ``PROVISIONER_TEST_DATABASE_URL`` (a superuser URL;
    its password may be in it, in ``PGPASSWORD`` or in ``~/.pgpass``), else a throwaway
    cluster, removed after the run. Under pytest-xdist the workers of a run share one
    throwaway cluster (:mod:`provisioner.testing.shared`).
``provisioner_database`` (session)
    A database of its own on that server (one per pytest-xdist worker), with the
    ``provisioner_owner`` and ``app_rw`` roles and the control schema at head.
``provisioner_settings`` (session)
    :class:`provisioner.Settings` for that database, to pass to the library's functions.
``tenant`` (function)
    A freshly provisioned tenant of its own for the test, dropped afterwards.
``tenant_factory`` (function)
    ``tenant_factory()`` or ``tenant_factory("acme")`` for tests that need several; every
    tenant it made is dropped after the test. ``tenant_factory("acme", settings=mine)`` puts
    the tenant in the database ``mine`` names instead (its control schema at head, the same
    roles), for a test that needs it beside rows or processes of its own there.
``provisioner_worker`` (function)
    ``provisioner_worker.drain()`` runs, in the test's process, every job the application
    queued (its sign-ups' provisioning, its suspensions...), as a worker would.

After every test that used the plugin's database, the tenants the application signed up on
its own (and the jobs it queued) are removed, so the next test starts from the same state.

The plugin imports the package only when a fixture is used, so it costs nothing to test
sessions that never ask for one.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Collection, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

if TYPE_CHECKING:
    from provisioner.models import Job
    from provisioner.settings import Settings
    from provisioner.testing import PgServer, ProvisionerDatabase, Tenant, TenantFactory


def shared_folder(tmp_path_factory: pytest.TempPathFactory) -> Path | None:
    """The folder every pytest-xdist worker of this run sees (None: not under xdist)."""
    if not os.environ.get("PYTEST_XDIST_WORKER"):
        return None
    return tmp_path_factory.getbasetemp().parent


@pytest.fixture(scope="session")
def provisioner_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[PgServer]:
    from provisioner.testing import SERVER_URL_ENV, PgServer

    url = os.environ.get(SERVER_URL_ENV) or None
    server = PgServer.start(url, shared_dir=shared_folder(tmp_path_factory))
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture(scope="session")
def provisioner_database(
    provisioner_server: PgServer, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[ProvisionerDatabase]:
    from provisioner.testing import ProvisionerDatabase

    database = ProvisionerDatabase.create(
        provisioner_server, tmp_path_factory.mktemp("provisioner")
    )
    try:
        yield database
    finally:
        database.drop(provisioner_server)


@pytest.fixture(scope="session")
def provisioner_settings(provisioner_database: ProvisionerDatabase) -> Settings:
    return provisioner_database.settings


@pytest.fixture(scope="session")
def provisioner_tenants(provisioner_database: ProvisionerDatabase) -> Iterator[TenantFactory]:
    """The session's spare tenants (built ahead in the background, handed out by rename)."""
    from provisioner.testing import TenantFactory

    factory = TenantFactory(provisioner_database)
    try:
        yield factory
    finally:
        factory.close()


@pytest.fixture(autouse=True)
def _provisioner_sweep(request: pytest.FixtureRequest) -> Iterator[None]:
    """After a test that used the plugin's database: drop the tenants the application signed
    up itself and the jobs it queued (the factory's tenants are the factory's to drop)."""
    if "provisioner_database" not in request.fixturenames:
        yield
        return
    factory: TenantFactory = request.getfixturevalue("provisioner_tenants")
    before = factory.snapshot()
    yield
    factory.sweep(before)


@pytest.fixture
def tenant_factory(provisioner_tenants: TenantFactory) -> Iterator[Callable[..., Tenant]]:
    made: list[Tenant] = []

    def make(tenant_id: str | None = None, *, settings: Settings | None = None) -> Tenant:
        made.append(provisioner_tenants.create(tenant_id, settings=settings))
        return made[-1]

    yield make
    for tenant in made:
        provisioner_tenants.drop(tenant)


@pytest.fixture
def tenant(tenant_factory: Callable[..., Tenant]) -> Tenant:
    return tenant_factory()


@dataclass(frozen=True)
class ProvisionerWorker:
    """Runs what the application queued, in the test's process (see :func:`drain`)."""

    settings: Settings

    def drain(self, job_types: Collection[str] | None = None) -> list[Job]:
        """Run every ready job (of ``job_types``; default: the owner's kinds) until none is
        left; the jobs as settled."""
        from provisioner.testing import drain

        return drain(self.settings, job_types)


@pytest.fixture
def provisioner_worker(provisioner_settings: Settings) -> ProvisionerWorker:
    return ProvisionerWorker(provisioner_settings)
